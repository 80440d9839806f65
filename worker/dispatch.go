package worker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/db"
)

const (
	minRetryDelay = 50 * time.Millisecond
	maxRetryDelay = 2 * time.Second
)

// runMeanWeight is the weight of the newest handler duration in the running
// mean that decides whether the worker claims ahead: 1/8, so that a few
// short jobs after a long one do not switch claiming ahead back on at once.
const runMeanWeight = 8

// pending holds what waits to be sent to the database.
type pending struct {
	done, failed []outcome
	// toHandBack holds jobs claimed ahead that are to be handed back unstarted.
	toHandBack []*execution
}

func (p *pending) empty() bool {
	return len(p.done) == 0 && len(p.failed) == 0 && len(p.toHandBack) == 0
}

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
	p.toHandBack = append(b.toHandBack, p.toHandBack...)
}

// round is one acknowledgement of a batch of outcomes together with a claim
// for the slots that are free, sent as one unit.
type round struct {
	batch pending
	claim int

	// adopt holds the lease tokens of earlier claims whose answer was lost:
	// the jobs still running under them are this worker's to run.
	// adoptSentAt is when the first of those claims was sent.
	adopt       []uuid.UUID
	adoptSentAt time.Time

	// Filled in by acknowledge. handedBack, failStates and completed stay
	// nil unless their statement succeeded.
	handedBack map[int64]bool        // jobs the database took back unstarted
	failStates map[int64]db.JobState // failures the database accepted
	completed  map[int64]bool        // completions the database accepted
	claimed    []db.JobCompleteAndClaimRow
	// adopted holds the jobs found under the tokens of adopt; adoptedOK is
	// whether the search was made.
	adopted   []db.JobCompleteAndClaimRow
	adoptedOK bool
	// lostClaim holds the tokens of this round's claim if its answer was
	// lost: the claim may have committed.
	lostClaim []uuid.UUID
	sentAt    time.Time
	err       error
}

// dispatcher is the state of the loop that claims jobs and acknowledges
// their outcomes. Only the goroutine running dispatch and drain touches it.
type dispatcher struct {
	w *Worker
	p pending
	// meanRun is a running mean of how long handlers take; measured is
	// false until the first one returned.
	meanRun  time.Duration
	measured bool
	// pendingSince is when the oldest outcome in p arrived.
	pendingSince time.Time
	// lostClaims holds the lease tokens of claims whose answer was lost
	// and whose jobs are not found yet; lostSentAt is when the first of
	// them was sent.
	lostClaims []uuid.UUID
	lostSentAt time.Time
}

// newRound takes what is pending, and the claims to look for, into a round
// that claims claim jobs.
func (d *dispatcher) newRound(claim int) *round {
	r := &round{batch: d.p.take(), claim: claim, adopt: d.lostClaims, adoptSentAt: d.lostSentAt}
	d.lostClaims = nil
	return r
}

// loseClaim notes the tokens of a claim sent at sentAt whose answer was
// lost, for a later round to look for.
func (d *dispatcher) loseClaim(tokens []uuid.UUID, sentAt time.Time) {
	if len(d.lostClaims) == 0 || sentAt.Before(d.lostSentAt) {
		d.lostSentAt = sentAt
	}
	d.lostClaims = append(d.lostClaims, tokens...)
}

// aheadLimit is how many jobs the worker may hold claimed beyond its free
// slots now: Config.Prefetch while its handlers are short, otherwise none.
func (d *dispatcher) aheadLimit() int {
	cfg := &d.w.cfg
	if cfg.Prefetch <= 0 || !d.measured || d.meanRun >= cfg.PrefetchWait/2 {
		return 0
	}
	return cfg.Prefetch
}

