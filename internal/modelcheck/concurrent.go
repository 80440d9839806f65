package modelcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
)

// Concurrent is a run of workers at once, whose outcomes no model can
// predict: it checks only what must hold whatever the interleaving. Every
// claim is ended exactly once (by an accepted completion, failure or
// release, or by a reclaim), so no job ever had two live claims and no
// stale acknowledgement ended one; a claim known to have ended refuses
// every later acknowledgement; fences and tokens are never handed out
// twice; every job enqueued ends terminal, with its attempts, error
// history and result as its recorded history says.
//
// An operator cancels and retries jobs alongside the workers. Each is
// recorded while its transaction still holds the job's row, so the
// recorded order of a job's cancels and retries is the order they took
// effect in. A job asked to cancel is never claimed again but after a
// retry, and ends cancelled or (its handler having succeeded) succeeded;
// a job ends cancelled only if a cancel applied since its last retry; a
// retry restarts the attempts; and no acknowledgement of a claim from
// before a retry is accepted after it.
type Concurrent struct {
	pool *pgxpool.Pool
	seed uint64

	mu     sync.Mutex
	jobs   map[int64]*jobHistory
	ended  map[pgtype.UUID]int64
	buried []Ack
	broken []string
	counts map[string]int
	// ids holds every job; claimed those claimed and stopped those
	// failed, reclaimed or cancelled, newest last: the likeliest to be
	// running, for cancels, and dead or cancelled, for retries.
	ids, claimed, stopped []int64
}

// jobHistory is what the workers saw happen to one job.
type jobHistory struct {
	claims    []claimRecord
	completed []pgtype.UUID
	fails     int
	// released holds the fence of each claim released.
	released []int64
	noted    int
	reclaims int
	// events are the cancels and retries that applied, in the order
	// they took effect.
	events []jobEvent
}

// jobEvent is a cancel or a retry that applied to a job: the fence the job
// had then, and, for a cancel of a running job, the mark it left.
type jobEvent struct {
	kind            string // "cancel", "cancel running" or "retry"
	fence           int64
	cancelRequested time.Time
}

// retryFence returns the fence at the job's last retry, or 0.
func (h *jobHistory) retryFence() int64 {
	for _, e := range slices.Backward(h.events) {
		if e.kind == "retry" {
			return e.fence
		}
	}
	return 0
}

// fenceOf returns the fence of the claim with token, or 0.
func (h *jobHistory) fenceOf(token pgtype.UUID) int64 {
	for _, cl := range h.claims {
		if cl.token == token {
			return cl.fence
		}
	}
	return 0
}

type claimRecord struct {
	token pgtype.UUID
	fence int64
}

// NewConcurrent returns a concurrent run on pool, which must reach a
// freshly migrated database that nothing else uses.
func NewConcurrent(pool *pgxpool.Pool, seed uint64) *Concurrent {
	return &Concurrent{
		pool: pool, seed: seed,
		jobs: map[int64]*jobHistory{}, ended: map[pgtype.UUID]int64{}, counts: map[string]int{},
	}
}

// Counts returns how many times each operation and outcome occurred.
func (c *Concurrent) Counts() map[string]int { return c.counts }

// Run enqueues jobs, runs workers workers at once for d, drains every job
// left, and returns an error naming every invariant broken.
func (c *Concurrent) Run(ctx context.Context, jobs, workers int, d time.Duration) error {
	if err := c.enqueue(ctx, rand.New(rand.NewPCG(c.seed, 0)), jobs); err != nil {
		return err
	}

	deadline := time.Now().Add(d)
	errs := make([]error, workers+1)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			w := &crowdWorker{c: c, id: fmt.Sprintf("c%d", i), rng: rand.New(rand.NewPCG(c.seed, uint64(i+1))), expires: map[pgtype.UUID]time.Time{}, told: map[pgtype.UUID]bool{}}
			errs[i] = w.run(ctx, deadline)
		})
	}
	wg.Go(func() {
		w := &crowdWorker{c: c, id: "operator", rng: rand.New(rand.NewPCG(c.seed, uint64(workers+1)))}
		errs[workers] = w.operate(ctx, deadline)
	})
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := c.drain(ctx); err != nil {
		return err
	}
	return c.verify(ctx)
}

