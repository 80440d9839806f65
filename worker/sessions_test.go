package worker_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/faultproxy"
	"github.com/relayq/relay/internal/modelcheck"
	"github.com/relayq/relay/internal/pgplan"
	"github.com/relayq/relay/worker"
)

// These tests specify worker sessions: a job is judged by the session it
// was claimed under, and a worker id belongs to one live session at a time.

func TestReclaim_TakesJobsOfAnEndedSessionAtOnceButNotOfALiveOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dead := b.enqueue(t, "noop", `{}`, 5)
	alive := b.enqueue(t, "noop", `{}`, 5)
	doomed := b.register(t, "doomed", 0)
	stalled := b.register(t, "stalled", 0)
	if rows := b.claimUnder(t, "doomed", &doomed.key, 1, time.Hour); len(rows) != 1 || *rows[0].ID != dead.ID {
		t.Fatalf("doomed claimed %+v, want job %d", rows, dead.ID)
	}
	if rows := b.claimUnder(t, "stalled", &stalled.key, 1, time.Hour); len(rows) != 1 || *rows[0].ID != alive.ID {
		t.Fatalf("stalled claimed %+v, want job %d", rows, alive.ID)
	}
	if got := b.get(t, dead.ID).LeaseSession; got == nil || *got != doomed.key {
		t.Errorf("the claimed job records session %v, want %d", got, doomed.key)
	}

	doomed.end(t, b)
	rows := b.reclaim(t, db.JobReclaimParams{MaxJobs: 10})
	want := []modelcheck.Reclaimed{{ID: dead.ID, State: db.JobStateAvailable, Attempt: 1, LeasedBy: ptr("doomed"), LastError: ptr("worker session ended")}}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("reclaim after the session ended (-want +got):\n%s", diff)
	}
	if got := b.get(t, alive.ID); got.State != db.JobStateRunning {
		t.Errorf("job of the stalled-but-connected worker is %s, want running: it is governed by its lease", got.State)
	}

	n, err := worker.ForgetEnded(b.ctx, b.pool)
	if err != nil || n != 1 {
		t.Errorf("forget ended sessions: %d rows, err %v; want 1 (doomed's)", n, err)
	}
}

// TestReclaim_EndsALastAttemptDeadAndAJobAskedToCancelCancelled: a job
// taken back, its lease expired or its worker's session ended, becomes
// available again while it has attempts left; on its last attempt it ends
// dead, as a crash that kills every worker that runs it must still run it
// out of attempts; and a job someone asked to cancel ends cancelled, on
// its last attempt too, the request then answered. Either way the reason
// is its last error.
func TestReclaim_EndsALastAttemptDeadAndAJobAskedToCancelCancelled(t *testing.T) {
	t.Parallel()
	type job struct {
		maxAttempts int32
		cancel      bool
		want        db.JobState
	}
	jobs := []job{
		{maxAttempts: 3, want: db.JobStateAvailable},
		{maxAttempts: 1, want: db.JobStateDead},
		{maxAttempts: 3, cancel: true, want: db.JobStateCancelled},
		{maxAttempts: 1, cancel: true, want: db.JobStateCancelled},
	}
	for _, tc := range []struct {
		name   string
		reason string
		// abandon claims n jobs and leaves them to be taken back.
		abandon func(t *testing.T, b *bundle, n int32, cancel func())
	}{
		{"its lease expired", "lease expired", func(t *testing.T, b *bundle, n int32, cancel func()) {
			rows := b.claim(t, "stalled", n, 500*time.Millisecond)
			cancel()
			b.waitForLeaseExpiry(t, *rows[len(rows)-1].ID)
		}},
		{"its session ended", "worker session ended", func(t *testing.T, b *bundle, n int32, cancel func()) {
			s := b.register(t, "crashed", 0)
			b.claimUnder(t, "crashed", &s.key, n, time.Hour)
			cancel()
			s.end(t, b)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var ids []int64
			for _, j := range jobs {
				ids = append(ids, b.enqueue(t, "noop", `{}`, j.maxAttempts).ID)
			}
			tc.abandon(t, b, int32(len(jobs)), func() {
				for i, j := range jobs {
					if !j.cancel {
						continue
					}
					if got, err := b.q.JobCancel(b.ctx, ids[i]); err != nil || !got.Applied || got.State != db.JobStateRunning {
						t.Fatalf("ask to cancel job %d: applied %t state %s, %v; want it marked, running", ids[i], got.Applied, got.State, err)
					}
				}
			})
			if got := b.reclaim(t, db.JobReclaimParams{MaxJobs: 10}); len(got) != len(jobs) {
				t.Fatalf("reclaim took %d jobs, want %d: %+v", len(got), len(jobs), got)
			}
			for i, j := range jobs {
				got := b.get(t, ids[i])
				finished := j.want != db.JobStateAvailable
				if got.State != j.want || (got.FinishedAt != nil) != finished || got.CancelRequestedAt != nil ||
					got.LeaseToken.Valid || got.Attempt != 1 || deref(got.LastError) != tc.reason {
					t.Errorf("job of %d attempts, cancel asked %t: %s, finished %v, cancel request %v, lease %v, attempt %d, last error %q; "+
						"want %s, finished %t, no cancel request, no lease, attempt 1, last error %q",
						j.maxAttempts, j.cancel, got.State, got.FinishedAt, got.CancelRequestedAt, got.LeaseToken, got.Attempt,
						deref(got.LastError), j.want, finished, tc.reason)
				}
			}
		})
	}
}

