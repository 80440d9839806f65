package worker

import (
	"context"
	"math/bits"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

const (
	minRetryDelay = 50 * time.Millisecond
	maxRetryDelay = 2 * time.Second
)

// roundRetryMax is the longest a worker waits to send a round again after
// one failed: a quarter of the heartbeat interval, as for a renewal, so
// that a database back before a finished job's lease runs out, which no
// heartbeat renews once its handler has returned, records its outcome;
// maxRetryDelay at most, so that a long lease does not keep a worker from
// claiming long after the database is back; and minRetryDelay at least,
// the wait before the first try again.
func (c Config) roundRetryMax() time.Duration {
	return min(max(c.HeartbeatInterval/4, minRetryDelay), maxRetryDelay)
}

// runMeanWeight is the weight of the newest handler duration in the running
// mean that decides whether the worker claims ahead: 1/8, so that a few
// short jobs after a long one do not switch claiming ahead back on at once.
const runMeanWeight = 8

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
	lostClaims []pgtype.UUID
	lostSentAt time.Time
	// recheckedFor is the Worker.returned that the rechecks counted in
	// rechecks were made for.
	recheckedFor int64
	rechecks     int
	// held holds the outcomes set aside because another transaction held
	// their jobs' rows (round.heldAside), and heldAt when a round last
	// found one held: a round sent heldRecheck after that asks again, and
	// one is sent then for the purpose if no other is (recheckDue).
	held   []outcome
	heldAt time.Time
	// heldReleases holds the jobs claimed ahead whose release was set
	// aside for the same reason (round.releaseHeldAside), asked about again
	// with held.
	heldReleases []*execution
	// graceEnd is when the shutdown's grace period ends, Config.ShutdownGrace
	// after dispatch saw its context end.
	graceEnd time.Time
}

// heldRecheck is how long outcomes set aside for a row another
// transaction holds wait before a round asks again whether it is held.
const heldRecheck = 250 * time.Millisecond

// newRound takes what is pending, and the claims to look for, into a round
// that claims claim jobs.
func (d *dispatcher) newRound(claim int) *round {
	r := &round{batch: d.p.take(), claim: claim, adopt: d.lostClaims, adoptSentAt: d.lostSentAt}
	d.lostClaims = nil
	if d.recheckDue() {
		r.recheck, d.held = d.held, nil
		r.releaseRecheck, d.heldReleases = d.heldReleases, nil
	}
	return r
}

// setAsideCount counts the outcomes and releases set aside for rows
// another transaction held.
func (d *dispatcher) setAsideCount() int { return len(d.held) + len(d.heldReleases) }

// recheckDue is whether a round is to ask again about what is set aside:
// heldRecheck has passed since a round last found a row held.
func (d *dispatcher) recheckDue() bool {
	return d.setAsideCount() > 0 && time.Since(d.heldAt) >= heldRecheck
}

// loseClaim notes the tokens of a claim sent at sentAt whose answer was
// lost, for a later round to look for.
func (d *dispatcher) loseClaim(tokens []pgtype.UUID, sentAt time.Time) {
	if len(d.lostClaims) == 0 || sentAt.Before(d.lostSentAt) {
		d.lostSentAt = sentAt
	}
	d.lostClaims = append(d.lostClaims, tokens...)
}

// aheadLimit is how many jobs the worker may hold claimed beyond its free
// slots now: while its handlers are short, Config.Prefetch, but no more
// than its slots start within PrefetchWait/2 at the handlers' mean run
// time, so that a job claimed ahead is not released only for waiting
// behind the others; otherwise none.
func (d *dispatcher) aheadLimit() int {
	cfg := &d.w.cfg
	if cfg.Prefetch <= 0 || !d.measured || d.meanRun >= cfg.PrefetchWait/2 {
		return 0
	}
	if d.meanRun <= 0 {
		return cfg.Prefetch
	}
	// slots·PrefetchWait/2 may pass an int64 when the wait is long.
	hi, lo := bits.Mul64(uint64(cfg.Slots), uint64(cfg.PrefetchWait/2))
	if hi >= uint64(d.meanRun) {
		return cfg.Prefetch
	}
	startable, _ := bits.Div64(hi, lo, uint64(d.meanRun))
	return int(min(uint64(cfg.Prefetch), startable))
}

// claimWant is whether, and why, the dispatcher means to claim with its
// next round.
type claimWant int

const (
	// claimNone: the queue holds nothing for the worker, as far as it
	// knows.
	claimNone claimWant = iota
	// claimPolled: a poll alone asks, with nothing to say the queue holds
	// a job, so the round claims only once JobAnyReady finds one
	// (round.probe).
	claimPolled
	// claimTold: the worker's start, a notification, a full claim, a
	// completion of a worker not told of new jobs, a recheck or a failed
	// round says the queue may hold a job.
	claimTold
)

