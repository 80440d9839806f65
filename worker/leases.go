package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgerr"
)

// leases makes the worker's calls of the lease statements of
// queries/leases.sql, in the order of that file, each in a method named
// after its statement.
type leases struct {
	w *Worker
	// q sends the statements: through the worker's pool, or on one
	// connection taken from it (on).
	q *db.Queries
}

// acquire takes a connection of the worker's pool for statements that
// commit on their own and whose answers may be lost (see on).
func (l leases) acquire(ctx context.Context) (*pgxpool.Conn, error) {
	conn, err := l.w.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquire a connection: %w", err)
	}
	return conn, nil
}

// on returns the same calls, made on conn, a connection acquire took. A
// statement sent through the pool fails alike whether it waited for a
// connection or, sent, for its answer (the context's error, as when a
// round is given up at shutdown), and would be taken for one whose answer
// was lost (pgerr.AnswerLost): its outcomes reported in doubt, and its
// claim looked for, though nothing was sent. A connection taken first
// tells the two apart.
func (l leases) on(conn *pgxpool.Conn) leases {
	return leases{w: l.w, q: db.New(conn)}
}

// completeAndClaim records the round's completions and makes its claim, in
// one statement (JobCompleteAndClaim; JobCompleteMany for a round that
// claims nothing). If the database refuses the result
// of a completion, the completions are sent again apart from the claim,
// isolating the refused ones, which move to the round's failures; the
// claim is then made on its own. If the isolation ends on another error,
// the completions the database answered for stay in the round, to be
// reported, and the rest go to r.unsettled, to be sent again.
func (l leases) completeAndClaim(ctx context.Context, r *round) error {
	w := l.w
	done := r.batch.done
	r.completed = make(map[int64]bool, len(done))
	claimed, err := l.sendCompleteAndClaim(ctx, r, done, r.claim)
	if err == nil {
		r.claimed = claimed
		return nil
	}
	if !isRowDataError(err) || len(done) == 0 {
		r.completed = nil
		return fmt.Errorf("complete and claim: %w", err)
	}
	refused, settled, err := sendIsolating(ctx, done, func(ctx context.Context, part []outcome) error {
		_, err := l.sendCompleteAndClaim(ctx, r, part, 0)
		return err
	})
	kept := make([]outcome, 0, settled)
	for i, o := range done[:settled] {
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
	if err != nil {
		r.unsettled.done = done[settled:]
		return fmt.Errorf("complete jobs: %w", err)
	}
	if r.claimed, err = l.sendCompleteAndClaim(ctx, r, nil, r.claim); err != nil {
		return fmt.Errorf("claim: %w", err)
	}
	return nil
}

// sendCompleteAndClaim runs JobCompleteAndClaim for done and a claim of up
// to claim jobs under the worker's session (JobCompleteMany, through
// completeMany, when it claims none), marks in r.completed the
// completions the database accepted, and returns the jobs claimed. The
// claim's lease tokens are drawn here; if the answer is lost, they are left
// in r.lostClaim, for the next round to find the jobs they hold.
func (l leases) sendCompleteAndClaim(ctx context.Context, r *round, done []outcome, claim int) ([]db.JobCompleteAndClaimRow, error) {
	w := l.w
	session, ok := w.session.claimSession()
	if !ok {
		claim = 0
	}
	if claim == 0 {
		return nil, l.completeMany(ctx, r, done)
	}
	params := db.JobCompleteAndClaimParams{
		LockWaitMs:  w.cfg.lockWaitMs(),
		SessionKey:  session,
		Queue:       w.cfg.Queue,
		ClaimTokens: make([]pgtype.UUID, claim),
		LeaseMs:     w.cfg.Lease.Milliseconds(),
		WorkerID:    w.cfg.ID,
	}
	params.CompleteIDs, params.CompleteTokens, params.CompleteResults = completions(done)
	params.CursorPriorities, params.CursorSince = w.cursors.params(time.Now())
	// A claim without cursors scans every priority from its head.
	fromHead := len(params.CursorPriorities) == 0
	r.fromCursors = !fromHead
	for i := range params.ClaimTokens {
		token, err := uuid.NewRandom()
		if err != nil {
			return nil, fmt.Errorf("draw a lease token: %w", err)
		}
		params.ClaimTokens[i] = pgtype.UUID{Bytes: token, Valid: true}
	}
	r.sentAt = time.Now()
	rows, err := l.q.JobCompleteAndClaim(ctx, params)
	if err != nil {
		if pgerr.AnswerLost(err) {
			r.lostClaim = params.ClaimTokens
			markUnanswered(done)
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
	w.cursors.claimed(claimed, fromHead, len(claimed) == claim)
	return claimed, nil
}

// completeMany records done, the completions of a round that claims
// nothing, in a statement without a claim (JobCompleteMany), and marks in
// r.completed those the database accepted. With nothing to complete it
// sends nothing.
func (l leases) completeMany(ctx context.Context, r *round, done []outcome) error {
	if len(done) == 0 {
		return nil
	}
	params := db.JobCompleteManyParams{LockWaitMs: l.w.cfg.lockWaitMs()}
	params.IDs, params.Tokens, params.Results = completions(done)
	r.sentAt = time.Now()
	ids, err := l.q.JobCompleteMany(ctx, params)
	if err != nil {
		if pgerr.AnswerLost(err) {
			markUnanswered(done)
		}
		return err
	}
	for _, id := range ids {
		r.completed[id] = true
	}
	return nil
}

// completions returns the ids, lease tokens and results of done, as the
// completing statements take them.
func completions(done []outcome) ([]int64, []pgtype.UUID, [][]byte) {
	ids := make([]int64, len(done))
	tokens := make([]pgtype.UUID, len(done))
	results := make([][]byte, len(done))
	for i, o := range done {
		ids[i], tokens[i], results[i] = o.exec.job.ID, o.exec.token, o.result
	}
	return ids, tokens, results
}

// markUnanswered marks the executions of outcomes, sent in a statement
// whose answer was lost, as possibly recorded (execution.unanswered).
func markUnanswered(outcomes []outcome) {
	for _, o := range outcomes {
		o.exec.unanswered = true
	}
}

// getClaimed returns the jobs still running under the lease tokens given,
// those of claims whose answer was lost (JobGetClaimed), in the shape of a
// claim.
func (l leases) getClaimed(ctx context.Context, tokens []pgtype.UUID) ([]db.JobCompleteAndClaimRow, error) {
	rows, err := l.q.JobGetClaimed(ctx, tokens)
	if err != nil {
		return nil, err
	}
	var claimed []db.JobCompleteAndClaimRow
	for _, row := range rows {
		claimed = append(claimed, claimedRow(row))
	}
	return claimed, nil
}

// claimedRow is a job found by JobGetClaimed, in the shape of a claim.
func claimedRow(r db.JobGetClaimedRow) db.JobCompleteAndClaimRow {
	return db.JobCompleteAndClaimRow{
		ID: &r.ID, Queue: &r.Queue, Kind: &r.Kind, Payload: r.Payload, Priority: &r.Priority,
		Attempt: &r.Attempt, MaxAttempts: &r.MaxAttempts, Fence: &r.Fence, LeaseToken: r.LeaseToken,
		LeaseExpiresAt: r.LeaseExpiresAt, CreatedAt: &r.CreatedAt, RunAt: &r.RunAt, StartedAt: r.StartedAt,
	}
}

// heartbeatMany renews the leases of held (JobHeartbeatMany), waiting for
// the answer until the time until, and returns the jobs whose lease it
// renewed and, among them, those someone asked to cancel, and the jobs it
// left for the next heartbeat because another transaction held their
// rows. Any other job of held is no longer the worker's.
func (l leases) heartbeatMany(ctx context.Context, held []*execution, until time.Time) (renewed, cancelled, busy map[int64]bool, err error) {
	w := l.w
	params := db.JobHeartbeatManyParams{
		LeaseMs: w.cfg.Lease.Milliseconds(),
		IDs:     make([]int64, len(held)),
		Tokens:  make([]pgtype.UUID, len(held)),
	}
	for i, e := range held {
		params.IDs[i] = e.job.ID
		params.Tokens[i] = e.token
	}
	ctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	rows, err := l.q.JobHeartbeatMany(ctx, params)
	if err != nil {
		return nil, nil, nil, err
	}
	renewed = make(map[int64]bool, len(rows))
	cancelled = make(map[int64]bool)
	busy = make(map[int64]bool)
	for _, r := range rows {
		switch {
		case !r.Renewed:
			busy[r.ID] = true
		case r.CancelRequested:
			renewed[r.ID] = true
			cancelled[r.ID] = true
		default:
			renewed[r.ID] = true
		}
	}
	return renewed, cancelled, busy, nil
}

// failMany records failed outcomes (JobFailMany), each with its retry
// delay, and returns the state each accepted failure moved its job to. A
// failure the database refuses to record is left to the job's lease. On
// an error it also returns how many failures at the head of failed the
// database answered for; the rest are to be sent again.
func (l leases) failMany(ctx context.Context, failed []outcome) (states map[int64]db.JobState, settled int, err error) {
	w := l.w
	states = make(map[int64]db.JobState, len(failed))
	refused, settled, err := sendIsolating(ctx, failed, func(ctx context.Context, part []outcome) error {
		params := db.JobFailManyParams{
			LockWaitMs: w.cfg.lockWaitMs(),
			IDs:        make([]int64, len(part)),
			Tokens:     make([]pgtype.UUID, len(part)),
			Errors:     make([]string, len(part)),
			Permanent:  make([]bool, len(part)),
			RetryInMs:  make([]int64, len(part)),
		}
		for i, o := range part {
			params.IDs[i] = o.exec.job.ID
			params.Tokens[i] = o.exec.token
			params.Errors[i] = errorText(o.err, MaxErrorLength)
			params.Permanent[i] = IsPermanent(o.err)
			// Only an attempt that a retry follows has a backoff: not
			// that of a job the worker knows someone cancelled, which
			// ends cancelled.
			if job := o.exec.job; !params.Permanent[i] && job.Attempt < job.MaxAttempts && !cancelled(o.exec) {
				params.RetryInMs[i] = w.backoff(job).Milliseconds()
			}
		}
		rows, err := l.q.JobFailMany(ctx, params)
		for _, r := range rows {
			states[r.ID] = r.State
		}
		if err != nil && pgerr.AnswerLost(err) {
			markUnanswered(part)
		}
		return err
	})
	for i, rerr := range refused {
		w.log.Error("the database refused to record a failure; the job's lease will expire", "job", failed[i].exec.job.ID, "err", rerr)
	}
	if err != nil {
		return states, settled, fmt.Errorf("record failures: %w", err)
	}
	return states, settled, nil
}

// cancelled reports whether e's handler was cancelled because someone
// cancelled its job (ErrJobCancelled): the failure then ends the job
// cancelled, whatever attempts it has left.
func cancelled(e *execution) bool {
	return errors.Is(context.Cause(e.ctx), ErrJobCancelled)
}

// heldElsewhere returns which of the jobs ids another transaction holds
// the rows of (JobHeldElsewhere), without waiting for any.
func (l leases) heldElsewhere(ctx context.Context, ids []int64) (map[int64]bool, error) {
	rows, err := l.q.JobHeldElsewhere(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("ask which jobs' rows another transaction holds: %w", err)
	}
	held := make(map[int64]bool)
	for _, r := range rows {
		if r.Held {
			held[r.ID] = true
		}
	}
	return held, nil
}

// outcomeJobs returns the ids of the jobs of outcomes.
func outcomeJobs(outcomes []outcome) []int64 {
	ids := make([]int64, len(outcomes))
	for i, o := range outcomes {
		ids[i] = o.exec.job.ID
	}
	return ids
}

// executionJobs returns the ids of the jobs of execs.
func executionJobs(execs []*execution) []int64 {
	ids := make([]int64, len(execs))
	for i, e := range execs {
		ids[i] = e.job.ID
	}
	return ids
}

// lockNotAvailable reports whether err is a statement refused a lock that
// another transaction holds (SQLSTATE 55P03, lock_not_available): one that
// asked with NOWAIT, or one that waited for a row until lock_timeout, as a
// round's completions and failures do for lock_wait_ms.
func lockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// errorText makes an error message safe to store: valid UTF-8, no NUL
// (which PostgreSQL text refuses), at most n bytes, cut at a rune boundary.
func errorText(err error, n int) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// releaseMany releases the jobs of execs to the queue (JobReleaseMany),
// with note in their error history if it is not nil, and returns those the
// database released, and those whose rows it refused (see sendIsolating).
// A job the database refuses to release is left to its lease; one it
// neither released nor refused, the fence turned down. A row another
// transaction holds is waited for lock_wait_ms at most; then the jobs
// whose rows are held are left out, returned in held, and the others sent
// again, so that a held row holds back only its own job's release.
func (l leases) releaseMany(ctx context.Context, execs []*execution, note *string) (released, refused map[int64]bool, held []*execution, err error) {
	released = make(map[int64]bool, len(execs))
	refused = make(map[int64]bool)
	err = l.release(ctx, execs, note, released, refused)
	switch {
	case err == nil:
		return released, refused, nil, nil
	case !lockNotAvailable(err):
		return nil, nil, nil, err
	}
	isHeld, herr := l.heldElsewhere(ctx, executionJobs(execs))
	if herr != nil || len(isHeld) == 0 {
		return nil, nil, nil, err
	}
	var free []*execution
	for _, e := range execs {
		switch {
		case isHeld[e.job.ID]:
			held = append(held, e)
		case !released[e.job.ID]:
			free = append(free, e)
		}
	}
	if err := l.release(ctx, free, note, released, refused); err != nil {
		return nil, nil, nil, err
	}
	return released, refused, held, nil
}

// release sends the releases of execs (JobReleaseMany) and records in
// released the jobs the database released, in the parts it answered for
// even if it did not answer for all, and in refused, once all are
// answered for, those whose rows it refused.
func (l leases) release(ctx context.Context, execs []*execution, note *string, released, refused map[int64]bool) error {
	w := l.w
	rowsRefused, _, err := sendIsolating(ctx, execs, func(ctx context.Context, part []*execution) error {
		params := db.JobReleaseManyParams{
			LockWaitMs: w.cfg.lockWaitMs(),
			Note:       note,
			IDs:        executionJobs(part),
			Tokens:     make([]pgtype.UUID, len(part)),
		}
		for i, e := range part {
			params.Tokens[i] = e.token
		}
		ids, err := l.q.JobReleaseMany(ctx, params)
		for _, id := range ids {
			released[id] = true
		}
		if err != nil && pgerr.AnswerLost(err) {
			for _, e := range part {
				e.unanswered = true
			}
		}
		return err
	})
	if err != nil {
		return err
	}
	for i, rerr := range rowsRefused {
		refused[execs[i].job.ID] = true
		w.log.Error("the database refused to release a job; its lease will expire", "job", execs[i].job.ID, "err", rerr)
	}
	return nil
}

// reclaim takes back up to DefaultReclaimBatch jobs of dead workers and
// expired leases (JobReclaim), those whose lease expired after since (a
// time by the database's clock) or, when it is nil, all of them, and
// those of recheck still abandoned; records the live workers it counted,
// in all and on the worker's queue (Worker.fleet, Worker.queueFleet);
// wakes the dispatcher if it took any jobs, and returns how many it took,
// the jobs it found abandoned but left, their rows held by another
// transaction, and when it ran, by the database's clock. A reclaim that
// fails keeps the last count.
func (l leases) reclaim(ctx context.Context, since *time.Time, recheck []int64) (taken int, left []int64, ran time.Time, err error) {
	w := l.w
	rctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	params := db.JobReclaimParams{MaxJobs: DefaultReclaimBatch, Queue: w.cfg.Queue, ExpiredSince: since, RecheckIDs: recheck}
	rows, err := l.q.JobReclaim(rctx, params)
	if err != nil {
		// One that ran out of time is logged too; one cut short by the
		// worker's stop is not.
		if ctx.Err() == nil {
			w.log.Warn("reclaim failed", "err", err)
		}
		return 0, nil, time.Time{}, err
	}
	for _, r := range rows {
		left, ran = r.LeftIDs, r.ReclaimedAt
		w.fleet.Store(r.Live)
		w.queueFleet.Store(r.LiveInQueue)
		if r.ID == nil {
			continue // the row that stands for none taken
		}
		taken++
		w.log.Info("reclaimed job", "job", *r.ID, "reason", deref(r.LastError),
			"from_worker", deref(r.LeasedBy), "attempt", deref(r.Attempt), "now", deref(r.State))
	}
	if taken > 0 {
		// They keep their run_at, behind the claim cursors.
		w.jobReturned()
		notify(w.wake)
	}
	return taken, left, ran, nil
}
