package modelcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/jobrow"
)

// ShutdownNote is what a worker shutting down records on the jobs it
// releases.
const ShutdownNote = "released: worker shutting down"

// operations lists every operation the driver chooses from, with its
// weight in the current state.
func (d *Driver) operations() []op {
	always := func(w float64) func() float64 { return func() float64 { return w } }
	ifHeld := func(w float64) func() float64 {
		return func() float64 {
			for _, x := range d.workers {
				if len(x.held) > 0 {
					return w
				}
			}
			return 0
		}
	}
	return []op{
		{"enqueue", d.enqueueWeight, d.enqueue},
		{"claim", always(12), d.claim},
		{"complete", ifHeld(6), d.complete},
		{"heartbeat", ifHeld(7), d.heartbeat},
		{"fail", ifHeld(5), d.fail},
		{"release", ifHeld(1.5), func(ctx context.Context) error { return d.release(ctx, true) }},
		{"release ahead", ifHeld(2.5), func(ctx context.Context) error { return d.release(ctx, false) }},
		{"reclaim", always(4), d.reclaim},
		{"cancel", always(2.5), d.cancel},
		{"retry", always(2.5), d.retry},
		{"end session", func() float64 { return min(float64(len(d.conns)), 1) * 1.5 }, d.endSession},
		{"register", always(2), d.registerOp},
		{"get claimed", always(2), d.getClaimed},
		{"zombie", func() float64 { return min(float64(len(d.graveyard)), 1) * 3 }, d.zombie},
		{"sleep", always(1.5), d.sleep},
		{"forget ended", always(0.7), d.forgetEnded},
		{"shutdown", always(0.5), d.shutdown},
		{"queue stats", always(0.7), d.queueStats},
		{"prune", always(0.7), d.prune},
	}
}

// enqueueWeight keeps a handful of unfinished jobs about.
func (d *Driver) enqueueWeight() float64 {
	open := 0
	for _, j := range d.model.jobs {
		if !j.Terminal() {
			open++
		}
	}
	switch {
	case open < 4:
		return 10
	case open < 12:
		return 4
	}
	return 0.5
}

// pickWorker chooses a worker that may claim: one with a session (live or
// not, as far as it knows) or one that runs on leases alone.
func (d *Driver) pickWorker() *simWorker {
	var can []*simWorker
	for _, w := range d.workers {
		if w.leaseOnly || w.session != nil {
			can = append(can, w)
		}
	}
	return can[d.choose(len(can))]
}

// pickHolder chooses a worker holding claims, or nil.
func (d *Driver) pickHolder() *simWorker {
	var can []*simWorker
	for _, w := range d.workers {
		if len(w.held) > 0 {
			can = append(can, w)
		}
	}
	if len(can) == 0 {
		return nil
	}
	return can[d.choose(len(can))]
}

// takeHeld removes up to n of w's claims, preferring those someone asked
// to cancel, and returns them.
func (d *Driver) takeHeld(w *simWorker, n int) []held {
	slices.SortStableFunc(w.held, func(a, b held) int {
		switch {
		case a.cancelRequested == b.cancelRequested:
			return 0
		case a.cancelRequested:
			return -1
		}
		return 1
	})
	var out []held
	for len(out) < n && len(w.held) > 0 {
		i := 0
		if !w.held[0].cancelRequested {
			i = d.choose(len(w.held))
		}
		out = append(out, w.held[i])
		w.held = slices.Delete(w.held, i, i+1)
	}
	return out
}

func acksOf(hs []held) []Ack {
	out := make([]Ack, len(hs))
	for i, h := range hs {
		out[i] = h.Ack
	}
	return out
}

// bury keeps acks whose claims their holder let go of, for zombies.
func (d *Driver) bury(acks []Ack) { d.graveyard = append(d.graveyard, acks...) }