// dispatch claims jobs for free slots (and ahead of them, see
// Config.Prefetch), starts their handlers and acknowledges their outcomes,
// until ctx is cancelled. It returns once the round in flight, if any, has
// come back.
func (d *dispatcher) dispatch(ctx context.Context) {
	w := d.w
	// roundOut is whether a round is in flight. There is never more than
	// one: the outcomes that arrive while a round's statement commits are
	// then sent together in the next one, and on a small host the
	// database's CPU per statement, not the wait for it, is what limits
	// throughput (relay experiment burst at 3x4 slots, before workers
	// claimed ahead: 750 jobs/s with one round in flight, 690-700 with two,
	// which sent 1.1 jobs per statement against 1.25). With jobs claimed
	// ahead, a slot seldom waits for a round at all. The dispatcher still
	// collects outcomes while a round is out.
	roundOut := false
	rounds := make(chan *round, 1)
	wantClaim := true
	poll := time.NewTimer(w.cfg.PollInterval)
	defer poll.Stop()
	hold := time.NewTimer(time.Hour)
	defer hold.Stop()
	linger := time.NewTimer(time.Hour)
	defer linger.Stop()
	var retry <-chan time.Time
	retryDelay := minRetryDelay

	for {
		held, waiting, oldest := w.holding()
		// No round starts once ctx is done, though select may still pick
		// other ready cases before ctx.Done ends the loop: the jobs such a
		// round claimed would only be handed back.
		if retry == nil && !roundOut && ctx.Err() == nil {
			claim := 0
			if _, ok := w.session.claimSession(); wantClaim && ok {
				claim = max(w.cfg.Slots+d.aheadLimit()-held, 0)
			}
			if d.sendNow(claim, waiting) {
				r := d.newRound(claim)
				roundOut = true
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

		// The oldest job claimed ahead is handed back once it has waited
		// PrefetchWait for a slot.
		var holdC <-chan time.Time
		if waiting > 0 {
			hold.Reset(time.Until(oldest.Add(w.cfg.PrefetchWait)))
			holdC = hold.C
		}
		var lingerC <-chan time.Time
		if d.outcomes() > 0 && !roundOut && retry == nil {
			linger.Reset(time.Until(d.pendingSince.Add(d.linger())))
			lingerC = linger.C
		}

		select {
		case <-lingerC:
		case r := <-rounds:
			roundOut = false
			d.finish(r)
			switch {
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
			d.collect(o)
			wantClaim = true
		case <-holdC:
			d.handBackStale()
		case <-w.wake:
			wantClaim = true
		case <-poll.C:
			wantClaim = true
			poll.Reset(jitter(w.cfg.PollInterval))
		case <-retry:
			retry = nil
		case <-ctx.Done():
			// Jobs the last round claims are held for drain to hand back,
			// not started.
			w.mu.Lock()
			w.stopping = true
			w.mu.Unlock()
			if roundOut {
				d.finish(<-rounds)
			}
			return
		}
	}
}

// holding returns how many jobs the worker holds, how many of them wait for
// a slot, and when the oldest of those was claimed.
func (w *Worker) holding() (held, waiting int, oldest time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.ahead) > 0 {
		oldest = w.ahead[0].claimedAt
	}
	return len(w.held), len(w.ahead), oldest
}

// outcomes counts the outcomes waiting to be acknowledged.
func (d *dispatcher) outcomes() int { return len(d.p.done) + len(d.p.failed) }

// linger is how long an outcome may wait for others to share its
// acknowledgement while the worker claims ahead: half a handler's mean run
// time, at most maxLinger.
func (d *dispatcher) linger() time.Duration { return min(d.meanRun/2, maxLinger) }

// maxLinger bounds how long a finished job's acknowledgement is delayed to
// share its statement with others.
const maxLinger = 5 * time.Millisecond

// sendNow decides whether to send a round now, claiming claim jobs, or to
// let outcomes gather so that one statement acknowledges several. Batching
// costs the database less per job, and costs a slot nothing while it has a
// job claimed ahead to start; so the worker waits only while it claims
// ahead, jobs are waiting for slots, and the outcomes are fewer than a
// quarter of what it may hold and younger than linger. waiting is how many
// jobs wait for a slot.
func (d *dispatcher) sendNow(claim, waiting int) bool {
	n := d.outcomes()
	switch {
	case len(d.lostClaims) > 0:
		return true
	case n == 0 && len(d.p.toHandBack) == 0:
		return claim > 0
	case len(d.p.toHandBack) > 0:
		return true
	}
	limit := d.aheadLimit()
	if limit == 0 {
		return true
	}
	return waiting == 0 ||
		n >= max(1, (d.w.cfg.Slots+limit)/4) ||
		time.Since(d.pendingSince) >= d.linger()
}

// collect files o, and every other outcome already waiting, for the next
// acknowledgement, so that outcomes that arrive together are acknowledged
// in one statement.
func (d *dispatcher) collect(o outcome) {
	w := d.w
	if d.outcomes() == 0 {
		d.pendingSince = time.Now()
	}
	for {
		if o.ran >= 0 {
			d.observe(o.ran)
		}
		w.mu.Lock()
		w.unhold(o.exec)
		w.startedJobs--
		lost := o.exec.lost
		w.mu.Unlock()
		o.exec.cancel(nil)
		switch {
		case lost:
			w.log.Warn("lease lost; outcome of this attempt dropped", "job", o.exec.job.ID,
				"kind", o.exec.job.Kind, "attempt", o.exec.job.Attempt, "handler_err", o.err)
			w.report(o, OutcomeLeaseLost, false)
		case o.err == nil:
			d.p.done = append(d.p.done, o)
		default:
			d.p.failed = append(d.p.failed, o)
		}
		select {
		case o = <-w.outcomes:
		default:
			return
		}
	}
}

// observe adds one handler duration to the running mean.
func (d *dispatcher) observe(ran time.Duration) {
	if !d.measured {
		d.meanRun, d.measured = ran, true
		return
	}
	d.meanRun += (ran - d.meanRun) / runMeanWeight
}

// handBackStale moves the jobs that have waited PrefetchWait for a slot
// into the next round, to be handed back to the queue, and stops claiming
// ahead until handlers are short again.
func (d *dispatcher) handBackStale() {
	w := d.w
	now := time.Now()
	w.mu.Lock()
	n := 0
	for n < len(w.ahead) && now.Sub(w.ahead[n].claimedAt) >= w.cfg.PrefetchWait {
		n++
	}
	stale := w.ahead[:n:n]
	w.ahead = append([]*execution(nil), w.ahead[n:]...)
	w.mu.Unlock()
	if n == 0 {
		return
	}
	w.log.Info("jobs claimed ahead waited too long for a slot; handing them back", "jobs", n, "wait", w.cfg.PrefetchWait)
	d.p.toHandBack = append(d.p.toHandBack, stale...)
	d.meanRun = max(d.meanRun, w.cfg.PrefetchWait)
}

// acknowledge sends a round: jobs handed back in a statement of their own,
// then completions and the claim together in one, then failures, so that
// the common case, a job finished and a slot to fill, costs one round trip
// and one commit. A row the database refuses never holds up the others
// (see sendIsolating): a completion whose result it refuses becomes a
// permanent failure of that job. It touches nothing but r, so that it can
// run beside the dispatcher.
func (w *Worker) acknowledge(ctx context.Context, r *round) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.Lease)
	defer cancel()

	if len(r.adopt) > 0 {
		rows, err := w.q.JobGetClaimed(ctx, r.adopt)
		if err != nil {
			r.err = fmt.Errorf("find the jobs of a claim whose answer was lost: %w", err)
			return
		}
		for _, row := range rows {
			r.adopted = append(r.adopted, claimedRow(row))
		}
		r.adoptedOK = true
	}
	if len(r.batch.toHandBack) > 0 {
		ids, err := w.handBack(ctx, r.batch.toHandBack, nil)
		if err != nil {
			r.err = fmt.Errorf("hand back jobs claimed ahead: %w", err)
			return
		}
		r.handedBack = ids
	}
	if err := w.completeAndClaim(ctx, r); err != nil {
		r.err = err
		return
	}
	if len(r.batch.failed) > 0 {
		states, err := w.fail(ctx, r.batch.failed)
		if err != nil {
			r.err = err
			return
		}
		r.failStates = states
	}
}

