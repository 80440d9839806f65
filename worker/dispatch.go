package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/relayq/relay/db"
)

// maxRoundsInFlight is how many acknowledge-and-claim statements a worker
// keeps in flight at once. One: the outcomes that arrive while a statement
// commits are then sent together in the next one, and on a small host the
// database's CPU per statement, not the wait for it, is what limits
// throughput (relay experiment burst at 3x4 slots: 750 jobs/s with one
// round in flight, 690-700 with two, which sent 1.1 jobs per statement
// against 1.25).
// The dispatcher still collects outcomes while a round is out.
const maxRoundsInFlight = 1

const (
	minRetryDelay = 50 * time.Millisecond
	maxRetryDelay = 2 * time.Second
)

// pending holds outcomes waiting to be acknowledged. Only the goroutine
// running Run touches it.
type pending struct {
	done, failed []outcome
}

func (p *pending) empty() bool { return len(p.done) == 0 && len(p.failed) == 0 }

// take moves every pending outcome into a new batch.
func (p *pending) take() pending {
	b := *p
	*p = pending{}
	return b
}

// restore puts a batch that could not be acknowledged back in front.
func (p *pending) restore(b pending) {
	p.done = append(b.done, p.done...)
	p.failed = append(b.failed, p.failed...)
}

// round is one acknowledgement of a batch of outcomes together with a claim
// for the slots that are free, sent as one unit.
type round struct {
	batch pending
	claim int

	// Filled in by acknowledge.
	failStates map[int64]db.JobState // failures the database accepted
	failsSent  bool
	completed  map[int64]bool // completions the database accepted
	claimed    []db.JobCompleteAndClaimRow
	sentAt     time.Time
	err        error
}

// dispatch claims jobs for free slots, starts their handlers and
// acknowledges their outcomes, until ctx is cancelled. It returns once the
// rounds it started have come back.
func (w *Worker) dispatch(ctx context.Context, p *pending) {
	rounds := make(chan *round, maxRoundsInFlight)
	inFlight, reserved := 0, 0 // rounds in flight, and the slots they claim for
	wantClaim := true
	poll := time.NewTimer(w.cfg.PollInterval)
	defer poll.Stop()
	var retry <-chan time.Time
	retryDelay := minRetryDelay

	for {
		if retry == nil && inFlight < maxRoundsInFlight {
			claim := 0
			if wantClaim && w.sessionUp.Load() {
				claim = w.cfg.Slots - w.numRunning() - reserved
			}
			if !p.empty() || claim > 0 {
				r := &round{batch: p.take(), claim: claim}
				inFlight++
				reserved += claim
				if claim > 0 {
					// Until this round says whether the queue had enough.
					wantClaim = false
				}
				go func() {
					w.acknowledge(ctx, r)
					rounds <- r
				}()
			}
		}

		select {
		case r := <-rounds:
			inFlight--
			reserved -= r.claim
			w.finish(r, p)
			switch {
			case r.err != nil && ctx.Err() != nil:
			case r.err != nil:
				w.log.Warn("acknowledge or claim failed; will retry", "err", r.err, "retry_in", retryDelay)
				retry = time.After(retryDelay)
				retryDelay = min(2*retryDelay, maxRetryDelay)
				wantClaim = true
			default:
				retryDelay = minRetryDelay
				if r.claim > 0 && len(r.claimed) == r.claim {
					// A full claim: the queue may hold more.
					wantClaim = true
				}
			}
		case o := <-w.outcomes:
			w.collect(o, p)
			wantClaim = true
		case <-w.wake:
			wantClaim = true
		case <-poll.C:
			wantClaim = true
			poll.Reset(jitter(w.cfg.PollInterval))
		case <-retry:
			retry = nil
		case <-ctx.Done():
			for ; inFlight > 0; inFlight-- {
				w.finish(<-rounds, p)
			}
			return
		}
	}
}

// collect files o, and every other outcome already waiting, for the next
// acknowledgement, so that outcomes that arrive together are acknowledged
// in one statement.
func (w *Worker) collect(o outcome, p *pending) {
	for {
		w.mu.Lock()
		delete(w.running, o.exec.job.ID)
		lost := o.exec.lost
		w.mu.Unlock()
		o.exec.cancel(nil)
		switch {
		case lost:
			w.log.Warn("lease lost; outcome of this attempt dropped", "job", o.exec.job.ID,
				"kind", o.exec.job.Kind, "attempt", o.exec.job.Attempt, "handler_err", o.err)
			w.report(o, OutcomeLeaseLost, false)
		case o.err == nil:
			p.done = append(p.done, o)
		default:
			p.failed = append(p.failed, o)
		}
		select {
		case o = <-w.outcomes:
		default:
			return
		}
	}
}

