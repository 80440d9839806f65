package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/worker"
)

// These tests specify how the workers keep the planner's statistics of the
// jobs table current where autovacuum does not. Each test turns autovacuum
// off for its own database's jobs table, so that they hold on a server
// that runs autovacuum as on one that does not.

func TestStatisticsDue_WhenManyRowsChangedSinceTheLastAnalyzeAndToOneWorkerAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	offForJobs(t, b)
	due := func(t *testing.T, q *db.Queries) bool {
		t.Helper()
		got, err := q.JobStatisticsDue(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	insert := func(t *testing.T, n int) {
		t.Helper()
		execReported(t, b, fmt.Sprintf(`INSERT INTO jobs (kind) SELECT 'noop' FROM generate_series(1, %d)`, n))
	}

	insert(t, 20)
	if due(t, db.New(b.pool)) {
		t.Errorf("due after 20 rows inserted, below autovacuum_analyze_threshold (50)")
	}
	insert(t, 1000)

	// Two workers ask at once, each in a transaction: one is told to
	// analyze, the other that someone is.
	first, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Rollback(b.ctx)
	if !due(t, db.New(first)) {
		t.Fatalf("not due after 1,020 rows inserted into a table never analyzed")
	}
	second, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Rollback(b.ctx)
	if due(t, db.New(second)) {
		t.Errorf("due to a second worker while the first holds the lock")
	}
	if err := db.New(first).JobAnalyze(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if due(t, db.New(b.pool)) {
		t.Errorf("still due right after ANALYZE")
	}
}

// TestStatistics_GatheredByAWorkerMakeACachedPlanAnew prepares the
// heartbeat on a connection with a generic plan over an empty table, as a
// worker's connection comes to cache it when the worker starts on a new
// database, and adds 20,000 finished jobs. That plan reads the whole table
// at every heartbeat. Once a worker has gathered the statistics,
// PostgreSQL makes the plan anew, and it looks jobs up by id.
func TestStatistics_GatheredByAWorkerMakeACachedPlanAnew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	offForJobs(t, b)
	heartbeat := keepPlan(t, b, "heartbeat", func(q *db.Queries) error {
		_, err := q.JobHeartbeatMany(b.ctx, db.JobHeartbeatManyParams{LeaseMs: 30_000})
		return err
	}, `EXECUTE heartbeat(30000, '{1,2}', '{00000000-0000-0000-0000-000000000001,00000000-0000-0000-0000-000000000002}')`)
	addFinishedJobs(t, b, 20_000)
	if scanned, buffers, _ := heartbeat.explain(t, b); !scanned {
		t.Fatalf("the plan made over the empty table does not scan the jobs table (%d buffers): the test no longer shows the cached plan it is about", buffers)
	}

	_, stop := b.startWorker(t, worker.Config{PruneInterval: 20 * time.Millisecond}, func(*worker.Worker) {})
	defer stop()
	deadline := time.Now().Add(20 * time.Second)
	for b.count(t, `SELECT count(*) FROM pg_stat_all_tables WHERE relid = 'jobs'::regclass AND last_analyze IS NOT NULL`) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no worker analyzed jobs within 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if scanned, buffers, plan := heartbeat.explain(t, b); scanned || buffers > 10 {
		t.Errorf("after the worker analyzed jobs, the heartbeat read %d buffers (scans the table: %v):\n%s", buffers, scanned, plan)
	}
}

// offForJobs turns autovacuum off for the jobs table of b's database.
func offForJobs(t *testing.T, b *bundle) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE jobs SET (autovacuum_enabled = false)`); err != nil {
		t.Fatal(err)
	}
}

// execReported runs sql on one connection and waits until the rows it
// changed count in the statistics that JobStatisticsDue reads. A backend
// reports them as it waits for its next statement, but at most once a
// second, and otherwise 10 s later, unless asked to
// (pg_stat_force_next_flush).
func execReported(t *testing.T, b *bundle, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var before int64
	if err := conn.QueryRow(ctx, `SELECT n_mod_since_analyze FROM pg_stat_all_tables WHERE relid = 'jobs'::regclass`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	tag, err := conn.Exec(ctx, sql)
	if err != nil {
		t.Fatal(err)
	}
	// Reported when this statement ends, as the backend waits again.
	if _, err := conn.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	for {
		var got int64
		if err := b.pool.QueryRow(ctx, `SELECT n_mod_since_analyze FROM pg_stat_all_tables WHERE relid = 'jobs'::regclass`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got >= before+tag.RowsAffected() {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("statistics of jobs count %d rows changed since the last ANALYZE after 10s, want at least %d", got, before+tag.RowsAffected())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