func TestReclaim_JudgesEachJobByTheSessionItWasClaimedUnder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A worker restarted under a fixed id (a pod name): its predecessor's
	// session ended, it registered a new one, and claimed a job of its own.
	first := b.enqueue(t, "noop", `{}`, 5)
	second := b.enqueue(t, "noop", `{}`, 5)
	old := b.register(t, "pod-0", 0)
	b.claimUnder(t, "pod-0", &old.key, 1, time.Hour)
	old.end(t, b)
	restarted := b.register(t, "pod-0", 0)
	b.claimUnder(t, "pod-0", &restarted.key, 1, time.Hour)

	rows := b.reclaim(t, db.JobReclaimParams{MaxJobs: 10})
	want := []modelcheck.Reclaimed{{ID: first.ID, State: db.JobStateAvailable, Attempt: 1, LeasedBy: ptr("pod-0"), LastError: ptr("worker session ended")}}
	if diff := cmp.Diff(want, rows); diff != "" {
		t.Errorf("reclaim after the restart (-want +got):\n%s", diff)
	}
	if got := b.get(t, second.ID); got.State != db.JobStateRunning {
		t.Errorf("the restarted worker's own job is %s, want running", got.State)
	}
}

func TestReclaim_NeverTakesAJobClaimedAgainUnderALiveSessionWhileTheReclaimRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Many ended sessions of other workers, so that a reclaim has work to
	// do (some 300 ms here) between taking its snapshot and locking the
	// job, while the worker registers anew and claims the job again.
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO worker_sessions (session_key, worker_id, queue, pid, host)
		SELECT 1000000 + n, 'gone-' || n, 'default', 1, 'test' FROM generate_series(1, 100000) AS n;
		ANALYZE worker_sessions`); err != nil {
		t.Fatal(err)
	}
	const rounds = 5
	premature := 0
	for round := range rounds {
		job := b.enqueue(t, "noop", `{}`, 25)
		s1 := b.register(t, "w", 0)
		rows := b.claimUnder(t, "w", &s1.key, 1, time.Hour)
		if len(rows) != 1 {
			t.Fatalf("round %d: claimed %d jobs, want 1", round, len(rows))
		}
		s1.end(t, b)

		// A reclaim starts; meanwhile the worker registers a new session,
		// hands the job back and claims it again under that session.
		done := make(chan struct{})
		go func() {
			defer close(done)
			if _, err := b.q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 10}); err != nil {
				t.Error(err)
			}
		}()
		s2 := b.register(t, "w", s1.key)
		released, err := b.q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{IDs: []int64{job.ID}, Tokens: []pgtype.UUID{rows[0].LeaseToken}})
		if err != nil {
			t.Fatal(err)
		}
		var again []db.JobCompleteAndClaimRow
		if len(released) == 1 {
			again = b.claimUnder(t, "w", &s2.key, 1, time.Hour)
		}
		<-done
		got := b.get(t, job.ID)
		if len(again) == 1 && (got.State != db.JobStateRunning || got.LeaseToken != again[0].LeaseToken) {
			premature++
			t.Errorf("round %d: the job claimed again under live session %d was taken: %s, last error %q",
				round, s2.key, got.State, deref(got.LastError))
		}
		// Finish the round: the job leaves the queue.
		if got.State == db.JobStateRunning {
			b.complete(t, job.ID, got.LeaseToken, `{}`)
		}
		s2.end(t, b)
		if _, err := b.q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 10}); err != nil {
			t.Fatal(err)
		}
		if _, err := b.pool.Exec(b.ctx, "UPDATE jobs SET state = 'cancelled', finished_at = now() WHERE id = $1 AND state = 'available'", job.ID); err != nil {
			t.Fatal(err)
		}
	}
	if premature > 0 {
		t.Errorf("%d of %d live claims taken by a reclaim that began before they were made", premature, rounds)
	}
}

func TestRegister_GivesAWorkerIDToOneLiveSessionAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	holder := b.register(t, "solo", 0)

	if _, err := b.tryRegister(t, "solo", 0); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("a second live session under the same id: err %v, want the registration refused (no row)", err)
	}
	if h := b.holderOf(t, "solo"); h.SessionKey != holder.key || !h.SessionAlive || h.PID != 1 || h.Host != "test" {
		t.Errorf("holder %+v, want the live session %d (pid 1 on host test)", h, holder.key)
	}

	// The holder's own process, registering again after losing its
	// connection, takes the id back even before the server noticed.
	again := b.register(t, "solo", holder.key)
	if again.key == holder.key {
		t.Fatalf("registering again reused session key %d", holder.key)
	}

	// Once its holder ended, anyone may take the id.
	again.end(t, b)
	holder.end(t, b)
	next := b.register(t, "solo", 0)
	if h, err := b.q.WorkerHolder(b.ctx, "solo"); err != nil || h.SessionKey != next.key {
		t.Errorf("after the holder ended, the id is held by %+v (%v), want session %d", h, err, next.key)
	}
}

func TestRegister_TwoAtOnceUnderOneIDGiveItToOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for round := range 20 {
		id := fmt.Sprintf("racer-%d", round)
		results := make(chan error, 2)
		for range 2 {
			go func() {
				_, err := b.tryRegister(t, id, 0)
				results <- err
			}()
		}
		won := 0
		for range 2 {
			err := <-results
			switch {
			case err == nil:
				won++
			case !errors.Is(err, pgx.ErrNoRows):
				t.Fatal(err)
			}
		}
		if won != 1 {
			t.Fatalf("round %d: %d of two simultaneous registrations of one id succeeded, want 1", round, won)
		}
	}
}

func TestClaim_UnderAnEndedSessionClaimsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 1)
	s := b.register(t, "late", 0)
	s.end(t, b)
	if rows := b.claimUnder(t, "late", &s.key, 5, time.Minute); len(rows) != 0 {
		t.Errorf("a worker whose session ended claimed %d jobs, want none", len(rows))
	}
	if got := b.get(t, job.ID); got.State != db.JobStateAvailable || got.Attempt != 0 {
		t.Errorf("job %s with attempt %d, want available with no attempt spent", got.State, got.Attempt)
	}
}

func TestUnregister_FreesTheIDAndLeavesTheSessionUntilItEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 5)
	s := b.register(t, "leaving", 0)
	b.claimUnder(t, "leaving", &s.key, 1, time.Hour)

	// Shutting down with its release failed: the job still runs under the
	// session.
	released, err := db.New(s.conn).WorkerUnregister(b.ctx, db.WorkerUnregisterParams{ID: "leaving", SessionKey: s.key})
	if err != nil || !released {
		t.Fatalf("unregister: id released %t, err %v; want the id released", released, err)
	}
	if n, err := worker.ForgetEnded(b.ctx, b.pool); err != nil || n != 0 {
		t.Errorf("forget ended sessions while the session lives: %d, %v; want none", n, err)
	}
	if keys, err := b.q.WorkerSessionKeys(b.ctx); err != nil || !slices.Equal(keys, []int32{s.key}) {
		t.Errorf("sessions after unregister: %v, %v; want the live session %d", keys, err, s.key)
	}
	s.end(t, b)
	rows := b.reclaim(t, db.JobReclaimParams{MaxJobs: 10})
	if len(rows) != 1 || rows[0].ID != job.ID || deref(rows[0].LastError) != "worker session ended" {
		t.Errorf("reclaim once the session closed: %+v, want job %d for its ended session", rows, job.ID)
	}
	if n, err := worker.ForgetEnded(b.ctx, b.pool); err != nil || n != 1 {
		t.Errorf("forget ended sessions: %d, %v; want the one that held the job", n, err)
	}
}

// TestWorkerForgetEnded_TakesAtMost200SessionsAtATime ends 201 sessions
// at once, and 200 more that still hold a running job each, under lower
// keys: one forget holds a lock for each session it takes until it
// commits, so it takes 200, those it can forget first, and the next one
// the last of them.
func TestWorkerForgetEnded_TakesAtMost200SessionsAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO worker_sessions (session_key, worker_id, queue, pid, host)
		SELECT 1000000 + i, 'ended' || i, 'default', i, 'test' FROM generate_series(1, 401) AS i;
		INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, lease_session, started_at)
		SELECT 'noop', 'running', 1, 1, gen_random_uuid(), now() + interval '1 hour', 'ended' || i, 1000000 + i, now()
		FROM generate_series(1, 200) AS i`); err != nil {
		t.Fatal(err)
	}
	for _, want := range []int64{200, 1, 0} {
		if n, err := worker.ForgetEnded(b.ctx, b.pool); err != nil || n != want {
			t.Errorf("forget ended sessions: %d, %v; want %d", n, err, want)
		}
	}
}

