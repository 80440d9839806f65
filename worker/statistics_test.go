package worker_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/devdb"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/worker"
)

// These tests specify how the workers keep the planner's statistics of the
// jobs table current where autovacuum does not. The tests of a server
// without autovacuum turn it off for their own database's jobs table, so
// that they hold on a server that runs autovacuum as on one that does not.

func TestStatisticsDue_WhenManyRowsChangedSinceTheLastAnalyzeAndToOneWorkerAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	offForJobs(t, b)
	due := func(t *testing.T, q *db.Queries) bool {
		t.Helper()
		got := dueIn(t, b, q)
		if got.Due && got.Reason != "autovacuum is off" {
			t.Errorf("due for the reason %q, want %q", got.Reason, "autovacuum is off")
		}
		return got.Due
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

// TestStatisticsDue_NeverToARoleThatDoesNotOwnTheTable asks as a role
// that may read the jobs table but does not own it, and is not a member
// of its owner's role: ANALYZE would skip the table with a warning, so
// the statistics are never due to it, though they are to the owner.
func TestStatisticsDue_NeverToARoleThatDoesNotOwnTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	offForJobs(t, b)
	execReported(t, b, `INSERT INTO jobs (kind) SELECT 'noop' FROM generate_series(1, 1000)`)
	var role string
	if err := b.pool.QueryRow(b.ctx, `SELECT 'relay_test_reader_' || substr(md5(random()::text), 1, 12)`).Scan(&role); err != nil {
		t.Fatal(err)
	}
	ident := pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{`CREATE ROLE ` + ident, `GRANT SELECT ON jobs TO ` + ident} {
		if _, err := b.pool.Exec(b.ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, stmt := range []string{`REVOKE ALL ON jobs FROM ` + ident, `DROP ROLE ` + ident} {
			if _, err := b.pool.Exec(context.Background(), stmt); err != nil {
				t.Errorf("%s: %v", stmt, err)
			}
		}
	})
	if got := dueAsked(t, b, role); got.Due || got.Reason != "" {
		t.Errorf("asked as a reader of the table: %+v, want not due and no reason", got)
	}
	if got := dueAsked(t, b, ""); !got.Due || got.Reason != "autovacuum is off" {
		t.Errorf("asked as the table's owner: %+v, want due because autovacuum is off", got)
	}
}

// heartbeatLookupBuffers bounds the buffers a heartbeat of the tests' two
// jobs reads when it looks them up by id: twice each (a job it does not
// renew is looked up again), two index pages and a heap page a lookup,
// with room for one more level. A scan of the tests' 20,000 jobs reads
// hundreds.
const heartbeatLookupBuffers = 2 * 2 * 4

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
		_, err := q.JobHeartbeatMany(b.ctx, db.JobHeartbeatManyParams{LeaseMs: 30_000, IDs: []int64{1, 2}, Tokens: leaseTokens(2)})
		return err
	})
	addFinishedJobs(t, b, 20_000)
	if scanned, buffers, _ := heartbeat.explain(t, b); !scanned {
		t.Fatalf("the plan made over the empty table does not scan the jobs table (%d buffers): the test no longer shows the cached plan it is about", buffers)
	}

	_, stop := b.startWorker(t, worker.Config{PruneInterval: 20 * time.Millisecond}, func(*worker.Worker) {})
	defer stop()
	waitAnalyzed(t, b, "")
	if scanned, buffers, plan := heartbeat.explain(t, b); scanned || buffers > heartbeatLookupBuffers {
		t.Errorf("after the worker analyzed jobs, the heartbeat read %d buffers (scans the table: %v):\n%s", buffers, scanned, plan)
	}
}