// dispatch claims jobs for free slots (and ahead of them, see
// Config.Prefetch), starts their handlers and acknowledges their outcomes,
// until ctx is cancelled, which starts the grace period. It returns once
// the rounds in flight, if any, have come back, or have been given up as
// the grace period ended.
func (d *dispatcher) dispatch(ctx context.Context) {
	w := d.w
	// A round outlives ctx, so that the jobs it claims as the worker
	// begins to stop are known, to be released, and its outcomes recorded;
	// but not the grace period: at its end, the rounds still in flight are
	// given up, and what they carried is sent again by drain.
	roundCtx, abandonRounds := context.WithCancel(context.WithoutCancel(ctx))
	defer abandonRounds()
	// roundsOut counts the rounds in flight, and claimsOut the jobs they
	// may bring back: those they claim, and those of the lost claims whose
	// tokens they look for (see loseClaim). The tokens of lost claims not
	// yet looked for count as jobs held too: each may have claimed one,
	// and until a round finds them the worker does not know which. A
	// second round starts only beside a first, once enough
	// outcomes have gathered behind it (see sendBeside): one statement at
	// a time keeps a backend, and so one of the server's cores, busy at
	// most, and that is what bounds one worker of many slots with short
	// jobs. With few slots, the outcomes that arrive while a round's
	// statement commits are sent together in the next one, since on a
	// small host the database's CPU per statement, not the wait for it,
	// is what limits throughput (relay experiment burst at 3x4 slots,
	// before workers claimed ahead: 750 jobs/s with one round in flight,
	// 690-700 with two for every outcome, which sent 1.1 jobs per
	// statement against 1.25). The dispatcher still collects outcomes
	// while rounds are out.
	//
	// finishedOut counts the outcomes the rounds in flight carry: their
	// jobs stay leased to this worker until their round commits, so a
	// claim sent beside a round that claims nothing still keeps the
	// worker's leases within its slots and what it may claim ahead.
	roundsOut, claimsOut, finishedOut := 0, 0, 0
	rounds := make(chan *round, maxRoundsOut)
	want := claimTold
	poll := time.NewTimer(w.cfg.PollInterval)
	defer poll.Stop()
	// pollDue is when poll fires, and told whether the worker was told of
	// new jobs when it was set: a worker told of them waits longer between
	// polls in a large fleet (pollEvery), and one that stops being told,
	// its session lost and its seat taken by another, does not wait out
	// that longer wait, since its polls are now how it finds new jobs.
	pollDue, told := time.Now().Add(w.cfg.PollInterval), w.session.told()
	hold := time.NewTimer(time.Hour)
	defer hold.Stop()
	linger := time.NewTimer(time.Hour)
	defer linger.Stop()
	// heldDue fires when a recheck of what is set aside is due (recheckDue):
	// a worker whose slots are all busy sends no round for a claim, and
	// without one a completion set aside would wait past its lease though
	// its row was freed, and a release set aside would keep its job from
	// every other worker.
	heldDue := time.NewTimer(time.Hour)
	defer heldDue.Stop()
	var retry <-chan time.Time
	retryMax := w.cfg.roundRetryMax()
	retryDelay := minRetryDelay
	// recheck fires when a claim is to look again for a job that came
	// back to the queue (see recheckReturned).
	var recheck <-chan time.Time
	// fromHead fires when a claim from the head is due after a claim
	// from the cursors came back short: a job behind them, such as one
	// inserted by a transaction that began long before it committed, is
	// announced as any other, and the claim the announcement caused
	// stepped over it. Without a look from the head it would wait for
	// the next poll, which in a large fleet, or at a long PollInterval,
	// comes far later than a second.
	var fromHead <-chan time.Time

	for {
		if now := w.session.told(); now != told {
			told = now
			if every := jitter(w.pollEvery()); !told && time.Until(pollDue) > every {
				poll.Reset(every)
				pollDue = time.Now().Add(every)
			}
		}
		held, waiting, oldest := w.holding()
		// A job whose release is set aside is held on its way out: it
		// takes no slot and is not waiting for one.
		held -= w.stillHolding(d.heldReleases)
		// No round starts once ctx is done, though select may still pick
		// other ready cases before ctx.Done ends the loop: the jobs such a
		// round claimed would only be released.
		if retry == nil && roundsOut < maxRoundsOut && ctx.Err() == nil {
			claim := 0
			if _, ok := w.session.claimSession(); want != claimNone && ok {
				claim = max(w.cfg.Slots+d.aheadLimit()-held-claimsOut-finishedOut-len(d.lostClaims), 0)
			}
			var send bool
			if roundsOut == 0 {
				send = d.sendNow(want != claimNone, claim, held, waiting)
			} else {
				send = d.sendBeside()
			}
			if send {
				r := d.newRound(claim)
				r.probe = want == claimPolled && claim > 0 && r.batch.empty() && len(r.adopt) == 0 && len(r.recheck) == 0
				roundsOut++
				claimsOut += claim + len(r.adopt)
				finishedOut += r.carried()
				if claim > 0 {
					// Until this round says whether the queue had enough.
					want = claimNone
				}
				go func() {
					r.acknowledge(roundCtx, w)
					rounds <- r
				}()
			}
		}

		// The oldest job claimed ahead is released once it has waited
		// PrefetchWait for a slot.
		var holdC <-chan time.Time
		if waiting > 0 {
			hold.Reset(time.Until(oldest.Add(w.cfg.PrefetchWait)))
			holdC = hold.C
		}
		var lingerC <-chan time.Time
		if d.outcomes() > 0 && roundsOut == 0 && retry == nil {
			linger.Reset(time.Until(d.pendingSince.Add(d.linger())))
			lingerC = linger.C
		}

		var heldDueC <-chan time.Time
		if d.setAsideCount() > 0 && roundsOut == 0 && retry == nil {
			heldDue.Reset(time.Until(d.heldAt.Add(heldRecheck)))
			heldDueC = heldDue.C
		}

		select {
		case <-lingerC:
		case <-heldDueC:
		case r := <-rounds:
			roundsOut--
			claimsOut -= r.claim + len(r.adopt)
			finishedOut -= r.carried()
			d.finish(r)
			switch {
			case r.err != nil:
				w.log.Warn("acknowledge or claim failed; will retry", "err", r.err, "retry_in", retryDelay)
				retry = time.After(retryDelay)
				retryDelay = min(2*retryDelay, retryMax)
				want = claimTold
			default:
				retryDelay = minRetryDelay
				if r.claim > 0 && len(r.claimed) == r.claim {
					// A full claim: the queue may hold more.
					want = claimTold
				} else if recheck == nil {
					if delay, ok := d.recheckReturned(r); ok {
						recheck = time.After(delay)
					}
				}
				// Unless the next poll comes first: its claim, if it
				// too comes back short from the cursors, sets it then.
				if due := w.cursors.due(); r.fromCursors && len(r.claimed) < r.claim && fromHead == nil && pollDue.After(due) {
					fromHead = time.After(time.Until(due))
				}
			}
		case o := <-w.outcomes:
			d.collect(o)
			// A slot is free, but the queue is known to hold more only
			// after a full claim, a notification or a poll, each of which
			// sets want. A worker that is not told of new jobs looks
			// with every completion, as it would otherwise look only at
			// its next poll.
			if !w.session.told() {
				want = claimTold
			}
		case <-holdC:
			d.releaseStale()
		case <-w.wake:
			want = claimTold
		case <-poll.C:
			want = max(want, claimPolled)
			every := jitter(w.pollEvery())
			poll.Reset(every)
			pollDue, told = time.Now().Add(every), w.session.told()
		case <-recheck:
			recheck = nil
			want = claimTold
			w.cursors.fromHead()
		case <-fromHead:
			fromHead = nil
			// As a poll: a claim only if JobAnyReady finds a job.
			want = max(want, claimPolled)
		case <-retry:
			retry = nil
		case <-ctx.Done():
			d.graceEnd = time.Now().Add(max(w.cfg.ShutdownGrace, 0))
			// Jobs the last round claims are held for drain to release,
			// not started.
			w.mu.Lock()
			w.stopping = true
			w.mu.Unlock()
			d.awaitRounds(rounds, roundsOut, abandonRounds)
			return
		}
	}
}

