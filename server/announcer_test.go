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
// one-job requests to two queues with notifications spaced 3 s apart, and
// listens as a worker of each queue does. The first job of each queue is
// heard at its commit. Those posted within the next 3 s are not heard
// then: each queue hears one notification for all of them, later, once
// they have committed, and nothing after it.
func TestEnqueue_JobsPostedWithinTheSpacingShareOneLaterNotification(t *testing.T) {
	t.Parallel()
	const every = 3 * time.Second
	e := setup(t, Config{AnnounceEvery: every})
	ctx := t.Context()
	queues := []string{"spaced-a", "spaced-b"}
	listeners := make(map[string]*pgx.Conn, len(queues))
	heard := func(q string) int { return len(dbtest.Heard(t, ctx, listeners[q])) }
	for _, q := range queues {
		listeners[q], _ = dbtest.Listen(t, e.pool, q)
	}
	post := func(queue string, n int) {
		t.Helper()
		for i := range n {
			body := fmt.Sprintf(`{"kind":"k%d","queue":%q}`, i, queue)
			if rec := e.do(t, "POST", "/v1/jobs", body); rec.Code != http.StatusCreated {
				t.Fatalf("post to %s: status %d, want 201: %s", queue, rec.Code, rec.Body)
			}
		}
	}

	for _, q := range queues {
		post(q, 1)
	}
	for _, q := range queues {
		if got := heard(q); got != 1 {
			t.Fatalf("%s: heard %d notifications for its first job, want 1, at its commit", q, got)
		}
	}
	for _, q := range queues {
		post(q, 5)
	}
	for _, q := range queues {
		if got := heard(q); got != 0 {
			t.Errorf("%s: heard %d notifications for 5 jobs posted within the spacing, want none yet", q, got)
		}
	}
	for _, q := range queues {
		waitCtx, cancel := context.WithTimeout(ctx, every+5*time.Second)
		_, err := listeners[q].WaitForNotification(waitCtx)
		cancel()
		if err != nil {
			t.Fatalf("%s: no notification for the 5 jobs: %v", q, err)
		}
		if got := heard(q); got != 0 {
			t.Errorf("%s: heard %d more notifications for the 5 jobs, want one in all", q, got)
		}
	}
	if got := dbtest.CountJobs(t, e.pool); got != 12 {
		t.Errorf("%d jobs stored, want 12", got)
	}
}

// TestAnnouncer_ForgetsIdleQueues leads groups on more queues than the
// announcer remembers, each seen once, with a spacing that has passed by
// the next: it keeps no more than maxIdleQueues of them.
func TestAnnouncer_ForgetsIdleQueues(t *testing.T) {
	t.Parallel()
	a := newAnnouncer(nil, time.Nanosecond, nil)
	for i := range 3 * maxIdleQueues {
		if !a.lead([]string{fmt.Sprintf("q%d", i)}) {
			t.Fatalf("queue %d, never seen: the group was not let lead", i)
		}
		time.Sleep(time.Nanosecond)
	}
	if n := len(a.queues); n > maxIdleQueues {
		t.Errorf("remembers %d queues, want at most %d", n, maxIdleQueues)
	}
}
