package worker

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
)

// pending holds what waits to be sent to the database.
type pending struct {
	done, failed []outcome
	// toRelease holds jobs claimed ahead that are to be released unstarted.
	toRelease []*execution
}

func (p *pending) empty() bool {
	return len(p.done) == 0 && len(p.failed) == 0 && len(p.toRelease) == 0
}

// finished counts the outcomes of finished handlers: the jobs whose
// completion or failure waits to be recorded.
func (p *pending) finished() int { return len(p.done) + len(p.failed) }

// take moves everything pending into a new batch, but for completions
// whose results, with those before them, pass what one statement carries
// (maxStatementResults): those stay pending for the next round, where in
// one statement they would fail it, and every round after, together.
func (p *pending) take() pending {
	b := *p
	*p = pending{}
	size := 0
	for i, o := range b.done {
		if size += len(o.result); size > maxStatementResults && i > 0 {
			b.done, p.done = b.done[:i:i], b.done[i:]
			break
		}
	}
	return b
}

// restore puts a batch that could not be sent back in front.
func (p *pending) restore(b pending) {
	p.done = append(b.done, p.done...)
	p.failed = append(b.failed, p.failed...)
	p.toRelease = append(b.toRelease, p.toRelease...)
}

// round is one acknowledgement of a batch of outcomes together with a claim
// for the slots that are free, sent as one unit.
type round struct {
	batch pending
	claim int
	// probe is set on a round that a poll alone sends, carrying nothing
	// but its claim: the claim is sent only if JobAnyReady finds a job.
	probe bool

	// adopt holds the lease tokens of earlier claims whose answer was lost:
	// the jobs still running under them are this worker's to run.
	// adoptSentAt is when the first of those claims was sent.
	adopt       []pgtype.UUID
	adoptSentAt time.Time

	// recheck holds outcomes an earlier round set aside because another
	// transaction held their jobs' rows: this round asks again which are
	// held, sends the others with its own and sets the rest aside again.
	recheck []outcome
	// heldAside holds, once the round is back, the outcomes whose jobs'
	// rows another transaction holds, found after a completion or failure
	// waited lock_wait_ms for one (see setAsideHeld), and heldAgain those
	// of recheck still held. Neither is sent again until a later round
	// finds its rows free.
	heldAside, heldAgain []outcome
	// releaseRecheck holds jobs claimed ahead whose release an earlier
	// round set aside, for the same reason, to be asked about again. Once
	// the round is back, releaseHeldAside holds those found held when this
	// round's release waited lock_wait_ms for them, and releaseHeldAgain
	// those of releaseRecheck still held.
	releaseRecheck                     []*execution
	releaseHeldAside, releaseHeldAgain []*execution

	// Filled in by acknowledge: what the database answered for. released
	// stays nil unless its statement succeeded, completed unless the
	// completions' statement, or the isolation of a row the database
	// refused (see sendIsolating), got an answer, and failStates unless
	// failures were sent. The outcomes the database did not answer for
	// are moved to unsettled, to be sent again.
	released   map[int64]bool        // jobs the database released unstarted
	failStates map[int64]db.JobState // failures the database accepted
	completed  map[int64]bool        // completions the database accepted
	unsettled  pending
	claimed    []db.JobCompleteAndClaimRow
	// releaseRefused holds, beside released, the jobs whose rows the
	// database refused to release (logged as it answered).
	releaseRefused map[int64]bool
	// adopted holds the jobs found under the tokens of adopt; adoptedOK is
	// whether the search was made.
	adopted   []db.JobCompleteAndClaimRow
	adoptedOK bool
	// lostClaim holds the tokens of this round's claim if its answer was
	// lost: the claim may have committed.
	lostClaim []pgtype.UUID
	// fromCursors is whether the claim started from the cursors: jobs
	// behind them were not looked for.
	fromCursors bool
	sentAt      time.Time
	err         error
	// deadline, if set, is when the round gives up, if sooner than a
	// lease after it is sent: a round at shutdown gives up when the
	// grace period ends, or when its leases run out.
	deadline time.Time
}

// carried counts the outcomes the round carries, whether the database
// answered for them, they are to be sent again, or they are set aside.
func (r *round) carried() int {
	return r.batch.finished() + r.unsettled.finished() + len(r.recheck) + len(r.heldAside) + len(r.heldAgain)
}