// enqueue inserts n jobs ready to run. They are known before the insert
// commits, so that whoever claims one finds its history.
func (c *Concurrent) enqueue(ctx context.Context, rng *rand.Rand, n int) error {
	params := db.JobInsertManyParams{}
	for range n {
		params.Queues = append(params.Queues, QueueDefault)
		params.Kinds = append(params.Kinds, "model")
		params.Payloads = append(params.Payloads, json.RawMessage(`{}`))
		params.Priorities = append(params.Priorities, int16(rng.IntN(3)))
		params.MaxAttempts = append(params.MaxAttempts, int32(1+rng.IntN(4)))
		params.RunAts = append(params.RunAts, time.Time{})
		params.DelaysMs = append(params.DelaysMs, 0)
	}
	_, err := inTx(ctx, c.pool, func(q *db.Queries, _ time.Time) error {
		ids, err := q.JobInsertMany(ctx, params)
		if err != nil {
			return err
		}
		c.mu.Lock()
		for _, id := range ids {
			c.jobs[id] = &jobHistory{}
			c.ids = append(c.ids, id)
		}
		c.counts["enqueue/jobs"] += len(ids)
		c.mu.Unlock()
		return nil
	})
	if err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	return nil
}

func (c *Concurrent) count(name string) {
	c.mu.Lock()
	c.counts[name]++
	c.mu.Unlock()
}

func (c *Concurrent) brokenf(format string, args ...any) {
	c.mu.Lock()
	c.broken = append(c.broken, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

// recordClaims keeps the claims a claim returned. Every claim of a job
// with a lower fence has ended, so its acknowledgements must be refused
// from now on. (Workers record their claims in an order of their own, so
// a claim may be recorded after a later one.)
func (c *Concurrent) recordClaims(rows []db.JobCompleteAndClaimRow) []Ack {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Ack
	for _, r := range rows {
		if r.ID == nil {
			continue
		}
		h := c.jobs[*r.ID]
		claim := claimRecord{token: r.LeaseToken, fence: *r.Fence}
		for _, old := range h.claims {
			switch {
			case old.fence < claim.fence:
				c.bury(Ack{ID: *r.ID, Token: old.token})
			case old.fence > claim.fence:
				c.bury(Ack{ID: *r.ID, Token: claim.token})
			}
		}
		h.claims = append(h.claims, claim)
		c.claimed = append(c.claimed, *r.ID)
		out = append(out, Ack{ID: *r.ID, Token: claim.token})
		c.counts["claim/jobs"]++
	}
	return out
}

// recordEnd keeps an acknowledgement that ended a claim.
func (c *Concurrent) recordEnd(a Ack, record func(*jobHistory)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	record(c.jobs[a.ID])
	c.bury(a)
}

// bury keeps a claim known to have ended, for zombies; c.mu is held.
func (c *Concurrent) bury(a Ack) {
	if _, ok := c.ended[a.Token]; !ok {
		c.ended[a.Token] = a.ID
		c.buried = append(c.buried, a)
	}
}

// staleAck returns the token of a claim known to have ended, if any:
// mostly a recent one, whose job is the likeliest to run again under a
// newer claim.
func (c *Concurrent) staleAck(rng *rand.Rand) (Ack, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.buried) == 0 {
		return Ack{}, false
	}
	from := 0
	if rng.IntN(4) != 0 {
		from = max(0, len(c.buried)-20)
	}
	return c.buried[from+rng.IntN(len(c.buried)-from)], true
}

// crowdWorker is one of the concurrent workers: it claims, runs, renews,
// acknowledges, abandons, reclaims, crashes and comes back as a zombie.
type crowdWorker struct {
	c       *Concurrent
	id      string
	rng     *rand.Rand
	conn    *pgx.Conn
	session int32
	// expires holds the lease expiry of each claim the worker holds, as
	// the database last told it: only the holder renews a lease.
	expires map[pgtype.UUID]time.Time
	// told holds the claims whose heartbeat said a cancel was asked.
	told map[pgtype.UUID]bool
}

func (w *crowdWorker) run(ctx context.Context, deadline time.Time) error {
	defer func() {
		if w.conn != nil {
			w.conn.Close(context.Background())
		}
	}()
	if err := w.register(ctx); err != nil {
		return err
	}
	q := db.New(w.c.pool)
	for time.Now().Before(deadline) {
		switch r := w.rng.IntN(20); {
		case r == 0:
			if err := w.crash(ctx); err != nil {
				return err
			}
		case r < 4:
			rows, err := q.JobReclaim(ctx, db.JobReclaimParams{MaxJobs: 100})
			if err != nil {
				return fmt.Errorf("%s: reclaim: %w", w.id, err)
			}
			taken, _ := ReclaimedOf(rows)
			w.c.mu.Lock()
			for _, r := range taken {
				w.c.jobs[r.ID].reclaims++
				w.c.counts["reclaim/jobs"]++
				w.c.stopped = append(w.c.stopped, r.ID)
			}
			w.c.mu.Unlock()
		case r < 7:
			if err := w.zombie(ctx); err != nil {
				return err
			}
		default:
			if err := w.work(ctx, q); err != nil {
				return err
			}
		}
	}
	return nil
}

// work claims a few jobs and does something with each.
func (w *crowdWorker) work(ctx context.Context, q *db.Queries) error {
	lease := time.Duration(20+w.rng.IntN(80)) * time.Millisecond
	tokens := make([]pgtype.UUID, 1+w.rng.IntN(3))
	for i := range tokens {
		tokens[i] = newToken()
	}
	rows, err := q.JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
		CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
		SessionKey: &w.session, Queue: QueueDefault, ClaimTokens: tokens, LeaseMs: lease.Milliseconds(), WorkerID: w.id,
	})
	if err != nil {
		return fmt.Errorf("%s: claim: %w", w.id, err)
	}
	claimed := w.c.recordClaims(rows)
	for _, r := range rows {
		if r.ID != nil {
			w.expires[r.LeaseToken] = *r.LeaseExpiresAt
		}
	}
	if len(claimed) == 0 {
		return w.c.enqueue(ctx, w.rng, 1+w.rng.IntN(5))
	}
	for _, a := range claimed {
		if err := w.handle(ctx, a, lease); err != nil {
			return err
		}
	}
	return nil
}