func (d *Driver) enqueue(ctx context.Context) error {
	type plan struct {
		e Enqueue
		// at, when set, places run_at this far from the insert's now().
		at *time.Duration
	}
	plans := make([]plan, 1+d.choose(3))
	many := d.choose(5) == 0
	for i := range plans {
		p := &plans[i]
		p.e = Enqueue{Queue: QueueDefault, Priority: int16(d.choose(3)), MaxAttempts: int32(1 + d.choose(4))}
		if d.choose(5) == 0 {
			p.e.Queue = QueueOther
		}
		switch r := d.choose(20); {
		case r < 13:
		case r < 16:
			p.e.Delay = time.Duration(5+d.choose(80)) * time.Millisecond
		case r < 19:
			at := -time.Duration(1+d.choose(500)) * time.Millisecond
			p.at = &at
		default:
			at := time.Duration(d.choose(200)) * time.Millisecond
			p.at = &at
		}
		if !many && d.choose(4) == 0 {
			p.e.IdempotencyKey = ptr(fmt.Sprintf("key-%d", d.choose(8)))
		}
	}

	if many {
		params := db.JobInsertManyParams{}
		for _, p := range plans {
			params.Queues = append(params.Queues, p.e.Queue)
			params.Kinds = append(params.Kinds, "model")
			params.Payloads = append(params.Payloads, json.RawMessage(`{}`))
			params.Priorities = append(params.Priorities, p.e.Priority)
			params.MaxAttempts = append(params.MaxAttempts, p.e.MaxAttempts)
			params.DelaysMs = append(params.DelaysMs, p.e.Delay.Milliseconds())
		}
		var inserted []int64
		now, err := d.inTx(ctx, func(q *db.Queries, txNow time.Time) error {
			params.RunAts = make([]time.Time, len(plans))
			for i, p := range plans {
				if p.at != nil {
					params.RunAts[i] = txNow.Add(*p.at)
				}
			}
			var err error
			inserted, err = q.JobInsertMany(ctx, params)
			return err
		})
		if err != nil {
			return fmt.Errorf("JobInsertMany: %w", err)
		}
		if len(inserted) != len(plans) {
			return fmt.Errorf("JobInsertMany of %d jobs returned %d ids", len(plans), len(inserted))
		}
		for i, p := range plans {
			if p.at != nil {
				p.e.RunAt = ptr(now.Add(*p.at))
			}
			if _, err := d.model.Insert(now, inserted[i], p.e); err != nil {
				return err
			}
		}
		d.countN("enqueue/jobs", len(inserted))
		d.logf("enqueue many: ids %v", inserted)
		return nil
	}

	type outcome struct {
		row       db.Job
		duplicate bool
	}
	outcomes := make([]outcome, len(plans))
	now, err := d.inTx(ctx, func(q *db.Queries, txNow time.Time) error {
		for i, p := range plans {
			params := db.JobInsertParams{
				Queue: p.e.Queue, Kind: "model", Payload: json.RawMessage(`{}`), Priority: p.e.Priority,
				MaxAttempts: p.e.MaxAttempts, DelayMs: p.e.Delay.Milliseconds(), IdempotencyKey: p.e.IdempotencyKey,
			}
			if p.at != nil {
				params.RunAt = ptr(txNow.Add(*p.at))
			}
			row, err := q.JobInsert(ctx, params)
			if noRow(err) && p.e.IdempotencyKey != nil {
				outcomes[i].duplicate = true
				row, err = q.JobGetByIdempotencyKey(ctx, db.JobGetByIdempotencyKeyParams{Queue: p.e.Queue, IdempotencyKey: p.e.IdempotencyKey})
			}
			if err != nil {
				return fmt.Errorf("JobInsert: %w", err)
			}
			outcomes[i].row = row
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, p := range plans {
		o := outcomes[i]
		got, err := fromDB(o.row)
		if err != nil {
			return err
		}
		if p.e.IdempotencyKey != nil {
			if old, ok := d.model.ByIdempotencyKey(p.e.Queue, *p.e.IdempotencyKey); ok {
				if !o.duplicate {
					return fmt.Errorf("JobInsert with key %q of queue %s inserted job %d, though job %d holds the key", *p.e.IdempotencyKey, p.e.Queue, o.row.ID, old.ID)
				}
				d.count("enqueue/duplicate")
				d.logf("enqueue key %q: duplicate of job %d", *p.e.IdempotencyKey, o.row.ID)
				if err := diffOrNil(fmt.Sprintf("the job holding key %q", *p.e.IdempotencyKey), old, got); err != nil {
					return err
				}
				continue
			}
		}
		if o.duplicate {
			return fmt.Errorf("JobInsert with key %s of queue %s inserted nothing, though no job holds the key", show(p.e.IdempotencyKey), p.e.Queue)
		}
		if p.at != nil {
			p.e.RunAt = ptr(now.Add(*p.at))
		}
		want, err := d.model.Insert(now, o.row.ID, p.e)
		if err != nil {
			return err
		}
		d.count("enqueue/jobs")
		d.logf("enqueue: job %d queue %s priority %d max %d run_at %s (now %s) key %s",
			want.ID, want.Queue, want.Priority, want.MaxAttempts, stamp(want.RunAt), stamp(now), show(want.IdempotencyKey))
		if err := diffOrNil(fmt.Sprintf("inserted job %d", want.ID), want, got); err != nil {
			return err
		}
	}
	return nil
}

func (d *Driver) claim(ctx context.Context) error {
	w := d.pickWorker()
	tokens := d.tokens(1 + d.choose(3))
	lease := d.lease()
	var done []held
	if d.choose(3) == 0 {
		done = d.takeHeld(w, 1+d.choose(2))
	}
	lost := d.choose(10) == 0
	return d.completeAndClaim(ctx, w, acksOf(done), tokens, lease, lost)
}

// complete sends, as a worker's round that claims nothing does, a
// JobCompleteMany for some of the jobs a worker holds.
func (d *Driver) complete(ctx context.Context) error {
	w := d.pickHolder()
	done := acksOf(d.takeHeld(w, 1+d.choose(2)))
	params := db.JobCompleteManyParams{
		IDs:     make([]int64, len(done)),
		Tokens:  make([]pgtype.UUID, len(done)),
		Results: make([][]byte, len(done)),
	}
	results, err := d.results(w, done)
	if err != nil {
		return err
	}
	for i, a := range done {
		params.IDs[i], params.Tokens[i], params.Results[i] = a.ID, a.Token, json.RawMessage(results[i])
	}
	var completed []int64
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		completed, err = q.JobCompleteMany(ctx, params)
		return err
	})
	if err != nil {
		return fmt.Errorf("JobCompleteMany: %w", err)
	}
	d.bury(done)
	slices.Sort(completed)
	d.logf("%s complete %s without a claim, now %s: completed %v", w.id, ids(done), stamp(now), completed)
	return d.checkCompletions(now, done, results, completed)
}

// results draws the result each completion of done by w records.
func (d *Driver) results(w *simWorker, done []Ack) ([]string, error) {
	results := make([]string, len(done))
	for i := range done {
		raw, err := json.Marshal(map[string]any{"by": w.id, "step": d.step})
		if err != nil {
			return nil, err
		}
		results[i] = string(raw)
	}
	return results, nil
}

// checkCompletions checks the completions the database accepted (sorted)
// of done, with their results, against the model's, at now.
func (d *Driver) checkCompletions(now time.Time, done []Ack, results []string, completed []int64) error {
	wantDone := d.model.Complete(now, done, results)
	if err := diffOrNil("completions accepted", wantDone, emptyNil(completed)); err != nil {
		return err
	}
	if err := d.checkAccepted(now, "completion", completed, done, true, nil); err != nil {
		return err
	}
	d.countN("complete/accepted", len(completed))
	d.countN("complete/rejected", len(done)-len(completed))
	return nil
}

// claimView is what a claim, and a lookup of claims, returns of a job.
type claimView struct {
	ID             int64
	Queue          string
	Priority       int16
	Attempt        int32
	MaxAttempts    int32
	Fence          int64
	LeaseToken     pgtype.UUID
	LeaseExpiresAt *time.Time
	RunAt          time.Time
	StartedAt      *time.Time
}

func viewOf(j Job) claimView {
	return claimView{
		ID: j.ID, Queue: j.Queue, Priority: j.Priority, Attempt: j.Attempt, MaxAttempts: j.MaxAttempts,
		Fence: j.Fence, LeaseToken: j.LeaseToken, LeaseExpiresAt: j.LeaseExpiresAt, RunAt: j.RunAt, StartedAt: j.StartedAt,
	}
}

// completeAndClaim sends JobCompleteAndClaim for w: the completions done
// and a claim of one job per token. A lost answer leaves the claim's
// tokens with the worker instead of the jobs.
func (d *Driver) completeAndClaim(ctx context.Context, w *simWorker, done []Ack, tokens []pgtype.UUID, lease time.Duration, lost bool) error {
	params := db.JobCompleteAndClaimParams{
		CompleteIDs:     make([]int64, len(done)),
		CompleteTokens:  make([]pgtype.UUID, len(done)),
		CompleteResults: make([][]byte, len(done)),
		Queue:           w.queue,
		ClaimTokens:     tokens,
		LeaseMs:         lease.Milliseconds(),
		WorkerID:        w.id,
	}
	if params.ClaimTokens == nil {
		params.ClaimTokens = []pgtype.UUID{}
	}
	if !w.leaseOnly {
		params.SessionKey = clone(w.session)
	}
	results, err := d.results(w, done)
	if err != nil {
		return err
	}
	for i, a := range done {
		params.CompleteIDs[i] = a.ID
		params.CompleteTokens[i] = a.Token
		params.CompleteResults[i] = json.RawMessage(results[i])
	}
	var rows []db.JobCompleteAndClaimRow
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		rows, err = q.JobCompleteAndClaim(ctx, params)
		return err
	})
	if err != nil {
		return fmt.Errorf("JobCompleteAndClaim: %w", err)
	}
	if len(rows) == 0 {
		return fmt.Errorf("JobCompleteAndClaim returned no row")
	}
	d.bury(done)

	completed := slices.Clone(rows[0].CompletedIDs)
	slices.Sort(completed)
	if rows[0].CompletedIDs == nil {
		return fmt.Errorf("JobCompleteAndClaim's first row lists no completions, not even none")
	}
	for i, r := range rows[1:] {
		if r.CompletedIDs != nil {
			return fmt.Errorf("JobCompleteAndClaim's row %d lists completions %v: only the first row does", i+2, r.CompletedIDs)
		}
	}
	if err := d.checkCompletions(now, done, results, completed); err != nil {
		return err
	}

	claim := Claim{Queue: w.queue, WorkerID: w.id, Session: params.SessionKey, Tokens: tokens, Lease: lease}
	alive := claim.Session == nil || d.model.Alive(*claim.Session)
	want := d.model.Claim(now, claim)
	var got []claimView
	for _, r := range rows {
		if r.ID == nil {
			if len(rows) > 1 {
				return fmt.Errorf("JobCompleteAndClaim returned an empty row beside claimed ones")
			}
			continue
		}
		got = append(got, claimView{
			ID: *r.ID, Queue: *r.Queue, Priority: *r.Priority, Attempt: *r.Attempt, MaxAttempts: *r.MaxAttempts,
			Fence: *r.Fence, LeaseToken: r.LeaseToken, LeaseExpiresAt: r.LeaseExpiresAt, RunAt: *r.RunAt, StartedAt: r.StartedAt,
		})
	}
	// The claim returns its jobs in no particular order; the model hands
	// out token i to the i-th job in claim order. Compare them by id.
	wantViews := make([]claimView, len(want))
	for i, j := range want {
		wantViews[i] = viewOf(j)
	}
	byID := func(a, b claimView) int { return int(a.ID - b.ID) }
	slices.SortFunc(wantViews, byID)
	slices.SortFunc(got, byID)
	note := ""
	if lost {
		note = " (answer lost)"
	}
	d.logf("%s complete %s and claim %d under session %s (alive %t), lease %s, now %s: completed %v, claimed %v%s",
		w.id, ids(done), len(tokens), show(claim.Session), alive, lease, stamp(now), completed, claimedIDs(got), note)
	if err := diffOrNil(fmt.Sprintf("claim of up to %d jobs of %s by %s at %s", len(tokens), w.queue, w.id, stamp(now)), emptyNil(wantViews), emptyNil(got)); err != nil {
		return err
	}
	if len(tokens) > 0 {
		switch {
		case !alive:
			d.count("claim/under ended session")
		case len(want) == 0:
			d.count("claim/nothing ready")
		}
	}
	d.countN("claim/jobs", len(want))
	for _, j := range want {
		if err := d.checkLeaseFree(now, j.ID); err != nil {
			return err
		}
		d.recordClaim(j)
		if !lost {
			w.held = append(w.held, held{Ack: Ack{ID: j.ID, Token: j.LeaseToken}})
		}
	}
	if lost && len(tokens) > 0 {
		w.lost = append(w.lost, tokens...)
	}
	return nil
}