// awaitRounds waits for the n rounds in flight as the worker stops, and
// finishes each. A database that does not answer them does not stretch the
// grace period: at its end, abandon gives them up, though not before
// minRoundWait, so that a short grace, or none, does not cancel a round
// a healthy database is answering. Each then comes back at once, its
// outcomes and releases to be sent again, and its claim, which may have
// committed, to be looked for, as for any round the database did not
// answer; drain does so while their leases last.
func (d *dispatcher) awaitRounds(rounds <-chan *round, n int, abandon context.CancelFunc) {
	giveUp := d.graceEnd
	if floor := time.Now().Add(minRoundWait); giveUp.Before(floor) {
		giveUp = floor
	}
	grace := time.NewTimer(time.Until(giveUp))
	defer grace.Stop()
	for n > 0 {
		select {
		case r := <-rounds:
			n--
			d.finish(r)
		case <-grace.C:
			d.w.log.Warn("the grace period ended with acknowledgements in flight; giving them up, to send again, though they may have landed", "rounds", n)
			abandon()
		}
	}
}

// minRoundWait is the least time a worker that stops waits for the rounds
// it has in flight, whatever its grace period, and for the release of the
// handlers still running, whatever its heartbeat interval: longer than a
// healthy database takes to answer one.
const minRoundWait = time.Second

