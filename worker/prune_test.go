package worker_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
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

// TestPrune_FreesTheIdempotencyKeyOfTheJobsItDeletes: an idempotency key
// protects against a duplicate for as long as its job is kept. An enqueue
// of the key again is answered with the job while it is kept, finished
// too; once the job is deleted after its retention, the same enqueue
// stores a new job.
func TestPrune_FreesTheIdempotencyKeyOfTheJobsItDeletes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := "charge-42"
	job := client.Job{Queue: "default", Kind: "noop", Payload: json.RawMessage(`{}`), MaxAttempts: 1, IdempotencyKey: &key}
	first, replayed, err := client.Insert(b.ctx, b.pool, job)
	if err != nil || replayed {
		t.Fatalf("enqueue: replayed %t, %v", replayed, err)
	}
	id, token := b.claimOne(t, "w", time.Minute)
	if id != first.ID || !b.complete(t, id, token, `"charged"`) {
		t.Fatalf("claimed job %d, want %d completed", id, first.ID)
	}
	if again, replayed, err := client.Insert(b.ctx, b.pool, job); err != nil || !replayed || again.ID != first.ID {
		t.Fatalf("enqueue again while the job is kept: job %d, replayed %t, %v; want job %d replayed", again.ID, replayed, err, first.ID)
	}

	if _, err := b.pool.Exec(b.ctx, `UPDATE jobs SET finished_at = now() - interval '2 hours' WHERE id = $1`, first.ID); err != nil {
		t.Fatal(err)
	}
	hour := int64(time.Hour / time.Millisecond)
	if n, err := b.q.JobPrune(b.ctx, db.JobPruneParams{RetainSucceededMs: &hour, MaxJobs: worker.DefaultPruneBatch}); err != nil || n.Succeeded != 1 {
		t.Fatalf("prune: %+v, %v; want the job deleted", n, err)
	}
	again, replayed, err := client.Insert(b.ctx, b.pool, job)
	if err != nil || replayed || again.ID == first.ID || again.State != db.JobStateAvailable {
		t.Errorf("enqueue again once the job was deleted: job %d %s, replayed %t, %v; want a new job, available, not replayed",
			again.ID, again.State, replayed, err)
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
		interval = 8 * time.Second
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

// TestPrune_UnderAPinnedHorizonReadsOnlyTheJobsFinishedSinceItsLastPrune
// prunes a history of succeeded jobs while a REPEATABLE READ snapshot
// taken before is held open, as a report or a session idle in a
// transaction would: the index entries of the jobs deleted can then be
// neither removed nor marked dead, and a prune that reads the finished
// jobs from the oldest steps over every one of them. A worker then prunes
// for two seconds, every 100 ms, with nothing left to delete: after its
// first prune, which reads them all, each reads only the jobs that
// finished since the last prune that found the rest gone, and the worker
// reads in all a few times what one prune of the whole history does, not
// twenty times.
func TestPrune_UnderAPinnedHorizonReadsOnlyTheJobsFinishedSinceItsLastPrune(t *testing.T) {
	b := setup(t)
	retain := int64(time.Hour / time.Millisecond)
	params := db.JobPruneParams{RetainSucceededMs: &retain, MaxJobs: worker.DefaultPruneBatch}
	// read returns the blocks of jobs_finished_idx read so far, by the
	// sessions that ended: a session reports them as it ends.
	read := func() int64 {
		t.Helper()
		time.Sleep(500 * time.Millisecond)
		return b.count(t, `SELECT idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes WHERE indexrelname = 'jobs_finished_idx'`)
	}
	// inSessions runs f on a pool of its own, closed once f returns.
	inSessions := func(f func(pool *pgxpool.Pool)) {
		pool := dbtest.Connect(t, b.url)
		f(pool)
		pool.Close()
	}
	inSessions(func(pool *pgxpool.Pool) {
		if _, err := pool.Exec(b.ctx, `
			INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
			SELECT 'done', 'succeeded', 1, 1, now() - interval '3 hours', now() - interval '3 hours' + i * interval '1 millisecond'
			FROM generate_series(1, 50000) AS i`); err != nil {
			t.Fatal(err)
		}
		if pinSnapshot(t, b) != 50000 {
			t.Fatal("the snapshot does not see the history")
		}
		for {
			n, err := db.New(pool).JobPrune(b.ctx, params)
			if err != nil {
				t.Fatal(err)
			}
			if n.Succeeded == 0 {
				break
			}
		}
	})
	before := read()
	inSessions(func(pool *pgxpool.Pool) {
		if _, err := db.New(pool).JobPrune(b.ctx, params); err != nil {
			t.Fatal(err)
		}
	})
	one := read() - before
	if one < 100 {
		t.Fatalf("one prune of the history read %d blocks of jobs_finished_idx: the snapshot did not pin its entries", one)
	}
	before += one
	inSessions(func(pool *pgxpool.Pool) {
		_, run := b.runWorker(t, pool, worker.Config{RetainSucceeded: time.Hour, PruneInterval: 100 * time.Millisecond}, func(*worker.Worker) {})
		time.Sleep(2 * time.Second)
		if err := run.stop(); err != nil {
			t.Fatal(err)
		}
	})
	worker := read() - before
	t.Logf("blocks of jobs_finished_idx read: %d by one prune of the history, %d by a worker pruning for 2s", one, worker)
	if worker > 3*one {
		t.Errorf("a worker that found nothing to prune for 2s read %d blocks of jobs_finished_idx, want at most 3 times the %d one prune of the history reads", worker, one)
	}
}

// TestPrune_DeletesTheJobsWhoseRetentionPassesWhileItRuns runs a worker
// that keeps succeeded jobs for half a second and prunes every 100 ms, and
// finishes jobs one after another meanwhile, most prunes finding nothing
// to delete: each job is deleted within a second of its retention having
// passed, though the worker's prunes, once one found nothing older, read
// only the jobs whose retention passed since, and read them all only
// every few seconds.
func TestPrune_DeletesTheJobsWhoseRetentionPassesWhileItRuns(t *testing.T) {
	b := setup(t)
	const retain = 500 * time.Millisecond
	b.startWorker(t, worker.Config{RetainSucceeded: retain, PruneInterval: 100 * time.Millisecond}, func(*worker.Worker) {})
	for i := range 10 {
		time.Sleep(150 * time.Millisecond)
		// Read before the job finishes, by the database clock on this
		// host: its deletion comes at least retain after.
		finished := time.Now()
		var id int64
		if err := b.pool.QueryRow(b.ctx, `
			INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
			VALUES ('done', 'succeeded', 1, 1, now(), now())
			RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		for {
			_, err := b.q.JobGet(b.ctx, id)
			if errors.Is(err, pgx.ErrNoRows) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if time.Since(finished) > retain+time.Second {
				t.Fatalf("job %d of 10 still kept %s after it finished, with a retention of %s", i+1, time.Since(finished).Round(time.Millisecond), retain)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if kept := time.Since(finished); kept < retain {
			t.Fatalf("job %d of 10 deleted %s after it finished, before its retention of %s passed", i+1, kept.Round(time.Millisecond), retain)
		}
	}
}

// TestPrune_DeletesAJobWhoseRetentionPassedWhileAPruneWasOnItsWay runs a
// worker that keeps succeeded jobs for an hour and prunes every 2 s, whose
// statements, just after a prune that found every older job gone, take
// 2.5 s to reach the database, as they do while its pool has no free
// connection or the network is slow. A job whose retention passes 200 ms
// after that prune is deleted by the next, rather than left to a prune
// that reads every finished job from the oldest, 30 rounds later: the
// window of the next prune reaches back to when the last one ran on the
// database, however long its own statement took to get there.
func TestPrune_DeletesAJobWhoseRetentionPassedWhileAPruneWasOnItsWay(t *testing.T) {
	b := setup(t)
	const interval = 2 * time.Second
	proxy, through := b.proxied(t)
	pool := dbtest.Connect(t, through)
	insert := func(finished string) int64 {
		t.Helper()
		var id int64
		if err := b.pool.QueryRow(b.ctx, `
			INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
			VALUES ('done', 'succeeded', 1, 1, now() - interval '2 hours', now() + $1::interval)
			RETURNING id`, finished).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	gone := func(id int64, within time.Duration) bool {
		t.Helper()
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			_, err := b.q.JobGet(b.ctx, id)
			if errors.Is(err, pgx.ErrNoRows) {
				return true
			}
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}
	marker := insert("-1 hour -1 second")
	_, run := b.runWorker(t, pool, worker.Config{RetainSucceeded: time.Hour, PruneInterval: interval}, func(*worker.Worker) {})
	defer run.stop() //nolint:errcheck // the test's outcome is the job's
	if !gone(marker, 3*interval) {
		t.Fatalf("the first prune did not delete a job past its retention within %s", 3*interval)
	}
	job := insert("-1 hour 200 milliseconds")
	proxy.Slow(2500 * time.Millisecond)
	time.Sleep(3 * time.Second)
	proxy.Slow(0)
	if !gone(job, 3*interval) {
		t.Fatalf("a job whose retention passed 200 ms after a prune is still kept %s later, after two more rounds",
			3*time.Second+3*interval)
	}
}

// TestPrune_KeepsADeadJobRetriedWhileItRuns retries a dead job long past
// its retention in a transaction still open while a prune runs: the prune
// skips the row the retry holds, and once the retry has committed the job
// is available and no prune deletes it. The other way round, a retry
// that comes while a prune holds the job waits for it, and finds no job
// once the prune has committed.
func TestPrune_KeepsADeadJobRetriedWhileItRuns(t *testing.T) {
	b := setup(t)
	hour := int64(time.Hour / time.Millisecond)
	params := db.JobPruneParams{RetainDeadMs: &hour, MaxJobs: worker.DefaultPruneBatch}
	dead := func() int64 {
		t.Helper()
		var id int64
		if err := b.pool.QueryRow(b.ctx, `
			INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
			VALUES ('done', 'dead', 1, 1, now() - interval '3 hours', now() - interval '3 hours')
			RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}

	retried := dead()
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // committed below
	if row, err := db.New(tx).JobRetry(b.ctx, retried); err != nil || !row.Applied {
		t.Fatalf("retry job %d: applied %t, %v", retried, row.Applied, err)
	}
	if n, err := b.q.JobPrune(b.ctx, params); err != nil || n.Dead != 0 {
		t.Fatalf("prune while the retry holds the job: %+v, %v; want none deleted", n, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := b.q.JobPrune(b.ctx, params); err != nil || n.Dead != 0 {
		t.Fatalf("prune after the retry: %+v, %v; want none deleted", n, err)
	}
	if job, err := b.q.JobGet(b.ctx, retried); err != nil || job.State != db.JobStateAvailable {
		t.Fatalf("job %d retried during a prune: %v, %v; want it kept, available", retried, job.State, err)
	}

	pruned := dead()
	tx, err = b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx) //nolint:errcheck // committed below
	if n, err := db.New(tx).JobPrune(b.ctx, params); err != nil || n.Dead != 1 {
		t.Fatalf("prune: %+v, %v; want the dead job deleted", n, err)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := b.q.JobRetry(b.ctx, pruned)
		answered <- err
	}()
	select {
	case err := <-answered:
		t.Fatalf("a retry of job %d answered while a prune held it: %v", pruned, err)
	case <-time.After(200 * time.Millisecond):
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-answered; !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("a retry of job %d, which a prune deleted meanwhile: %v; want no job", pruned, err)
	}
}

// TestMaintenance_AStatementThatRunsOutOfTimeSaysSo holds a lock on the
// jobs table that lets no row be changed, as a migration or a VACUUM FULL
// holds one, while a worker prunes and reclaims: each of its prunes and
// reclaims waits until the lease it is given runs out, and the worker
// logs that it failed, and why, as it logs any other failure. Only one
// cut short by the worker's own stop goes unsaid.
func TestMaintenance_AStatementThatRunsOutOfTimeSaysSo(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  worker.Config
		want string
	}{
		{"a prune", worker.Config{PruneInterval: 50 * time.Millisecond}, "prune finished jobs failed"},
		{"a reclaim", worker.Config{ReclaimInterval: 50 * time.Millisecond}, "reclaim failed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			tx, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(b.ctx) //nolint:errcheck // the lock is all it holds
			if _, err := tx.Exec(b.ctx, `LOCK TABLE jobs IN SHARE MODE`); err != nil {
				t.Fatal(err)
			}
			var logs syncBuffer
			tc.cfg.Lease = 200 * time.Millisecond
			tc.cfg.Logger = logs.logger()
			b.startWorker(t, tc.cfg, func(*worker.Worker) {})
			logs.waitForLog(t, 5*time.Second, tc.want, "context deadline exceeded")
		})
	}
}

// TestPrune_WarnsAtStartWhenAutovacuumWillNotVacuumTheJobsTable: a worker
// says so, and why, when autovacuum is off for the jobs table, when the
// server keeps no counts of the table's changes (track_counts), without
// which autovacuum never learns that it needs a vacuum, and when the
// server runs no autovacuum at all.
func TestPrune_WarnsAtStartWhenAutovacuumWillNotVacuumTheJobsTable(t *testing.T) {
	for _, tc := range []struct {
		name string
		sql  string
		want string
	}{
		{"off for the table", `ALTER TABLE jobs SET (autovacuum_enabled = false)`,
			"autovacuum is off for the jobs table (its storage parameter autovacuum_enabled)"},
		{"the server keeps no counts", `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET track_counts = off', current_database()); END $$`,
			"track_counts is off, so autovacuum never learns that the jobs table needs it"},
		{"off on the server", ``, "autovacuum is off on the database server"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if tc.sql == "" {
				var on bool
				if err := b.pool.QueryRow(b.ctx, `SELECT current_setting('autovacuum')::boolean`).Scan(&on); err != nil {
					t.Fatal(err)
				}
				if on {
					t.Skip("skipped: the test server runs autovacuum, which a test cannot turn off")
				}
			} else if _, err := b.pool.Exec(b.ctx, tc.sql); err != nil {
				t.Fatal(err)
			}
			// Connections opened from now on take the database's settings.
			b.pool.Reset()
			var logs syncBuffer
			b.startWorker(t, worker.Config{Logger: logs.logger()}, func(*worker.Worker) {})
			logs.waitForLog(t, 5*time.Second, "level=WARN msg=\""+tc.want+": the space of finished jobs the workers prune")
		})
	}
}
