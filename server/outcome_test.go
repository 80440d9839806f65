package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

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
			proxy, through, err := faultproxy.StartFor(dbtest.NewURL(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { proxy.Close() })
			e := setupWithPool(t, dbtest.Connect(t, through))
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