// handle runs one claimed job: a short wait with heartbeats, then an
// outcome, or nothing (the worker forgets it: its lease runs out).
func (w *crowdWorker) handle(ctx context.Context, a Ack, lease time.Duration) error {
	for range w.rng.IntN(3) {
		time.Sleep(time.Duration(w.rng.IntN(int(lease.Milliseconds()))) * time.Millisecond)
		if _, err := w.ack(ctx, "heartbeat", a, false); err != nil {
			return err
		}
	}
	if w.rng.IntN(10) == 0 {
		time.Sleep(lease)
	}
	kinds := []string{"complete", "complete", "complete", "fail", "fail permanently", "release", "release ahead", "forget"}
	kind := kinds[w.rng.IntN(len(kinds))]
	if w.told[a.Token] && w.rng.IntN(2) == 0 {
		// The handler returns the cancellation as its error, or
		// ignores it and succeeds, or the worker shuts down first.
		kind = []string{"fail", "complete", "release"}[w.rng.IntN(3)]
	}
	_, err := w.ack(ctx, kind, a, false)
	delete(w.expires, a.Token)
	delete(w.told, a.Token)
	return err
}

// zombie acknowledges a claim known to have ended: the database must
// refuse it.
func (w *crowdWorker) zombie(ctx context.Context) error {
	a, ok := w.c.staleAck(w.rng)
	if !ok {
		return nil
	}
	kinds := []string{"heartbeat", "complete", "fail", "release", "release ahead"}
	_, err := w.ack(ctx, kinds[w.rng.IntN(len(kinds))], a, true)
	return err
}

