package worker

import (
	"context"
	"time"
)

// reclaimer takes back the jobs of dead workers and expired leases, and
// forgets the sessions that ended.
type reclaimer struct {
	w *Worker
}

// run takes back the jobs of dead workers and expired leases every
// ReclaimInterval (longer in a large fleet, see reclaimInterval), and now
// and then forgets the sessions that ended (WorkerForgetEnded).
func (r reclaimer) run(ctx context.Context) {
	w := r.w
	live := 1
	for round := 0; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(reclaimInterval(w.cfg.ReclaimInterval, live))):
		}
		for {
			n, err := w.leases.reclaim(ctx)
			if err != nil || n < DefaultReclaimBatch {
				break
			}
		}
		if round%forgetEndedEvery == 0 {
			rctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
			if _, err := w.q.WorkerForgetEnded(rctx); err != nil && ctx.Err() == nil {
				w.log.Warn("forget ended worker sessions failed", "err", err)
			}
			if n, err := w.q.WorkerSessionsLiveCount(rctx); err == nil {
				live = int(n)
			}
			cancel()
		}
	}
}

// forgetEndedEvery is how many reclaim rounds pass between two
// WorkerForgetEnded, which forget the sessions that ended.
const forgetEndedEvery = 40

// reclaimersPerInterval is how many reclaims a fleet of workers makes, in
// all, per ReclaimInterval once it has more workers than that.
const reclaimersPerInterval = 16

// reclaimInterval is how long one worker of a fleet of live workers waits
// between two reclaims: base while the fleet is small; in a larger one,
// longer in proportion, so that the fleet as a whole still reclaims
// reclaimersPerInterval times per base (a dead worker's jobs come back
// about as fast) while the database runs a constant number of reclaim
// statements per second instead of one per worker, each of which reads
// every lock of the server.
func reclaimInterval(base time.Duration, live int) time.Duration {
	if live <= reclaimersPerInterval {
		return base
	}
	return base * time.Duration(live) / reclaimersPerInterval
}
