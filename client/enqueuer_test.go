package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/faultproxy"
)

// insertConcurrently has one goroutine per kind call enq.Insert with a job
// of that kind on queue, all at once, and returns what each got, in the
// order of kinds. Each job returned must be the caller's own, as stored.
func insertConcurrently(t *testing.T, pool *pgxpool.Pool, enq *client.Enqueuer, queue string, kinds []string) []error {
	t.Helper()
	errs := make([]error, len(kinds))
	jobs := make([]db.Job, len(kinds))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, kind := range kinds {
		job := newJob(t, client.Request{Kind: kind, Queue: &queue})
		wg.Go(func() {
			<-start
			jobs[i], errs[i] = enq.Insert(t.Context(), job)
		})
	}
	close(start)
	wg.Wait()
	for i, j := range jobs {
		if errs[i] != nil {
			continue
		}
		stored, err := db.New(pool).JobGet(t.Context(), j.ID)
		if err != nil {
			t.Fatalf("insert %d: job %d: %v", i, j.ID, err)
		}
		if stored.Kind != kinds[i] || j.Kind != kinds[i] || !j.RunAt.Equal(stored.RunAt) {
			t.Errorf("insert %d, of kind %s, returned %+v; stored %+v", i, kinds[i], j, stored)
		}
	}
	return errs
}

// kinds returns n kinds, k0 to k(n-1).
func kinds(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = fmt.Sprintf("k%d", i)
	}
	return k
}

// statements counts the statements that stored the jobs of pool's
// database: jobs inserted by one statement share its transaction id.
func statements(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), `SELECT count(DISTINCT xmin::text) FROM jobs`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// newEnqueuer returns an Enqueuer on pool with cfg, closed when the test
// ends.
func newEnqueuer(t *testing.T, pool *pgxpool.Pool, cfg client.EnqueuerConfig) *client.Enqueuer {
	t.Helper()
	enq := client.NewEnqueuer(pool, cfg)
	t.Cleanup(func() { enq.Close(context.Background()) })
	return enq
}

// spacedHourly returns an Enqueuer on a fresh database whose
// notifications are spaced an hour apart, closed when the test ends, and
// a session listening as a worker of queue does, once a first job on
// queue was heard at its commit: from then on, a job inserted is owed
// its notification until Close. With slowCommits, the commit of a job of
// dbtest.SlowCommitPayload takes that long.
func spacedHourly(t *testing.T, queue string, slowCommits time.Duration) (*pgxpool.Pool, *client.Enqueuer, *pgx.Conn) {
	t.Helper()
	pool := dbtest.New(t)
	if slowCommits > 0 {
		dbtest.SlowCommits(t, pool, slowCommits)
	}
	listener, _ := dbtest.Listen(t, pool, queue)
	enq := newEnqueuer(t, pool, client.EnqueuerConfig{AnnounceEvery: time.Hour})
	if _, err := enq.Insert(t.Context(), newJob(t, client.Request{Queue: &queue})); err != nil {
		t.Fatal(err)
	}
	if got := len(dbtest.Heard(t, t.Context(), listener)); got != 1 {
		t.Fatalf("heard %d notifications for the first job, want 1, at its commit", got)
	}
	return pool, enq, listener
}

// TestEnqueuer_ConcurrentInsertsShareStatementsAndEachGetsItsOwnJob has
// 200 goroutines insert a job each at once, with the notifications
// unspaced, beside a worker's listening session: each gets its own job,
// the jobs were stored by fewer statements than jobs, and each statement
// was heard once, at its commit.
func TestEnqueuer_ConcurrentInsertsShareStatementsAndEachGetsItsOwnJob(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	listener, _ := dbtest.Listen(t, pool, "default")
	enq := newEnqueuer(t, pool, client.EnqueuerConfig{AnnounceEvery: -1})
	const n = 200
	for i, err := range insertConcurrently(t, pool, enq, "default", kinds(n)) {
		if err != nil {
			t.Errorf("insert %d: %v", i, err)
		}
	}
	jobs, stmts := dbtest.CountJobs(t, pool), statements(t, pool)
	heard := len(dbtest.Heard(t, t.Context(), listener))
	t.Logf("%d jobs stored by %d statements, announced by %d notifications", jobs, stmts, heard)
	if jobs != n || stmts >= n {
		t.Errorf("%d jobs stored by %d statements; want %d jobs, by fewer statements", jobs, stmts, n)
	}
	if heard != stmts {
		t.Errorf("heard %d notifications for %d statements, want one per statement", heard, stmts)
	}
}