// TestWorkerForgetEnded_KeepsTheSessionOfAClaimInFlight ends a session
// while a claim that found it alive has yet to commit, and forgets the
// ended sessions meanwhile: the session's row stays until the claim's job
// can be seen running under it, so that a reclaim takes the job back at
// once instead of when its lease expires.
func TestWorkerForgetEnded_KeepsTheSessionOfAClaimInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 5)
	s := b.register(t, "w", 0)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	rows, err := b.q.WithTx(tx).JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
		Queue: "default", ClaimTokens: leaseTokens(1), LeaseMs: time.Hour.Milliseconds(), WorkerID: "w", SessionKey: &s.key,
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := claimedIDs(rows); !slices.Equal(got, []int64{job.ID}) {
		t.Fatalf("claim under the live session took %v, want job %d", got, job.ID)
	}
	s.end(t, b)
	if n, err := worker.ForgetEnded(b.ctx, b.pool); err != nil || n != 0 {
		t.Errorf("forget ended sessions with a claim under one in flight: %d, %v; want none", n, err)
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	taken := b.reclaim(t, db.JobReclaimParams{MaxJobs: 10})
	if len(taken) != 1 || taken[0].ID != job.ID || deref(taken[0].LastError) != "worker session ended" {
		t.Errorf("reclaim once the claim committed: %+v, want job %d for its ended session", taken, job.ID)
	}
	if n, err := worker.ForgetEnded(b.ctx, b.pool); err != nil || n != 1 {
		t.Errorf("forget ended sessions after the reclaim: %d, %v; want 1", n, err)
	}
}

