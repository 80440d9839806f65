package migrations_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/migrations"
)

// TestMigrations_MigratorsOfOneDatabaseAtOnceApplyEachMigrationOnce runs
// three migrators, each with a pool of its own as three processes would,
// against one empty database at once. Every one succeeds, and each
// migration is applied by exactly one of them.
func TestMigrations_MigratorsOfOneDatabaseAtOnceApplyEachMigrationOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := dbtest.NewURL(t)
	m, err := migrations.NewMigrator(dbtest.Connect(t, url))
	if err != nil {
		t.Fatal(err)
	}
	all, err := m.DownTo(ctx, 0)
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	const migrators = 3
	applied := make([][]int64, migrators)
	errs := make([]error, migrators)
	var wg sync.WaitGroup
	for i := range migrators {
		pool := dbtest.Connect(t, url)
		wg.Go(func() { applied[i], errs[i] = migrations.Up(ctx, pool) })
	}
	wg.Wait()
	times := map[int64]int{}
	for i := range migrators {
		if errs[i] != nil {
			t.Errorf("migrator %d: %v", i, errs[i])
		}
		for _, v := range applied[i] {
			times[v]++
		}
	}
	want := map[int64]int{}
	for _, v := range all {
		want[v] = 1
	}
	if diff := cmp.Diff(want, times); diff != "" {
		t.Errorf("times each migration was applied (-want +got):\n%s", diff)
	}
}