// TestEnqueuer_AJobTheDatabaseRefusesFailsAloneAmongConcurrentOnes inserts
// jobs at once, one in ten of a kind a constraint of the database
// refuses: those fail with the database's error and stored nothing, the
// others are stored.
func TestEnqueuer_AJobTheDatabaseRefusesFailsAloneAmongConcurrentOnes(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	if _, err := pool.Exec(t.Context(), `ALTER TABLE jobs ADD CONSTRAINT no_forbidden CHECK (kind !~ '^forbidden')`); err != nil {
		t.Fatal(err)
	}
	enq := newEnqueuer(t, pool, client.EnqueuerConfig{})
	const n = 200
	k := kinds(n)
	for i := 0; i < n; i += 10 {
		k[i] = fmt.Sprintf("forbidden%d", i)
	}
	for i, err := range insertConcurrently(t, pool, enq, "default", k) {
		var pgErr *pgconn.PgError
		refused := errors.As(err, &pgErr) && pgErr.ConstraintName == "no_forbidden"
		if strings.HasPrefix(k[i], "forbidden") != refused {
			t.Errorf("insert %d (%s): %v", i, k[i], err)
		}
	}
	if got := dbtest.CountJobs(t, pool); got != n-n/10 {
		t.Errorf("%d jobs stored, want %d", got, n-n/10)
	}
}

// TestEnqueuer_RefusesAJobWithAnIdempotencyKeyAlone: a key is looked up
// by client.Insert alone, so an Enqueuer refuses a job with one, and the
// jobs inserted at the same time are stored all the same.
func TestEnqueuer_RefusesAJobWithAnIdempotencyKeyAlone(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	enq := newEnqueuer(t, pool, client.EnqueuerConfig{})
	const n = 50
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		req := client.Request{}
		if i == n/2 {
			req.IdempotencyKey = ptr("once")
		}
		job := newJob(t, req)
		wg.Go(func() {
			<-start
			_, errs[i] = enq.Insert(t.Context(), job)
		})
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if keyed := i == n/2; keyed != errors.Is(err, client.ErrNoIdempotencyInBatch) || !keyed && err != nil {
			t.Errorf("insert %d (with a key: %v): %v", i, keyed, err)
		}
	}
	if got := dbtest.CountJobs(t, pool); got != n-1 {
		t.Errorf("%d jobs stored, want %d: all but the one with a key", got, n-1)
	}
}

// TestEnqueuer_JobsInsertedWithinTheSpacingShareOneLaterNotification
// inserts jobs on two queues with notifications spaced 10 s apart, and
// listens as a worker of each queue does. The first job is heard at its
// commit. The jobs inserted next on either queue, within the spacing, are
// not heard then: each queue hears one notification for them, no sooner
// than the spacing after the first, and nothing after it. Close then
// sends nothing more.
func TestEnqueuer_JobsInsertedWithinTheSpacingShareOneLaterNotification(t *testing.T) {
	t.Parallel()
	const every = 10 * time.Second
	pool := dbtest.New(t)
	ctx := t.Context()
	queues := []string{"spaced-a", "spaced-b"}
	listeners := map[string]*pgx.Conn{}
	for _, q := range queues {
		listeners[q], _ = dbtest.Listen(t, pool, q)
	}
	heard := func(q string) int { return len(dbtest.Heard(t, ctx, listeners[q])) }
	enq := newEnqueuer(t, pool, client.EnqueuerConfig{AnnounceEvery: every})
	insert := func(queue string, n int) {
		t.Helper()
		for i := range n {
			if _, err := enq.Insert(ctx, newJob(t, client.Request{Kind: fmt.Sprintf("k%d", i), Queue: &queue})); err != nil {
				t.Fatal(err)
			}
		}
	}

	first := time.Now()
	insert(queues[0], 1)
	for q, want := range map[string]int{queues[0]: 1, queues[1]: 0} {
		if got := heard(q); got != want {
			t.Fatalf("%s: heard %d notifications after the first job, on %s, want %d", q, got, queues[0], want)
		}
	}
	for _, q := range queues {
		insert(q, 5)
	}
	for _, q := range queues {
		if got := heard(q); got != 0 {
			t.Errorf("%s: heard %d notifications for 5 jobs inserted within the spacing, want none yet", q, got)
		}
	}
	for _, q := range queues {
		waitCtx, cancel := context.WithTimeout(ctx, 3*every)
		_, err := listeners[q].WaitForNotification(waitCtx)
		cancel()
		if err != nil {
			t.Fatalf("%s: no notification for the 5 jobs: %v", q, err)
		}
		if waited := time.Since(first); waited < every {
			t.Errorf("%s: heard the 5 jobs' notification %s after the first job, want no sooner than %s", q, waited, every)
		}
	}
	enq.Close(ctx)
	for _, q := range queues {
		if got := heard(q); got != 0 {
			t.Errorf("%s: heard %d more notifications for the 5 jobs, want one in all", q, got)
		}
	}
}