func TestWorkerForgetEnded_KeepsLiveSessionsAndThoseHoldingJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, "noop", `{}`, 5)
	live := b.register(t, "live", 0)
	holding := b.register(t, "holding", 0)
	b.claimUnder(t, "holding", &holding.key, 1, time.Hour)
	idle := b.register(t, "idle", 0)
	holding.end(t, b)
	idle.end(t, b)

	if n, err := worker.ForgetEnded(b.ctx, b.pool); err != nil || n != 1 {
		t.Fatalf("forget ended sessions: %d, %v; want 1 (idle's)", n, err)
	}
	keys, err := b.q.WorkerSessionKeys(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]int32{live.key, holding.key}, keys); diff != "" {
		t.Errorf("sessions kept (-want +got):\n%s", diff)
	}
	workers, err := b.q.WorkerList(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, w := range workers {
		ids = append(ids, w.ID)
	}
	if diff := cmp.Diff([]string{"live"}, ids); diff != "" {
		t.Errorf("worker ids still held (-want +got):\n%s", diff)
	}
}

// TestWorkerForgetEnded_KeepsAnIDTakenOverWhileItRuns has a new session
// take over an ended session's worker id in a transaction that commits
// only once the forget waits for the id's row: the forget, which found the
// id's session ended, must leave the id to its new holder.
func TestWorkerForgetEnded_KeepsAnIDTakenOverWhileItRuns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.register(t, "x", 0).end(t, b)

	conn, err := pgx.ConnectConfig(b.ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	reg, err := db.New(tx).WorkerRegister(b.ctx, db.WorkerRegisterParams{ID: "x", Queue: "default", PID: 2, Host: "test"})
	if err != nil {
		t.Fatalf("take over the id: %v", err)
	}

	type result struct {
		n   int64
		err error
	}
	forgot := make(chan result, 1)
	go func() {
		n, err := worker.ForgetEnded(b.ctx, b.pool)
		forgot <- result{n, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); !b.blocks(t, tx); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the forget never waited for the id's row")
		}
	}
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if r := <-forgot; r.err != nil || r.n != 1 {
		t.Fatalf("forget ended sessions: %d, %v; want the ended session's 1", r.n, r.err)
	}
	workers, err := b.q.WorkerList(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(workers) != 1 || workers[0].ID != "x" || workers[0].SessionKey != reg.SessionKey || !workers[0].SessionAlive {
		t.Errorf("workers after the forget: %+v, want x held by the live session %d", workers, reg.SessionKey)
	}
}