// returnedRecheckDelay is how long after a short claim the first recheck
// (recheckReturned) looks again, and maxReturnedRechecks how many it
// makes, each waiting twice as long as the one before.
const (
	returnedRecheckDelay = 50 * time.Millisecond
	maxReturnedRechecks  = 2
)

// recheckReturned decides whether, and how soon, the worker looks again
// for a job after a claim that came back short though a job of its queue
// had just come back to available (Worker.returned, at or before the
// claim was sent). A job taken back is not told of again, and the claim
// may have skipped it: another worker's reclaim that began before the job
// was taken back finds it no longer abandoned, but holds its row locked
// until that statement commits (a row locked FOR UPDATE stays locked when
// the recheck on its newest version fails), and a claim skips locked rows.
// Without a recheck the job would wait for the next poll. Each job that
// comes back earns maxReturnedRechecks rechecks at most.
func (d *dispatcher) recheckReturned(r *round) (time.Duration, bool) {
	at := d.w.returned.Load()
	if r.claim == 0 || at == 0 || r.sentAt.UnixNano() < at {
		return 0, false
	}
	if at != d.recheckedFor {
		d.recheckedFor, d.rechecks = at, 0
	}
	if d.rechecks >= maxReturnedRechecks {
		return 0, false
	}
	d.rechecks++
	return returnedRecheckDelay << (d.rechecks - 1), true
}

// outcomes counts the outcomes waiting to be acknowledged.
func (d *dispatcher) outcomes() int { return d.p.finished() }

// linger is how long an outcome may wait for others to share its
// acknowledgement while the worker claims ahead or has nothing to claim:
// half a handler's mean run time, at most maxLinger.
func (d *dispatcher) linger() time.Duration { return min(d.meanRun/2, maxLinger) }

// maxLinger bounds how long a finished job's acknowledgement is delayed to
// share its statement with others.
const maxLinger = 5 * time.Millisecond

// sendNow decides whether to send a round now, claiming claim jobs, or to
// let outcomes gather so that one statement acknowledges several. Batching
// costs the database less per job, and costs a slot nothing while it has a
// job claimed ahead to start, or while the queue holds nothing to claim.
// So the worker waits while it claims ahead, jobs are waiting for slots,
// and the outcomes are fewer than a quarter of what it may hold and
// younger than linger; or while it has no reason to claim (wantClaim is
// false), handlers still run, and the outcomes are younger than linger
// and fewer than a round beside another would carry. A round goes at once
// to look for the jobs of a lost claim, or to ask again about what is set
// aside for a row another transaction held, once that is due. held is how
// many jobs the worker holds, and waiting how many of them wait for a slot.
func (d *dispatcher) sendNow(wantClaim bool, claim, held, waiting int) bool {
	n := d.outcomes()
	switch {
	case len(d.lostClaims) > 0 || d.recheckDue():
		return true
	case n == 0 && len(d.p.toRelease) == 0:
		return claim > 0
	case len(d.p.toRelease) > 0:
		return true
	}
	if !wantClaim && held > waiting {
		// The queue holds nothing for this worker, as far as it knows,
		// so the round claims nothing and frees no slot by going now:
		// its outcomes may wait, up to linger, for those of the handlers
		// still running, or until they are as many as a round sent
		// beside another carries. Under a backlog every claim comes back
		// full and this never applies.
		return n >= max(minBeside, (d.w.cfg.Slots+d.aheadLimit())/4) ||
			time.Since(d.pendingSince) >= d.linger()
	}
	limit := d.aheadLimit()
	if limit == 0 {
		return true
	}
	return waiting == 0 ||
		n >= max(1, (d.w.cfg.Slots+limit)/4) ||
		time.Since(d.pendingSince) >= d.linger()
}

// maxRoundsOut bounds the rounds in flight at once.
const maxRoundsOut = 2

// minBeside is the fewest outcomes a round sent beside another carries.
const minBeside = 32

// sendBeside decides whether to send a round while another is in flight:
// only for a share of outcomes, a quarter of the jobs the worker may hold
// and at least minBeside, worth a statement and a backend of its own.
// Fewer wait for the round in flight to come back, and go in the next one.
func (d *dispatcher) sendBeside() bool {
	return len(d.lostClaims) == 0 &&
		d.outcomes() >= max(minBeside, (d.w.cfg.Slots+d.aheadLimit())/4)
}