// ack sends one acknowledgement of a, in a transaction that reads now()
// first, and records it if accepted; stale says the claim was known to
// have ended before it was sent.
func (w *crowdWorker) ack(ctx context.Context, kind string, a Ack, stale bool) (bool, error) {
	if kind == "forget" {
		w.c.count("forget")
		return false, nil
	}
	var accepted, busy, told bool
	var record func(*jobHistory)
	var renewed time.Time
	// A retry recorded by now ended every claim up to its fence: an
	// acknowledgement of one of them sent from now on must be refused.
	w.c.mu.Lock()
	retried := w.c.jobs[a.ID].retryFence()
	fence := w.c.jobs[a.ID].fenceOf(a.Token)
	w.c.mu.Unlock()
	now, err := inTx(ctx, w.c.pool, func(q *db.Queries, _ time.Time) error {
		switch kind {
		case "heartbeat":
			rows, err := q.JobHeartbeatMany(ctx, db.JobHeartbeatManyParams{LeaseMs: 50, IDs: []int64{a.ID}, Tokens: []pgtype.UUID{a.Token}})
			if err != nil {
				return err
			}
			switch {
			case len(rows) == 1 && rows[0].Renewed:
				accepted = true
				renewed = *rows[0].LeaseExpiresAt
				told = rows[0].CancelRequested
			case len(rows) == 1:
				// Left for the next heartbeat: another transaction
				// held the row, and the fence held in the snapshot.
				busy = true
			}
		case "complete":
			rows, err := q.JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
				CompleteIDs: []int64{a.ID}, CompleteTokens: []pgtype.UUID{a.Token}, CompleteResults: [][]byte{resultOf(a)},
				Queue: QueueDefault, ClaimTokens: []pgtype.UUID{}, WorkerID: w.id,
			})
			if err != nil {
				return err
			}
			accepted = len(rows) > 0 && slices.Contains(rows[0].CompletedIDs, a.ID)
			record = func(h *jobHistory) { h.completed = append(h.completed, a.Token) }
		case "fail", "fail permanently":
			rows, err := q.JobFailMany(ctx, db.JobFailManyParams{
				IDs: []int64{a.ID}, Tokens: []pgtype.UUID{a.Token}, Errors: []string{"failed"},
				Permanent: []bool{kind == "fail permanently"}, RetryInMs: []int64{int64(w.rng.IntN(20))},
			})
			if err != nil {
				return err
			}
			accepted = len(rows) == 1
			record = func(h *jobHistory) {
				h.fails++
				w.c.stopped = append(w.c.stopped, a.ID)
			}
		case "release", "release ahead":
			var note *string
			if kind == "release" {
				note = ptr(ShutdownNote)
			}
			rows, err := q.JobReleaseMany(ctx, db.JobReleaseManyParams{Note: note, IDs: []int64{a.ID}, Tokens: []pgtype.UUID{a.Token}})
			if err != nil {
				return err
			}
			accepted = len(rows) == 1
			record = func(h *jobHistory) {
				h.released = append(h.released, h.fenceOf(a.Token))
				if note != nil {
					h.noted++
				}
			}
		default:
			return fmt.Errorf("unknown acknowledgement %q", kind)
		}
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("%s: %s: %w", w.id, kind, err)
	}
	outcome := "rejected"
	switch {
	case accepted:
		outcome = "accepted"
	case busy:
		outcome = "busy"
	}
	switch {
	case stale:
		w.c.count("zombie " + kind + "/" + outcome)
		if accepted || busy {
			w.c.brokenf("%s of job %d %s under token %s, whose claim had ended before it was sent", kind, a.ID, outcome, a.Token)
		}
	default:
		w.c.count(kind + "/" + outcome)
		if e, ok := w.expires[a.Token]; accepted && ok && !e.After(now) {
			w.c.brokenf("%s of job %d accepted at %s under token %s, whose lease expired at %s", kind, a.ID, stamp(now), a.Token, stamp(e))
		}
	}
	if accepted && retried > 0 && fence <= retried {
		w.c.brokenf("%s of job %d accepted under token %s of fence %d, sent after a retry at fence %d", kind, a.ID, a.Token, fence, retried)
	}
	if accepted && kind == "heartbeat" && !stale {
		w.expires[a.Token] = renewed
		if told {
			w.told[a.Token] = true
			w.c.count("heartbeat/told of a cancel")
			w.c.mu.Lock()
			asked := slices.ContainsFunc(w.c.jobs[a.ID].events, func(e jobEvent) bool { return e.kind == "cancel running" && e.fence == fence })
			w.c.mu.Unlock()
			if !asked {
				w.c.brokenf("heartbeat of job %d under token %s of fence %d told of a cancel, but none was asked of that claim", a.ID, a.Token, fence)
			}
		}
	}
	if accepted && record != nil {
		w.c.recordEnd(a, record)
	}
	return accepted, nil
}