// completeAndClaim records the round's completions and makes its claim, in
// one statement (JobCompleteAndClaim). If the database refuses the result
// of a completion, the completions are sent again apart from the claim,
// isolating the refused ones, which move to the round's failures; the
// claim is then made on its own.
func (w *Worker) completeAndClaim(ctx context.Context, r *round) error {
	done := r.batch.done
	r.completed = make(map[int64]bool, len(done))
	claimed, err := w.sendCompleteAndClaim(ctx, r, done, r.claim)
	if err == nil {
		r.claimed = claimed
		return nil
	}
	if !isRowDataError(err) || len(done) == 0 {
		r.completed = nil
		return fmt.Errorf("complete and claim: %w", err)
	}
	refused, err := sendIsolating(ctx, done, func(ctx context.Context, part []outcome) error {
		_, err := w.sendCompleteAndClaim(ctx, r, part, 0)
		return err
	})
	if err != nil {
		r.completed = nil
		return fmt.Errorf("complete jobs: %w", err)
	}
	if len(refused) > 0 {
		kept := make([]outcome, 0, len(done)-len(refused))
		for i, o := range done {
			if rerr, ok := refused[i]; ok {
				w.log.Error("the database refused a job's result; failing the job", "job", o.exec.job.ID, "kind", o.exec.job.Kind, "err", rerr)
				o.err = Permanent(fmt.Errorf("result refused by the database: %s", refusalText(rerr)))
				o.result = nil
				r.batch.failed = append(r.batch.failed, o)
				continue
			}
			kept = append(kept, o)
		}
		r.batch.done = kept
	}
	if r.claimed, err = w.sendCompleteAndClaim(ctx, r, nil, r.claim); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	return nil
}