// acknowledge sends a round: failures in one statement, then completions and
// the claim together in another, so that the common case, a job finished
// and a slot to fill, costs one round trip and one commit. It touches
// nothing but r, so that it can run beside the dispatcher.
func (w *Worker) acknowledge(ctx context.Context, r *round) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.Lease)
	defer cancel()

	if len(r.batch.failed) > 0 {
		states, err := w.fail(ctx, r.batch.failed)
		if err != nil {
			r.err = err
			return
		}
		r.failStates, r.failsSent = states, true
	}

	done := r.batch.done
	params := db.JobCompleteAndClaimParams{
		CompleteIds:     make([]int64, len(done)),
		CompleteTokens:  make([]uuid.UUID, len(done)),
		CompleteResults: make([]json.RawMessage, len(done)),
		Queue:           w.cfg.Queue,
		MaxJobs:         int32(r.claim),
		LeaseMs:         w.cfg.Lease.Milliseconds(),
		WorkerID:        w.cfg.ID,
	}
	for i, o := range done {
		params.CompleteIds[i] = o.exec.job.ID
		params.CompleteTokens[i] = o.exec.token
		params.CompleteResults[i] = o.result
	}
	r.sentAt = time.Now()
	rows, err := w.q.JobCompleteAndClaim(ctx, params)
	if err != nil {
		r.err = fmt.Errorf("complete and claim: %w", err)
		return
	}
	r.completed = make(map[int64]bool, len(done))
	if len(rows) > 0 {
		for _, id := range rows[0].CompletedIds {
			r.completed[id] = true
		}
	}
	for _, row := range rows {
		if row.ID != nil {
			r.claimed = append(r.claimed, row)
		}
	}
}

// fail records failed outcomes, each with its retry delay, and returns the
// state each accepted failure moved its job to.
func (w *Worker) fail(ctx context.Context, failed []outcome) (map[int64]db.JobState, error) {
	params := db.JobFailManyParams{
		Ids:       make([]int64, len(failed)),
		Tokens:    make([]uuid.UUID, len(failed)),
		Errors:    make([]string, len(failed)),
		Permanent: make([]bool, len(failed)),
		RetryInMs: make([]int64, len(failed)),
	}
	for i, o := range failed {
		params.Ids[i] = o.exec.job.ID
		params.Tokens[i] = o.exec.token
		params.Errors[i] = errorText(o.err, MaxErrorLength)
		params.Permanent[i] = IsPermanent(o.err)
		params.RetryInMs[i] = w.cfg.Backoff(o.exec.job.Attempt).Milliseconds()
	}
	rows, err := w.q.JobFailMany(ctx, params)
	if err != nil {
		return nil, fmt.Errorf("record failures: %w", err)
	}
	states := make(map[int64]db.JobState, len(rows))
	for _, r := range rows {
		states[r.ID] = r.State
	}
	return states, nil
}

// finish reports what became of a round's outcomes, starts the jobs it
// claimed, and puts back in p whatever must be sent again.
func (w *Worker) finish(r *round, p *pending) {
	if r.failsSent {
		for _, o := range r.batch.failed {
			state, ok := r.failStates[o.exec.job.ID]
			if ok {
				w.log.Info("job failed", "job", o.exec.job.ID, "kind", o.exec.job.Kind,
					"attempt", o.exec.job.Attempt, "now", state, "err", o.err)
			} else {
				w.log.Warn("failure rejected: the lease is no longer this worker's", "job", o.exec.job.ID, "attempt", o.exec.job.Attempt)
			}
			w.report(o, OutcomeFailed, ok)
		}
		r.batch.failed = nil
	}
	if r.err != nil {
		p.restore(r.batch)
		return
	}
	for _, o := range r.batch.done {
		ok := r.completed[o.exec.job.ID]
		if !ok {
			w.log.Warn("completion rejected: the lease is no longer this worker's", "job", o.exec.job.ID, "attempt", o.exec.job.Attempt)
		}
		w.report(o, OutcomeCompleted, ok)
	}
	for _, row := range r.claimed {
		w.start(row, r.sentAt)
	}
}

// start runs the handler of a claimed job in its own goroutine.
func (w *Worker) start(r db.JobCompleteAndClaimRow, sentAt time.Time) {
	job := Job{
		ID:          *r.ID,
		Queue:       deref(r.Queue),
		Kind:        deref(r.Kind),
		Payload:     r.Payload,
		Priority:    deref(r.Priority),
		Attempt:     int(deref(r.Attempt)),
		MaxAttempts: int(deref(r.MaxAttempts)),
		Fence:       deref(r.Fence),
		WorkerID:    w.cfg.ID,
	}
	if r.CreatedAt != nil {
		job.CreatedAt = *r.CreatedAt
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	e := &execution{job: job, token: deref(r.LeaseToken), ctx: ctx, cancel: cancel, renewedAt: sentAt}
	w.mu.Lock()
	w.running[job.ID] = e
	w.mu.Unlock()
	go w.execute(e)
}