// resultOf is the result a completion under a's token records.
func resultOf(a Ack) json.RawMessage {
	return json.RawMessage(`{"token":"` + a.Token.String() + `"}`)
}

// operate cancels and retries jobs, as POST /v1/jobs/{id}/cancel and
// /retry do, every few milliseconds until deadline, while the workers run
// them.
func (w *crowdWorker) operate(ctx context.Context, deadline time.Time) error {
	for time.Now().Before(deadline) {
		time.Sleep(time.Duration(w.rng.IntN(5)) * time.Millisecond)
		op := w.cancel
		if w.rng.IntN(5) < 2 {
			op = w.retry
		}
		if err := op(ctx); err != nil {
			return err
		}
	}
	return nil
}

// pickJob returns a job: one of the newest of recent half the time, else
// any.
func (c *Concurrent) pickJob(rng *rand.Rand, recent []int64) int64 {
	if len(recent) > 0 && rng.IntN(2) == 0 {
		from := max(0, len(recent)-20)
		return recent[from+rng.IntN(len(recent)-from)]
	}
	return c.ids[rng.IntN(len(c.ids))]
}

// cancel cancels a job, mostly one claimed lately, and records what the
// cancel did while its transaction still holds the job.
func (w *crowdWorker) cancel(ctx context.Context) error {
	w.c.mu.Lock()
	id := w.c.pickJob(w.rng, w.c.claimed)
	w.c.mu.Unlock()
	_, err := inTx(ctx, w.c.pool, func(q *db.Queries, now time.Time) error {
		row, err := q.JobCancel(ctx, id)
		if err != nil {
			return err
		}
		w.c.mu.Lock()
		defer w.c.mu.Unlock()
		h := w.c.jobs[id]
		var last jobEvent
		if len(h.events) > 0 {
			last = h.events[len(h.events)-1]
		}
		bad := func(format string, args ...any) {
			w.c.broken = append(w.c.broken, fmt.Sprintf("cancel of job %d at %s: ", id, stamp(now))+fmt.Sprintf(format, args...))
		}
		switch {
		case !row.Applied:
			w.c.counts["cancel/refused"]++
			if row.State != db.JobStateSucceeded && row.State != db.JobStateDead && row.State != db.JobStateCancelled {
				bad("refused in state %s", row.State)
			}
			return nil
		case last.kind == "cancel":
			bad("applied (leaving it %s) after a cancel at fence %d, with no retry since", row.State, last.fence)
		case row.State == db.JobStateCancelled:
			w.c.counts["cancel/cancelled"]++
			w.c.stopped = append(w.c.stopped, id)
			if row.FinishedAt == nil || !row.FinishedAt.Equal(now) || row.LeaseToken.Valid || row.CancelRequestedAt != nil {
				bad("left it cancelled with finished_at %v, lease token %v, cancel_requested_at %v", row.FinishedAt, row.LeaseToken, row.CancelRequestedAt)
			}
		case row.State == db.JobStateRunning:
			w.c.counts["cancel/marked"]++
			switch {
			case row.CancelRequestedAt == nil || !row.LeaseToken.Valid:
				bad("left the running job with cancel_requested_at %v and lease token %v", row.CancelRequestedAt, row.LeaseToken)
			case last.kind == "cancel running" && last.fence == row.Fence:
				if !last.cancelRequested.Equal(*row.CancelRequestedAt) {
					bad("moved its mark from %s to %s", stamp(last.cancelRequested), stamp(*row.CancelRequestedAt))
				}
			case !row.CancelRequestedAt.Equal(now):
				bad("marked the running job at %s", stamp(*row.CancelRequestedAt))
			}
		default:
			bad("applied, leaving it %s", row.State)
		}
		e := jobEvent{kind: "cancel", fence: row.Fence}
		if row.State == db.JobStateRunning {
			e.kind = "cancel running"
			if row.CancelRequestedAt != nil {
				e.cancelRequested = *row.CancelRequestedAt
			}
		}
		h.events = append(h.events, e)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: cancel job %d: %w", w.id, id, err)
	}
	return nil
}

// retry retries a job, mostly one that failed, was reclaimed or was
// cancelled lately, and records what the retry did while its transaction
// still holds the job: every claim up to the fence it found has ended, for
// zombies to acknowledge.
func (w *crowdWorker) retry(ctx context.Context) error {
	w.c.mu.Lock()
	id := w.c.pickJob(w.rng, w.c.stopped)
	w.c.mu.Unlock()
	_, err := inTx(ctx, w.c.pool, func(q *db.Queries, now time.Time) error {
		row, err := q.JobRetry(ctx, id)
		if err != nil {
			return err
		}
		w.c.mu.Lock()
		defer w.c.mu.Unlock()
		if !row.Applied {
			w.c.counts["retry/refused"]++
			if row.State == db.JobStateDead || row.State == db.JobStateCancelled {
				w.c.broken = append(w.c.broken, fmt.Sprintf("retry of job %d at %s refused in state %s", id, stamp(now), row.State))
			}
			return nil
		}
		w.c.counts["retry/applied"]++
		if row.State != db.JobStateAvailable || row.Attempt != 0 || !row.RunAt.Equal(now) || row.FinishedAt != nil || row.Result != nil ||
			row.LeaseToken.Valid || row.CancelRequestedAt != nil {
			w.c.broken = append(w.c.broken, fmt.Sprintf("retry of job %d at %s left it %s, attempt %d, run_at %s, finished_at %v, result %s, lease token %v, cancel_requested_at %v",
				id, stamp(now), row.State, row.Attempt, stamp(row.RunAt), row.FinishedAt, row.Result, row.LeaseToken, row.CancelRequestedAt))
		}
		h := w.c.jobs[id]
		h.events = append(h.events, jobEvent{kind: "retry", fence: row.Fence})
		for _, cl := range h.claims {
			if cl.fence <= row.Fence {
				w.c.bury(Ack{ID: id, Token: cl.token})
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: retry job %d: %w", w.id, id, err)
	}
	return nil
}

// register registers a new session for the worker, replacing its last.
func (w *crowdWorker) register(ctx context.Context) error {
	conn, err := pgx.ConnectConfig(ctx, w.c.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("%s: connect: %w", w.id, err)
	}
	p := db.WorkerRegisterParams{ID: w.id, Queue: QueueDefault, PID: 1, Host: "modelcheck"}
	if w.session != 0 {
		p.PreviousSessionKey = &w.session
	}
	reg, err := db.New(conn).WorkerRegister(ctx, p)
	if err != nil {
		conn.Close(ctx)
		return fmt.Errorf("%s: register: %w", w.id, err)
	}
	w.conn, w.session = conn, reg.SessionKey
	return nil
}

// crash ends the worker's session, waits until its lock is gone, and
// registers a new one.
func (w *crowdWorker) crash(ctx context.Context) error {
	if err := endSession(ctx, w.c.pool, w.conn, w.session); err != nil {
		return err
	}
	w.conn = nil
	w.c.count("crash")
	clear(w.expires)
	// Its claims in flight still name the ended session: they must
	// claim nothing.
	rows, err := db.New(w.c.pool).JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
		CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
		SessionKey: &w.session, Queue: QueueDefault, ClaimTokens: []pgtype.UUID{newToken()}, LeaseMs: 1000, WorkerID: w.id,
	})
	if err != nil {
		return fmt.Errorf("%s: claim under ended session: %w", w.id, err)
	}
	if got := w.c.recordClaims(rows); len(got) > 0 {
		w.c.brokenf("claim under session %d, which had ended, took job %d", w.session, got[0].ID)
	}
	return w.register(ctx)
}

// drain finishes every job left: every session has ended, so a reclaim
// takes back every running job at once; a worker without a session then
// claims and completes the rest until all are terminal.
func (c *Concurrent) drain(ctx context.Context) error {
	q := db.New(c.pool)
	deadline := time.Now().Add(30 * time.Second)
	for {
		rows, err := q.JobReclaim(ctx, db.JobReclaimParams{MaxJobs: 1000})
		if err != nil {
			return fmt.Errorf("drain: reclaim: %w", err)
		}
		taken, _ := ReclaimedOf(rows)
		for _, r := range taken {
			c.jobs[r.ID].reclaims++
		}
		tokens := make([]pgtype.UUID, 100)
		for i := range tokens {
			tokens[i] = newToken()
		}
		claimed, err := q.JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
			CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
			Queue: QueueDefault, ClaimTokens: tokens, LeaseMs: time.Minute.Milliseconds(), WorkerID: "drain",
		})
		if err != nil {
			return fmt.Errorf("drain: claim: %w", err)
		}
		acks := c.recordClaims(claimed)
		for _, a := range acks {
			rows, err := q.JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
				CompleteIDs: []int64{a.ID}, CompleteTokens: []pgtype.UUID{a.Token}, CompleteResults: [][]byte{resultOf(a)},
				Queue: QueueDefault, ClaimTokens: []pgtype.UUID{}, WorkerID: "drain",
			})
			if err != nil {
				return fmt.Errorf("drain: complete: %w", err)
			}
			if len(rows) == 0 || !slices.Contains(rows[0].CompletedIDs, a.ID) {
				return fmt.Errorf("drain: completion of job %d under a fresh one-minute lease refused", a.ID)
			}
			c.recordEnd(a, func(h *jobHistory) { h.completed = append(h.completed, a.Token) })
		}
		stats, err := q.JobQueueStats(ctx)
		if err != nil {
			return fmt.Errorf("drain: stats: %w", err)
		}
		open := int64(0)
		for _, s := range stats {
			open += s.Available + s.Running
		}
		if open == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("drain: %d jobs still unfinished after 30s", open)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// verify checks every job against its history.