// TestMigrations_AMigratorKeepsItsLockWhileAMigrationHoldsItsPoolsOnlyConnection
// has a migrator on a pool of one connection, as a URL with
// pool_max_conns=1 makes it, run a migration that waits: CREATE INDEX
// CONCURRENTLY, behind a transaction whose snapshot is older. The
// migration holds that connection throughout, and the lock's lease is
// renewed all the same, at its heartbeat: had it run out, another
// migrator would take the lock and run the same migration beside this
// one.
func TestMigrations_AMigratorKeepsItsLockWhileAMigrationHoldsItsPoolsOnlyConnection(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	dsn := dbtest.NewURL(t)
	pool := dbtest.Connect(t, dsn)
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		t.Fatal(err)
	}
	_, err = m.DownTo(ctx, 9)
	m.Close()
	if err != nil {
		t.Fatal(err)
	}
	// Migration 10 builds its index concurrently, which waits for this
	// transaction to end.
	older, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(context.Background()) //nolint:errcheck // rolled back below
	if _, err := older.Exec(ctx, `SELECT count(*) FROM jobs`); err != nil {
		t.Fatal(err)
	}

	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("pool_max_conns", "1")
	u.RawQuery = q.Encode()
	lone, err := migrations.NewMigrator(dbtest.Connect(t, u.String()))
	if err != nil {
		t.Fatal(err)
	}
	defer lone.Close()
	type result struct {
		applied []int64
		err     error
	}
	done := make(chan result, 1)
	go func() {
		applied, err := lone.UpTo(ctx, 10)
		done <- result{applied, err}
	}()

	lease := func() time.Time {
		t.Helper()
		var at time.Time
		if err := pool.QueryRow(ctx, `SELECT lease_expires_at FROM goose_lock WHERE locked`).Scan(&at); err != nil {
			t.Fatalf("read the migration lock: %v", err)
		}
		return at
	}
	for waiting := false; !waiting; {
		select {
		case r := <-done:
			t.Fatalf("migration 10 ended (%v, %v) while a transaction it waits for is open", r.applied, r.err)
		case <-time.After(50 * time.Millisecond):
		}
		if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE datname = current_database() AND state = 'active' AND query LIKE 'CREATE INDEX CONCURRENTLY%')`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
	}
	before := lease()
	// goose's heartbeat renews the lease every 5 s; 2 s more for a busy server.
	time.Sleep(7 * time.Second)
	if after := lease(); !after.After(before) {
		t.Errorf("the lock's lease, to run out at %s, was not renewed in 7 s while the migration held the pool's only connection: "+
			"another migrator could take the lock once it ran out", before.Format(time.RFC3339Nano))
	}

	if err := older.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil || !slices.Equal(r.applied, []int64{10}) {
		t.Errorf("up to 10 = %v, %v; want [10]", r.applied, r.err)
	}
}

// TestMigrations_CarryAPopulatedDatabaseUpAndDown applies each migration to a
// database that already holds jobs and workers, checks what it made of
// them, and rolls it back again.
func TestMigrations_CarryAPopulatedDatabaseUpAndDown(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := dbtest.New(t)
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.DownTo(ctx, 2); err != nil {
		t.Fatalf("down to 2: %v", err)
	}
	exec(t, pool, `
		INSERT INTO workers (id, session_key, queue, pid, host) VALUES ('w1', 7, 'default', 11, 'h');
		INSERT INTO jobs (kind) VALUES ('waiting');
		INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, started_at)
		VALUES ('busy', 'running', 1, 1, gen_random_uuid(), now() + interval '1 minute', 'w1', now());`)

	if _, err := m.UpTo(ctx, 3); err != nil {
		t.Fatalf("up to 3: %v", err)
	}
	if diff := cmp.Diff("7 w1 default 11 h", one(t, pool, `
		SELECT concat_ws(' ', session_key, worker_id, queue, pid, host) FROM worker_sessions`)); diff != "" {
		t.Errorf("sessions after 00003 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff("busy 7,waiting -", one(t, pool, `
		SELECT string_agg(kind || ' ' || coalesce(lease_session::text, '-'), ',' ORDER BY kind) FROM jobs`)); diff != "" {
		t.Errorf("jobs' sessions after 00003 (-want +got):\n%s", diff)
	}

	if _, err := m.DownTo(ctx, 2); err != nil {
		t.Fatalf("down to 2: %v", err)
	}
	if diff := cmp.Diff("busy running w1,waiting available -", one(t, pool, `
		SELECT string_agg(concat_ws(' ', kind, state, coalesce(leased_by, '-')), ',' ORDER BY kind) FROM jobs`)); diff != "" {
		t.Errorf("jobs after rolling 00003 back (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff("w1 7", one(t, pool, `SELECT concat_ws(' ', id, session_key) FROM workers`)); diff != "" {
		t.Errorf("workers after rolling 00003 back (-want +got):\n%s", diff)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestMigrations_CapExistingErrorHistoriesAndCountThem carries jobs with
// error histories of several lengths over 00004 and back: up counts every
// entry and keeps the newest 20, in order; down keeps what up kept.
func TestMigrations_CapExistingErrorHistoriesAndCountThem(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := dbtest.New(t)
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.DownTo(ctx, 3); err != nil {
		t.Fatalf("down to 3: %v", err)
	}
	// Jobs named after the length of their history, entries numbered 1 to n.
	exec(t, pool, `
		INSERT INTO jobs (kind, errors)
		SELECT 'errors' || n, (SELECT COALESCE(jsonb_agg(jsonb_build_object('attempt', i, 'error', 'e' || i) ORDER BY i), '[]')
		                       FROM generate_series(1, n) AS i)
		FROM unnest(ARRAY[0, 1, 20, 21, 45]) AS n`)
	// Each job as kind, then the errors of its history in order.
	const histories = `
		SELECT string_agg(concat_ws(' ', kind, (SELECT string_agg(e ->> 'error', ' ' ORDER BY n)
		                                       FROM jsonb_array_elements(errors) WITH ORDINALITY AS x (e, n))), ', ' ORDER BY id)
		FROM jobs`
	kept := "errors0, errors1 e1, errors20 " + entries(1, 20) + ", errors21 " + entries(2, 21) + ", errors45 " + entries(26, 45)

	if _, err := m.UpTo(ctx, 4); err != nil {
		t.Fatalf("up to 4: %v", err)
	}
	if diff := cmp.Diff(kept, one(t, pool, histories)); diff != "" {
		t.Errorf("histories after 00004 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff("0 1 20 21 45", one(t, pool, `SELECT string_agg(error_count::text, ' ' ORDER BY id) FROM jobs`)); diff != "" {
		t.Errorf("error counts after 00004 (-want +got):\n%s", diff)
	}

	if _, err := m.DownTo(ctx, 3); err != nil {
		t.Fatalf("down to 3: %v", err)
	}
	if diff := cmp.Diff(kept, one(t, pool, histories)); diff != "" {
		t.Errorf("histories after rolling 00004 back (-want +got):\n%s", diff)
	}
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// entries is "e<from> ... e<to>".
func entries(from, to int) string {
	var s []string
	for i := from; i <= to; i++ {
		s = append(s, fmt.Sprintf("e%d", i))
	}
	return strings.Join(s, " ")
}

func exec(t *testing.T, pool *pgxpool.Pool, sql string) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatal(err)
	}
}

func one(t *testing.T, pool *pgxpool.Pool, sql string) string {
	t.Helper()
	var s string
	if err := pool.QueryRow(context.Background(), sql).Scan(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// carriedOver is what a query answers below a span of migrations, above
// it, and below it again once rolled back.
type carriedOver struct {
	what          string
	query         string
	before, after string
}

// carryOver migrates a fresh database down to version from, fills it
// with fixture, and carries it up to version to and back down. Each
// query of checks must answer its before below the span and its after
// above it, and the jobs, as jobs reads them, must stay the same
// throughout. It migrates up again at the end.
func carryOver(t *testing.T, from, to int64, fixture, jobs string, checks ...carriedOver) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := dbtest.New(t)
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.DownTo(ctx, from); err != nil {
		t.Fatalf("down to %d: %v", from, err)
	}
	exec(t, pool, fixture)
	before := one(t, pool, jobs)
	look := func(when string, below bool) {
		t.Helper()
		for _, c := range checks {
			want := c.after
			if below {
				want = c.before
			}
			if diff := cmp.Diff(want, one(t, pool, c.query)); diff != "" {
				t.Errorf("%s %s (-want +got):\n%s", c.what, when, diff)
			}
		}
		if diff := cmp.Diff(before, one(t, pool, jobs)); diff != "" {
			t.Errorf("jobs %s (-want +got):\n%s", when, diff)
		}
	}
	look(fmt.Sprintf("at %d", from), true)
	if _, err := m.UpTo(ctx, to); err != nil {
		t.Fatalf("up to %d: %v", to, err)
	}
	look(fmt.Sprintf("after migrating up to %d", to), false)
	if _, err := m.DownTo(ctx, from); err != nil {
		t.Fatalf("down to %d: %v", from, err)
	}
	look(fmt.Sprintf("after rolling back to %d", from), true)
	if _, err := m.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
}

// TestMigrations_IndexFinishedJobsOverAPopulatedDatabase carries a history
// of jobs in every state over 00007 and back: up builds the index that
// pruning reads, over the finished jobs alone; down drops it; the jobs are
// the same throughout.
func TestMigrations_IndexFinishedJobsOverAPopulatedDatabase(t *testing.T) {
	carryOver(t, 6, 7, `
		INSERT INTO jobs (kind) SELECT 'waiting' FROM generate_series(1, 100);
		INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
		SELECT 'done', (ARRAY['succeeded', 'dead', 'cancelled'])[1 + i % 3]::job_state, 1, 1,
		       now() - i * interval '1 minute', now() - i * interval '1 minute'
		FROM generate_series(1, 3000) AS i;`,
		`SELECT md5(string_agg(concat_ws(' ', id, kind, state, finished_at), ',' ORDER BY id)) FROM jobs`,
		carriedOver{what: "jobs_finished_idx, valid and entries", query: `
			SELECT coalesce((SELECT concat_ws(' ', i.indisvalid, c.reltuples)
			                 FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
			                 WHERE c.relname = 'jobs_finished_idx'), 'none')`,
			before: "none", after: "t 3000"})
}

// TestMigrations_IndexLeasesByTheirColumnsOverAPopulatedDatabase carries
// running jobs, with and without a session, and a history over 00008 and
// 00009 and back: up replaces the reclaim's two indexes, partial over
// running jobs, by indexes over the jobs that hold a lease or a session,
// with an entry for each running job alone, and adds the trigger that
// announces returned jobs; down restores the indexes and drops the
// trigger; the jobs are the same throughout.
func TestMigrations_IndexLeasesByTheirColumnsOverAPopulatedDatabase(t *testing.T) {
	carryOver(t, 7, 9, `
		INSERT INTO worker_sessions (session_key, worker_id, queue, pid, host) VALUES (7, 'w1', 'default', 11, 'h');
		INSERT INTO jobs (kind) SELECT 'waiting' FROM generate_series(1, 100);
		INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, lease_session, started_at)
		SELECT 'busy', 'running', 1, 1, gen_random_uuid(), now() + interval '1 minute', 'w1',
		       CASE WHEN i % 2 = 0 THEN 7 END, now()
		FROM generate_series(1, 40) AS i;
		INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
		SELECT 'done', 'succeeded', 1, 1, now(), now() FROM generate_series(1, 1000);
		ANALYZE jobs;`,
		`SELECT md5(string_agg(concat_ws(' ', id, kind, state, lease_token, lease_session), ',' ORDER BY id)) FROM jobs`,
		carriedOver{what: "the reclaim's indexes, valid and entries", query: `
			SELECT coalesce(string_agg(concat_ws(' ', c.relname, i.indisvalid, c.reltuples), ',' ORDER BY c.relname), 'none')
			FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
			WHERE c.relname LIKE 'jobs_lease%'`,
			before: "jobs_lease_expiry_idx t 40,jobs_lease_session_idx t 40",
			after:  "jobs_lease_expires_at_idx t 40,jobs_lease_session_key_idx t 20"},
		carriedOver{what: "jobs_notify_returned triggers",
			query:  `SELECT count(*)::text FROM pg_trigger WHERE tgname = 'jobs_notify_returned'`,
			before: "0", after: "1"})
}

// TestMigrations_IndexReadyJobsByTheirColumnsOverAPopulatedDatabase
// carries available, running and finished jobs over 00010 and back: up
// replaces the claim index, partial over available jobs, by one over the
// jobs with neither a lease nor a finish, under the same name and with
// an entry for each available job alone; down restores the old predicate;
// the jobs are the same throughout.
func TestMigrations_IndexReadyJobsByTheirColumnsOverAPopulatedDatabase(t *testing.T) {
	carryOver(t, 9, 10, `
		INSERT INTO jobs (kind) SELECT 'waiting' FROM generate_series(1, 100);
		INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, started_at)
		SELECT 'busy', 'running', 1, 1, gen_random_uuid(), now() + interval '1 minute', 'w1', now()
		FROM generate_series(1, 40);
		INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
		SELECT 'done', 'succeeded', 1, 1, now(), now() FROM generate_series(1, 1000);
		ANALYZE jobs;`,
		jobsDigest,
		carriedOver{what: "the claim index, valid, entries and predicate", query: `
			SELECT coalesce(string_agg(concat_ws(' ', c.relname, i.indisvalid, c.reltuples, pg_get_expr(i.indpred, i.indrelid)), ','), 'none')
			FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
			WHERE c.relname IN ('jobs_claim_idx', 'jobs_ready_idx', 'jobs_available_idx')`,
			before: "jobs_claim_idx t 100 (state = 'available'::job_state)",
			after:  "jobs_claim_idx t 100 ((lease_token IS NULL) AND (finished_at IS NULL))"})
}

// TestMigrations_IndexListingsApartForBacklogAndHistoryOverAPopulatedDatabase
// carries available, running and finished jobs over 00011 and back: up
// replaces the listing's four indexes over every job by four over the
// finished jobs alone and one over the others, by state and id; down
// restores the four; the jobs are the same throughout.
func TestMigrations_IndexListingsApartForBacklogAndHistoryOverAPopulatedDatabase(t *testing.T) {
	carryOver(t, 10, 11, backlogAndHistory,
		jobsDigest,
		carriedOver{what: "the listing's indexes, valid, entries and predicate", query: `
			SELECT string_agg(concat_ws(' ', c.relname, i.indisvalid, c.reltuples, pg_get_expr(i.indpred, i.indrelid)), ',' ORDER BY c.relname)
			FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
			WHERE c.relname ~ '^jobs_.*state_idx$'`,
			before: "jobs_kind_state_idx t 1140,jobs_queue_kind_state_idx t 1140,jobs_queue_state_idx t 1140,jobs_state_idx t 1140",
			after:  "jobs_active_state_idx t 140 (finished_at IS NULL)," + fourHistoryIndexes})
}

// TestMigrations_ListHistoryQueueByQueueOverAPopulatedDatabase carries
// available, running and finished jobs over 00012 and back: up drops the
// history's indexes by state and by kind, and keeps those by queue; down
// builds the two again over the finished jobs; the jobs are the same
// throughout.
func TestMigrations_ListHistoryQueueByQueueOverAPopulatedDatabase(t *testing.T) {
	carryOver(t, 11, 12, backlogAndHistory,
		jobsDigest,
		carriedOver{what: "the history's indexes, valid, entries and predicate", query: historyIndexes,
			before: fourHistoryIndexes, after: twoHistoryIndexes})
}

// TestMigrations_IndexHistoryByStateAndKindAgainOverAPopulatedDatabase
// carries available, running and finished jobs over 00013 and back: up
// builds the history's indexes by state and by kind again, over the
// finished jobs alone; down drops them; the jobs are the same throughout.
func TestMigrations_IndexHistoryByStateAndKindAgainOverAPopulatedDatabase(t *testing.T) {
	carryOver(t, 12, 13, backlogAndHistory,
		jobsDigest,
		carriedOver{what: "the history's indexes, valid, entries and predicate", query: historyIndexes,
			before: twoHistoryIndexes, after: fourHistoryIndexes})
}

// backlogAndHistory is a fixture for the migrations of the listing's
// indexes: 100 available jobs, 40 running and 1,000 finished, a third in
// each finished state. jobsDigest sums up the jobs of a database, which
// migrating must leave as they were.
const (
	backlogAndHistory = `
		INSERT INTO jobs (kind) SELECT 'waiting' FROM generate_series(1, 100);
		INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, started_at)
		SELECT 'busy', 'running', 1, 1, gen_random_uuid(), now() + interval '1 minute', 'w1', now()
		FROM generate_series(1, 40);
		INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
		SELECT 'done', (ARRAY['succeeded', 'dead', 'cancelled'])[1 + i % 3]::job_state, 1, 1, now(), now()
		FROM generate_series(1, 1000) AS i;
		ANALYZE jobs;`
	jobsDigest = `SELECT md5(string_agg(concat_ws(' ', id, kind, state, lease_token, finished_at), ',' ORDER BY id)) FROM jobs`
)

// historyIndexes lists the listing's indexes over the finished jobs, each
// valid or not, with its entries and its predicate; fourHistoryIndexes and
// twoHistoryIndexes are what it reads over backlogAndHistory with all four
// (00011, 00013) and with the two led by the queue (00012).
const (
	historyIndexes = `
		SELECT string_agg(concat_ws(' ', c.relname, i.indisvalid, c.reltuples, pg_get_expr(i.indpred, i.indrelid)), ',' ORDER BY c.relname)
		FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
		WHERE c.relname ~ '^jobs_finished_.*state_idx$'`
	fourHistoryIndexes = "jobs_finished_kind_state_idx t 1000 (finished_at IS NOT NULL)," +
		"jobs_finished_queue_kind_state_idx t 1000 (finished_at IS NOT NULL)," +
		"jobs_finished_queue_state_idx t 1000 (finished_at IS NOT NULL)," +
		"jobs_finished_state_idx t 1000 (finished_at IS NOT NULL)"
	twoHistoryIndexes = "jobs_finished_queue_kind_state_idx t 1000 (finished_at IS NOT NULL)," +
		"jobs_finished_queue_state_idx t 1000 (finished_at IS NOT NULL)"
)

// TestMigrations_StopNotifyingTheSharedChannelsOverAPopulatedDatabase
// carries available, running and finished jobs over 00015 and back: up
// leaves each queue's channels as the only ones the triggers notify; down
// notifies the channels shared by all queues again; the jobs are the
// same throughout. What the workers hear is checked in package worker.
func TestMigrations_StopNotifyingTheSharedChannelsOverAPopulatedDatabase(t *testing.T) {
	carryOver(t, 14, 15, backlogAndHistory,
		jobsDigest,
		carriedOver{what: "the triggers' functions that notify the shared channels", query: `
			SELECT coalesce(string_agg(proname, ',' ORDER BY proname), 'none')
			FROM pg_proc
			WHERE proname IN ('jobs_notify_available', 'jobs_notify_returned')
			  AND prosrc ~ 'relay_jobs_(available|returned)'`,
			before: "jobs_notify_available,jobs_notify_returned", after: "none"},
		carriedOver{what: "the triggers' functions that notify each queue's channels", query: `
			SELECT string_agg(proname, ',' ORDER BY proname)
			FROM pg_proc
			WHERE proname IN ('jobs_notify_available', 'jobs_notify_returned')
			  AND prosrc ~ 'relay_queue_channel'`,
			before: "jobs_notify_available,jobs_notify_returned", after: "jobs_notify_available,jobs_notify_returned"})
}

// TestMigrations_LetEnqueuesAnnounceAfterCommitOverAPopulatedDatabase
// carries available, running and finished jobs over 00016 and back: up
// has the insert's trigger leave the notification to an insert that says
// it announces its job after its commit; down has it notify always; the
// jobs are the same throughout. What the workers hear is checked in
// package client.
func TestMigrations_LetEnqueuesAnnounceAfterCommitOverAPopulatedDatabase(t *testing.T) {
	carryOver(t, 15, 16, backlogAndHistory,
		jobsDigest,
		carriedOver{what: "the insert trigger's function, whether it reads relay.announce", query: `
			SELECT (prosrc ~ 'relay\.announce')::text FROM pg_proc WHERE proname = 'jobs_notify_available'`,
			before: "false", after: "true"})
}

// TestMigrations_RefuseInfiniteTimesOverAPopulatedDatabase carries
// available, running and finished jobs, and one stored with an infinite
// run_at before 00017, over 00017 and back: up records the constraint
// without reading the rows already stored, so the job with the infinite
// time is kept as it is; down drops it; the jobs are the same throughout.
func TestMigrations_RefuseInfiniteTimesOverAPopulatedDatabase(t *testing.T) {
	carryOver(t, 16, 17, backlogAndHistory+`
		INSERT INTO jobs (kind, run_at) VALUES ('stored before', 'infinity');`,
		`SELECT md5(string_agg(concat_ws(' ', id, kind, state, run_at, lease_token, finished_at), ',' ORDER BY id)) FROM jobs`,
		carriedOver{what: "jobs_times_finite, validated", query: `
			SELECT coalesce((SELECT convalidated::text FROM pg_constraint WHERE conname = 'jobs_times_finite'), 'none')`,
			before: "none", after: "false"})
}

// TestMigrations_AJobsTimesAreFinite: once migrated, a job written by SQL
// with 'infinity' or '-infinity' in any of its times is refused by a check
// (SQLSTATE 23514), which an insert of Relay's never meets, and so is an
// update that writes one; a finite time, or null where the column allows
// it, is stored.
func TestMigrations_AJobsTimesAreFinite(t *testing.T) {
	pool := dbtest.New(t)
	ctx := t.Context()
	running := `INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, started_at)
		VALUES ('k', 'running', 1, 1, gen_random_uuid(), %[1]s, 'w1', %[1]s)`
	for _, tt := range []struct {
		name, sql string
	}{
		{"run_at", `INSERT INTO jobs (kind, run_at) VALUES ('k', %s)`},
		{"created_at", `INSERT INTO jobs (kind, created_at) VALUES ('k', %s)`},
		{"started_at and lease_expires_at", running},
		{"finished_at", `INSERT INTO jobs (kind, state, finished_at) VALUES ('k', 'succeeded', %s)`},
		{"cancel_requested_at", fmt.Sprintf(running, "now()") + `;
			UPDATE jobs SET cancel_requested_at = %s WHERE state = 'running'`},
	} {
		for _, when := range []string{"'infinity'", "'-infinity'"} {
			t.Run(tt.name+" "+when, func(t *testing.T) {
				_, err := pool.Exec(ctx, fmt.Sprintf(tt.sql, when))
				if code := pgErrCode(err); code != "23514" || !strings.Contains(err.Error(), "jobs_times_finite") {
					t.Errorf("err = %v, want a violation (23514) of jobs_times_finite", err)
				}
			})
		}
		t.Run(tt.name+" finite", func(t *testing.T) {
			if _, err := pool.Exec(ctx, fmt.Sprintf(tt.sql, "now()")); err != nil {
				t.Errorf("a finite time: %v", err)
			}
		})
	}
	if _, err := pool.Exec(ctx, `UPDATE jobs SET run_at = '-infinity' WHERE state = 'available'`); pgErrCode(err) != "23514" {
		t.Errorf("update to an infinite run_at: err = %v, want a violation (23514)", err)
	}
}

// pgErrCode returns the SQLSTATE of err, or "" if PostgreSQL did not
// answer it.
func pgErrCode(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}