// acknowledge sends a round: jobs released in a statement of their own,
// then completions and the claim together in one (for a round a poll
// alone sends, only once JobAnyReady has found a job), then failures, so that
// the common case, a job finished and a slot to fill, costs one round trip
// and one commit. A row the database refuses never holds up the others
// (see sendIsolating): a completion whose result it refuses becomes a
// permanent failure of that job. A row another transaction holds holds
// up only its own outcome: a completion or failure waits lock_wait_ms for
// it, then the round sets that outcome aside (setAsideHeld) and its others
// are sent again; a release waits as long, then is set aside alike
// (leases.releaseMany). It touches nothing but r, so that it can run beside the
// dispatcher. It gives up when ctx ends, or a lease after it is sent (or
// at r.deadline, if sooner). Its statements go on one connection of the
// pool, taken first: a round that cannot get one sends nothing, and
// everything it carries is to be sent again, none of it in doubt.
func (r *round) acknowledge(ctx context.Context, w *Worker) {
	deadline := time.Now().Add(w.cfg.Lease)
	if !r.deadline.IsZero() && r.deadline.Before(deadline) {
		deadline = r.deadline
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()

	conn, err := w.leases.acquire(ctx)
	if err != nil {
		r.err = err
		// Set aside again, as takeBackFree does when it cannot ask.
		r.heldAgain, r.releaseHeldAgain = r.recheck, r.releaseRecheck
		r.recheck, r.releaseRecheck = nil, nil
		return
	}
	defer conn.Release()
	l := w.leases.on(conn)
	r.takeBackFree(ctx, l)
	r.send(ctx, l)
	if r.err != nil && lockNotAvailable(r.err) {
		r.setAsideHeld(ctx, l)
	}
}

// takeBackFree asks which of the outcomes and releases set aside earlier
// (recheck, releaseRecheck) still have their jobs' rows held by another
// transaction, adds the others to the round's batch and sets the rest
// aside again. If it cannot ask, it sets them all aside again.
func (r *round) takeBackFree(ctx context.Context, l leases) {
	if len(r.recheck) == 0 && len(r.releaseRecheck) == 0 {
		return
	}
	recheck, releases := r.recheck, r.releaseRecheck
	r.recheck, r.releaseRecheck = nil, nil
	held, err := l.heldElsewhere(ctx, append(outcomeJobs(recheck), executionJobs(releases)...))
	if err != nil {
		r.heldAgain, r.releaseHeldAgain = recheck, releases
		return
	}
	for _, o := range recheck {
		switch {
		case held[o.exec.job.ID]:
			r.heldAgain = append(r.heldAgain, o)
		case o.err == nil:
			r.batch.done = append(r.batch.done, o)
		default:
			r.batch.failed = append(r.batch.failed, o)
		}
	}
	for _, e := range releases {
		if held[e.job.ID] {
			r.releaseHeldAgain = append(r.releaseHeldAgain, e)
		} else {
			r.batch.toRelease = append(r.batch.toRelease, e)
		}
	}
}

// setAsideHeld runs after a completion or failure of the round gave up
// waiting for a row: it asks which of the outcomes still to be sent have
// their jobs' rows held by another transaction, and moves those to
// heldAside, so that the others go again without them. If it cannot ask,
// every outcome stays to be sent again.
func (r *round) setAsideHeld(ctx context.Context, l leases) {
	// The outcomes to be sent again, as finish will find them.
	var unsent []*[]outcome
	if r.completed == nil {
		unsent = append(unsent, &r.batch.done)
	}
	unsent = append(unsent, &r.unsettled.done)
	if r.failStates == nil {
		unsent = append(unsent, &r.batch.failed)
	}
	unsent = append(unsent, &r.unsettled.failed)
	var all []outcome
	for _, s := range unsent {
		all = append(all, *s...)
	}
	if len(all) == 0 {
		return
	}
	held, err := l.heldElsewhere(ctx, outcomeJobs(all))
	if err != nil || len(held) == 0 {
		return
	}
	for _, s := range unsent {
		kept := make([]outcome, 0, len(*s))
		for _, o := range *s {
			if held[o.exec.job.ID] {
				r.heldAside = append(r.heldAside, o)
			} else {
				kept = append(kept, o)
			}
		}
		*s = kept
	}
}

// send makes the round's statements, in the order acknowledge describes.
func (r *round) send(ctx context.Context, l leases) {
	if len(r.adopt) > 0 {
		adopted, err := l.getClaimed(ctx, r.adopt)
		if err != nil {
			r.err = fmt.Errorf("find the jobs of a claim whose answer was lost: %w", err)
			return
		}
		r.adopted = adopted
		r.adoptedOK = true
	}
	if len(r.batch.toRelease) > 0 {
		ids, refused, held, err := l.releaseMany(ctx, r.batch.toRelease, nil)
		if err != nil {
			r.err = fmt.Errorf("release jobs claimed ahead: %w", err)
			return
		}
		r.released, r.releaseRefused = ids, refused
		if len(held) > 0 {
			r.releaseHeldAside = held
			r.batch.toRelease = slices.DeleteFunc(r.batch.toRelease, func(e *execution) bool { return slices.Contains(held, e) })
		}
	}
	if r.probe {
		r.sentAt = time.Now()
		ready, err := l.q.JobAnyReady(ctx, l.w.cfg.Queue)
		if err != nil {
			r.err = fmt.Errorf("look for ready jobs: %w", err)
			return
		}
		if !ready {
			return // nothing to claim, and nothing else to acknowledge
		}
	}
	if err := l.completeAndClaim(ctx, r); err != nil {
		r.err = err
		return
	}
	if len(r.batch.failed) > 0 {
		states, settled, err := l.failMany(ctx, r.batch.failed)
		r.failStates = states
		r.unsettled.failed = r.batch.failed[settled:]
		r.batch.failed = r.batch.failed[:settled]
		if err != nil {
			r.err = err
			return
		}
	}
}