// collect files o, and every other outcome already waiting, for the next
// acknowledgement, so that outcomes that arrive together are acknowledged
// in one statement.
func (d *dispatcher) collect(o outcome) {
	for {
		d.collectOne(o)
		select {
		case o = <-d.w.outcomes:
		default:
			return
		}
	}
}

// collectOne adds one outcome to those waiting to be acknowledged, or
// drops it if the lease was lost.
func (d *dispatcher) collectOne(o outcome) {
	w := d.w
	if d.outcomes() == 0 {
		d.pendingSince = time.Now()
	}
	if o.ran >= 0 {
		d.observe(o.ran)
	}
	w.mu.Lock()
	w.unhold(o.exec)
	delete(w.running, o.exec)
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
}

// observe adds one handler duration to the running mean.
func (d *dispatcher) observe(ran time.Duration) {
	if !d.measured {
		d.meanRun, d.measured = ran, true
		return
	}
	d.meanRun += (ran - d.meanRun) / runMeanWeight
}

// releaseStale moves the jobs that have waited PrefetchWait for a slot
// into the next round, to be released to the queue, and stops claiming
// ahead until handlers are short again. Those that slots just started are
// about to take are left to them, however short PrefetchWait.
func (d *dispatcher) releaseStale() {
	w := d.w
	now := time.Now()
	w.mu.Lock()
	taken := w.takenAhead()
	n := taken
	for n < len(w.ahead) && now.Sub(w.ahead[n].claimedAt) >= w.cfg.PrefetchWait {
		n++
	}
	stale := append([]*execution(nil), w.ahead[taken:n]...)
	w.ahead = append(w.ahead[:taken:taken], w.ahead[n:]...)
	w.mu.Unlock()
	if len(stale) == 0 {
		return
	}
	w.log.Info("jobs claimed ahead waited too long for a slot; releasing them", "jobs", len(stale), "wait", w.cfg.PrefetchWait)
	d.release(stale, nil)
	d.meanRun = max(d.meanRun, w.cfg.PrefetchWait)
}

// finish reports what became of a round's outcomes, starts the jobs it
// claimed (or holds them ahead), and puts back in the pending batch
// whatever must be sent again: each part of a round whose statement did
// not complete.
func (d *dispatcher) finish(r *round) {
	w := d.w
	var retry pending
	if r.released != nil {
		warned := make([]bool, len(r.batch.toRelease))
		w.mu.Lock()
		for i, e := range r.batch.toRelease {
			w.unhold(e)
			warned[i] = e.lost
		}
		w.mu.Unlock()
		for i, e := range r.batch.toRelease {
			e.cancel(nil)
			d.releasedAhead(e, r.released[e.job.ID], r.releaseRefused[e.job.ID] || warned[i])
			w.report(outcome{exec: e, err: e.releaseCause}, OutcomeReleased, r.released[e.job.ID])
		}
	} else {
		retry.toRelease = r.batch.toRelease
	}
	if r.failStates != nil {
		newest := newestClaims(r.batch.failed)
		for _, o := range r.batch.failed {
			state, ok := r.failStates[o.exec.job.ID]
			ok = ok && o.exec.job.Fence == newest[o.exec.job.ID]
			if ok {
				w.log.Info("job failed", "job", o.exec.job.ID, "kind", o.exec.job.Kind,
					"attempt", o.exec.job.Attempt, "now", state, "err", o.err)
			} else {
				d.logRefused("failure", o)
			}
			w.report(o, OutcomeFailed, ok)
		}
	} else {
		retry.failed = r.batch.failed
	}
	if r.completed != nil {
		newest := newestClaims(r.batch.done)
		for _, o := range r.batch.done {
			ok := r.completed[o.exec.job.ID] && o.exec.job.Fence == newest[o.exec.job.ID]
			if !ok {
				d.logRefused("completion", o)
			}
			w.report(o, OutcomeCompleted, ok)
		}
	} else {
		retry.done = r.batch.done
	}
	retry.done = append(retry.done, r.unsettled.done...)
	retry.failed = append(retry.failed, r.unsettled.failed...)
	d.p.restore(retry)
	if len(r.heldAside) > 0 || len(r.heldAgain) > 0 || len(r.releaseHeldAside)+len(r.releaseHeldAgain) > 0 {
		d.setAside(r)
	}
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
		claimed = append(claimed, newExecution(row, w.cfg.ID, r.sentAt))
	}
	for _, row := range r.adopted {
		// Its lease runs from when the lost claim was sent.
		claimed = append(claimed, newExecution(row, w.cfg.ID, r.adoptSentAt))
	}
	var superseded []*execution
	w.mu.Lock()
	for _, e := range claimed {
		// A job claimed again while this worker still holds an older
		// attempt of it: that attempt's lease is gone. One whose release
		// is under way may be gone because this worker released it: its
		// release's answer tells (see releasedAhead).
		if old, ok := w.held[e.job.ID]; ok && !old.lost && !old.releasing {
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
		spawn = max(min(w.cfg.Slots-w.slotsBusy, len(w.ahead)-w.slotsStarting), 0)
		w.slotsBusy += spawn
		w.slotsStarting += spawn
	}
	w.mu.Unlock()
	if stopping {
		// Claimed as the worker began to stop: released unstarted.
		d.release(claimed, ErrShutdown)
	}
	for _, old := range superseded {
		w.log.Warn("lease lost; cancelling handler", "job", old.job.ID, "attempt", old.job.Attempt, "why", "the job was claimed again")
		old.cancel(ErrLeaseLost)
	}
	for range spawn {
		go slot{w: w}.run()
	}
}