func claimedIDs(views []claimView) []int64 {
	out := make([]int64, len(views))
	for i, v := range views {
		out[i] = v.ID
	}
	return out
}

func (d *Driver) heartbeat(ctx context.Context) error {
	w := d.pickHolder()
	n := 1 + d.choose(len(w.held))
	var acks []Ack
	for _, h := range w.held[:n] {
		acks = append(acks, h.Ack)
	}
	renewed, err := d.sendHeartbeat(ctx, w, acks)
	if err != nil {
		return err
	}
	// The worker drops what the heartbeat did not renew: its lease is
	// lost; it learns of requests to cancel the others.
	kept := w.held[:0]
	for _, h := range w.held {
		if slices.Contains(acks, h.Ack) {
			r, ok := renewed[h.ID]
			if !ok || h.Token != d.newest(h.ID) {
				d.bury([]Ack{h.Ack})
				continue
			}
			h.cancelRequested = r.CancelRequested
		}
		kept = append(kept, h)
	}
	w.held = kept
	// A worker told of a cancel often acts on it at once: the handler
	// returns the cancellation as its error, or ignores it and succeeds.
	if slices.ContainsFunc(w.held, func(h held) bool { return h.cancelRequested }) && d.choose(2) == 0 {
		hs := d.takeHeld(w, 1)
		if d.choose(3) == 0 {
			return d.completeAndClaim(ctx, w, acksOf(hs), nil, d.lease(), false)
		}
		return d.sendFail(ctx, w, acksOf(hs))
	}
	return nil
}