// TestEnqueuer_CloseSendsTheNotificationsOwed inserts two jobs with
// notifications spaced an hour apart: the second is owed its notification
// until Close sends it, and a job inserted after Close is heard at its
// commit.
func TestEnqueuer_CloseSendsTheNotificationsOwed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, enq, listener := spacedHourly(t, "closed", 0)
	if _, err := enq.Insert(ctx, newJob(t, client.Request{Queue: ptr("closed")})); err != nil {
		t.Fatal(err)
	}
	if got := len(dbtest.Heard(t, ctx, listener)); got != 0 {
		t.Fatalf("heard %d notifications for the second job before Close, want none", got)
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	enq.Close(closeCtx)
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Errorf("heard %d notifications once closed, want 1", got)
	}
	if _, err := enq.Insert(ctx, newJob(t, client.Request{Queue: ptr("closed")})); err != nil {
		t.Fatal(err)
	}
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Errorf("heard %d notifications for a job inserted after Close, want 1, at its commit", got)
	}
}

// TestEnqueuer_CloseGivesUpAfterTheStoreTimeout owes a notification
// (spaced an hour apart), then stops the database's answers, as a network
// that drops every packet does: Close, given a context that never ends,
// returns after the 500 ms StoreTimeout, not when the database comes
// back.
func TestEnqueuer_CloseGivesUpAfterTheStoreTimeout(t *testing.T) {
	t.Parallel()
	proxy, through, err := faultproxy.StartFor(dbtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	pool := dbtest.Connect(t, through)
	const timeout = 500 * time.Millisecond
	enq := client.NewEnqueuer(pool, client.EnqueuerConfig{AnnounceEvery: time.Hour, StoreTimeout: timeout})
	for range 2 { // the second is owed its notification
		if _, err := enq.Insert(t.Context(), newJob(t, client.Request{})); err != nil {
			t.Fatal(err)
		}
	}
	proxy.Blackhole()
	defer proxy.Heal() // so that the pool's connections close at once
	start := time.Now()
	closed := make(chan time.Duration, 1)
	go func() {
		enq.Close(context.Background())
		closed <- time.Since(start)
	}()
	select {
	case took := <-closed:
		if took < timeout {
			t.Errorf("Close returned after %s with the database out of reach, before the StoreTimeout, %s, ran out", took, timeout)
		}
	case <-time.After(10 * timeout):
		proxy.Heal()
		t.Errorf("Close still waiting %s after it began, with the database out of reach; want it to give up after the StoreTimeout, %s", 10*timeout, timeout)
		<-closed
	}
}

// TestEnqueuer_CloseWaitsForTheGroupsBeingStored closes an Enqueuer
// (notifications spaced an hour apart) while a job's statement waits a
// second for its commit, stored without a notification since another
// went out just before: Close returns once that job has committed, and
// its notification has gone out by then.
func TestEnqueuer_CloseWaitsForTheGroupsBeingStored(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, enq, listener := spacedHourly(t, "closing", time.Second)
	slow := newJob(t, client.Request{Queue: ptr("closing"), Payload: json.RawMessage(dbtest.SlowCommitPayload)})
	stored := make(chan error, 1)
	go func() {
		_, err := enq.Insert(ctx, slow)
		stored <- err
	}()
	waitForASlowCommit(t, pool)
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	enq.Close(closeCtx)
	if got := dbtest.CountJobs(t, pool); got != 2 {
		t.Errorf("%d jobs committed once Close returned, want 2: Close returned before the job being stored had committed", got)
	}
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Errorf("heard %d notifications for the slow job once Close returned, want 1", got)
	}
	if err := <-stored; err != nil {
		t.Fatal(err)
	}
}

// TestEnqueuer_CloseSendsWhatIsOwedThoughGroupsKeepComing owes a job's
// notification (spaced an hour apart) while other goroutines keep
// storing jobs of another queue whose commits each take a second, so that
// some group is always being stored: Close, given 1.5 s, waits for them
// until its time runs out, but has sent what was owed first.
func TestEnqueuer_CloseSendsWhatIsOwedThoughGroupsKeepComing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool, enq, listener := spacedHourly(t, "owed", time.Second)
	if _, err := enq.Insert(ctx, newJob(t, client.Request{Queue: ptr("owed")})); err != nil {
		t.Fatal(err) // owed its notification
	}
	streamCtx, stopStream := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			slow := newJob(t, client.Request{Queue: ptr("stream"), Payload: json.RawMessage(dbtest.SlowCommitPayload)})
			for streamCtx.Err() == nil {
				enq.Insert(streamCtx, slow) //nolint:errcheck // only keeps groups coming
			}
		})
	}
	defer func() {
		stopStream()
		wg.Wait()
	}()
	waitForASlowCommit(t, pool)
	closeCtx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancel()
	enq.Close(closeCtx)
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Errorf("heard %d notifications for the owed job once Close returned, want 1", got)
	}
}

// waitForASlowCommit waits until a commit dbtest.SlowCommits made slow
// has begun in pool's database.
func waitForASlowCommit(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var sleeping int
		if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event = 'PgSleep'`).Scan(&sleeping); err != nil {
			t.Fatal(err)
		}
		if sleeping > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no slow commit began")
		}
	}
}
