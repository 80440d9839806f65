package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/pgbouncer"
)

// postConcurrently sends one POST /v1/jobs per body, all at once, and
// returns the responses in the order of bodies.
func postConcurrently(t *testing.T, e *testEnv, bodies []string) []int {
	t.Helper()
	status := make([]int, len(bodies))
	views := make([]JobView, len(bodies))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, body := range bodies {
		wg.Go(func() {
			<-start
			rec := e.do(t, "POST", "/v1/jobs", body)
			status[i] = rec.Code
			if rec.Code == http.StatusCreated {
				views[i] = decode[JobView](t, rec)
			}
		})
	}
	close(start)
	wg.Wait()
	for i, v := range views {
		if status[i] != http.StatusCreated {
			continue
		}
		// Each request is answered with its own job, as stored.
		stored, err := e.q.JobGet(context.Background(), v.ID)
		if err != nil {
			t.Fatalf("request %d: job %d: %v", i, v.ID, err)
		}
		if want := fmt.Sprintf(`{"kind":%q}`, stored.Kind); want != bodies[i] {
			t.Errorf("request %d (%s) was answered with job %d, of kind %q", i, bodies[i], v.ID, stored.Kind)
		}
		if v.Kind != stored.Kind || !v.RunAt.Equal(stored.RunAt) {
			t.Errorf("request %d: answered %+v, stored %+v", i, v, stored)
		}
	}
	return status
}