// sendHeartbeat renews acks for w and returns those renewed, by job.
func (d *Driver) sendHeartbeat(ctx context.Context, w *simWorker, acks []Ack) (map[int64]Renewal, error) {
	lease := d.lease()
	params := db.JobHeartbeatManyParams{LeaseMs: lease.Milliseconds()}
	for _, a := range acks {
		params.IDs = append(params.IDs, a.ID)
		params.Tokens = append(params.Tokens, a.Token)
	}
	var rows []db.JobHeartbeatManyRow
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		rows, err = q.JobHeartbeatMany(ctx, params)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("JobHeartbeatMany: %w", err)
	}
	var got []Renewal
	for _, r := range rows {
		if !r.Renewed {
			// The driver runs one statement at a time: no other
			// transaction can hold a row.
			return nil, fmt.Errorf("heartbeat left job %d for later, although no other transaction ran", r.ID)
		}
		if r.LeaseExpiresAt == nil {
			return nil, fmt.Errorf("heartbeat renewed job %d to no expiry", r.ID)
		}
		got = append(got, Renewal{ID: r.ID, LeaseExpiresAt: *r.LeaseExpiresAt, CancelRequested: r.CancelRequested})
	}
	slices.SortFunc(got, func(a, b Renewal) int { return int(a.ID - b.ID) })
	want := d.model.Heartbeat(now, lease, acks)
	d.logf("%s heartbeat %s, lease %s, now %s: renewed %d", w.id, ids(acks), lease, stamp(now), len(got))
	if err := diffOrNil("heartbeats accepted", want, got); err != nil {
		return nil, err
	}
	accepted := make([]int64, len(got))
	expiries := map[int64]time.Time{}
	out := map[int64]Renewal{}
	for i, r := range got {
		accepted[i] = r.ID
		expiries[r.ID] = r.LeaseExpiresAt
		out[r.ID] = r
	}
	if err := d.checkAccepted(now, "heartbeat", accepted, acks, false, expiries); err != nil {
		return nil, err
	}
	d.countN("heartbeat/accepted", len(got))
	d.countN("heartbeat/rejected", len(acks)-len(got))
	return out, nil
}

func (d *Driver) fail(ctx context.Context) error {
	w := d.pickHolder()
	return d.sendFail(ctx, w, acksOf(d.takeHeld(w, 1+d.choose(2))))
}