// TestStatistics_GatheredByAWorkerOnceTheTableOutgrewThemWhereAutovacuumRuns
// runs on a private cluster with autovacuum on, as production servers
// run. Autovacuum gathers statistics only at its next round of the
// database, and this test keeps it from analyzing jobs at all, as if that
// round were far off. The statistics are due once more rows changed since
// the last ANALYZE than the table then held, and not before; a worker
// then gathers them, and the heartbeat's plan kept from the empty table
// is made anew.
func TestStatistics_GatheredByAWorkerOnceTheTableOutgrewThemWhereAutovacuumRuns(t *testing.T) {
	t.Parallel()
	b := setupPrivate(t)
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE jobs SET (autovacuum_analyze_threshold = 2000000000)`); err != nil {
		t.Fatal(err)
	}
	due := func(t *testing.T) bool {
		t.Helper()
		got := dueAsked(t, b, "")
		if got.Due && got.Reason != "the table outgrew them" {
			t.Errorf("due for the reason %q, want %q", got.Reason, "the table outgrew them")
		}
		return got.Due
	}

	heartbeat := keepPlan(t, b, "heartbeat", func(q *db.Queries) error {
		_, err := q.JobHeartbeatMany(b.ctx, db.JobHeartbeatManyParams{LeaseMs: 30_000, IDs: []int64{1, 2}, Tokens: leaseTokens(2)})
		return err
	})
	addFinishedJobs(t, b, 40)
	if due(t) {
		t.Errorf("due after 40 rows inserted, below autovacuum_analyze_threshold (50)")
	}
	addFinishedJobs(t, b, 20_000)
	if scanned, buffers, _ := heartbeat.explain(t, b); !scanned {
		t.Fatalf("the plan made over the empty table does not scan the jobs table (%d buffers): the test no longer shows the cached plan it is about", buffers)
	}
	if !due(t) {
		t.Fatalf("not due after 20,040 rows inserted into a table never analyzed")
	}

	_, stop := b.startWorker(t, worker.Config{PruneInterval: 20 * time.Millisecond}, func(*worker.Worker) {})
	waitAnalyzed(t, b, "")
	if scanned, buffers, plan := heartbeat.explain(t, b); scanned || buffers > heartbeatLookupBuffers {
		t.Errorf("after the worker analyzed jobs, the heartbeat read %d buffers (scans the table: %v):\n%s", buffers, scanned, plan)
	}

	// Half as many rows again as the table held: not due, autovacuum's
	// own rule would have applied long before, and no worker analyzes.
	addFinishedJobs(t, b, 10_000)
	if due(t) {
		t.Errorf("due after 10,000 rows inserted into a table of 20,040 analyzed")
	}
	time.Sleep(200 * time.Millisecond)
	stop()
	if got := analyzeCount(t, b); got != 1 {
		t.Errorf("jobs analyzed %d times, want once", got)
	}
}

// TestStatistics_AWorkerNeverWaitsForTheTableWhileAutovacuumWorksOnIt
// holds, in a transaction of the test's, the lock that autovacuum holds
// while it vacuums or analyzes the jobs table. An ANALYZE that waited for
// it would, after deadlock_timeout, cancel autovacuum's work. While the
// lock is held, no worker waits for a lock on the table; once it is
// released, a worker analyzes.
func TestStatistics_AWorkerNeverWaitsForTheTableWhileAutovacuumWorksOnIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	offForJobs(t, b)
	execReported(t, b, `INSERT INTO jobs (kind) SELECT 'noop' FROM generate_series(1, 1000)`)
	holder, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(b.ctx)
	if _, err := holder.Exec(b.ctx, `LOCK TABLE jobs IN SHARE UPDATE EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}

	b.startWorker(t, worker.Config{PruneInterval: 20 * time.Millisecond}, func(*worker.Worker) {})
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		// The test databases are copies of one template, so the jobs table
		// of every other test's database has the same oid: the locks are
		// this database's only.
		if n := b.count(t, `SELECT count(*) FROM pg_locks
			WHERE relation = 'jobs'::regclass AND NOT granted
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`); n > 0 {
			t.Fatalf("%d sessions wait for a lock on jobs while its vacuum lock is held", n)
		}
	}
	if got := analyzeCount(t, b); got != 0 {
		t.Fatalf("jobs analyzed %d times while its vacuum lock was held", got)
	}
	if err := holder.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitAnalyzed(t, b, " of the lock's release")
}

// dueIn asks JobStatisticsDue through q.
func dueIn(t *testing.T, b *bundle, q *db.Queries) db.JobStatisticsDueRow {
	t.Helper()
	got, err := q.JobStatisticsDue(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// dueAsked asks JobStatisticsDue in a transaction of its own, which it
// rolls back, as role if one is given (SET LOCAL ROLE).
func dueAsked(t *testing.T, b *bundle, role string) db.JobStatisticsDueRow {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if role != "" {
		if _, err := tx.Exec(b.ctx, `SET LOCAL ROLE `+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Fatal(err)
		}
	}
	return dueIn(t, b, db.New(tx))
}

// analyzeCount is how many times jobs was analyzed other than by
// autovacuum: by the workers, here.
func analyzeCount(t *testing.T, b *bundle) int64 {
	t.Helper()
	return b.count(t, `SELECT analyze_count FROM pg_stat_all_tables WHERE relid = 'jobs'::regclass`)
}

// waitAnalyzed waits up to 20 s, from now, until a worker has analyzed
// jobs; since says from what, in the failure.
func waitAnalyzed(t *testing.T, b *bundle, since string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for analyzeCount(t, b) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no worker analyzed jobs within 20s%s", since)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// setupPrivate is setup on a private cluster of PostgreSQL's defaults,
// autovacuum on, that this test alone uses and that is removed when it
// ends.
func setupPrivate(t *testing.T) *bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err := devdb.StartLocal(ctx, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("start a private cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := cluster.Stop(context.Background()); err != nil {
			t.Errorf("stop the private cluster: %v", err)
		}
	})
	pool := dbtest.Connect(t, cluster.URL())
	if _, err := migrations.Up(ctx, pool); err != nil {
		t.Fatalf("migrate: %v", err)
	}
	return &bundle{ctx: context.Background(), url: cluster.URL(), pool: pool, q: db.New(pool)}
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
