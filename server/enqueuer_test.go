package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/dbtest"
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

// TestClassify_AnswersWithA4xxExactlyTheErrorsAGroupIsReplayedFor: a
// group of one-job requests is stored again one job at a time only after
// an error client.RefusedAValue accepts, which stored nothing; those, and
// no others, are the errors the API answers with a 4xx (classify asks
// client.RefusedAValue, and answers no other error with one), so that
// the request whose value was refused, and it alone, hears that it was
// its own.
func TestClassify_AnswersWithA4xxExactlyTheErrorsAGroupIsReplayedFor(t *testing.T) {
	codes := []string{
		"22001", "22003", "22007", "22P02", "22P05", "22023",
		"23502", "23503", "23505", "23514", "23P01",
		"54000", "54001", "54011", "54023",
		"08006", "08P01", "40001", "40P01", "53300", "57014", "57P01",
		"25P02", "42501", "42P01", "XX000",
	}
	for _, code := range codes {
		err := fmt.Errorf("insert 3 jobs: %w", &pgconn.PgError{Code: code})
		if fourXX, refused := classify(err).status < http.StatusInternalServerError, client.RefusedAValue(err); fourXX != refused {
			t.Errorf("SQLSTATE %s: the API answers %d, client.RefusedAValue says %v", code, classify(err).status, refused)
		}
	}
	for _, err := range []error{context.DeadlineExceeded, io.ErrUnexpectedEOF, errors.New("other")} {
		if classify(err).status < http.StatusInternalServerError || client.RefusedAValue(err) {
			t.Errorf("%v: the API answers %d, client.RefusedAValue says %v; want neither a 4xx nor a refusal", err, classify(err).status, client.RefusedAValue(err))
		}
	}
}