func (c *Concurrent) verify(ctx context.Context) error {
	rows, err := readJobs(ctx, db.New(c.pool))
	if err != nil {
		return err
	}
	broken := slices.Clone(c.broken)
	if len(rows) != len(c.jobs) {
		broken = append(broken, fmt.Sprintf("%d jobs enqueued, %d in the table", len(c.jobs), len(rows)))
	}
	tokens := map[pgtype.UUID]int64{}
	for _, r := range rows {
		h, ok := c.jobs[r.ID]
		if !ok {
			broken = append(broken, fmt.Sprintf("job %d was never enqueued", r.ID))
			continue
		}
		job, err := fromDB(r)
		if err != nil {
			return err
		}
		broken = append(broken, h.check(job, tokens)...)
	}
	if len(broken) > 0 {
		return fmt.Errorf("%d invariants broken:\n  %s", len(broken), strings.Join(broken, "\n  "))
	}
	return nil
}

// checkCancels checks a finished job against its cancels and retries,
// given the fences of its claims, sorted: a job asked to cancel is never
// claimed again but after a retry, and ends cancelled or succeeded; only
// a cancel since its last retry ends it cancelled.
func (h *jobHistory) checkCancels(j Job, fences []int64) []string {
	var broken []string
	bad := func(format string, args ...any) {
		broken = append(broken, fmt.Sprintf("job %d: ", j.ID)+fmt.Sprintf(format, args...))
	}
	var cancelled *jobEvent
	for i, e := range h.events {
		if e.kind == "retry" {
			cancelled = nil
			continue
		}
		if cancelled != nil {
			// A cancel after the first since the last retry found
			// the same claim (checked as it applied).
			continue
		}
		cancelled = &h.events[i]
		next := slices.IndexFunc(h.events[i:], func(e jobEvent) bool { return e.kind == "retry" })
		switch {
		case next >= 0 && h.events[i+next].fence != e.fence:
			bad("%s at fence %d, but the next retry found fence %d: claimed again in between", e.kind, e.fence, h.events[i+next].fence)
		case next < 0 && slices.ContainsFunc(fences, func(f int64) bool { return f > e.fence }):
			bad("%s at fence %d, then claimed again (fences %v) with no retry", e.kind, e.fence, fences)
		}
	}
	switch {
	case cancelled == nil && j.State == db.JobStateCancelled:
		bad("ends cancelled, but no cancel applied since its last retry (events %v)", h.events)
	case cancelled == nil:
	case cancelled.kind == "cancel" && j.State != db.JobStateCancelled,
		cancelled.kind == "cancel running" && j.State != db.JobStateCancelled && j.State != db.JobStateSucceeded:
		bad("ends %s after a %s at fence %d with no retry since", j.State, cancelled.kind, cancelled.fence)
	case j.Fence != cancelled.fence:
		bad("ends at fence %d after a %s at fence %d with no retry since", j.Fence, cancelled.kind, cancelled.fence)
	}
	return broken
}