// release adds execs, jobs claimed ahead and never started, to the
// releases the next round sends, marked releasing first (see
// execution.releasing): a heartbeat, or a newer claim of one of them,
// that finds its lease gone may come after its release landed. cause is
// why, which OnAck reports with each release.
func (d *dispatcher) release(execs []*execution, cause error) {
	w := d.w
	w.mu.Lock()
	for _, e := range execs {
		e.releasing = true
		e.releaseCause = cause
	}
	w.mu.Unlock()
	d.p.toRelease = append(d.p.toRelease, execs...)
}

// releasedAhead logs what became of the release of e, a job claimed ahead
// and never started, that the database answered for: released, the lease
// given back; or not, which is a lease lost unless told already (told: the
// database refused the row, or a heartbeat or a newer claim found the
// lease lost before the release was under way, and each said so). A
// heartbeat that finds such a lease gone while the release is under way
// says nothing (see heartbeater.lose): it may have come after the release.
func (d *dispatcher) releasedAhead(e *execution, released, told bool) {
	w := d.w
	switch {
	case released || told:
		w.log.Debug("released job claimed ahead", "job", e.job.ID, "accepted", released)
	case e.unanswered:
		w.log.Info("release of a job claimed ahead rejected, in doubt: an earlier release whose answer was lost may have released it, or the lease is no longer this worker's",
			"job", e.job.ID, "attempt", e.job.Attempt)
	default:
		w.log.Warn("release of a job claimed ahead rejected: the lease is no longer this worker's",
			"job", e.job.ID, "attempt", e.job.Attempt)
	}
}

// newestClaims returns, for each job of outcomes, the fence of the newest
// claim of it among them. The database answers for a round's outcomes by
// job id, and a round may carry two of one job: that of an attempt whose
// lease was lost, set aside or sent late, and that of the claim this
// worker made of the job since. Only the newest claim's can have been
// accepted: a claim draws a new lease token, which fences out every older
// one.
func newestClaims(outcomes []outcome) map[int64]int64 {
	newest := make(map[int64]int64, len(outcomes))
	for _, o := range outcomes {
		if f, ok := newest[o.exec.job.ID]; !ok || o.exec.job.Fence > f {
			newest[o.exec.job.ID] = o.exec.job.Fence
		}
	}
	return newest
}

// logRefused logs the refusal of o, a completion or failure (what), by the
// fence: the lease is no longer this worker's, or, if a statement that
// carried o before got no answer, that statement may have recorded it.
func (d *dispatcher) logRefused(what string, o outcome) {
	if o.exec.unanswered {
		d.w.log.Warn(what+" rejected, in doubt: an earlier statement whose answer was lost may have recorded it, or the lease is no longer this worker's",
			"job", o.exec.job.ID, "attempt", o.exec.job.Attempt)
		return
	}
	d.w.log.Warn(what+" rejected: the lease is no longer this worker's", "job", o.exec.job.ID, "attempt", o.exec.job.Attempt)
}

// drain runs after dispatch, which stopped slots from starting jobs and
// started the grace period: it releases the jobs claimed ahead,
// acknowledges what finishes within the grace period, then releases the
// rest. Outcomes it could not send by the end are reported unsent.
func (d *dispatcher) drain(ctx context.Context) {
	w := d.w
	w.mu.Lock()
	ahead := w.ahead
	w.ahead = nil
	w.mu.Unlock()
	d.release(ahead, ErrShutdown)
	graceEnd := d.graceEnd
	d.acknowledgeAtShutdown(ctx, graceEnd, false)
	grace := time.NewTimer(time.Until(graceEnd))
	defer grace.Stop()
	if n := w.numStarted(); n > 0 {
		w.log.Info("waiting for running jobs", "running", n, "grace", w.cfg.ShutdownGrace)
	}
	for w.numStarted() > 0 {
		select {
		case o := <-w.outcomes:
			d.collect(o)
			d.acknowledgeAtShutdown(ctx, graceEnd, false)
			continue
		case <-grace.C:
		}
		break
	}
	d.collectReturned(d.releaseAtShutdown(ctx))
	d.acknowledgeAtShutdown(ctx, d.leasesLastUntil(), true)
	d.reportUnsent(d.held, "another transaction holds the job's row")
	d.held = nil
	d.reportUnsent(append(d.p.done, d.p.failed...), "the database could not be reached")
	for _, e := range append(d.p.toRelease, d.heldReleases...) {
		w.log.Warn("release left unsent at shutdown: the job claimed ahead is taken back once this worker's session ends",
			"job", e.job.ID)
		w.report(outcome{exec: e, err: e.releaseCause}, OutcomeReleased, false)
	}
	if len(d.lostClaims) > 0 {
		w.log.Warn("claim whose answer was lost left unfound at shutdown: the jobs it may hold are taken back once this worker's session ends or their leases run out",
			"tokens", len(d.lostClaims))
	}
	d.p, d.heldReleases, d.lostClaims = pending{}, nil, nil
}

