package worker

import (
	"context"
	"time"
)

// heartbeater renews the leases the worker holds, and stops the handlers
// of those it lost.
type heartbeater struct {
	w *Worker
}

// run renews every held lease together, every HeartbeatInterval, and
// cancels the handlers whose lease was lost or whose job was cancelled.
func (h heartbeater) run(ctx context.Context) {
	w := h.w
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.heartbeatNow:
		}
		h.heartbeat(ctx)
	}
}

func (h heartbeater) heartbeat(ctx context.Context) {
	w := h.w
	w.mu.Lock()
	held := make([]*execution, 0, len(w.held))
	var oldest time.Time
	for _, e := range w.held {
		if !e.lost {
			held = append(held, e)
			if oldest.IsZero() || e.renewedAt.Before(oldest) {
				oldest = e.renewedAt
			}
		}
	}
	w.mu.Unlock()
	if len(held) == 0 {
		return
	}
	sentAt := time.Now()
	// A renewal is worth waiting for as long as the leases it renews
	// last: an answer that comes after the next tick, from a slow or
	// overloaded server, still keeps them. Abandoning it at the interval
	// would also close its connection, and lose every lease of a worker
	// whose server answers slower than that. It waits at least an
	// interval, and gives up when the soonest lease runs out by the
	// worker's clock, which then loses that job.
	until := oldest.Add(w.cfg.Lease)
	if floor := sentAt.Add(w.cfg.HeartbeatInterval); until.Before(floor) {
		until = floor
	}
	renewed, cancelled, busy, err := w.leases.heartbeatMany(ctx, held, until)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		w.log.Warn("heartbeat failed", "err", err, "jobs", len(held))
		for _, e := range held {
			h.loseIfRanOut(e, "lease ran out while the database was unreachable")
		}
		return
	}
	for _, e := range held {
		switch {
		case busy[e.job.ID]:
			// Another transaction held the job's row: the lease was not
			// renewed this time, nor refused.
			if !h.loseIfRanOut(e, "lease ran out while another transaction held the job's row") {
				w.log.Debug("heartbeat left a job whose row another transaction holds for the next one", "job", e.job.ID)
			}
		case !renewed[e.job.ID]:
			h.lose(e, "heartbeat rejected")
		case cancelled[e.job.ID]:
			w.mu.Lock()
			e.renewedAt = sentAt
			w.mu.Unlock()
			e.cancel(ErrJobCancelled)
		default:
			w.mu.Lock()
			e.renewedAt = sentAt
			w.mu.Unlock()
		}
	}
}

// loseIfRanOut loses e, for the reason why, if no heartbeat has renewed its
// lease for a whole lease period, and reports whether it did. It is for
// when the database did not say: the worker's own clock then tells that
// the lease has expired.
func (h heartbeater) loseIfRanOut(e *execution, why string) bool {
	if time.Since(e.renewedAt) < h.w.cfg.Lease {
		return false
	}
	h.lose(e, why)
	return true
}

// lose marks e's lease lost and cancels its handler; its outcome will be
// dropped. A job claimed ahead whose release is under way is left alone:
// the heartbeat may have been sent after the release landed, and only the
// release's answer tells whether the worker gave the lease back or had
// lost it (see dispatcher.releasedAhead).
func (h heartbeater) lose(e *execution, why string) {
	w := h.w
	w.mu.Lock()
	stillHeld := w.held[e.job.ID] == e
	already, releasing := e.lost, e.releasing
	if stillHeld && !releasing {
		e.lost = true
	}
	w.mu.Unlock()
	if !stillHeld || already {
		return
	}
	if releasing {
		w.log.Debug("heartbeat did not renew the lease of a job claimed ahead whose release is under way; the release's answer tells whether it was given back",
			"job", e.job.ID, "why", why)
		return
	}
	w.log.Warn("lease lost; cancelling handler", "job", e.job.ID, "attempt", e.job.Attempt, "why", why)
	e.cancel(ErrLeaseLost)
}
