package server

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/internal/dbtest"
)

// TestEnqueue_JobsPostedWithinTheSpacingShareOneLaterNotification posts
// one-job requests to two queues with notifications spaced 10 s apart,
// and listens as a worker of each queue does. The first job, on one
// queue, is heard at its commit. The jobs posted next on either queue,
// within the spacing, are not heard then: each queue hears one
// notification for them, no sooner than the spacing after the first, and
// nothing after it.
func TestEnqueue_JobsPostedWithinTheSpacingShareOneLaterNotification(t *testing.T) {
	t.Parallel()
	const every = 10 * time.Second
	e := setup(t, Config{AnnounceEvery: every})
	ctx := t.Context()
	listeners := map[string]*pgx.Conn{}
	heard := func(q string) int { return len(dbtest.Heard(t, ctx, listeners[q])) }
	queues := []string{"spaced-a", "spaced-b"}
	for _, q := range queues {
		listeners[q], _ = dbtest.Listen(t, e.pool, q)
	}

	first := time.Now()
	postSpaced(t, e, queues[0], 1)
	for q, want := range map[string]int{queues[0]: 1, queues[1]: 0} {
		if got := heard(q); got != want {
			t.Fatalf("%s: heard %d notifications after the first job, on %s, want %d", q, got, queues[0], want)
		}
	}
	for _, q := range queues {
		postSpaced(t, e, q, 5)
	}
	for _, q := range queues {
		if got := heard(q); got != 0 {
			t.Errorf("%s: heard %d notifications for 5 jobs posted within the spacing, want none yet", q, got)
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
			t.Errorf("%s: heard the 5 jobs' notification %s after the first job was posted, want no sooner than %s", q, waited, every)
		}
		if got := heard(q); got != 0 {
			t.Errorf("%s: heard %d more notifications for the 5 jobs, want one in all", q, got)
		}
	}
	if got := dbtest.CountJobs(t, e.pool); got != 11 {
		t.Errorf("%d jobs stored, want 11", got)
	}
}

// TestHandler_CloseSendsTheNotificationsOwed posts two one-job requests
// with notifications spaced an hour apart: the second job is owed its
// notification until Close sends it.
func TestHandler_CloseSendsTheNotificationsOwed(t *testing.T) {
	t.Parallel()
	e := setup(t, Config{AnnounceEvery: time.Hour})
	ctx := t.Context()
	listener, _ := dbtest.Listen(t, e.pool, "closed")
	postSpaced(t, e, "closed", 1)
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Fatalf("heard %d notifications for the first job, want 1", got)
	}
	postSpaced(t, e, "closed", 1)
	if got := len(dbtest.Heard(t, ctx, listener)); got != 0 {
		t.Fatalf("heard %d notifications for the second job before Close, want none", got)
	}
	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	e.h.(*Handler).Close(closeCtx)
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Errorf("heard %d notifications once closed, want 1", got)
	}
	postSpaced(t, e, "closed", 1)
	if got := len(dbtest.Heard(t, ctx, listener)); got != 1 {
		t.Errorf("heard %d notifications for a job posted after Close, want 1, at its commit", got)
	}
}

// postSpaced posts n one-job requests to queue, one after another.
func postSpaced(t *testing.T, e *testEnv, queue string, n int) {
	t.Helper()
	for i := range n {
		body := fmt.Sprintf(`{"kind":"k%d","queue":%q}`, i, queue)
		if rec := e.do(t, "POST", "/v1/jobs", body); rec.Code != http.StatusCreated {
			t.Fatalf("post to %s: status %d, want 201: %s", queue, rec.Code, rec.Body)
		}
	}
}
