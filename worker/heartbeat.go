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
// It also renews them the moment the soonest lease runs out by this
// process's clock, if no heartbeat has renewed it by then: one that failed
// at once (the database refusing connections), or left the job because
// another transaction held its row, renewed nothing, and the next one may
// come up to an interval after the lease ran out, while another worker
// runs the job. Then the database refuses the renewal, or it fails again
// and the job is lost by the same clock (loseIfRanOut). A renewal that
// fails is tried again soon, backing off up to a quarter of the interval,
// so that a database back before the leases run out renews them, though
// the next heartbeat due would come too late.
func (h heartbeater) run(ctx context.Context) {
	w := h.w
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	runOut := time.NewTimer(time.Hour)
	defer runOut.Stop()
	maxDelay := max(w.cfg.HeartbeatInterval/4, MinInterval)
	delay := min(minRetryDelay, maxDelay)
	var retry <-chan time.Time
	for {
		runOut.Reset(h.untilRunOut())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.heartbeatNow:
		case <-runOut.C:
		case <-retry:
		}
		retry = nil
		if h.heartbeat(ctx) {
			delay = min(minRetryDelay, maxDelay)
			continue
		}
		retry = time.After(delay)
		delay = min(2*delay, maxDelay)
	}
}

// held returns the executions whose leases the worker holds and has not
// lost, and the time the oldest of their leases was last renewed.
func (h heartbeater) held() (held []*execution, oldest time.Time) {
	w := h.w
	w.mu.Lock()
	defer w.mu.Unlock()
	held = make([]*execution, 0, len(w.held))
	for _, e := range w.held {
		if !e.lost {
			held = append(held, e)
			if oldest.IsZero() || e.renewedAt.Before(oldest) {
				oldest = e.renewedAt
			}
		}
	}
	return held, oldest
}

// untilRunOut returns how long until the soonest lease held runs out by
// this process's clock, unless renewed before; an hour when none is held,
// as a job claimed meanwhile is renewed, or lost, by a heartbeat before its
// lease runs out. A job claimed ahead whose release is under way does not
// count: its release's answer, not its lease, tells what became of it (see
// lose).
func (h heartbeater) untilRunOut() time.Duration {
	w := h.w
	w.mu.Lock()
	defer w.mu.Unlock()
	var oldest time.Time
	for _, e := range w.held {
		if !e.lost && !e.releasing && (oldest.IsZero() || e.renewedAt.Before(oldest)) {
			oldest = e.renewedAt
		}
	}
	if oldest.IsZero() {
		return time.Hour
	}
	return max(time.Until(oldest.Add(w.cfg.Lease)), 0)
}

// heartbeat renews the leases held, and reports false if its statement
// failed, to be tried again.
func (h heartbeater) heartbeat(ctx context.Context) (ok bool) {
	w := h.w
	held, oldest := h.held()
	if len(held) == 0 {
		return true
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
			return true
		}
		w.log.Warn("heartbeat failed", "err", err, "jobs", len(held))
		for _, e := range held {
			h.loseIfRanOut(e, "lease ran out while the database was unreachable")
		}
		return false
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
	return true
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