// check compares a finished job with its history; tokens collects the
// claims' tokens of every job, to find one handed out twice.
func (h *jobHistory) check(j Job, tokens map[pgtype.UUID]int64) []string {
	var broken []string
	bad := func(format string, args ...any) {
		broken = append(broken, fmt.Sprintf("job %d: ", j.ID)+fmt.Sprintf(format, args...))
	}
	if !j.Terminal() {
		bad("ends %s, not terminal", j.State)
	}
	fences := make([]int64, len(h.claims))
	for i, cl := range h.claims {
		fences[i] = cl.fence
	}
	slices.Sort(fences)
	for i, f := range fences {
		if f != int64(i+1) {
			bad("claims got fences %v, not 1 to %d", fences, len(fences))
			break
		}
	}
	for _, cl := range h.claims {
		if other, ok := tokens[cl.token]; ok {
			bad("token %s handed out again (job %d had it)", cl.token, other)
		}
		tokens[cl.token] = j.ID
	}
	if j.Fence != int64(len(h.claims)) {
		bad("fence %d after %d claims", j.Fence, len(h.claims))
	}
	if ends := len(h.completed) + h.fails + len(h.released) + h.reclaims; ends != len(h.claims) {
		bad("%d claims ended %d times (%d completions, %d failures, %d releases, %d reclaims): a claim ended twice or never",
			len(h.claims), ends, len(h.completed), h.fails, len(h.released), h.reclaims)
	}
	// A retry restarts the attempts: only the claims since count.
	retried := h.retryFence()
	claims, releases := 0, 0
	for _, f := range fences {
		if f > retried {
			claims++
		}
	}
	for _, f := range h.released {
		if f > retried {
			releases++
		}
	}
	if want := int32(claims - releases); j.Attempt != want {
		bad("attempt %d after %d claims and %d releases since its last retry (at fence %d)", j.Attempt, claims, releases, retried)
	}
	broken = append(broken, h.checkCancels(j, fences)...)
	if want := h.fails + h.noted + h.reclaims; j.Errors != want {
		bad("%d entries in the error history after %d failures, %d noted releases and %d reclaims", j.Errors, h.fails, h.noted, h.reclaims)
	}
	switch {
	case len(h.completed) > 1:
		bad("completed %d times", len(h.completed))
	case len(h.completed) == 1:
		if want := string(resultOf(Ack{Token: h.completed[0]})); j.State != db.JobStateSucceeded || j.Result != want {
			bad("completed under %s, but ends %s with result %s", h.completed[0], j.State, j.Result)
		}
	case j.State == db.JobStateSucceeded:
		bad("succeeded without an accepted completion")
	}
	return broken
}