// collectReturned collects the outcomes of the handlers that had returned
// when the shutdown released the rest, and drops those of the handlers
// released or reported lost. Each is on its way: a handler that returned
// sends its outcome next, and the channel has room for it. An execution
// whose lease is lost meanwhile (a heartbeat still runs) is collected all
// the same, and reported lost.
func (d *dispatcher) collectReturned(returned map[*execution]bool) {
	for len(returned) > 0 {
		o := <-d.w.outcomes
		if returned[o.exec] {
			delete(returned, o.exec)
			d.collectOne(o)
		}
	}
}

// setAside keeps outcomes whose jobs' rows another transaction holds for
// a later round to send, once a row is free: the completion of such a job
// lands if its lease still holds then, and is refused otherwise, as the
// job has been taken back to run again. Either way the row held costs that
// job alone. Releases of jobs claimed ahead are kept alike; a heartbeat
// renews those jobs' leases meanwhile, as the worker still holds them.
func (d *dispatcher) setAside(r *round) {
	d.held = append(d.held, r.heldAgain...)
	d.held = append(d.held, r.heldAside...)
	d.heldReleases = append(d.heldReleases, r.releaseHeldAgain...)
	d.heldReleases = append(d.heldReleases, r.releaseHeldAside...)
	d.heldAt = time.Now()
	if len(r.heldAside) > 0 {
		d.w.log.Warn("another transaction holds the row of a finished job; its acknowledgement waits for the row, the others are sent",
			"jobs", outcomeJobs(r.heldAside), "lock_wait", time.Duration(d.w.cfg.lockWaitMs())*time.Millisecond)
	}
	if len(r.releaseHeldAside) > 0 {
		d.w.log.Warn("another transaction holds the row of a job claimed ahead; its release waits for the row, the others are sent",
			"jobs", executionJobs(r.releaseHeldAside), "lock_wait", time.Duration(d.w.cfg.lockWaitMs())*time.Millisecond)
	}
}

// acknowledgeAtShutdown sends what is pending, and looks for the jobs of
// claims whose answer was lost, in up to shutdownRounds rounds that claim
// nothing, each asking again whether the rows of outcomes and releases set
// aside are still held, and each given up at until. The calls a shutdown
// makes while handlers may still run give up when the grace period ends.
// On its last call (final), a round the database does not answer does not
// count: it is sent again, backing off, for as long as something it
// carries may still land, until the latest of their leases, as the call
// begins, has surely run out by this process's clock (until is then
// leasesLastUntil), after which the database would refuse it all. So a
// database that is away for a moment as the worker stops costs no job a
// second run, and the call lasts a lease at most.
func (d *dispatcher) acknowledgeAtShutdown(ctx context.Context, until time.Time, final bool) {
	w := d.w
	delay := minRetryDelay
	for rounds := 0; (!d.p.empty() || len(d.lostClaims) > 0 || d.setAsideCount() > 0) && rounds < shutdownRounds; {
		if !time.Now().Before(until) {
			if final {
				w.log.Warn("acknowledge at shutdown: giving up, as the leases have run out")
			}
			return
		}
		d.heldAt = time.Time{}
		r := d.newRound(0)
		r.deadline = until
		r.acknowledge(ctx, w)
		d.finish(r)
		if r.err == nil {
			rounds++
			delay = minRetryDelay
			continue
		}
		if !final {
			rounds++
			w.log.Warn("acknowledge at shutdown failed", "err", r.err)
			time.Sleep(min(minRetryDelay, max(time.Until(until), 0)))
			continue
		}
		wait := min(delay, max(time.Until(until), 0))
		w.log.Warn("acknowledge at shutdown failed; will retry while the leases last", "err", r.err,
			"retry_in", wait, "leases_until", until)
		time.Sleep(wait)
		delay = min(2*delay, w.cfg.roundRetryMax())
	}
}

