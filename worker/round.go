package worker

import (
	"context"
	"fmt"
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

// take moves everything pending into a new batch.
func (p *pending) take() pending {
	b := *p
	*p = pending{}
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
	// adopted holds the jobs found under the tokens of adopt; adoptedOK is
	// whether the search was made.
	adopted   []db.JobCompleteAndClaimRow
	adoptedOK bool
	// lostClaim holds the tokens of this round's claim if its answer was
	// lost: the claim may have committed.
	lostClaim []pgtype.UUID
	sentAt    time.Time
	err       error
}

// carried counts the outcomes the round carries, whether the database
// answered for them or they are to be sent again.
func (r *round) carried() int { return r.batch.finished() + r.unsettled.finished() }

// acknowledge sends a round: jobs released in a statement of their own,
// then completions and the claim together in one (for a round a poll
// alone sends, only once JobAnyReady has found a job), then failures, so that
// the common case, a job finished and a slot to fill, costs one round trip
// and one commit. A row the database refuses never holds up the others
// (see sendIsolating): a completion whose result it refuses becomes a
// permanent failure of that job. It touches nothing but r, so that it can
// run beside the dispatcher.
func (r *round) acknowledge(ctx context.Context, w *Worker) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.Lease)
	defer cancel()

	if len(r.adopt) > 0 {
		adopted, err := w.leases.getClaimed(ctx, r.adopt)
		if err != nil {
			r.err = fmt.Errorf("find the jobs of a claim whose answer was lost: %w", err)
			return
		}
		r.adopted = adopted
		r.adoptedOK = true
	}
	if len(r.batch.toRelease) > 0 {
		ids, err := w.leases.releaseMany(ctx, r.batch.toRelease, nil)
		if err != nil {
			r.err = fmt.Errorf("release jobs claimed ahead: %w", err)
			return
		}
		r.released = ids
	}
	if r.probe {
		r.sentAt = time.Now()
		ready, err := w.q.JobAnyReady(ctx, w.cfg.Queue)
		if err != nil {
			r.err = fmt.Errorf("look for ready jobs: %w", err)
			return
		}
		if !ready {
			return // nothing to claim, and nothing else to acknowledge
		}
	}
	if err := w.leases.completeAndClaim(ctx, r); err != nil {
		r.err = err
		return
	}
	if len(r.batch.failed) > 0 {
		states, settled, err := w.leases.failMany(ctx, r.batch.failed)
		r.failStates = states
		r.unsettled.failed = r.batch.failed[settled:]
		r.batch.failed = r.batch.failed[:settled]
		if err != nil {
			r.err = err
			return
		}
	}
}
