package worker_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/worker"
)

// TestPrune_DeletesFinishedJobsOnceTheirRetentionHasPassed runs a worker
// that keeps succeeded jobs for an hour, dead ones for three and cancelled
// ones forever, over a history of jobs that finished two hours ago or just
// now, and more old succeeded jobs than one prune statement deletes.
func TestPrune_DeletesFinishedJobsOnceTheirRetentionHasPassed(t *testing.T) {
	b := setup(t)
	ids := map[string]int64{}
	for _, state := range []string{"succeeded", "dead", "cancelled"} {
		for _, age := range []string{"2 hours", "0 seconds"} {
			var id int64
			if err := b.pool.QueryRow(b.ctx, `
				INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
				VALUES ('done', $1, 1, 1, now() - $2::interval, now() - $2::interval)
				RETURNING id`, state, age).Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids[state+" "+age+" ago"] = id
		}
	}
	waiting := b.enqueue(t, "nobody-handles-this", `{}`, 1)
	if _, err := b.pool.Exec(b.ctx, `UPDATE jobs SET created_at = now() - interval '1 day', run_at = now() + interval '1 day' WHERE id = $1`, waiting.ID); err != nil {
		t.Fatal(err)
	}
	ids["available, enqueued a day ago"] = waiting.ID
	const old = 2*worker.DefaultPruneBatch + 500
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
		SELECT 'done', 'succeeded', 1, 1, now() - interval '3 hours', now() - interval '3 hours'
		FROM generate_series(1, $1)`, old); err != nil {
		t.Fatal(err)
	}

	_, stop := b.startWorker(t, worker.Config{
		RetainSucceeded: time.Hour,
		RetainDead:      3 * time.Hour,
		RetainCancelled: worker.KeepForever,
		PruneInterval:   20 * time.Millisecond,
	}, func(*worker.Worker) {})
	deadline := time.Now().Add(20 * time.Second)
	for b.count(t, `SELECT count(*) FROM jobs WHERE state = 'succeeded' AND finished_at < now() - interval '1 hour'`) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("succeeded jobs older than their retention still there after 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()

	kept := map[string]bool{}
	for name, id := range ids {
		_, err := b.q.JobGet(b.ctx, id)
		switch {
		case err == nil:
			kept[name] = true
		case errors.Is(err, pgx.ErrNoRows):
			kept[name] = false
		default:
			t.Fatalf("get job %d: %v", id, err)
		}
	}
	want := map[string]bool{
		"succeeded 2 hours ago":         false,
		"succeeded 0 seconds ago":       true,
		"dead 2 hours ago":              true,
		"dead 0 seconds ago":            true,
		"cancelled 2 hours ago":         true,
		"cancelled 0 seconds ago":       true,
		"available, enqueued a day ago": true,
	}
	if diff := cmp.Diff(want, kept); diff != "" {
		t.Errorf("jobs kept (-want +got):\n%s", diff)
	}
	if n := b.count(t, `SELECT count(*) FROM jobs`); n != 6 {
		t.Errorf("%d jobs left, want the 6 kept", n)
	}
}

// TestPrune_KeepsEveryJobWhenEveryStateIsKeptForever runs a worker that
// keeps every state forever over jobs that finished years ago.
func TestPrune_KeepsEveryJobWhenEveryStateIsKeptForever(t *testing.T) {
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
		SELECT 'done', s::job_state, 1, 1, now() - interval '3 years', now() - interval '3 years'
		FROM unnest(ARRAY['succeeded', 'dead', 'cancelled']) AS s`); err != nil {
		t.Fatal(err)
	}
	_, stop := b.startWorker(t, worker.Config{
		RetainSucceeded: worker.KeepForever,
		RetainDead:      worker.KeepForever,
		RetainCancelled: worker.KeepForever,
		PruneInterval:   time.Millisecond,
	}, func(*worker.Worker) {})
	time.Sleep(200 * time.Millisecond)
	stop()
	if n := b.count(t, `SELECT count(*) FROM jobs`); n != 3 {
		t.Errorf("%d jobs left, want all 3", n)
	}
}

// count runs a query that counts something.
func (b *bundle) count(t *testing.T, query string) int64 {
	t.Helper()
	var n int64
	if err := b.pool.QueryRow(b.ctx, query).Scan(&n); err != nil {
		t.Fatal(fmt.Errorf("%s: %w", query, err))
	}
	return n
}

// TestPrune_CatchesUpOnAHistoryLongerThanTenBatchesWithinAnInterval runs
// a worker over a history of succeeded jobs past their retention six
// times as long as it deletes in one round (maxPruneBatches statements of
// DefaultPruneBatch jobs), as a worker that finishes more than a thousand
// jobs a second leaves every ten seconds. Once it has begun, the worker
// deletes the whole history within one PruneInterval: each statement is
// short and a transaction of its own, but a worker that waited an
// interval after every ten would fall further behind with every round,
// and keep jobs long past their retention, without bound.
func TestPrune_CatchesUpOnAHistoryLongerThanTenBatchesWithinAnInterval(t *testing.T) {
	b := setup(t)
	const (
		round    = 10 * worker.DefaultPruneBatch
		history  = 6 * round
		interval = 5 * time.Second
	)
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
		SELECT 'done', 'succeeded', 1, 1, now() - interval '3 hours', now() - interval '3 hours'
		FROM generate_series(1, $1)`, history); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `ANALYZE jobs`); err != nil {
		t.Fatal(err)
	}
	b.startWorker(t, worker.Config{
		RetainSucceeded: time.Hour,
		PruneInterval:   interval,
	}, func(*worker.Worker) {})
	const left = `SELECT count(*) FROM jobs`
	deadline := time.Now().Add(2 * interval)
	for b.count(t, left) == history {
		if time.Now().After(deadline) {
			t.Fatalf("no job pruned after %s", 2*interval)
		}
		time.Sleep(10 * time.Millisecond)
	}
	begun := time.Now()
	for {
		n := b.count(t, left)
		if n == 0 {
			t.Logf("the history pruned %s after the first round began", time.Since(begun).Round(time.Millisecond))
			return
		}
		if time.Since(begun) > interval {
			t.Fatalf("%d of %d jobs past their retention still kept %s after the first round began, want none",
				n, history, interval)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