// sendFail fails acks for w, each with a permanent or retryable error.
func (d *Driver) sendFail(ctx context.Context, w *simWorker, acks []Ack) error {
	var failures []Failure
	params := db.JobFailManyParams{}
	for _, a := range acks {
		f := Failure{
			Ack: a, Error: fmt.Sprintf("failed at step %d", d.step), Permanent: d.choose(4) == 0,
			RetryIn: []time.Duration{0, 5, 30, 150}[d.choose(4)] * time.Millisecond,
		}
		failures = append(failures, f)
		params.IDs = append(params.IDs, a.ID)
		params.Tokens = append(params.Tokens, a.Token)
		params.Errors = append(params.Errors, f.Error)
		params.Permanent = append(params.Permanent, f.Permanent)
		params.RetryInMs = append(params.RetryInMs, f.RetryIn.Milliseconds())
	}
	var rows []db.JobFailManyRow
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		rows, err = q.JobFailMany(ctx, params)
		return err
	})
	if err != nil {
		return fmt.Errorf("JobFailMany: %w", err)
	}
	d.bury(acks)
	var got []Failed
	var accepted []int64
	for _, r := range rows {
		got = append(got, Failed(r))
		accepted = append(accepted, r.ID)
	}
	slices.SortFunc(got, func(a, b Failed) int { return int(a.ID - b.ID) })
	want := d.model.Fail(now, failures)
	d.logf("%s fail %s (permanent %v), now %s: %v", w.id, ids(acks), params.Permanent, stamp(now), got)
	if err := diffOrNil("failures accepted", want, got); err != nil {
		return err
	}
	if err := d.checkAccepted(now, "failure", accepted, acks, true, nil); err != nil {
		return err
	}
	for _, f := range got {
		d.count("fail/accepted, " + string(f.State))
	}
	d.countN("fail/rejected", len(acks)-len(got))
	return nil
}

// release hands claims of a worker back: with the shutdown note, any of
// them; without (a release of jobs claimed ahead), the newest.
func (d *Driver) release(ctx context.Context, noted bool) error {
	w := d.pickHolder()
	var acks []Ack
	if noted {
		acks = acksOf(d.takeHeld(w, 1+d.choose(len(w.held))))
	} else {
		acks = []Ack{w.held[len(w.held)-1].Ack}
		w.held = w.held[:len(w.held)-1]
	}
	var note *string
	if noted {
		note = ptr(ShutdownNote)
	}
	return d.sendRelease(ctx, w, note, acks)
}

// sendRelease releases acks for w, with note (nil: jobs claimed ahead).
func (d *Driver) sendRelease(ctx context.Context, w *simWorker, note *string, acks []Ack) error {
	params := db.JobReleaseManyParams{Note: note, IDs: []int64{}, Tokens: []pgtype.UUID{}}
	for _, a := range acks {
		params.IDs = append(params.IDs, a.ID)
		params.Tokens = append(params.Tokens, a.Token)
	}
	var got []int64
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		got, err = q.JobReleaseMany(ctx, params)
		return err
	})
	if err != nil {
		return fmt.Errorf("JobReleaseMany: %w", err)
	}
	d.bury(acks)
	slices.Sort(got)
	want := d.model.Release(now, note, acks)
	kind := "release ahead"
	if note != nil {
		kind = "release"
	}
	d.logf("%s %s %s, now %s: %v", w.id, kind, ids(acks), stamp(now), got)
	if err := diffOrNil(kind+"s accepted", want, emptyNil(got)); err != nil {
		return err
	}
	if err := d.checkAccepted(now, kind, got, acks, true, nil); err != nil {
		return err
	}
	for _, id := range got {
		d.count(kind + "/accepted, " + string(d.modelJob(id).State))
	}
	d.countN(kind+"/rejected", len(acks)-len(got))
	return nil
}

func (d *Driver) reclaim(ctx context.Context) error {
	limit := int32(1000)
	if d.choose(5) == 0 {
		limit = int32(1 + d.choose(2))
	}
	// Jobs to look up by id, as a worker does those a reclaim left: any
	// job, so that no job is taken only for being named.
	var recheck []int64
	for range d.choose(4) {
		recheck = append(recheck, d.pickJob())
	}
	var rows []db.JobReclaimRow
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		rows, err = q.JobReclaim(ctx, db.JobReclaimParams{MaxJobs: limit, RecheckIDs: recheck})
		return err
	})
	if err != nil {
		return fmt.Errorf("JobReclaim: %w", err)
	}
	can := d.model.Reclaimable(now)
	got, left := ReclaimedOf(rows)
	// Nothing else holds a row: it leaves a job only past its limit, and
	// then says nothing of those it left.
	if len(left) > 0 {
		return fmt.Errorf("reclaim (limit %d) at %s took %d of %d reclaimable and says it left %v", limit, stamp(now), len(got), len(can), left)
	}
	var taken []int64
	for _, r := range got {
		want, ok := can[r.ID]
		if !ok {
			return fmt.Errorf("reclaim at %s took job %d, which the model says it must leave: %+v", stamp(now), r.ID, d.modelJob(r.ID))
		}
		if slices.Contains(taken, r.ID) {
			return fmt.Errorf("reclaim took job %d twice", r.ID)
		}
		if err := diffOrNil(fmt.Sprintf("reclaim of job %d", r.ID), want, Reclaimed(r)); err != nil {
			return err
		}
		taken = append(taken, r.ID)
	}
	slices.Sort(taken)
	d.logf("reclaim (limit %d), now %s: took %v of %d reclaimable", limit, stamp(now), taken, len(can))
	if wantN := min(int(limit), len(can)); len(taken) != wantN {
		var left []int64
		for id := range can {
			if !slices.Contains(taken, id) {
				left = append(left, id)
			}
		}
		slices.Sort(left)
		return fmt.Errorf("reclaim (limit %d) at %s took %d jobs %v, want %d: it left %v", limit, stamp(now), len(taken), taken, wantN, left)
	}
	for _, id := range taken {
		d.count("reclaim/" + *can[id].LastError + ", " + string(can[id].State))
		if s := d.modelJob(id).LeaseSession; *can[id].LastError == ReasonLeaseExpired && s != nil && d.ended[*s] {
			d.count("reclaim/lease expired, session ended too")
		}
	}
	return d.model.Reclaim(now, taken)
}