// TestEnqueue_ConcurrentRequestsShareStatementsAndEachGetsItsOwnJob sends
// 200 one-job requests at once: each is answered 201 with its own job, and
// they were stored by fewer statements than requests (jobs inserted by one
// statement share its transaction id, xmin).
func TestEnqueue_ConcurrentRequestsShareStatementsAndEachGetsItsOwnJob(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 200
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = fmt.Sprintf(`{"kind":"k%d"}`, i)
	}
	for i, status := range postConcurrently(t, e, bodies) {
		if status != http.StatusCreated {
			t.Errorf("request %d: status %d, want 201", i, status)
		}
	}
	var jobs, statements int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*), count(DISTINCT xmin::text) FROM jobs`).Scan(&jobs, &statements); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d jobs stored by %d statements", jobs, statements)
	if jobs != n || statements >= n {
		t.Errorf("%d jobs stored by %d statements; want %d jobs, by fewer statements", jobs, statements, n)
	}
}

// TestEnqueue_EachRequestsJobIsAnnouncedToItsQueueOnceItCommits listens
// as a worker of the default queue does, with the notifications unspaced
// (Config.AnnounceEvery below zero). A one-job request is heard once,
// with an Idempotency-Key or without, and its replay not at all. Of 200
// requests at once, stored together, each statement that stored some is
// heard once.
func TestEnqueue_EachRequestsJobIsAnnouncedToItsQueueOnceItCommits(t *testing.T) {
	t.Parallel()
	e := setup(t, Config{AnnounceEvery: -1})
	ctx := t.Context()
	listener, _ := dbtest.Listen(t, e.pool, "default")
	heard := func() int { return len(dbtest.Heard(t, ctx, listener)) }

	for _, tc := range []struct {
		name   string
		key    string
		status int
		heard  int
	}{
		{name: "one job", status: http.StatusCreated, heard: 1},
		{name: "one job under a key", key: "k1", status: http.StatusCreated, heard: 1},
		{name: "its replay", key: "k1", status: http.StatusOK, heard: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var headers []string
			if tc.key != "" {
				headers = []string{"Idempotency-Key", tc.key}
			}
			rec := e.do(t, "POST", "/v1/jobs", `{"kind":"k"}`, headers...)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if got := heard(); got != tc.heard {
				t.Errorf("heard %d notifications, want %d", got, tc.heard)
			}
		})
	}

	if _, err := e.pool.Exec(ctx, `TRUNCATE jobs`); err != nil {
		t.Fatal(err)
	}
	bodies := make([]string, 200)
	for i := range bodies {
		bodies[i] = fmt.Sprintf(`{"kind":"k%d"}`, i)
	}
	for i, status := range postConcurrently(t, e, bodies) {
		if status != http.StatusCreated {
			t.Fatalf("request %d: status %d, want 201", i, status)
		}
	}
	got := heard()
	var statements int
	if err := e.pool.QueryRow(ctx, `SELECT count(DISTINCT xmin::text) FROM jobs`).Scan(&statements); err != nil {
		t.Fatal(err)
	}
	t.Logf("200 jobs stored by %d statements, announced by %d notifications", statements, got)
	if got != statements {
		t.Errorf("heard %d notifications for 200 jobs stored by %d statements, want one per statement", got, statements)
	}
}

// TestEnqueue_AJobTheDatabaseRefusesFailsAloneAmongConcurrentOnes sends
// one-job requests at once, one in ten of a kind a constraint of the
// database refuses: those are 400s and stored nothing, the others 201s.
func TestEnqueue_AJobTheDatabaseRefusesFailsAloneAmongConcurrentOnes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.pool.Exec(context.Background(), `ALTER TABLE jobs ADD CONSTRAINT no_forbidden CHECK (kind !~ '^forbidden')`); err != nil {
		t.Fatal(err)
	}
	const n = 200
	bodies := make([]string, n)
	for i := range bodies {
		bodies[i] = fmt.Sprintf(`{"kind":"k%d"}`, i)
		if i%10 == 0 {
			bodies[i] = fmt.Sprintf(`{"kind":"forbidden%d"}`, i)
		}
	}
	for i, status := range postConcurrently(t, e, bodies) {
		want := http.StatusCreated
		if strings.Contains(bodies[i], "forbidden") {
			want = http.StatusBadRequest
		}
		if status != want {
			t.Errorf("request %d (%s): status %d, want %d", i, bodies[i], status, want)
		}
	}
	if got := dbtest.CountJobs(t, e.pool); got != n-n/10 {
		t.Errorf("%d jobs stored, want %d", got, n-n/10)
	}
}

// TestEnqueuer_ARequestThatGivesUpBeforeItsJobIsTakenStoresNothing holds
// every flusher busy while a request's context ends: the request returns
// its context's error, and the next statement leaves its job out.
func TestEnqueuer_ARequestThatGivesUpBeforeItsJobIsTakenStoresNothing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	enq := newEnqueuer(e.pool, newAnnouncer(e.pool, -1, nil))
	job := func(kind string) client.Job {
		j, err := client.Validate(client.Request{Kind: kind}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	enq.mu.Lock()
	enq.flushing = maxFlushers // as if every flusher were storing a group
	enq.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := enq.insert(ctx, job("abandoned")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("insert with every flusher busy: %v, want the context's deadline", err)
	}
	enq.mu.Lock()
	enq.flushing = 0
	enq.mu.Unlock()
	stored, err := enq.insert(context.Background(), job("next"))
	if err != nil || stored.Kind != "next" {
		t.Fatalf("next insert: %+v, %v", stored, err)
	}
	var kinds string
	if err := e.pool.QueryRow(context.Background(), `SELECT string_agg(kind, ',' ORDER BY id) FROM jobs`).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	if kinds != "next" {
		t.Errorf("jobs stored: %s, want only next", kinds)
	}
	// The flusher counts itself out once it finds nothing more to store.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		enq.mu.Lock()
		pending, flushing := len(enq.pending), enq.flushing
		enq.mu.Unlock()
		if pending == 0 && flushing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the last insert: %d pending, %d flushing; want none", pending, flushing)
		}
	}
}

// TestEnqueuer_AGroupHoldsAtMostMaxGroupBytes queues five requests of 3 MiB
// payloads before any flusher runs: they are stored two, two and one to a
// statement, none of more than maxGroupBytes, and a job larger than that
// alone still gets a statement of its own.
func TestEnqueuer_AGroupHoldsAtMostMaxGroupBytes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	enq := newEnqueuer(e.pool, newAnnouncer(e.pool, -1, nil))
	job := func(kind string, payloadBytes int) client.Job {
		payload := `"` + strings.Repeat("x", payloadBytes-2) + `"`
		j, err := client.Validate(client.Request{Kind: kind, Payload: json.RawMessage(payload)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	jobs := []client.Job{
		job("a", 3<<20), job("b", 3<<20), job("c", 3<<20), job("d", 3<<20), job("e", 3<<20),
		job("huge", maxGroupBytes+1),
	}
	enq.mu.Lock()
	enq.flushing = maxFlushers // as if every flusher were storing a group
	enq.mu.Unlock()
	errs := make(chan error, len(jobs))
	for i, j := range jobs {
		go func() {
			_, err := enq.insert(context.Background(), j)
			errs <- err
		}()
		// Queued in order.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			enq.mu.Lock()
			queued := len(enq.pending)
			enq.mu.Unlock()
			if queued == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d requests queued, want %d", queued, i+1)
			}
		}
	}
	enq.mu.Lock()
	enq.flushing = 1
	enq.mu.Unlock()
	go enq.flush()
	for range jobs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	rows, err := e.pool.Query(context.Background(), `
		SELECT string_agg(kind, '' ORDER BY id), sum(octet_length(payload::text))
		FROM jobs GROUP BY xmin::text ORDER BY min(id)`)
	if err != nil {
		t.Fatal(err)
	}
	var statements []string
	for rows.Next() {
		var kinds string
		var bytes int64
		if err := rows.Scan(&kinds, &bytes); err != nil {
			t.Fatal(err)
		}
		statements = append(statements, kinds)
		if bytes > maxGroupBytes && kinds != "huge" {
			t.Errorf("statement storing %s held %d payload bytes, more than %d", kinds, bytes, maxGroupBytes)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"ab", "cd", "e", "huge"}; !slices.Equal(statements, want) {
		t.Errorf("jobs stored by statement: %v, want %v", statements, want)
	}
}

// TestEnqueuer_AGroupAPoolerGaveUpOnIsNotStoredAgain stores a group through
// PgBouncer in transaction mode whose query_timeout ends the wait for a
// slow commit: PgBouncer answers with an error of its own (08P01) while
// the server goes on to commit the group. Each request gets that error,
// and the group's jobs are stored once, not replayed one by one beside it.
func TestEnqueuer_AGroupAPoolerGaveUpOnIsNotStoredAgain(t *testing.T) {
	t.Parallel()
	dsn := dbtest.NewURL(t)
	direct, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(direct.Close)
	// The commit of a job whose payload says so waits 3s, as a commit
	// waits for a slow disk or a synchronous standby.
	if _, err := direct.Exec(context.Background(), `
		CREATE FUNCTION test_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(3); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER test_slow_commit AFTER INSERT ON jobs
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
		WHEN (NEW.payload ? 'slow_commit') EXECUTE FUNCTION test_slow_commit();`); err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	bouncer := pgbouncer.ForTest(t, dsn, pgbouncer.Options{PoolMode: pgbouncer.PoolModeTransaction, QueryTimeout: time.Second})
	cfg, err := pgxpool.ParseConfig(bouncer.URL(strings.TrimPrefix(u.Path, "/")))
	if err != nil {
		t.Fatal(err)
	}
	// As relay serve runs behind a transaction-mode pooler.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	pooled, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pooled.Close)

	group := make([]*pendingJob, 3)
	for i := range group {
		payload := `{}`
		if i == 0 {
			payload = `{"slow_commit": true}`
		}
		job, err := client.Validate(client.Request{Kind: fmt.Sprintf("k%d", i), Payload: json.RawMessage(payload)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		group[i] = &pendingJob{job: job, done: make(chan stored, 1)}
	}
	newEnqueuer(pooled, newAnnouncer(pooled, -1, nil)).store(group)
	for i, p := range group {
		if s := <-p.done; s.err == nil {
			t.Errorf("request %d: stored as job %d, want the pooler's error: its outcome is not known", i, s.job.ID)
		}
	}
	// The server committed the group after PgBouncer gave up on it.
	deadline := time.Now().Add(10 * time.Second)
	for dbtest.CountJobs(t, direct) < len(group) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	var kinds string
	if err := direct.QueryRow(context.Background(), `SELECT string_agg(kind, ',' ORDER BY kind) FROM jobs`).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	if kinds != "k0,k1,k2" {
		t.Errorf("jobs stored: %s, want k0,k1,k2, each once", kinds)
	}
}