// TestWorkerForgetEnded_LooksUpNoWorkersSessionOneByOne forgets one ended
// session beside 20 live ones, and counts the per-session lock checks the
// statement made: each reads the whole lock table, and one per worker made
// the fleet's forgets cost the square of its size.
func TestWorkerForgetEnded_LooksUpNoWorkersSessionOneByOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for i := range 20 {
		b.register(t, fmt.Sprintf("live%d", i), 0)
	}
	b.register(t, "gone", 0).end(t, b)

	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if _, err := tx.Exec(b.ctx, "SET LOCAL track_functions = 'all'"); err != nil {
		t.Fatal(err)
	}
	q := db.New(tx)
	keys, err := q.WorkerStopClaimsOfEndedSessions(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := q.WorkerForgetEnded(b.ctx, keys); err != nil || n != 1 {
		t.Fatalf("forget ended sessions: %d, %v; want 1", n, err)
	}
	var calls int64
	if err := tx.QueryRow(b.ctx,
		"SELECT COALESCE(pg_stat_get_xact_function_calls('worker_session_alive(integer)'::regprocedure), 0)").Scan(&calls); err != nil {
		t.Fatal(err)
	}
	if calls != 0 {
		t.Errorf("the forget checked %d sessions one by one, want none: it reads the lock table once", calls)
	}
}

