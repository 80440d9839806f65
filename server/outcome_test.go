package server

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/faultproxy"
)

// TestEnqueue_AnAnswerLostAtTheCommitIs504 cuts the connection of each
// enqueue just after its statement committed: the request is answered
// 504, without Retry-After, saying that the job may have been stored, as
// it was, and what a retry does; and with an Idempotency-Key, sending the
// request again returns that job rather than storing another.
func TestEnqueue_AnAnswerLostAtTheCommitIs504(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, path, body, key, statement, retry string
	}{
		{"one job", "/v1/jobs", `{"kind":"k"}`, "", "-- name: JobInsertAll :many", "a retry stores it again"},
		{"one job with an Idempotency-Key", "/v1/jobs", `{"kind":"k"}`, "lost", "-- name: JobInsert :one", "a retry with the same Idempotency-Key answers with it if it was"},
		{"a batch", "/v1/jobs/batch", `{"jobs":[{"kind":"k"}]}`, "", "-- name: JobInsertMany :many", "a retry may store them again"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			proxy, e := setupBehindFaultProxy(t)
			post := func(key string) *httptest.ResponseRecorder {
				if key == "" {
					return e.do(t, "POST", tt.path, tt.body)
				}
				return e.do(t, "POST", tt.path, tt.body, "Idempotency-Key", key)
			}
			warmUp := ""
			if tt.key != "" {
				warmUp = "warm-up"
			}
			wantStatus(t, post(warmUp), http.StatusCreated) // prepares the statements before the cut
			proxy.CutAfterCommit(faultproxy.CommitCut{Statement: tt.statement, Times: 1})
			rec := post(tt.key)
			got := wantError(t, rec, http.StatusGatewayTimeout, "")
			if !strings.Contains(got.Error, "may have been stored") || !strings.Contains(got.Error, tt.retry) {
				t.Errorf("error = %q, want it to say that the job may have been stored, and that %s", got.Error, tt.retry)
			}
			if ra := rec.Header().Get("Retry-After"); ra != "" {
				t.Errorf("Retry-After: %s, want none: a retry may store the job again", ra)
			}
			if proxy.Armed() != 0 {
				t.Fatal("the connection was never cut at the enqueue's commit")
			}
			if n := dbtest.CountJobs(t, e.pool); n != 2 {
				t.Errorf("%d jobs stored, want 2: the first request's and the one whose answer was lost", n)
			}
			if tt.key == "" {
				return
			}
			wantStatus(t, post(tt.key), http.StatusOK)
			if n := dbtest.CountJobs(t, e.pool); n != 2 {
				t.Errorf("%d jobs stored after the request was sent again with its Idempotency-Key, want 2", n)
			}
		})
	}
}

// TestTransitionJob_AnAnswerLostAtTheCommitIs504 cuts the connection of a
// cancel and of a retry just after the statement committed: the request
// is answered 504, without Retry-After, saying that the change may have
// been applied and what to do, and the change did land.
func TestTransitionJob_AnAnswerLostAtTheCommitIs504(t *testing.T) {
	t.Parallel()
	tests := []struct {
		verb, statement, state string
		job                    func(*testing.T, *testEnv) (int64, pgtype.UUID)
		advice                 string
	}{
		{"cancel", "-- name: JobCancel :one", "cancelled", availableJob, "sending the cancel again is safe"},
		{"retry", "-- name: JobRetry :one", "available", deadJob, "GET the job to see its state before sending the retry again"},
	}
	for _, tt := range tests {
		t.Run(tt.verb, func(t *testing.T) {
			t.Parallel()
			proxy, e := setupBehindFaultProxy(t)
			transition := func(id int64) *httptest.ResponseRecorder {
				return e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/%s", id, tt.verb), "")
			}
			warmUp, _ := tt.job(t, e)
			wantStatus(t, transition(warmUp), http.StatusOK) // prepares the statement before the cut
			id, _ := tt.job(t, e)
			proxy.CutAfterCommit(faultproxy.CommitCut{Statement: tt.statement, Times: 1})
			rec := transition(id)
			got := wantError(t, rec, http.StatusGatewayTimeout, "")
			if want := "the " + tt.verb + " may have been applied"; !strings.Contains(got.Error, want) || !strings.Contains(got.Error, tt.advice) {
				t.Errorf("error = %q, want it to say %q, and %q", got.Error, want, tt.advice)
			}
			if ra := rec.Header().Get("Retry-After"); ra != "" {
				t.Errorf("Retry-After: %s, want none: the change may have been made", ra)
			}
			if proxy.Armed() != 0 {
				t.Fatal("the connection was never cut at the statement's commit")
			}
			job, err := e.q.JobGet(t.Context(), id)
			if err != nil {
				t.Fatal(err)
			}
			if string(job.State) != tt.state {
				t.Errorf("job is %s, want %s: the %s whose answer was lost committed", job.State, tt.state, tt.verb)
			}
		})
	}
}

// TestTransitionJob_NoConnectionInTimeIs503 holds the pool's only
// connection, so that a cancel's wait for one runs out before its
// statement is sent: nothing changed, so that is a 503 with Retry-After,
// not the 504 of a lost answer.
func TestTransitionJob_NoConnectionInTimeIs503(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(dbtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	e := setupWithPool(t, pool)
	id, _ := availableJob(t, e)
	held, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, "POST", fmt.Sprintf("/v1/jobs/%d/cancel", id), nil)
	rec := httptest.NewRecorder()
	e.h.ServeHTTP(rec, req)
	wantError(t, rec, http.StatusServiceUnavailable, "")
	if ra := rec.Header().Get("Retry-After"); ra == "" {
		t.Error("no Retry-After: nothing was sent, so a retry is safe")
	}
	held.Release()
	job, err := e.q.JobGet(t.Context(), id)
	if err != nil {
		t.Fatal(err)
	}
	if job.State != db.JobStateAvailable {
		t.Errorf("job is %s, want it still available", job.State)
	}
}

// setupBehindFaultProxy returns the API on a fresh migrated database that
// it reaches through a fault proxy, and the proxy.
func setupBehindFaultProxy(t *testing.T) (*faultproxy.Proxy, *testEnv) {
	t.Helper()
	proxy, through, err := faultproxy.StartFor(dbtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	return proxy, setupWithPool(t, dbtest.Connect(t, through))
}
