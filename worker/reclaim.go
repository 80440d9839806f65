package worker

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
)

// reclaimer takes back the jobs of dead workers and expired leases, and
// forgets the sessions that ended.
type reclaimer struct {
	w *Worker
}

// run takes back the jobs of dead workers and expired leases every
// ReclaimInterval (longer in a large fleet, see fleetInterval), and now
// and then forgets the sessions that ended (forgetEnded). Each reclaim
// also counts the live workers (JobReclaim), which spaces the next: a
// survivor of a large fleet that mostly died waits the small fleet's
// interval from its next round on, whatever that round found to take
// back, so that the jobs of workers that die after that come back as
// fast as in any fleet of its size. The count costs the fleet no
// statement of its own, and no read of the server's lock table but the
// one the reclaim makes.
func (r reclaimer) run(ctx context.Context) {
	w := r.w
	window := newReclaimWindow()
	// left are the jobs the last reclaim found abandoned but could not
	// take, their rows held by another transaction: the next reclaims look
	// each up by id, whatever their window, until it is taken.
	var left []int64
	for round := 0; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(fleetInterval(w.cfg.ReclaimInterval, w.fleetSize()))):
		}
		if round%fullReclaimEvery == 0 {
			window.forget()
		}
		for {
			n, stillLeft, ran, err := w.leases.reclaim(ctx, window.since(), left)
			// A list of the jobs left as long as a batch may have been cut
			// short: then the next reclaim reads everything.
			window.record(ran, err == nil && n < DefaultReclaimBatch && len(stillLeft) < DefaultReclaimBatch)
			if err == nil {
				left = stillLeft
			}
			if err != nil || n < DefaultReclaimBatch {
				break
			}
		}
		if round%forgetEndedEvery == 0 {
			rctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
			if _, err := forgetEnded(rctx, w.pool); err != nil && ctx.Err() == nil {
				w.log.Warn("forget ended worker sessions failed", "err", err)
			}
			cancel()
		}
	}
}

// fullReclaimEvery is how many reclaim rounds pass between two that read
// every expired lease rather than a window of them (see newReclaimWindow).
const fullReclaimEvery = 40

// reclaimWindowMargin is how far a reclaim's window of expired leases
// reaches back beyond the last reclaim that took every one it found: a
// lease that a transaction renewed or claimed before that reclaim ran,
// committing only after it began, was not there to be found.
const reclaimWindowMargin = time.Second

// newReclaimWindow returns the window of lease times in which a reclaim
// looks for expired leases. Once a reclaim has taken every expired lease
// it found, but those whose rows another transaction held (which the next
// reclaims look up by id), the next needs only those that expired since
// it ran. Otherwise (at start, after a failure, after a full batch, after
// a list of the jobs left as long as a batch, and every fullReclaimEvery
// rounds) it looks at them all. Each worker keeps its own, so that what
// one worker misses another's window cannot hide.
func newReclaimWindow() *sinceLastComplete {
	return &sinceLastComplete{margin: reclaimWindowMargin}
}

// forgetEnded forgets the sessions that ended and hold no running job, and
// frees the worker ids they held: WorkerStopClaimsOfEndedSessions, then
// WorkerForgetEnded, in one READ COMMITTED transaction, so that the second
// reads a snapshot taken once no claim under those sessions is in flight.
// It returns how many sessions it forgot.
func forgetEnded(ctx context.Context, pool *pgxpool.Pool) (forgot int64, err error) {
	err = pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		q := db.New(tx)
		keys, err := q.WorkerStopClaimsOfEndedSessions(ctx)
		if err != nil {
			return fmt.Errorf("stop the claims of ended sessions: %w", err)
		}
		if len(keys) == 0 {
			return nil
		}
		forgot, err = q.WorkerForgetEnded(ctx, keys)
		if err != nil {
			return fmt.Errorf("forget ended sessions: %w", err)
		}
		return nil
	})
	return forgot, err
}

// forgetEndedEvery is how many reclaim rounds pass between two
// forgetEnded, which forget the sessions that ended.
const forgetEndedEvery = 40

// fleetShare is how many times a fleet of workers runs a duty it shares,
// in all, per the duty's base interval once it has more workers than
// that.
const fleetShare = 16

// fleetInterval is how long one worker of a fleet of live workers waits
// between two runs of a duty the fleet shares, such as the reclaim: base
// while the fleet is small; in a larger one, longer in proportion, so that
// the fleet as a whole still runs it fleetShare times per base (a dead
// worker's jobs come back about as fast) while the database runs a
// constant number of its statements per second instead of one per worker.
// Each reclaim reads every lock of the server. A base so long that this
// would pass the largest time.Duration gives that instead, never an
// interval that wrapped around to a short or negative one.
func fleetInterval(base time.Duration, live int32) time.Duration {
	if live <= fleetShare {
		return base
	}
	n := time.Duration(live)
	if base <= math.MaxInt64/n {
		return base * n / fleetShare
	}
	if share := base / fleetShare; share <= math.MaxInt64/n {
		return share * n
	}
	return math.MaxInt64
}