// sendCompleteAndClaim runs JobCompleteAndClaim for done and a claim of up
// to claim jobs under the worker's session, marks in r.completed the
// completions the database accepted, and returns the jobs claimed. The
// claim's lease tokens are drawn here; if the answer is lost, they are left
// in r.lostClaim, for the next round to find the jobs they hold.
func (w *Worker) sendCompleteAndClaim(ctx context.Context, r *round, done []outcome, claim int) ([]db.JobCompleteAndClaimRow, error) {
	session, ok := w.session.claimSession()
	if !ok {
		claim = 0
	}
	params := db.JobCompleteAndClaimParams{
		CompleteIDs:     make([]int64, len(done)),
		CompleteTokens:  make([]uuid.UUID, len(done)),
		CompleteResults: make([]json.RawMessage, len(done)),
		SessionKey:      session,
		Queue:           w.cfg.Queue,
		ClaimTokens:     make([]uuid.UUID, claim),
		LeaseMs:         w.cfg.Lease.Milliseconds(),
		WorkerID:        w.cfg.ID,
	}
	for i, o := range done {
		params.CompleteIDs[i] = o.exec.job.ID
		params.CompleteTokens[i] = o.exec.token
		params.CompleteResults[i] = o.result
	}
	for i := range params.ClaimTokens {
		token, err := uuid.NewRandom()
		if err != nil {
			return nil, fmt.Errorf("draw a lease token: %w", err)
		}
		params.ClaimTokens[i] = token
	}
	r.sentAt = time.Now()
	rows, err := w.q.JobCompleteAndClaim(ctx, params)
	if err != nil {
		if claim > 0 && answerLost(err) {
			r.lostClaim = params.ClaimTokens
		}
		return nil, err
	}
	if len(rows) > 0 {
		for _, id := range rows[0].CompletedIDs {
			r.completed[id] = true
		}
	}
	var claimed []db.JobCompleteAndClaimRow
	for _, row := range rows {
		if row.ID != nil {
			claimed = append(claimed, row)
		}
	}
	return claimed, nil
}