func (d *Driver) modelJob(id int64) Job {
	j, _ := d.model.Job(id)
	return j
}

// pickJob chooses a job id, preferring jobs in states, sometimes one that
// does not exist.
func (d *Driver) pickJob(states ...db.JobState) int64 {
	if d.choose(20) == 0 || len(d.model.jobs) == 0 {
		return d.model.maxID + 1 + int64(d.choose(3))
	}
	jobs := d.model.Jobs()
	var preferred []int64
	for _, j := range jobs {
		if slices.Contains(states, j.State) {
			preferred = append(preferred, j.ID)
		}
	}
	if len(preferred) > 0 && d.choose(4) != 0 {
		return preferred[d.choose(len(preferred))]
	}
	return jobs[d.choose(len(jobs))].ID
}

func (d *Driver) cancel(ctx context.Context) error {
	states := []db.JobState{db.JobStateRunning}
	if d.choose(3) == 0 {
		states = []db.JobState{db.JobStateAvailable}
	}
	id := d.pickJob(states...)
	return d.oneJob(ctx, "cancel", id, func(q *db.Queries) (db.JobCancelRow, error) { return q.JobCancel(ctx, id) }, d.model.Cancel)
}

func (d *Driver) retry(ctx context.Context) error {
	id := d.pickJob(db.JobStateDead, db.JobStateCancelled)
	d.retried[id] = true
	return d.oneJob(ctx, "retry", id, func(q *db.Queries) (db.JobCancelRow, error) {
		row, err := q.JobRetry(ctx, id)
		return db.JobCancelRow(row), err
	}, d.model.Retry)
}

// oneJob runs a statement on job id that returns the job with whether it
// applied (JobCancel, JobRetry: their rows have the same columns), or no
// row for a missing job, and checks it against the model's transition: a
// job refused is returned as the model has it.
func (d *Driver) oneJob(ctx context.Context, kind string, id int64, stmt func(*db.Queries) (db.JobCancelRow, error), model func(time.Time, int64) (Job, bool)) error {
	var row db.JobCancelRow
	exists := true
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		row, err = stmt(q)
		if noRow(err) {
			exists, err = false, nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s: %w", kind, err)
	}
	before, known := d.model.Job(id)
	if !known {
		before.State = "missing"
	}
	want, ok := model(now, id)
	applied := exists && row.Applied
	d.logf("%s job %d (%s), now %s: applied %t", kind, id, before.State, stamp(now), applied)
	if applied != ok {
		return fmt.Errorf("%s of job %d in state %s at %s: database applied it %t, model %t", kind, id, before.State, stamp(now), applied, ok)
	}
	if !applied {
		d.count(kind + "/refused")
		if !exists || !known {
			return nil
		}
		want = before
	} else {
		d.count(kind + "/applied")
	}
	got, err := fromDB(jobrow.OfTransition(row))
	if err != nil {
		return err
	}
	return diffOrNil(fmt.Sprintf("%s of job %d", kind, id), want, got)
}

// pruneRetentions are the retentions a prune picks from for each state:
// none (keep forever), one that the jobs finished in the last sleeps
// outlive, and none at all.
var pruneRetentions = []*time.Duration{nil, ptr(time.Duration(0)), ptr(60 * time.Millisecond), ptr(time.Hour)}

