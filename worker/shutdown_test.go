package worker

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
)

// TestShutdown_CollectsAReturnedHandlerWhoseLeaseAHeartbeatLost sets up a
// shutdown that finds two handlers returned with their outcomes not yet
// collected, one of them on a lease a heartbeat loses: before the release
// looks at it, or after, while its outcome is on its way. The shutdown
// releases neither, collects both outcomes and returns; it acknowledges
// the one whose lease holds, and reports the other lost, as a running
// worker does, leaving its job to whoever holds it now.
func TestShutdown_CollectsAReturnedHandlerWhoseLeaseAHeartbeatLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	q := db.New(pool)
	for _, lostWhen := range []string{"before the release looks", "after the release looked"} {
		t.Run("lease lost "+lostWhen, func(t *testing.T) {
			w, acks := recordingWorker(t, pool, 2)
			rows := insertAndClaim(t, pool, "shutdown-"+uuid.NewString(), 2, 3)
			held, lost := newExecution(rows[0], "w", time.Now()), newExecution(rows[1], "w", time.Now())
			d := &dispatcher{w: w}
			w.mu.Lock()
			for _, e := range []*execution{held, lost} {
				w.held[e.job.ID] = e
				e.returned = true // as nextForSlot marks a handler that returned
				w.running[e] = true
			}
			loseLease := func() {
				w.mu.Lock()
				lost.lost = true // as a heartbeat marks a lease it lost
				w.mu.Unlock()
			}
			w.mu.Unlock()

			if lostWhen == "before the release looks" {
				loseLease()
			}
			returned := d.releaseAtShutdown(ctx)
			if lostWhen == "after the release looked" {
				loseLease()
			}
			// Each returned handler's outcome is on its way, as a slot sends it.
			for _, e := range []*execution{held, lost} {
				w.outcomes <- outcome{exec: e, result: json.RawMessage(`{}`)}
			}
			collected := make(chan struct{})
			go func() {
				defer close(collected)
				d.collectReturned(returned)
			}()
			select {
			case <-collected:
			case <-time.After(10 * time.Second):
				t.Fatal("the shutdown still waited for outcomes after 10 s, with both collectable")
			}
			d.acknowledgeAtShutdown(ctx, d.leasesLastUntil(), true)

			want := map[int64][]string{
				held.job.ID: {"completed accepted=true"},
				lost.job.ID: {"lease_lost accepted=false"},
			}
			if diff := cmp.Diff(want, acks()); diff != "" {
				t.Errorf("reported (-want +got):\n%s", diff)
			}
			if n := w.numStarted(); n != 0 {
				t.Errorf("%d started jobs left uncollected, want 0", n)
			}
			for e, state := range map[*execution]db.JobState{held: db.JobStateSucceeded, lost: db.JobStateRunning} {
				if job, err := q.JobGet(ctx, e.job.ID); err != nil || job.State != state {
					t.Errorf("job %d: %s, %v; want %s", e.job.ID, job.State, err, state)
				}
			}
		})
	}
}