// shutdownRounds is how many answered rounds a shutdown sends at most to
// acknowledge what is pending: more are needed only for outcomes set aside
// while another transaction holds their jobs' rows.
const shutdownRounds = 3

// leasesLastUntil returns when the latest lease of the jobs a round at
// shutdown would carry surely runs out by this process's clock: a lease
// period after the statement that last renewed it was sent, or after the
// first lost claim was sent. An acknowledgement sent later is refused.
func (d *dispatcher) leasesLastUntil() time.Time {
	w := d.w
	var until time.Time
	if len(d.lostClaims) > 0 {
		until = d.lostSentAt.Add(w.cfg.Lease)
	}
	later := func(e *execution) {
		if t := e.renewedAt.Add(w.cfg.Lease); t.After(until) {
			until = t
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, outcomes := range [][]outcome{d.p.done, d.p.failed, d.held} {
		for _, o := range outcomes {
			later(o.exec)
		}
	}
	for _, execs := range [][]*execution{d.p.toRelease, d.heldReleases} {
		for _, e := range execs {
			later(e)
		}
	}
	return until
}

// reportUnsent reports the outcomes a shutdown could not send, with a
// warning for each: their jobs run again once taken back.
func (d *dispatcher) reportUnsent(outcomes []outcome, why string) {
	for _, o := range outcomes {
		msg := "acknowledgement left unsent at shutdown: " + why + "; the job runs again once taken back"
		if o.exec.unanswered {
			msg += ", unless a statement whose answer was lost recorded it (in doubt)"
		}
		d.w.log.Warn(msg, "job", o.exec.job.ID, "attempt", o.exec.job.Attempt)
		kind := OutcomeCompleted
		if o.err != nil {
			kind = OutcomeFailed
		}
		d.w.report(o, kind, false)
	}
}

// releaseNote is what a release at shutdown adds to a job's error history.
const releaseNote = "released: worker shutting down"

// releaseAtShutdown cancels the handlers still running and releases their
// jobs, reporting each release, accepted or not. A handler whose lease was
// lost, and which still runs though it was cancelled then, is reported
// lost here, as its outcome, if it ever comes, is never collected. It
// returns the executions whose handlers had returned by then with their
// outcomes not yet collected: select picks the end of the grace period as
// readily as an outcome waiting, and an outcome may come in while the last
// acknowledgement is out. Those jobs are not released, so that what their
// handlers did is acknowledged rather than run again. Jobs claimed ahead
// still to be released are not among those running: they go with the
// acknowledgements that follow, untouched, as they never started.
func (d *dispatcher) releaseAtShutdown(ctx context.Context) (returned map[*execution]bool) {
	w := d.w
	returned = map[*execution]bool{}
	w.mu.Lock()
	var left, lost []*execution
	for e := range w.running {
		switch {
		case e.returned:
			// Collected and reported, as lost if its lease was lost.
			returned[e] = true
			continue
		case e.lost:
			// A heartbeat lost its lease, or a newer claim of its job
			// took its place in held: cancelled then, it still runs.
			lost = append(lost, e)
		default:
			e.lost = true
			left = append(left, e)
		}
		e.cancel(ErrShutdown)
	}
	w.mu.Unlock()
	for _, e := range lost {
		w.log.Warn("lease lost; the handler still runs at shutdown, its outcome dropped", "job", e.job.ID,
			"kind", e.job.Kind, "attempt", e.job.Attempt)
		w.report(outcome{exec: e, err: context.Cause(e.ctx)}, OutcomeLeaseLost, false)
	}
	if len(left) == 0 {
		return returned
	}
	ctx, cancel := context.WithTimeout(ctx, max(w.cfg.HeartbeatInterval, minRoundWait))
	defer cancel()
	note := releaseNote
	var released map[int64]bool
	var held []*execution
	// On a connection taken first, as a round's statements are: a release
	// that cannot get one is not reported in doubt.
	conn, err := w.leases.acquire(ctx)
	if err == nil {
		released, _, held, err = w.leases.on(conn).releaseMany(ctx, left, &note)
		conn.Release()
	}
	switch {
	case err != nil:
		w.log.Warn("release failed; the jobs will be reclaimed when this worker's session ends", "err", err, "jobs", len(left))
	case len(held) > 0:
		w.log.Warn("another transaction holds the rows of jobs to release; they will be reclaimed when this worker's session ends",
			"jobs", executionJobs(held))
	}
	for _, e := range left {
		if err == nil {
			w.log.Info("released job", "job", e.job.ID, "accepted", released[e.job.ID])
		}
		w.report(outcome{exec: e, err: ErrShutdown}, OutcomeReleased, released[e.job.ID])
	}
	return returned
}