// prune runs JobPrune with retentions picked for each state, and a batch
// larger than the jobs there are, so that which jobs go does not depend on
// the order of jobs that finished at the same instant.
func (d *Driver) prune(ctx context.Context) error {
	r := [3]*time.Duration{}
	for i := range r {
		r[i] = pruneRetentions[d.choose(len(pruneRetentions))]
	}
	ms := func(d *time.Duration) *int64 {
		if d == nil {
			return nil
		}
		return ptr(d.Milliseconds())
	}
	var row db.JobPruneRow
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		row, err = q.JobPrune(ctx, db.JobPruneParams{
			RetainSucceededMs: ms(r[0]), RetainDeadMs: ms(r[1]), RetainCancelledMs: ms(r[2]), MaxJobs: 1000,
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("JobPrune: %w", err)
	}
	show := func(d *time.Duration) string {
		if d == nil {
			return "forever"
		}
		return d.String()
	}
	want := d.model.Prune(now, r[0], r[1], r[2])
	got := [3]int64{row.Succeeded, row.Dead, row.Cancelled}
	d.logf("prune, retaining succeeded %s, dead %s, cancelled %s, now %s: deleted %v",
		show(r[0]), show(r[1]), show(r[2]), stamp(now), got)
	if got != want {
		return fmt.Errorf("prune at %s deleted %v (succeeded, dead, cancelled), model %v", stamp(now), got, want)
	}
	if got != ([3]int64{}) {
		d.count("prune/deleted")
	}
	return nil
}

// endSession ends a live session: it closes the session's connection and
// waits until PostgreSQL has dropped its lock. Its worker does not learn
// of it.
func (d *Driver) endSession(ctx context.Context) error {
	keys := make([]int32, 0, len(d.conns))
	for key := range d.conns {
		keys = append(keys, key)
	}
	slices.Sort(keys)
	// Mostly a busy worker's: the crash that reclaims must catch at once.
	busy := slices.DeleteFunc(slices.Clone(keys), func(k int32) bool { return !d.model.leasedUnder(k, d.lastNow) })
	if len(busy) > 0 && d.choose(4) != 0 {
		keys = busy
	}
	if err := d.closeSession(ctx, keys[d.choose(len(keys))]); err != nil {
		return err
	}
	// Often another worker's reclaim ticks right after a crash.
	if d.choose(2) == 0 {
		return d.reclaim(ctx)
	}
	return nil
}

func (d *Driver) closeSession(ctx context.Context, key int32) error {
	if err := endSession(ctx, d.pool, d.conns[key], key); err != nil {
		return err
	}
	delete(d.conns, key)
	d.ended[key] = true
	d.model.EndSession(key)
	d.count("session ended")
	d.logf("session %d ended", key)
	return nil
}

// registerOp registers a session for a worker: a restart after its
// session ended, a take over from its own previous session, still alive,
// or an impostor's attempt at an id another live session holds.
func (d *Driver) registerOp(ctx context.Context) error {
	var can []*simWorker
	for _, w := range d.workers {
		if !w.leaseOnly {
			can = append(can, w)
		}
	}
	w := can[d.choose(len(can))]
	var previous *int32
	switch {
	case w.session == nil || d.ended[*w.session]:
		if w.session != nil && d.choose(2) == 0 {
			previous = clone(w.session)
		}
	case d.choose(2) == 0:
		previous = clone(w.session)
	case d.choose(2) == 0:
		// Another process claiming to be w's previous one.
		previous = ptr(*w.session + 1000)
	}
	return d.register(ctx, w, previous)
}

// register registers a new session of w on a connection of its own,
// replacing previous, and checks whether the database gave it the id as
// the model says it must.
func (d *Driver) register(ctx context.Context, w *simWorker, previous *int32) error {
	conn, err := pgx.ConnectConfig(ctx, d.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	may := d.model.MayRegister(w.id, previous)
	holder, isHeld := d.model.Holder(w.id)
	reg, err := db.New(conn).WorkerRegister(ctx, db.WorkerRegisterParams{
		ID: w.id, Queue: w.queue, PID: 1, Host: "modelcheck", PreviousSessionKey: previous,
	})
	if noRow(err) {
		conn.Close(ctx)
		d.logf("%s register (previous %s; holder %d, alive %t): refused", w.id, show(previous), holder, d.model.Alive(holder))
		if may {
			return fmt.Errorf("registration of %s (previous %s) refused, though the id is free to take (holder %d held %t, alive %t)",
				w.id, show(previous), holder, isHeld, d.model.Alive(holder))
		}
		got, err := d.q.WorkerHolder(ctx, w.id)
		if err != nil {
			return fmt.Errorf("WorkerHolder: %w", err)
		}
		if got.SessionKey != holder || !got.SessionAlive {
			return fmt.Errorf("registration of %s refused; WorkerHolder says session %d (alive %t), model %d (alive)", w.id, got.SessionKey, got.SessionAlive, holder)
		}
		d.count("register/refused")
		return nil
	}
	if err != nil {
		conn.Close(ctx)
		return fmt.Errorf("WorkerRegister: %w", err)
	}
	d.logf("%s register (previous %s; holder %d, alive %t): session %d", w.id, show(previous), holder, d.model.Alive(holder), reg.SessionKey)
	if !may {
		conn.Close(ctx)
		return fmt.Errorf("registration of %s (previous %s) took the id from live session %d", w.id, show(previous), holder)
	}
	if err := d.model.Register(w.id, reg.SessionKey); err != nil {
		conn.Close(ctx)
		return err
	}
	d.conns[reg.SessionKey] = conn
	w.session = ptr(reg.SessionKey)
	d.count("register/accepted")
	return nil
}

// getClaimed looks up claims by token, as a worker that lost the answer
// to its claim does, mixing in tokens of claims current and stale, and
// adopts what it finds of its own.
func (d *Driver) getClaimed(ctx context.Context) error {
	w := d.workers[d.choose(len(d.workers))]
	tokens := slices.Clone(w.lost)
	for range d.choose(3) {
		if x := d.pickHolder(); x != nil {
			tokens = append(tokens, x.held[d.choose(len(x.held))].Token)
		}
	}
	for range d.choose(3) {
		if len(d.graveyard) > 0 {
			tokens = append(tokens, d.graveyard[d.choose(len(d.graveyard))].Token)
		}
	}
	tokens = append(tokens, d.token())
	var rows []db.JobGetClaimedRow
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		rows, err = q.JobGetClaimed(ctx, tokens)
		return err
	})
	if err != nil {
		return fmt.Errorf("JobGetClaimed: %w", err)
	}
	var got []claimView
	for _, r := range rows {
		got = append(got, claimView{
			ID: r.ID, Queue: r.Queue, Priority: r.Priority, Attempt: r.Attempt, MaxAttempts: r.MaxAttempts,
			Fence: r.Fence, LeaseToken: r.LeaseToken, LeaseExpiresAt: r.LeaseExpiresAt, RunAt: r.RunAt, StartedAt: r.StartedAt,
		})
	}
	var want []claimView
	for _, j := range d.model.Claimed(now, tokens) {
		want = append(want, viewOf(j))
	}
	d.logf("%s get claimed (%d tokens, %d lost), now %s: found %v", w.id, len(tokens), len(w.lost), stamp(now), claimedIDs(got))
	if err := diffOrNil("claims found by token", want, got); err != nil {
		return err
	}
	for _, v := range got {
		if slices.Contains(w.lost, v.LeaseToken) {
			w.held = append(w.held, held{Ack: Ack{ID: v.ID, Token: v.LeaseToken}})
			d.count("get claimed/adopted")
		}
	}
	for _, t := range w.lost {
		if !slices.ContainsFunc(got, func(v claimView) bool { return v.LeaseToken == t }) {
			if l, ok := d.leases[t]; ok {
				d.bury([]Ack{{ID: l.id, Token: t}})
			}
		}
	}
	w.lost = nil
	return nil
}