func TestReclaim_LooksOnlyAtExpiredLeasesAndEndedSessionsByIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// 20,000 running jobs of 2,000 sessions, and 50 sessions holding one
	// job each: the reclaim must not read every running job.
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO worker_sessions (session_key, worker_id, queue, pid, host)
		SELECT k, 'w' || k, 'default', 1, 'test' FROM generate_series(1, 2050) AS k;
		INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, lease_session, started_at)
		SELECT 'noop', 'running', 1, 1, gen_random_uuid(), now() + interval '1 hour', 'w' || k, k, now()
		FROM generate_series(1, 2000) AS k, generate_series(1, 10);
		INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, lease_session, started_at)
		SELECT 'noop', 'running', 1, 1, gen_random_uuid(), now() + interval '1 hour', 'w' || k, k, now()
		FROM generate_series(2001, 2050) AS k;
		ANALYZE worker_sessions; ANALYZE jobs;`); err != nil {
		t.Fatal(err)
	}
	// EXPLAIN ANALYZE runs the reclaim, in a transaction rolled back.
	got := explain(t, b, func(q *db.Queries) error {
		_, err := q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 1000})
		return err
	}, nil)
	read := map[string]bool{}
	got.root.Walk(func(n pgplan.Node) {
		read[n.IndexName] = true
		if n.NodeType == "Seq Scan" && n.RelationName == "jobs" {
			t.Errorf("the reclaim reads every running job:\n%s", got.plan)
		}
	})
	for _, want := range []string{"jobs_lease_expires_at_idx", "jobs_lease_session_key_idx", "jobs_pkey"} {
		if !read[want] {
			t.Errorf("the reclaim's plan does not use %s:\n%s", want, got.plan)
		}
	}
}

// TestReclaim_ReadsNoHistoryUnderAPlanMadeWhileTheTableWasEmpty prepares
// the reclaim over an empty table with a generic plan, as PostgreSQL comes
// to cache it on a worker's connection when the worker starts on a new
// database, and then adds 20,000 finished jobs without gathering
// statistics, as on a server without autovacuum, where that plan is never
// made again. With no session ended, as at nearly every reclaim, the
// reclaim must still read a few pages, not the table.
func TestReclaim_ReadsNoHistoryUnderAPlanMadeWhileTheTableWasEmpty(t *testing.T) {
	t.Parallel()
	b := setup(t)
	offForJobs(t, b)
	reclaim := keepPlan(t, b, "reclaim", func(q *db.Queries) error {
		_, err := q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 1000})
		return err
	})
	addFinishedJobs(t, b, 20_000)
	scanned, buffers, plan := reclaim.explain(t, b)
	if scanned || buffers > 20 {
		t.Errorf("the reclaim read %d buffers over 20,000 finished jobs (scans the table: %v), want at most 20:\n%s", buffers, scanned, plan)
	}
}

// TestReclaim_CountsTheFleetAgainSoonAfterItGrows starts a worker, then a
// second one on another queue and a third on its own, and checks that the
// first counts them, in all and on its queue, within a few of its reclaim
// rounds, not only after forgetEndedEvery of them: a worker started early
// in a fleet that starts one process after another would otherwise run
// the fleet's shared duties at a small fleet's rate.
func TestReclaim_CountsTheFleetAgainSoonAfterItGrows(t *testing.T) {
	b := setup(t)
	noHandlers := func(*worker.Worker) {}
	first, _ := b.startWorker(t, worker.Config{ID: "first", Slots: 1}, noHandlers)
	waitFleet(t, first, 1, 1, 5*time.Second)
	b.startWorker(t, worker.Config{ID: "second", Queue: "other", Slots: 1}, noHandlers)
	waitFleet(t, first, 2, 1, 3*time.Second)
	b.startWorker(t, worker.Config{ID: "third", Slots: 1}, noHandlers)
	waitFleet(t, first, 3, 2, 3*time.Second)
}

// TestReclaim_CountsTheFleetAgainSoonAfterMostOfItEnds counts a fleet of
// 160 live workers, 159 of them sessions held by one connection, and then
// ends those 159 at once. The survivor counts the fleet again at its next
// round, the one that takes back their jobs, if they held any. It then
// waits the interval of a fleet of one, where it would otherwise keep the
// interval of a fleet of 160, ten times as long.
func TestReclaim_CountsTheFleetAgainSoonAfterMostOfItEnds(t *testing.T) {
	for _, tc := range []struct {
		name string
		jobs bool
		// every is the survivor's ReclaimInterval: a round takes
		// every/16*160 in the fleet of 160.
		every time.Duration
	}{
		{"a running job each: its reclaim takes them back", true, 50 * time.Millisecond},
		{"no job", false, 5 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t)
			crowd := b.crowd(t, 159)
			if tc.jobs {
				runJobsUnder(t, b, "true")
			}
			w, _ := b.startWorker(t, worker.Config{ID: "survivor", Slots: 1, ReclaimInterval: tc.every},
				func(*worker.Worker) {})
			waitFleet(t, w, 160, 160, 5*time.Second)

			if err := crowd.Close(b.ctx); err != nil {
				t.Fatal(err)
			}
			waitFleet(t, w, 1, 1, 5*time.Second)
			var running int
			if err := b.pool.QueryRow(b.ctx,
				`SELECT count(*) FROM jobs WHERE state = 'running' AND leased_by LIKE 'crowd-%'`).Scan(&running); err != nil {
				t.Fatal(err)
			}
			if running != 0 {
				t.Errorf("%d of the crowd's jobs still running after the survivor counted the fleet again, want none", running)
			}
		})
	}
}

// TestReclaim_ASurvivorWhoseRoundsFindNothingCountsTheFleetAtItsNextRound
// counts a fleet of 160 live workers, 159 of them sessions held by two
// connections, 158 of a crowd and one that dies later, and then ends the
// 158 at once. The survivor's own rounds find nothing to take back:
// another survivor took back the crowd's jobs first, or they held none.
// It counts the fleet at its next round all the same, not only once a
// round takes jobs back or the forget of ended sessions, every 40 of its
// rounds (20 s away in the fleet of 160), forgets theirs; so a worker
// that dies after that has its job taken back within the interval of a
// fleet of two, where it would otherwise wait for the interval of a
// fleet of 160, ten times as long.
func TestReclaim_ASurvivorWhoseRoundsFindNothingCountsTheFleetAtItsNextRound(t *testing.T) {
	// every is the survivor's ReclaimInterval: a round takes every/16*160
	// in the fleet of 160.
	const every = 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		jobs bool
	}{
		{"another survivor took back their jobs first", true},
		{"they held no job", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := setup(t)
			crowd := b.crowd(t, 158)
			late := b.crowd(t, 1)
			if tc.jobs {
				runJobsUnder(t, b, "true")
			} else {
				// Only the one that dies later, registered last.
				runJobsUnder(t, b, "s.session_key = (SELECT max(session_key) FROM worker_sessions)")
			}
			w, _ := b.startWorker(t, worker.Config{ID: "survivor", Slots: 1, ReclaimInterval: every},
				func(*worker.Worker) {})
			waitFleet(t, w, 160, 160, 5*time.Second)

			if err := crowd.Close(b.ctx); err != nil {
				t.Fatal(err)
			}
			// The server lets the crowd's locks go once its backend ends.
			waitLive(t, b, 2, 5*time.Second)
			if tc.jobs {
				// The other survivor. A round of the survivor's that runs
				// at the same moment may take a few.
				if taken := b.reclaim(t, db.JobReclaimParams{MaxJobs: 1000}); len(taken) == 0 {
					t.Fatal("the other survivor took back none of the crowd's jobs, want them")
				}
			}
			waitFleet(t, w, 2, 2, 3*time.Second)

			if err := late.Close(b.ctx); err != nil {
				t.Fatal(err)
			}
			ended := time.Now()
			for {
				var running int
				if err := b.pool.QueryRow(b.ctx,
					`SELECT count(*) FROM jobs WHERE state = 'running'`).Scan(&running); err != nil {
					t.Fatal(err)
				}
				if running == 0 {
					break
				}
				// A fleet of two reclaims every 100 ms, jittered by 20%;
				// one of 160 every second. The rest of the bound is for
				// the server to let the lock go and for a loaded machine.
				if time.Since(ended) > 600*time.Millisecond {
					t.Fatalf("the job of the worker that died later still running %s after it died, want it taken back within the interval of a fleet of two", time.Since(ended).Round(time.Millisecond))
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}

// TestReclaim_LogsACountOfTheFleetThatFailed breaks the count of the live
// workers, which the reclaim statement makes, under a running worker, and
// checks that the worker says so, with the error: the count spaces the
// fleet's shared duties, and one that keeps failing leaves them at a
// stale rate.
func TestReclaim_LogsACountOfTheFleetThatFailed(t *testing.T) {
	b := setup(t)
	var logs syncBuffer
	w, _ := b.startWorker(t, worker.Config{
		Slots:           1,
		ReclaimInterval: 50 * time.Millisecond,
		Logger:          logs.logger(),
	}, func(*worker.Worker) {})
	waitFleet(t, w, 1, 1, 5*time.Second)
	// Only the count and a session's registration read this column.
	if _, err := b.pool.Exec(b.ctx, `ALTER TABLE worker_sessions RENAME COLUMN queue TO queue_renamed`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := b.pool.Exec(b.ctx, `ALTER TABLE worker_sessions RENAME COLUMN queue_renamed TO queue`); err != nil {
			t.Error(err)
		}
	})
	logs.waitForLog(t, 5*time.Second, "level=WARN msg=\"reclaim failed\"", "queue", "does not exist")
}

// runJobsUnder gives each worker session that where selects (a condition
// on worker_sessions AS s) a running job, leased for an hour.
func runJobsUnder(t *testing.T, b *bundle, where string) {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, lease_session, started_at)
		SELECT 'noop', 'running', 1, 1, gen_random_uuid(), now() + interval '1 hour', s.worker_id, s.session_key, now()
		FROM worker_sessions AS s
		WHERE `+where); err != nil {
		t.Fatal(err)
	}
}

