package server

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/relayq/relay/internal/dbtest"
)

// TestHandler_CloseSendsTheNotificationsOwed posts two one-job requests
// with notifications spaced an hour apart (Config.AnnounceEvery): the
// second job is owed its notification until Close sends it. How the
// spacing works is client.Enqueuer's, and its tests'.
func TestHandler_CloseSendsTheNotificationsOwed(t *testing.T) {
	t.Parallel()
	e := setup(t, Config{AnnounceEvery: time.Hour})
	ctx := t.Context()
	listener, _ := dbtest.Listen(t, e.pool, "closed")
	postOne(t, e, "closed")
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Fatalf("heard %d notifications for the first job, want 1", got)
	}
	postOne(t, e, "closed")
	if got := len(dbtest.Heard(t, ctx, listener)); got != 0 {
		t.Fatalf("heard %d notifications for the second job before Close, want none", got)
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e.h.(*Handler).Close(closeCtx)
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Errorf("heard %d notifications once closed, want 1", got)
	}
	postOne(t, e, "closed")
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Errorf("heard %d notifications for a job posted after Close, want 1, at its commit", got)
	}
}

// postOne posts a one-job request to queue.
func postOne(t *testing.T, e *testEnv, queue string) {
	t.Helper()
	body := fmt.Sprintf(`{"kind":"k","queue":%q}`, queue)
	if rec := e.do(t, "POST", "/v1/jobs", body); rec.Code != http.StatusCreated {
		t.Fatalf("post to %s: status %d, want 201: %s", queue, rec.Code, rec.Body)
	}
}