// handBack hands the jobs of execs back to the queue (JobReleaseMany),
// with note in their error history if it is not nil, and returns those the
// database took back. A job the database refuses to take back is left to
// its lease.
func (w *Worker) handBack(ctx context.Context, execs []*execution, note *string) (map[int64]bool, error) {
	taken := make(map[int64]bool, len(execs))
	refused, err := sendIsolating(ctx, execs, func(ctx context.Context, part []*execution) error {
		params := db.JobReleaseManyParams{Note: note, IDs: make([]int64, len(part)), Tokens: make([]uuid.UUID, len(part))}
		for i, e := range part {
			params.IDs[i] = e.job.ID
			params.Tokens[i] = e.token
		}
		ids, err := w.q.JobReleaseMany(ctx, params)
		for _, id := range ids {
			taken[id] = true
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	for i, rerr := range refused {
		w.log.Error("the database refused to take a job back; its lease will expire", "job", execs[i].job.ID, "err", rerr)
	}
	return taken, nil
}

// fail records failed outcomes, each with its retry delay, and returns the
// state each accepted failure moved its job to. A failure the database
// refuses to record is left to the job's lease.
func (w *Worker) fail(ctx context.Context, failed []outcome) (map[int64]db.JobState, error) {
	states := make(map[int64]db.JobState, len(failed))
	refused, err := sendIsolating(ctx, failed, func(ctx context.Context, part []outcome) error {
		params := db.JobFailManyParams{
			IDs:       make([]int64, len(part)),
			Tokens:    make([]uuid.UUID, len(part)),
			Errors:    make([]string, len(part)),
			Permanent: make([]bool, len(part)),
			RetryInMs: make([]int64, len(part)),
		}
		for i, o := range part {
			params.IDs[i] = o.exec.job.ID
			params.Tokens[i] = o.exec.token
			params.Errors[i] = errorText(o.err, MaxErrorLength)
			params.Permanent[i] = IsPermanent(o.err)
			params.RetryInMs[i] = w.cfg.Backoff(o.exec.job.Attempt).Milliseconds()
		}
		rows, err := w.q.JobFailMany(ctx, params)
		for _, r := range rows {
			states[r.ID] = r.State
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("record failures: %w", err)
	}
	for i, rerr := range refused {
		w.log.Error("the database refused to record a failure; the job's lease will expire", "job", failed[i].exec.job.ID, "err", rerr)
	}
	return states, nil
}

// finish reports what became of a round's outcomes, starts the jobs it
// claimed (or holds them ahead), and puts back in the pending batch
// whatever must be sent again: each part of a round whose statement did
// not complete.
func (d *dispatcher) finish(r *round) {
	w := d.w
	var retry pending
	if r.handedBack != nil {
		w.mu.Lock()
		for _, e := range r.batch.toHandBack {
			w.unhold(e)
		}
		w.mu.Unlock()
		for _, e := range r.batch.toHandBack {
			e.cancel(nil)
			w.log.Debug("handed back job claimed ahead", "job", e.job.ID, "accepted", r.handedBack[e.job.ID])
		}
	} else {
		retry.toHandBack = r.batch.toHandBack
	}
	if r.failStates != nil {
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
	} else {
		retry.failed = r.batch.failed
	}
	if r.completed != nil {
		for _, o := range r.batch.done {
			ok := r.completed[o.exec.job.ID]
			if !ok {
				w.log.Warn("completion rejected: the lease is no longer this worker's", "job", o.exec.job.ID, "attempt", o.exec.job.Attempt)
			}
			w.report(o, OutcomeCompleted, ok)
		}
	} else {
		retry.done = r.batch.done
	}
	d.p.restore(retry)
	if len(r.adopt) > 0 && !r.adoptedOK {
		d.loseClaim(r.adopt, r.adoptSentAt)
	}
	if len(r.lostClaim) > 0 {
		w.log.Warn("the answer to a claim was lost; looking for the jobs it claimed", "tokens", len(r.lostClaim))
		d.loseClaim(r.lostClaim, r.sentAt)
	}
	if len(r.adopted) > 0 {
		w.log.Info("adopted the jobs of a claim whose answer was lost", "jobs", len(r.adopted))
	}
	if len(r.claimed)+len(r.adopted) == 0 {
		return
	}
	claimed := make([]*execution, 0, len(r.claimed)+len(r.adopted))
	for _, row := range r.claimed {
		claimed = append(claimed, w.newExecution(row, r.sentAt))
	}
	for _, row := range r.adopted {
		// Its lease runs from when the lost claim was sent.
		claimed = append(claimed, w.newExecution(row, r.adoptSentAt))
	}
	var superseded []*execution
	w.mu.Lock()
	for _, e := range claimed {
		// A job claimed again while this worker still holds an older
		// attempt of it: that attempt's lease is gone.
		if old, ok := w.held[e.job.ID]; ok && !old.lost {
			old.lost = true
			superseded = append(superseded, old)
		}
		w.held[e.job.ID] = e
	}
	stopping := w.stopping
	spawn := 0
	if !stopping {
		w.ahead = append(w.ahead, claimed...)
		// Free slots start the new jobs; slots that are busy take them as
		// their handlers return.
		spawn = min(w.cfg.Slots-w.slotsBusy, len(w.ahead))
		w.slotsBusy += spawn
	}
	w.mu.Unlock()
	if stopping {
		// Claimed as the worker began to stop: handed back unstarted.
		d.p.toHandBack = append(d.p.toHandBack, claimed...)
	}
	for _, old := range superseded {
		w.log.Warn("lease lost; cancelling handler", "job", old.job.ID, "attempt", old.job.Attempt, "why", "the job was claimed again")
		old.cancel(ErrLeaseLost)
	}
	for range spawn {
		go w.runSlot()
	}
}

// answerLost reports whether err leaves it unknown whether the statement
// committed: it was sent, and no answer from the server came back (the
// connection failed, or the wait for the answer timed out). An error the
// server answered with means the statement did not commit.
func answerLost(err error) bool {
	var pgErr *pgconn.PgError
	return !errors.As(err, &pgErr) && !pgconn.SafeToRetry(err)
}

// claimedRow is a job found by JobGetClaimed, in the shape of a claim.
func claimedRow(r db.JobGetClaimedRow) db.JobCompleteAndClaimRow {
	return db.JobCompleteAndClaimRow{
		ID: &r.ID, Queue: &r.Queue, Kind: &r.Kind, Payload: r.Payload, Priority: &r.Priority,
		Attempt: &r.Attempt, MaxAttempts: &r.MaxAttempts, Fence: &r.Fence, LeaseToken: r.LeaseToken,
		LeaseExpiresAt: r.LeaseExpiresAt, CreatedAt: &r.CreatedAt, RunAt: &r.RunAt, StartedAt: r.StartedAt,
	}
}

// newExecution makes the execution of a job just claimed.
func (w *Worker) newExecution(r db.JobCompleteAndClaimRow, sentAt time.Time) *execution {
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
	return &execution{job: job, token: deref(r.LeaseToken), ctx: ctx, cancel: cancel,
		renewedAt: sentAt, claimedAt: time.Now()}
}