// waitLive waits up to timeout for want worker sessions to be live.
func waitLive(t *testing.T, b *bundle, want int, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var live int
		if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM worker_sessions_live`).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d worker sessions live after %s, want %d", live, timeout, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// waitFleet waits up to timeout for w to have counted want live workers,
// wantQueue of them on its queue.
func waitFleet(t *testing.T, w *worker.Worker, want, wantQueue int32, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for w.FleetSize() != want || w.QueueFleetSize() != wantQueue {
		if time.Now().After(deadline) {
			t.Fatalf("the worker counted %d live workers, %d on its queue, after %s; want %d and %d",
				w.FleetSize(), w.QueueFleetSize(), timeout, want, wantQueue)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestWorker_SessionShowsUnderThePoolsApplicationNameUnlessItsURLSetsOne(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := dbtest.Connect(t, withApplicationName(t, b.url, "billing-worker"))
	for i, tc := range []struct {
		name       string
		sessionURL string
		want       string
	}{
		{"no session URL: the pool's settings", "", "billing-worker"},
		{"a session URL that names no application", b.url, "billing-worker"},
		{"a session URL that names its own", withApplicationName(t, b.url, "billing-session"), "billing-session"},
		{"a session URL that names its own among its options", withParam(t, b.url, "options", "--application_name=billing-options"), "billing-options"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("named-%d", i)
			_, run := b.runWorker(t, pool, worker.Config{ID: id, Slots: 1, SessionDatabaseURL: tc.sessionURL}, func(*worker.Worker) {})
			defer func() {
				if err := run.stop(); err != nil {
					t.Errorf("worker Run: %v", err)
				}
			}()
			var got string
			deadline := time.Now().Add(10 * time.Second)
			for {
				err := b.pool.QueryRow(b.ctx, `
					SELECT a.application_name
					FROM workers AS w
					JOIN pg_locks AS l ON l.locktype = 'advisory' AND l.classid = 1380273241 AND l.objid = w.session_key
					JOIN pg_stat_activity AS a ON a.pid = l.pid
					-- Session keys are drawn per database; the lock table is the server's.
					WHERE w.id = $1 AND a.datname = current_database()`, id).Scan(&got)
				if err == nil {
					break
				}
				if !errors.Is(err, pgx.ErrNoRows) || time.Now().After(deadline) {
					t.Fatalf("find the session of worker %s: %v", id, err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if got != tc.want {
				t.Errorf("the session shows as %q in pg_stat_activity, want %q", got, tc.want)
			}
		})
	}
}

// withApplicationName returns the URL dsn with its application_name set to
// name.
func withApplicationName(t *testing.T, dsn, name string) string {
	t.Helper()
	return withParam(t, dsn, "application_name", name)
}

// withParam returns the URL dsn with its parameter key set to value.
func withParam(t *testing.T, dsn, key, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse the database URL: %v", err)
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// TestSession_ReconnectsAtOnceAfterEachLossOfASessionItHeld ends a
// worker's session seven times, each once the worker has held a new one
// for longer than the longest wait before a reconnection, and checks that
// the worker holds a new session within a second every time: the wait
// grows while reconnections fail, or their sessions are lost at once, and
// starts again from the shortest once a session held, so that the
// sessions a long-lived worker lost long ago do not make it wait the
// longest, without a session and so without claims, at its next.
func TestSession_ReconnectsAtOnceAfterEachLossOfASessionItHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _ := b.startWorker(t, worker.Config{ID: "lossy", Slots: 1}, func(*worker.Worker) {})
	// sessionPID returns the server process that holds the worker's
	// session lock, 0 while none does.
	sessionPID := func() int32 {
		t.Helper()
		var pid int32
		err := b.pool.QueryRow(b.ctx, `
			SELECT l.pid
			FROM pg_locks AS l JOIN workers AS wk ON l.objid::integer = wk.session_key
			WHERE l.locktype = 'advisory' AND l.classid = 1380273241 AND l.objsubid = 2 AND l.granted
			  AND wk.id = 'lossy'
			  AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())`).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) {
			return 0
		}
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	waitTold(t, w, true)
	for loss := 1; loss <= 7; loss++ {
		time.Sleep(2100 * time.Millisecond)
		pid := sessionPID()
		if pid == 0 {
			t.Fatalf("before loss %d: no session holds the worker's lock", loss)
		}
		lost := time.Now()
		var ok bool
		if err := b.pool.QueryRow(b.ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok); err != nil || !ok {
			t.Fatalf("loss %d: terminate the session's server process %d: %v, %v", loss, pid, ok, err)
		}
		for {
			if now := sessionPID(); now != 0 && now != pid && w.Told() {
				break
			}
			if time.Since(lost) > 10*time.Second {
				t.Fatalf("loss %d: no new session after 10s", loss)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if took := time.Since(lost); took > time.Second {
			t.Errorf("loss %d: a new session after %s, want at most 1s", loss, took.Round(time.Millisecond))
		}
	}
}

// TestSession_ARegistrationWhoseAnswerWasLostLeavesTheWorkerItsID loses
// the answer of a worker's registration after it committed, on a session
// connection whose end the server never sees: the session it registered
// lives on, holding the worker's id. The worker registers again, takes
// its id over from that session of its own, and works, rather than take
// the session for another process's and stop with IDInUseError.
func TestSession_ARegistrationWhoseAnswerWasLostLeavesTheWorkerItsID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, through := b.proxied(t)
	proxy.CutAfterCommit(faultproxy.CommitCut{Statement: "-- name: WorkerRegister :one", KeepServer: true})
	job := b.enqueue(t, "task", `{}`, 3)
	w, run := b.runWorker(t, b.pool, worker.Config{ID: "unanswered", Slots: 1, SessionDatabaseURL: through}, func(w *worker.Worker) {
		w.HandleFunc("task", func(context.Context, *worker.Job) (any, error) { return "done", nil })
	})
	for deadline := time.Now().Add(10 * time.Second); !w.Told(); time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-run.done:
			run.once.Do(func() { run.err = err })
			t.Fatalf("the worker stopped after its registration's answer was lost: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker holds no session 10s after its registration's answer was lost")
		}
	}
	if cuts := proxy.Stats().CommitCuts; cuts != 1 {
		t.Fatalf("the proxy lost %d registrations' answers, want 1", cuts)
	}
	b.waitForState(t, job.ID, db.JobStateSucceeded, 5*time.Second)
}

// TestWorker_WhoseSessionReachesAnotherDatabaseSaysSoAndClaimsNothing
// points a worker's session at another Relay database than its pool's.
// There its lock shows nothing to the pool's database, whose claims take
// the session for ended: the worker can claim nothing, and says so, as an
// error, rather than wait silently.
func TestWorker_WhoseSessionReachesAnotherDatabaseSaysSoAndClaimsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	elsewhere := dbtest.NewURL(t)
	job := b.enqueue(t, "task", `{}`, 3)
	var logs syncBuffer
	b.runWorker(t, b.pool, worker.Config{ID: "astray", Slots: 1, SessionDatabaseURL: elsewhere, Logger: logs.logger()}, func(w *worker.Worker) {
		w.HandleFunc("task", func(context.Context, *worker.Job) (any, error) { return "done", nil })
	})
	logs.waitForLog(t, 5*time.Second, "level=ERROR", "the pool does not see the session")
	if got := b.get(t, job.ID); got.State != db.JobStateAvailable || got.Attempt != 0 {
		t.Errorf("job: %s at attempt %d, want available and never claimed", got.State, got.Attempt)
	}
}
