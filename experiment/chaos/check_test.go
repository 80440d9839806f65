package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/experiment/chaos/schema"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/dbtest"
)

// The checker is proven able to fail: each test below writes a history by
// hand, through Relay's own statements where the history is legal and by
// direct updates where it is not (what a broken queue would do), and
// checks that the checker flags exactly what is wrong.

// history is a database with the chaos schema, on which a test writes a
// history.
type history struct {
	t    *testing.T
	ctx  context.Context
	pool *pgxpool.Pool
	q    *db.Queries
	lab  *labdb.Queries
}

func newHistory(t *testing.T) *history {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	pool := dbtest.New(t)
	if _, err := pool.Exec(ctx, schema.Chaos); err != nil {
		t.Fatalf("add the chaos schema: %v", err)
	}
	// Twice, as the harness may: every statement must be repeatable.
	if _, err := pool.Exec(ctx, schema.Chaos); err != nil {
		t.Fatalf("add the chaos schema again: %v", err)
	}
	return &history{t: t, ctx: ctx, pool: pool, q: db.New(pool), lab: labdb.New(pool)}
}

// enqueue inserts a job and records its enqueue as acknowledged.
func (h *history) enqueue(kind string, maxAttempts int32) int64 {
	h.t.Helper()
	id := h.insert(kind, maxAttempts)
	if err := h.lab.ChaosEnqueued(h.ctx, labdb.ChaosEnqueuedParams{JobIDs: []int64{id}, Via: "go"}); err != nil {
		h.t.Fatal(err)
	}
	return id
}

// insert inserts a job without recording its enqueue.
func (h *history) insert(kind string, maxAttempts int32) int64 {
	h.t.Helper()
	ids, err := h.q.JobInsertMany(h.ctx, db.JobInsertManyParams{
		Queues: []string{"default"}, Kinds: []string{kind}, Payloads: [][]byte{json.RawMessage("{}")},
		Priorities: []int16{0}, MaxAttempts: []int32{maxAttempts}, RunAts: []time.Time{{}}, DelaysMs: []int64{0},
	})
	if err != nil {
		h.t.Fatal(err)
	}
	return ids[0]
}

// claimed is one claim, as a worker holds it.
type claimed struct {
	id     int64
	fence  int64
	token  pgtype.UUID
	worker string
}

// claim claims the next ready job for worker, and records its execution's
// start, as a chaos worker does.
func (h *history) claim(worker string, lease time.Duration) claimed {
	h.t.Helper()
	return h.claimUnder(worker, nil, lease)
}

// claimUnder claims as claim does, under the worker session given (nil:
// none).
func (h *history) claimUnder(worker string, session *int32, lease time.Duration) claimed {
	h.t.Helper()
	rows, err := h.q.JobCompleteAndClaim(h.ctx, db.JobCompleteAndClaimParams{
		CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
		Queue: "default", ClaimTokens: []pgtype.UUID{newToken()}, LeaseMs: lease.Milliseconds(), WorkerID: worker,
		SessionKey: session,
	})
	if err != nil || len(rows) != 1 || rows[0].ID == nil {
		h.t.Fatalf("claim: %v (%d rows)", err, len(rows))
	}
	c := claimed{id: *rows[0].ID, fence: *rows[0].Fence, token: rows[0].LeaseToken, worker: worker}
	if err := h.lab.ChaosExecutionStart(h.ctx, labdb.ChaosExecutionStartParams{
		JobID: c.id, Kind: *rows[0].Kind, Attempt: *rows[0].Attempt, Fence: c.fence, Worker: worker, PID: 1,
	}); err != nil {
		h.t.Fatal(err)
	}
	return c
}