// zombie sends an acknowledgement under a token whose holder let it go:
// a worker that stalled, lost its connection or its lease, and comes back.
func (d *Driver) zombie(ctx context.Context) error {
	// Mostly the token of a job that runs again under a newer, live
	// claim: the acknowledgement the fence exists to refuse.
	candidates := d.graveyard
	if again := slices.DeleteFunc(slices.Clone(d.graveyard), func(a Ack) bool {
		j := d.modelJob(a.ID)
		return j.State != db.JobStateRunning || !j.LeaseExpiresAt.After(d.lastNow)
	}); len(again) > 0 && d.choose(4) != 0 {
		candidates = again
	}
	a := candidates[d.choose(len(candidates))]
	w := d.pickWorker()
	d.count("zombie")
	switch d.choose(5) {
	case 0:
		return d.completeAndClaim(ctx, w, []Ack{a}, nil, d.lease(), false)
	case 1:
		_, err := d.sendHeartbeat(ctx, w, []Ack{a})
		return err
	case 2:
		return d.sendFail(ctx, w, []Ack{a})
	case 3:
		return d.sendRelease(ctx, w, ptr(ShutdownNote), []Ack{a})
	}
	return d.sendRelease(ctx, w, nil, []Ack{a})
}

// sleep lets time pass, so that leases and delays run out.
func (d *Driver) sleep(ctx context.Context) error {
	pause := time.Duration(5+d.choose(120)) * time.Millisecond
	d.logf("sleep %s", pause)
	select {
	case <-time.After(pause):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (d *Driver) forgetEnded(ctx context.Context) error {
	var n int64
	if _, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		keys, err := q.WorkerStopClaimsOfEndedSessions(ctx)
		if err != nil {
			return fmt.Errorf("WorkerStopClaimsOfEndedSessions: %w", err)
		}
		n, err = q.WorkerForgetEnded(ctx, keys)
		if err != nil {
			return fmt.Errorf("WorkerForgetEnded: %w", err)
		}
		return nil
	}); err != nil {
		return err
	}
	want := d.model.ForgetEnded()
	d.logf("forget ended sessions: %d", n)
	if n != want {
		return fmt.Errorf("WorkerForgetEnded forgot %d sessions, model %d", n, want)
	}
	d.countN("forget ended/sessions", int(n))
	return nil
}

// shutdown stops a worker as SIGTERM does: it releases every job it
// holds with the shutdown note, unregisters and closes its session.
func (d *Driver) shutdown(ctx context.Context) error {
	w := d.pickWorker()
	acks := acksOf(w.held)
	w.held = nil
	if err := d.sendRelease(ctx, w, ptr(ShutdownNote), acks); err != nil {
		return err
	}
	for _, t := range w.lost {
		if l, ok := d.leases[t]; ok {
			d.bury([]Ack{{ID: l.id, Token: t}})
		}
	}
	w.lost = nil
	if w.session == nil {
		return nil
	}
	key := *w.session
	w.session = nil
	conn, ok := d.conns[key]
	if !ok {
		d.logf("%s shut down; its session %d had ended", w.id, key)
		return nil
	}
	released, err := db.New(conn).WorkerUnregister(ctx, db.WorkerUnregisterParams{ID: w.id, SessionKey: key})
	if err != nil {
		return fmt.Errorf("WorkerUnregister: %w", err)
	}
	want := d.model.Unregister(w.id, key)
	d.logf("%s unregister session %d: id released %t", w.id, key, released)
	if released != want {
		return fmt.Errorf("unregister: id released %t, model %t", released, want)
	}
	return d.closeSession(ctx, key)
}

func (d *Driver) queueStats(ctx context.Context) error {
	var rows []db.JobQueueStatsRow
	now, err := d.inTx(ctx, func(q *db.Queries, _ time.Time) error {
		var err error
		rows, err = q.JobQueueStats(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("JobQueueStats: %w", err)
	}
	var got []QueueStats
	for _, r := range rows {
		got = append(got, QueueStats{
			Queue: r.Queue, Available: r.Available, Running: r.Running,
			OldestReadyAge: time.Duration(r.OldestReadyAgeSeconds * float64(time.Second)).Round(time.Microsecond),
		})
	}
	d.logf("queue stats, now %s", stamp(now))
	return diffOrNil("queue statistics", emptyNil(d.model.Stats(now)), got)
}

// emptyNil turns an empty slice into nil, so that the two compare equal.
func emptyNil[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}