// complete completes a claim through Relay's fenced statement, with a
// result naming its fence, and records whether it was accepted.
func (h *history) complete(c claimed) bool {
	h.t.Helper()
	rows, err := h.q.JobCompleteAndClaim(h.ctx, db.JobCompleteAndClaimParams{
		CompleteIDs: []int64{c.id}, CompleteTokens: []pgtype.UUID{c.token},
		CompleteResults: [][]byte{json.RawMessage(fmt.Sprintf(`{"fence": %d}`, c.fence))},
		Queue:           "default", LeaseMs: 1000, WorkerID: c.worker,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	accepted := len(rows) > 0 && len(rows[0].CompletedIDs) == 1
	h.ack(c, "completed", accepted)
	return accepted
}

// fail fails a claim through Relay's fenced statement, retrying after
// retry, and records whether it was accepted.
func (h *history) fail(c claimed, retry time.Duration) bool {
	h.t.Helper()
	rows, err := h.q.JobFailMany(h.ctx, db.JobFailManyParams{
		IDs: []int64{c.id}, Tokens: []pgtype.UUID{c.token}, Errors: []string{fmt.Sprintf("boom (fence=%d)", c.fence)},
		Permanent: []bool{false}, RetryInMs: []int64{retry.Milliseconds()},
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.ack(c, "failed", len(rows) == 1)
	return len(rows) == 1
}

// ack records the fate of an execution's acknowledgement.
func (h *history) ack(c claimed, ack string, accepted bool) {
	h.t.Helper()
	if err := h.lab.ChaosExecutionsAck(h.ctx, labdb.ChaosExecutionsAckParams{
		JobIDs: []int64{c.id}, Fences: []int64{c.fence}, Acks: []string{ack}, Accepted: []bool{accepted}, AckedAts: []time.Time{time.Now()},
	}); err != nil {
		h.t.Fatal(err)
	}
}

// register registers a session of worker, as a worker does, on a
// connection of its own that holds the session's lock until the test ends,
// and returns its key.
func (h *history) register(worker string, previous *int32) *int32 {
	h.t.Helper()
	conn, err := h.pool.Acquire(h.ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { conn.Conn().Close(context.Background()); conn.Release() })
	reg, err := db.New(conn).WorkerRegister(h.ctx, db.WorkerRegisterParams{
		ID: worker, Queue: "default", PID: 1, Host: "test", PreviousSessionKey: previous,
	})
	if err != nil {
		h.t.Fatalf("register %s: %v", worker, err)
	}
	return &reg.SessionKey
}

// fault records a fault on a worker.
func (h *history) fault(kind, worker string) {
	h.t.Helper()
	if _, err := h.lab.ChaosFaultRecord(h.ctx, labdb.ChaosFaultRecordParams{Kind: kind, Target: worker}); err != nil {
		h.t.Fatal(err)
	}
}

// exec runs a fixture statement: what a broken queue would do.
func (h *history) exec(sql string, args ...any) {
	h.t.Helper()
	if _, err := h.pool.Exec(h.ctx, sql, args...); err != nil {
		h.t.Fatalf("%s: %v", sql, err)
	}
}

// reclaim takes a running job back as Relay's reclaim does, for reason,
// whether or not that is justified.
func (h *history) reclaim(id int64, reason string) {
	h.t.Helper()
	h.exec(`UPDATE jobs SET state = 'available', run_at = now(), lease_token = NULL, lease_expires_at = NULL, lease_session = NULL,
	            last_error = $2, error_count = error_count + 1, errors = job_errors_append(errors, jsonb_build_object(
	                'attempt', attempt, 'worker', leased_by, 'error', $2::text, 'at', now()))
	        WHERE id = $1`, id, reason)
}

func (h *history) check() *Check {
	h.t.Helper()
	c, err := CheckHistory(h.ctx, h.lab)
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

// wantFindings fails unless exactly the named findings are non-zero, each
// with the given count.
func wantFindings(t *testing.T, c *Check, want map[string]int64) {
	t.Helper()
	got := map[string]Finding{
		"lost": c.Lost, "wrong outcome": c.WrongOutcome, "unexpected": c.Unexpected, "phantoms": c.Phantoms,
		"stale accepted": c.StaleAccepted, "terminal changes": c.TerminalChanges,
		"premature reclaims": c.PrematureReclaims, "poison misbehaved": c.PoisonMisbehaved,
	}
	for name, f := range got {
		if f.Count != want[name] {
			t.Errorf("%s: %d, want %d; examples: %v", name, f.Count, want[name], f.Examples)
		}
	}
	for name := range want {
		if _, ok := got[name]; !ok {
			t.Fatalf("no finding named %q", name)
		}
	}
}

func TestCheckHistory_AcceptsALegalHistory(t *testing.T) {
	h := newHistory(t)
	// A job that simply runs.
	h.enqueue("sleep", 25)
	if !h.complete(h.claim("w1", time.Minute)) {
		t.Fatal("a fresh claim's completion was refused")
	}
	// A job whose worker is killed: reclaimed for its ended session, run
	// again elsewhere; the old worker's late completion is refused.
	h.enqueue("sleep", 25)
	first := h.claim("w1", time.Minute)
	h.fault("kill", "w1")
	h.reclaim(first.id, "worker session ended")
	second := h.claim("w2", time.Minute)
	if h.complete(first) {
		t.Fatal("a reclaimed claim's completion was accepted")
	}
	h.complete(second)
	// A job whose lease runs out while its worker stalls.
	h.enqueue("sleep", 25)
	stalled := h.claim("w3", 50*time.Millisecond)
	time.Sleep(100 * time.Millisecond)
	if h.fail(stalled, 0) {
		t.Fatal("a failure after the lease expired was accepted")
	}
	h.reclaim(stalled.id, "lease expired")
	h.complete(h.claim("w2", time.Minute))
	// A poison job of each kind that ends dead after its only attempt.
	for _, kind := range []string{KindPanic, KindFail, KindExit} {
		h.enqueue(kind, 1)
		h.fail(h.claim("w2", time.Minute), 0)
	}

	c := h.check()
	wantFindings(t, c, nil)
	if c.Enqueued != 6 || c.Executions != 8 {
		t.Errorf("enqueued %d, executions %d; want 6 and 8", c.Enqueued, c.Executions)
	}
	if c.Duplicates.Jobs != 2 || c.Duplicates.ExtraExecutions != 2 {
		t.Errorf("duplicates = %+v, want 2 jobs with 2 extra executions", c.Duplicates)
	}
	if c.Reclaims["worker session ended"] != 1 || c.Reclaims["lease expired"] != 1 {
		t.Errorf("reclaims = %v, want one of each reason", c.Reclaims)
	}
	if c.WorstRedeliveryAfterDeathMs <= 0 {
		t.Errorf("the killed worker's job was not timed back to its next claim: %+v", c.ReclaimDelays)
	}
}

func TestCheckHistory_CatchesALostJob(t *testing.T) {
	h := newHistory(t)
	h.enqueue("sleep", 25) // never run
	if err := h.lab.ChaosEnqueued(h.ctx, labdb.ChaosEnqueuedParams{JobIDs: []int64{424242}, Via: "http"}); err != nil {
		t.Fatal(err) // acknowledged, but not in the table at all
	}
	wantFindings(t, h.check(), map[string]int64{"lost": 2})
}

func TestCheckHistory_CatchesStaleAcknowledgements(t *testing.T) {
	t.Run("a completion applied after the lease expired", func(t *testing.T) {
		h := newHistory(t)
		h.enqueue("sleep", 25)
		c := h.claim("w1", 20*time.Millisecond)
		time.Sleep(60 * time.Millisecond)
		h.exec(`UPDATE jobs SET state = 'succeeded', finished_at = now(), lease_token = NULL, lease_expires_at = NULL,
		            result = jsonb_build_object('fence', fence) WHERE id = $1`, c.id)
		h.ack(c, "completed", true)
		wantFindings(t, h.check(), map[string]int64{"stale accepted": 1})
	})
	t.Run("a result produced by an older claim", func(t *testing.T) {
		h := newHistory(t)
		h.enqueue("sleep", 25)
		c := h.claim("w1", time.Minute)
		h.exec(`UPDATE jobs SET state = 'succeeded', finished_at = now(), lease_token = NULL, lease_expires_at = NULL,
		            result = jsonb_build_object('fence', fence - 1) WHERE id = $1`, c.id)
		wantFindings(t, h.check(), map[string]int64{"stale accepted": 1})
	})
	t.Run("a heartbeat that revived an expired lease", func(t *testing.T) {
		h := newHistory(t)
		h.enqueue("sleep", 25)
		c := h.claim("w1", 20*time.Millisecond)
		time.Sleep(60 * time.Millisecond)
		h.exec(`UPDATE jobs SET lease_expires_at = now() + interval '1 minute' WHERE id = $1`, c.id)
		h.complete(c)
		wantFindings(t, h.check(), map[string]int64{"stale accepted": 1})
	})
	t.Run("a worker told its completion was accepted when it was not", func(t *testing.T) {
		h := newHistory(t)
		h.enqueue("sleep", 25)
		c := h.claim("w1", time.Minute)
		h.ack(c, "completed", true) // but the database has no such completion
		h.fault("kill", "w1")
		h.reclaim(c.id, "worker session ended")
		h.complete(h.claim("w2", time.Minute))
		wantFindings(t, h.check(), map[string]int64{"stale accepted": 1})
	})
}

func TestCheckHistory_CatchesTerminalChanges(t *testing.T) {
	h := newHistory(t)
	h.enqueue("sleep", 25)
	c := h.claim("w1", time.Minute)
	h.complete(c)
	h.exec(`UPDATE jobs SET result = '{"fence": 99}' WHERE id = $1`, c.id) // finalised twice
	h.exec(`UPDATE jobs SET state = 'available', finished_at = NULL, result = NULL WHERE id = $1`, c.id)
	h.complete(h.claim("w2", time.Minute))
	wantFindings(t, h.check(), map[string]int64{"terminal changes": 2})
}

func TestCheckHistory_CatchesPrematureReclaims(t *testing.T) {
	h := newHistory(t)
	// Reclaimed for an expired lease that had a minute left.
	h.enqueue("sleep", 25)
	early := h.claim("w1", time.Minute)
	h.reclaim(early.id, "lease expired")
	h.complete(h.claim("w1", time.Minute))
	// Reclaimed for an ended session while nothing had touched it.
	h.enqueue("sleep", 25)
	alive := h.claim("w2", time.Minute)
	h.reclaim(alive.id, "worker session ended")
	h.complete(h.claim("w2", time.Minute))
	// A paused worker keeps its session: a pause explains no such reclaim.
	h.enqueue("sleep", 25)
	paused := h.claim("w3", time.Minute)
	h.fault("pause", "w3")
	h.reclaim(paused.id, "worker session ended")
	h.complete(h.claim("w2", time.Minute))
	// A kill does.
	h.enqueue("sleep", 25)
	killed := h.claim("w4", time.Minute)
	h.fault("kill", "w4")
	h.reclaim(killed.id, "worker session ended")
	h.complete(h.claim("w2", time.Minute))
	wantFindings(t, h.check(), map[string]int64{"premature reclaims": 3})
}

// TestCheckHistory_JudgesASessionReclaimByTheClaimsOwnSession specifies a
// partition's aftermath: a claim sent under a worker's session before a
// partition that runs only once it heals, after the worker registered its
// next session, was made under the session the partition ended, and its
// reclaim is explained; a claim under the next session, reclaimed for an
// ended session that no fault touched, is not.
func TestCheckHistory_JudgesASessionReclaimByTheClaimsOwnSession(t *testing.T) {
	h := newHistory(t)
	first := h.register("w1", nil)
	h.fault("blackhole", "w1")
	// Recorded faults and registrations are ordered by their clocks.
	time.Sleep(10 * time.Millisecond)
	next := h.register("w1", first)
	time.Sleep(10 * time.Millisecond)
	h.enqueue("sleep", 25)
	late := h.claimUnder("w1", first, time.Minute)
	h.reclaim(late.id, "worker session ended")
	h.complete(h.claim("w2", time.Minute))
	h.enqueue("sleep", 25)
	alive := h.claimUnder("w1", next, time.Minute)
	h.reclaim(alive.id, "worker session ended")
	h.complete(h.claim("w2", time.Minute))
	c := h.check()
	wantFindings(t, c, map[string]int64{"premature reclaims": 1})
	if got := c.PrematureReclaims.Examples; len(got) != 1 || !strings.Contains(got[0], fmt.Sprintf("job %d ", alive.id)) {
		t.Errorf("premature reclaims %q, want only job %d's", got, alive.id)
	}
}

func TestCheckHistory_CatchesUnexpectedExecutionsAndPhantomJobs(t *testing.T) {
	h := newHistory(t)
	phantom := h.insert("sleep", 25) // stored, never enqueued by the harness
	h.complete(h.claim("w1", time.Minute))
	if err := h.lab.ChaosEnqueueKeys(h.ctx, []string{"sent-but-unanswered"}); err != nil {
		t.Fatal(err)
	}
	h.exec(`INSERT INTO jobs (kind, idempotency_key) VALUES ('sleep', 'sent-but-unanswered')`)
	h.complete(h.claim("w1", time.Minute))
	c := h.check()
	wantFindings(t, c, map[string]int64{"unexpected": 1, "phantoms": 1})
	if c.Unanswered != 1 {
		t.Errorf("unanswered enqueues = %d, want 1 (a job sent under a harness key is no phantom)", c.Unanswered)
	}
	if len(c.Unexpected.Examples) != 1 || !strings.Contains(c.Unexpected.Examples[0], fmt.Sprintf("job %d ", phantom)) {
		t.Errorf("unexpected executions %v, want job %d's", c.Unexpected.Examples, phantom)
	}
}

// brokenClaim claims job id for worker as a broken queue would: whatever
// its state and run_at, adding attempts to its attempt. It records the
// execution's start, as a chaos worker does.
func (h *history) brokenClaim(id int64, worker string, attempts int32) claimed {
	h.t.Helper()
	h.exec(`UPDATE jobs SET state = 'running', attempt = attempt + $3, fence = fence + 1, lease_token = gen_random_uuid(),
	            lease_expires_at = now() + interval '1 minute', leased_by = $2, started_at = now() WHERE id = $1`, id, worker, attempts)
	c := claimed{worker: worker}
	var kind string
	var attempt int32
	if err := h.pool.QueryRow(h.ctx, `SELECT id, fence, lease_token, kind, attempt FROM jobs WHERE id = $1`, id).
		Scan(&c.id, &c.fence, &c.token, &kind, &attempt); err != nil {
		h.t.Fatal(err)
	}
	if err := h.lab.ChaosExecutionStart(h.ctx, labdb.ChaosExecutionStartParams{
		JobID: c.id, Kind: kind, Attempt: attempt, Fence: c.fence, Worker: worker, PID: 1,
	}); err != nil {
		h.t.Fatal(err)
	}
	return c
}

func TestCheckHistory_CatchesPoisonRetriedBeforeItsBackoff(t *testing.T) {
	h := newHistory(t)
	id := h.enqueue(KindFail, 2)
	h.fail(h.claim("w1", time.Minute), time.Hour)
	h.fail(h.brokenClaim(id, "w1", 1), 0)
	wantFindings(t, h.check(), map[string]int64{"poison misbehaved": 1})
}

// A poison job that dies otherwise than after exactly max_attempts
// attempts is one finding, of the poison check alone: it ended in the
// state its kind must.
func TestCheckHistory_CatchesPoisonDeadAfterOtherThanMaxAttempts(t *testing.T) {
	t.Run("dead after fewer claims", func(t *testing.T) {
		h := newHistory(t)
		id := h.enqueue(KindPanic, 3)
		h.fail(h.claim("w1", time.Minute), 0)
		h.exec(`UPDATE jobs SET state = 'dead', finished_at = now() WHERE id = $1`, id)
		wantFindings(t, h.check(), map[string]int64{"poison misbehaved": 1})
	})
	t.Run("dead after more claims", func(t *testing.T) {
		h := newHistory(t)
		id := h.enqueue(KindFail, 2)
		h.fail(h.claim("w1", time.Minute), 0)
		h.fail(h.brokenClaim(id, "w1", 0), 0) // an attempt not counted
		h.fail(h.claim("w2", time.Minute), 0)
		wantFindings(t, h.check(), map[string]int64{"poison misbehaved": 1})
	})
	t.Run("dead after max_attempts claims with another attempt", func(t *testing.T) {
		h := newHistory(t)
		id := h.enqueue(KindExit, 2)
		h.fail(h.claim("w1", time.Minute), 0)
		h.fail(h.brokenClaim(id, "w1", 0), 0)
		h.exec(`UPDATE jobs SET state = 'dead', finished_at = now() WHERE id = $1`, id)
		wantFindings(t, h.check(), map[string]int64{"poison misbehaved": 1})
	})
}

// claimAhead claims the next ready job for worker without starting it, as
// a worker claiming ahead of a free slot does.
func (h *history) claimAhead(worker string) claimed {
	h.t.Helper()
	rows, err := h.q.JobCompleteAndClaim(h.ctx, db.JobCompleteAndClaimParams{
		CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
		Queue: "default", ClaimTokens: []pgtype.UUID{newToken()}, LeaseMs: time.Minute.Milliseconds(), WorkerID: worker,
	})
	if err != nil || len(rows) != 1 || rows[0].ID == nil {
		h.t.Fatalf("claim ahead: %v (%d rows)", err, len(rows))
	}
	return claimed{id: *rows[0].ID, fence: *rows[0].Fence, token: rows[0].LeaseToken, worker: worker}
}

func TestCheckHistory_AReleasedUnstartedClaimIsNoAttempt(t *testing.T) {
	h := newHistory(t)
	h.enqueue(KindFail, 2)
	ahead := h.claimAhead("w1")
	ids, err := h.q.JobReleaseMany(h.ctx, db.JobReleaseManyParams{IDs: []int64{ahead.id}, Tokens: []pgtype.UUID{ahead.token}})
	if err != nil || len(ids) != 1 {
		t.Fatalf("release: %v, %v", ids, err)
	}
	h.fail(h.claim("w1", time.Minute), 0)
	h.fail(h.claim("w2", time.Minute), 0)
	wantFindings(t, h.check(), map[string]int64{})
}

func TestCheckHistory_CatchesAReleaseAppliedAfterTheLeaseExpired(t *testing.T) {
	h := newHistory(t)
	h.enqueue("sleep", 1)
	ahead := h.claimAhead("w1")
	// A broken hand-back that ignores the lease.
	h.exec(`UPDATE jobs SET state = 'available', attempt = attempt - 1, lease_token = NULL, lease_expires_at = NULL
	        WHERE id = $1`, ahead.id)
	h.exec(`UPDATE chaos_transitions SET old_lease_expires_at = tx_at - interval '1 second' WHERE job_id = $1 AND action = 'unclaim'`, ahead.id)
	h.complete(h.claim("w2", time.Minute))
	wantFindings(t, h.check(), map[string]int64{"stale accepted": 1})
}

func TestCheckHistory_CatchesAWrongOutcome(t *testing.T) {
	h := newHistory(t)
	h.enqueue(KindPanic, 3) // must end dead after 3 attempts
	h.complete(h.claim("w1", time.Minute))
	h.enqueue("sleep", 1) // must succeed
	h.fail(h.claim("w1", time.Minute), 0)
	wantFindings(t, h.check(), map[string]int64{"wrong outcome": 2})
}

// newToken draws a fresh random lease token.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }
