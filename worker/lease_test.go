package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgplan"
)

// These tests specify the statements of queries/ directly: the state
// machine, the fence, and the claim's use of its index.

func TestClaim_ConcurrentClaimersClaimEachJobExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const jobs, claimers = 5000, 32

	params := db.JobInsertManyParams{}
	for i := range jobs {
		params.Queues = append(params.Queues, "default")
		params.Kinds = append(params.Kinds, "noop")
		params.Payloads = append(params.Payloads, json.RawMessage(fmt.Sprintf(`{"n": %d}`, i)))
		params.Priorities = append(params.Priorities, int16(i%3))
		params.MaxAttempts = append(params.MaxAttempts, 1)
		params.RunAts = append(params.RunAts, time.Time{})
		params.DelaysMs = append(params.DelaysMs, 0)
	}
	ids, err := b.q.JobInsertMany(b.ctx, params)
	if err != nil {
		t.Fatalf("insert: %v", err)
	}
	if len(ids) != jobs {
		t.Fatalf("inserted %d jobs, want %d", len(ids), jobs)
	}

	var (
		mu      sync.Mutex
		claims  = map[int64]int{}
		wg      sync.WaitGroup
		errOnce sync.Once
		failure error
	)
	for c := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				rows, err := b.q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
					Queue: "default", ClaimTokens: leaseTokens(7), LeaseMs: 60_000, WorkerID: fmt.Sprintf("claimer-%d", c),
				})
				if err != nil {
					errOnce.Do(func() { failure = err })
					return
				}
				got := 0
				mu.Lock()
				for _, r := range rows {
					if r.ID != nil {
						claims[*r.ID]++
						got++
					}
				}
				mu.Unlock()
				if got == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	if failure != nil {
		t.Fatalf("claim: %v", failure)
	}

	for _, id := range ids {
		if claims[id] != 1 {
			t.Errorf("job %d claimed %d times, want exactly 1", id, claims[id])
		}
	}
	if len(claims) != jobs {
		t.Errorf("claimed %d distinct jobs, want %d", len(claims), jobs)
	}
	stats, err := b.q.JobQueueStats(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []db.JobQueueStatsRow{{Queue: "default", Running: jobs}}
	if diff := cmp.Diff(want, stats); diff != "" {
		t.Errorf("queue stats (-want +got):\n%s", diff)
	}
}

func TestClaim_TakesJobsByPriorityThenRunAtThenID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var want []int64
	base := time.Now().Add(-time.Hour)
	insert := func(priority int16, delayMs int64) int64 {
		past := base.Add(time.Duration(delayMs) * time.Millisecond)
		job, err := b.q.JobInsert(b.ctx, db.JobInsertParams{
			Queue: "default", Kind: "noop", Payload: json.RawMessage(`{}`), Priority: priority, MaxAttempts: 1, RunAt: &past,
		})
		if err != nil {
			t.Fatal(err)
		}
		return job.ID
	}
	late := insert(1, 10)
	early := insert(1, 0)
	urgent := insert(0, 20)
	tie := insert(1, 10)
	if _, err := b.q.JobInsert(b.ctx, db.JobInsertParams{
		Queue: "other", Kind: "noop", Payload: json.RawMessage(`{}`), MaxAttempts: 1,
	}); err != nil {
		t.Fatal(err)
	}
	want = []int64{urgent, early, late, tie}

	var got []int64
	for range 5 {
		for _, r := range b.claim(t, "w", 1, time.Minute) {
			got = append(got, *r.ID)
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("claim order (-want +got):\n%s", diff)
	}
}

// TestClaim_LocksNoMoreJobsThanItTakes holds one claim of five open while
// another claims: a claim locks only the jobs it takes, whatever cursors
// split its scan into, so the second claim takes the next five instead of
// skipping ready jobs the first only looked at.
func TestClaim_LocksNoMoreJobsThanItTakes(t *testing.T) {
	t.Parallel()
	base := time.Now().Add(-time.Hour)
	for _, tc := range []struct {
		name       string
		priorities []int16
		since      []time.Time
	}{
		{name: "no cursor"},
		{name: "a cursor at the first priority", priorities: []int16{0}, since: []time.Time{base}},
		{name: "a cursor at the second priority", priorities: []int16{1}, since: []time.Time{base}},
		{name: "a cursor at each", priorities: []int16{0, 1}, since: []time.Time{base, base}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// Five ready jobs at priority 0, then five at priority 1.
			var first, second []int64
			for i := range 10 {
				runAt := base.Add(time.Duration(i) * time.Second)
				job, err := b.q.JobInsert(b.ctx, db.JobInsertParams{
					Queue: "default", Kind: "noop", Payload: json.RawMessage(`{}`), Priority: int16(i / 5), MaxAttempts: 1, RunAt: &runAt,
				})
				if err != nil {
					t.Fatal(err)
				}
				if i < 5 {
					first = append(first, job.ID)
				} else {
					second = append(second, job.ID)
				}
			}
			tx, err := b.pool.Begin(b.ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(b.ctx)
			rows, err := b.q.WithTx(tx).JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
				CursorPriorities: tc.priorities, CursorSince: tc.since,
				Queue: "default", ClaimTokens: leaseTokens(5), LeaseMs: time.Minute.Milliseconds(), WorkerID: "open",
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(first, claimedIDs(rows)); diff != "" {
				t.Errorf("first claim, still open (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(second, claimedIDs(b.claim(t, "next", 5, time.Minute))); diff != "" {
				t.Errorf("claim beside it (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCompleteAndClaim_ListsTheCompletionsOnItsFirstRowAndTheClaimsInOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var ids []int64
	for _, priority := range []int16{3, 2, 1, 0, 0, 1} {
		job, err := b.q.JobInsert(b.ctx, db.JobInsertParams{
			Queue: "default", Kind: "noop", Payload: json.RawMessage(`{}`), Priority: priority, MaxAttempts: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, job.ID)
	}
	first := b.claim(t, "w", 2, time.Minute)
	if len(first) != 2 {
		t.Fatalf("claimed %d jobs, want 2", len(first))
	}
	completeAndClaim := func(done []db.JobCompleteAndClaimRow, claim int) []db.JobCompleteAndClaimRow {
		t.Helper()
		rows, err := b.q.JobCompleteAndClaim(b.ctx, nextRound("w", done, claim))
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}

	// Two completions and three claims: the completions once, on the
	// first row; the claims by priority, then run_at, then id.
	second := completeAndClaim(first, 3)
	if diff := cmp.Diff([]int64{ids[2], ids[5], ids[1]}, claimedIDs(second)); diff != "" {
		t.Errorf("claimed (-want +got):\n%s", diff)
	}
	if got, want := slices.Sorted(slices.Values(second[0].CompletedIDs)), claimedIDs(first); !slices.Equal(got, slices.Sorted(slices.Values(want))) {
		t.Errorf("first row lists completions %v, want %v", got, want)
	}
	for i, r := range second[1:] {
		if r.CompletedIDs != nil {
			t.Errorf("row %d lists completions %v, want none: only the first row lists them", i+2, r.CompletedIDs)
		}
	}

	// Completions and no claim: one row that lists them, and no job.
	last := completeAndClaim(second, 0)
	if len(last) != 1 || last[0].ID != nil {
		t.Fatalf("rows %+v, want one without a job", last)
	}
	if got, want := slices.Sorted(slices.Values(last[0].CompletedIDs)), slices.Sorted(slices.Values(claimedIDs(second))); !slices.Equal(got, want) {
		t.Errorf("lists completions %v, want %v", got, want)
	}
}

func TestCompleteAndClaim_ClaimsBeforeItsCompletionsCanWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	running := b.enqueue(t, "noop", `{}`, 1)
	held := b.claim(t, "x", 1, time.Minute)
	if len(held) != 1 || *held[0].ID != running.ID {
		t.Fatalf("claimed %+v, want job %d", held, running.ID)
	}
	head := b.enqueue(t, "noop", `{}`, 1)
	next := b.enqueue(t, "noop", `{}`, 1)

	// Another transaction holds the running job's row, so that x's
	// completion of it has to wait.
	blocker := b.holdRow(t, running.ID)
	type round struct {
		rows []db.JobCompleteAndClaimRow
		err  error
	}
	xRound := make(chan round, 1)
	go func() {
		rows, err := b.q.JobCompleteAndClaim(b.ctx, nextRound("x", held, 1))
		xRound <- round{rows, err}
	}()
	for !b.blocks(t, blocker) {
		select {
		case r := <-xRound:
			t.Fatalf("x's round ended (%+v, %v) while its completion's row was held", r.rows, r.err)
		case <-time.After(time.Millisecond):
		}
	}

	// While x's completion waits, y claims: x has already taken the head
	// of the queue, so y takes the next job.
	y := b.claim(t, "y", 1, time.Minute)
	if len(y) != 1 || *y[0].ID != next.ID {
		t.Errorf("y claimed %v, want job %d: the head (%d) belongs to x's round", claimedIDs(y), next.ID, head.ID)
	}
	if err := blocker.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	x := <-xRound
	if x.err != nil {
		t.Fatal(x.err)
	}
	if got := claimedIDs(x.rows); !slices.Equal(got, []int64{head.ID}) {
		t.Errorf("x claimed %v, want the head of the queue as its round began, job %d", got, head.ID)
	}
	if got := x.rows[0].CompletedIDs; !slices.Equal(got, []int64{running.ID}) {
		t.Errorf("x completed %v, want job %d", got, running.ID)
	}
}

func TestClaim_SkipsJobsScheduledForLater(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.q.JobInsert(b.ctx, db.JobInsertParams{
		Queue: "default", Kind: "noop", Payload: json.RawMessage(`{}`), MaxAttempts: 1, DelayMs: 60_000,
	}); err != nil {
		t.Fatal(err)
	}
	if got := b.claim(t, "w", 10, time.Minute); len(got) != 0 {
		t.Errorf("claimed %d jobs scheduled a minute ahead, want 0", len(got))
	}
}

func TestClaim_MarksJobRunningUnderFreshLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 3)
	id, token := b.claimOne(t, "w1", time.Minute)
	if id != job.ID {
		t.Fatalf("claimed job %d, want %d", id, job.ID)
	}
	got := b.get(t, id)
	if got.State != db.JobStateRunning || got.Attempt != 1 || got.Fence != 1 || deref(got.LeasedBy) != "w1" || got.LeaseToken != token {
		t.Errorf("after claim: state %s attempt %d fence %d leased_by %v token %v; want running 1 1 w1 %v",
			got.State, got.Attempt, got.Fence, deref(got.LeasedBy), got.LeaseToken, token)
	}
	var leaseSeconds float64
	if err := b.pool.QueryRow(b.ctx, "SELECT extract(epoch FROM lease_expires_at - started_at) FROM jobs WHERE id = $1", id).Scan(&leaseSeconds); err != nil {
		t.Fatal(err)
	}
	if leaseSeconds != 60 {
		t.Errorf("lease runs %v s from the claim, want 60 (database time)", leaseSeconds)
	}
}

func TestComplete_EndsTheJobAlikeWithOrWithoutAClaimBesideIt(t *testing.T) {
	t.Parallel()
	completions := []struct {
		name     string
		complete func(b *bundle, t *testing.T, id int64, token pgtype.UUID, result string) bool
	}{
		{"JobCompleteAndClaim", (*bundle).complete},
		{"JobCompleteMany", (*bundle).completeAlone},
	}
	b := setup(t)
	s := b.register(t, "w1", 0)
	var ended []db.Job
	for _, c := range completions {
		job := b.enqueue(t, "noop", `{}`, 3)
		rows := b.claimUnder(t, "w1", &s.key, 1, time.Minute)
		if len(rows) != 1 || *rows[0].ID != job.ID {
			t.Fatalf("claimed %+v, want job %d", rows, job.ID)
		}
		id, token := job.ID, rows[0].LeaseToken
		// Every column that holds a running job's lease is set, and a
		// cancel request too: the completion must clear each (the schema's
		// checks refuse a finished job that keeps one), and its success
		// stands over the request.
		if got, err := b.q.JobCancel(b.ctx, id); err != nil || !got.Applied {
			t.Fatalf("ask to cancel: applied %t, %v", got.Applied, err)
		}
		if !c.complete(b, t, id, token, `{"sum": 42}`) {
			t.Fatalf("%s refused the completion of a job under its lease", c.name)
		}
		got := b.get(t, id)
		if got.State != db.JobStateSucceeded || string(got.Result) != `{"sum": 42}` || got.FinishedAt == nil ||
			got.LeaseToken.Valid || got.LeaseExpiresAt != nil || got.LeaseSession != nil || got.CancelRequestedAt != nil ||
			got.Attempt != 1 || got.Fence != 1 {
			t.Errorf("%s left state %s result %s finished %v lease %v/%v/%v cancel request %v attempt %d fence %d; "+
				"want succeeded with its result, finished, no lease, no cancel request, attempt 1, fence 1",
				c.name, got.State, got.Result, got.FinishedAt, got.LeaseToken, got.LeaseExpiresAt, got.LeaseSession,
				got.CancelRequestedAt, got.Attempt, got.Fence)
		}
		ended = append(ended, got)
	}
	// Apart from what differs between any two jobs, the two rows agree
	// column for column.
	unlike := func(j db.Job) db.Job {
		j.ID, j.CreatedAt, j.RunAt, j.StartedAt, j.FinishedAt = 0, time.Time{}, time.Time{}, nil, nil
		return j
	}
	if diff := cmp.Diff(unlike(ended[0]), unlike(ended[1])); diff != "" {
		t.Errorf("the two completions ended their jobs differently (-%s +%s):\n%s", completions[0].name, completions[1].name, diff)
	}
}

// ack is one kind of acknowledgement a worker can make under a lease.
type ack struct {
	name string
	// send makes the acknowledgement and reports whether it was accepted.
	send func(t *testing.T, b *bundle, id int64, token pgtype.UUID) bool
}

var acks = []ack{
	{"complete", func(t *testing.T, b *bundle, id int64, token pgtype.UUID) bool {
		return b.complete(t, id, token, `{"by": "stale"}`)
	}},
	{"complete without a claim", func(t *testing.T, b *bundle, id int64, token pgtype.UUID) bool {
		return b.completeAlone(t, id, token, `{"by": "stale"}`)
	}},
	{"fail", func(t *testing.T, b *bundle, id int64, token pgtype.UUID) bool {
		rows, err := b.q.JobFailMany(b.ctx, db.JobFailManyParams{
			IDs: []int64{id}, Tokens: []pgtype.UUID{token}, Errors: []string{"stale failure"},
			Permanent: []bool{false}, RetryInMs: []int64{0},
		})
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) == 1
	}},
	{"heartbeat", func(t *testing.T, b *bundle, id int64, token pgtype.UUID) bool {
		rows, err := b.q.JobHeartbeatMany(b.ctx, db.JobHeartbeatManyParams{
			LeaseMs: 60_000, IDs: []int64{id}, Tokens: []pgtype.UUID{token},
		})
		if err != nil {
			t.Fatal(err)
		}
		return len(rows) == 1 && rows[0].Renewed
	}},
	{"release", func(t *testing.T, b *bundle, id int64, token pgtype.UUID) bool {
		ids, err := b.q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{IDs: []int64{id}, Tokens: []pgtype.UUID{token}})
		if err != nil {
			t.Fatal(err)
		}
		return len(ids) == 1
	}},
}

func TestAcknowledgement_FromStaleClaimIsRejectedAndNewerOutcomeStands(t *testing.T) {
	t.Parallel()
	for _, a := range acks {
		t.Run(a.name, func(t *testing.T) {
			b := setup(t)
			job := b.enqueue(t, "noop", `{}`, 5)

			_, oldToken := b.claimOne(t, "zombie", 300*time.Millisecond)
			b.waitForLeaseExpiry(t, job.ID)
			if taken := b.reclaim(t, db.JobReclaimParams{MaxJobs: 10}); len(taken) != 1 || taken[0].ID != job.ID {
				t.Fatalf("reclaim took %+v, want job %d", taken, job.ID)
			}
			_, newToken := b.claimOne(t, "successor", time.Minute)

			// While the successor holds the job, the zombie's acknowledgement
			// changes nothing.
			before := b.get(t, job.ID)
			if a.send(t, b, job.ID, oldToken) {
				t.Fatalf("%s with the stale token was accepted", a.name)
			}
			if diff := cmp.Diff(before, b.get(t, job.ID)); diff != "" {
				t.Errorf("stale %s changed the job (-before +after):\n%s", a.name, diff)
			}

			// After the successor completes, it still changes nothing.
			if !b.complete(t, job.ID, newToken, `{"by": "successor"}`) {
				t.Fatal("successor's completion was rejected")
			}
			if a.send(t, b, job.ID, oldToken) {
				t.Fatalf("%s with the stale token was accepted after completion", a.name)
			}
			final := b.get(t, job.ID)
			if final.State != db.JobStateSucceeded || string(final.Result) != `{"by": "successor"}` || final.Attempt != 2 {
				t.Errorf("final: state %s result %s attempt %d; want succeeded, the successor's result, attempt 2",
					final.State, final.Result, final.Attempt)
			}
		})
	}
}

func TestAcknowledgement_AfterLeaseExpiredIsRejectedEvenBeforeReclaim(t *testing.T) {
	t.Parallel()
	for _, a := range acks {
		t.Run(a.name, func(t *testing.T) {
			b := setup(t)
			job := b.enqueue(t, "noop", `{}`, 5)
			_, token := b.claimOne(t, "slow", 200*time.Millisecond)
			b.waitForLeaseExpiry(t, job.ID)
			if a.send(t, b, job.ID, token) {
				t.Fatalf("%s after the lease expired was accepted", a.name)
			}
			if got := b.get(t, job.ID); got.State != db.JobStateRunning {
				t.Errorf("state %s, want running until reclaimed", got.State)
			}
		})
	}
}

func TestAcknowledgement_WithRandomTokenIsRejected(t *testing.T) {
	t.Parallel()
	for _, a := range acks {
		t.Run(a.name, func(t *testing.T) {
			b := setup(t)
			job := b.enqueue(t, "noop", `{}`, 5)
			b.claimOne(t, "owner", time.Minute)
			if a.send(t, b, job.ID, newToken()) {
				t.Fatalf("%s with a token that was never issued was accepted", a.name)
			}
		})
	}
}

func TestHeartbeat_ExtendsLeaseInDatabaseTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 1)
	_, token := b.claimOne(t, "w", time.Second)
	rows, err := b.q.JobHeartbeatMany(b.ctx, db.JobHeartbeatManyParams{LeaseMs: 120_000, IDs: []int64{job.ID}, Tokens: []pgtype.UUID{token}})
	if err != nil || len(rows) != 1 || !rows[0].Renewed {
		t.Fatalf("heartbeat: %+v, err %v; want the job renewed", rows, err)
	}
	var remaining float64
	if err := b.pool.QueryRow(b.ctx, "SELECT extract(epoch FROM lease_expires_at - now()) FROM jobs WHERE id = $1", job.ID).Scan(&remaining); err != nil {
		t.Fatal(err)
	}
	if remaining < 110 || remaining > 120 {
		t.Errorf("lease has %.1f s left after a 120 s renewal, want about 120", remaining)
	}
}

func TestHeartbeat_LeavesARowAnotherTransactionHoldsForLaterAndRenewsTheRest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, "noop", `{}`, 1)
	b.enqueue(t, "noop", `{}`, 1)
	b.enqueue(t, "noop", `{}`, 1)
	claimed := b.claim(t, "w", 3, 30*time.Second)
	if len(claimed) != 3 {
		t.Fatalf("claimed %d jobs, want 3", len(claimed))
	}
	held, free, lost := claimed[0], claimed[1], claimed[2]
	if !b.completeAlone(t, *lost.ID, lost.LeaseToken, `{}`) {
		t.Fatalf("completing job %d was refused", *lost.ID)
	}

	// Another transaction holds one running job's row, as a claim that
	// stepped over it or a cancel does until it commits.
	blocker := b.holdRow(t, *held.ID)

	// The heartbeat does not wait for it: a wait would end in this
	// context's deadline.
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	heartbeat := func() map[int64]db.JobHeartbeatManyRow {
		t.Helper()
		rows, err := b.q.JobHeartbeatMany(ctx, db.JobHeartbeatManyParams{
			LeaseMs: 120_000,
			IDs:     []int64{*held.ID, *free.ID, *lost.ID},
			Tokens:  []pgtype.UUID{held.LeaseToken, free.LeaseToken, lost.LeaseToken},
		})
		if err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		byID := map[int64]db.JobHeartbeatManyRow{}
		for _, r := range rows {
			byID[r.ID] = r
		}
		return byID
	}
	rows := heartbeat()
	if r, ok := rows[*free.ID]; !ok || !r.Renewed || r.LeaseExpiresAt == nil {
		t.Errorf("job %d, whose row no one held: %+v, want renewed", *free.ID, r)
	}
	if r, ok := rows[*held.ID]; !ok || r.Renewed || r.LeaseExpiresAt != nil {
		t.Errorf("job %d, whose row another transaction held: %+v (listed %v), want left for the next heartbeat", *held.ID, r, ok)
	}
	if r, ok := rows[*lost.ID]; ok {
		t.Errorf("job %d, completed: %+v, want no row: it is no longer the worker's", *lost.ID, r)
	}
	var left float64
	if err := b.pool.QueryRow(b.ctx, "SELECT extract(epoch FROM lease_expires_at - now()) FROM jobs WHERE id = $1", *held.ID).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left > 30 {
		t.Errorf("job %d's lease has %.1f s left, want what is left of its 30 s claim: the heartbeat left it alone", *held.ID, left)
	}

	// Once the row is free, the next heartbeat renews it.
	if err := blocker.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if r := heartbeat()[*held.ID]; !r.Renewed {
		t.Errorf("job %d after the other transaction ended: %+v, want renewed", *held.ID, r)
	}
}

func TestFail_SchedulesRetryWithBackoffInDatabaseTime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 3)
	_, token := b.claimOne(t, "w", time.Minute)
	rows, err := b.q.JobFailMany(b.ctx, db.JobFailManyParams{
		IDs: []int64{job.ID}, Tokens: []pgtype.UUID{token}, Errors: []string{"boom"},
		Permanent: []bool{false}, RetryInMs: []int64{90_000},
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]db.JobFailManyRow{{ID: job.ID, State: db.JobStateAvailable}}, rows); diff != "" {
		t.Fatalf("fail (-want +got):\n%s", diff)
	}
	var wait float64
	if err := b.pool.QueryRow(b.ctx, "SELECT extract(epoch FROM run_at - now()) FROM jobs WHERE id = $1", job.ID).Scan(&wait); err != nil {
		t.Fatal(err)
	}
	if wait < 80 || wait > 90 {
		t.Errorf("retry runs in %.1f s, want about 90 by the database clock", wait)
	}
	if got := b.claim(t, "w", 1, time.Minute); len(got) != 0 {
		t.Errorf("a job backing off was claimed")
	}
}

func TestFail_GoesDeadAfterMaxAttemptsWithFullErrorHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 3)
	for attempt := 1; attempt <= 3; attempt++ {
		_, token := b.claimOne(t, fmt.Sprintf("w%d", attempt), time.Minute)
		rows, err := b.q.JobFailMany(b.ctx, db.JobFailManyParams{
			IDs: []int64{job.ID}, Tokens: []pgtype.UUID{token}, Errors: []string{fmt.Sprintf("error %d", attempt)},
			Permanent: []bool{false}, RetryInMs: []int64{0},
		})
		if err != nil || len(rows) != 1 {
			t.Fatalf("attempt %d: fail rows %d err %v", attempt, len(rows), err)
		}
		want := db.JobStateAvailable
		if attempt == 3 {
			want = db.JobStateDead
		}
		if rows[0].State != want {
			t.Fatalf("after attempt %d: %s, want %s", attempt, rows[0].State, want)
		}
	}
	got := b.get(t, job.ID)
	if got.FinishedAt == nil || deref(got.LastError) != "error 3" {
		t.Errorf("dead job: finished_at %v last_error %q", got.FinishedAt, deref(got.LastError))
	}
	type entry struct {
		Attempt int    `json:"attempt"`
		Worker  string `json:"worker"`
		Error   string `json:"error"`
		At      string `json:"at"`
	}
	var history []entry
	if err := json.Unmarshal(got.Errors, &history); err != nil {
		t.Fatal(err)
	}
	for i := range history {
		if history[i].At == "" {
			t.Errorf("history entry %d has no time", i)
		}
		history[i].At = ""
	}
	want := []entry{{1, "w1", "error 1", ""}, {2, "w2", "error 2", ""}, {3, "w3", "error 3", ""}}
	if diff := cmp.Diff(want, history); diff != "" {
		t.Errorf("error history (-want +got):\n%s", diff)
	}
}

func TestFail_PermanentErrorGoesDeadAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 10)
	_, token := b.claimOne(t, "w", time.Minute)
	rows, err := b.q.JobFailMany(b.ctx, db.JobFailManyParams{
		IDs: []int64{job.ID}, Tokens: []pgtype.UUID{token}, Errors: []string{"bad input"},
		Permanent: []bool{true}, RetryInMs: []int64{0},
	})
	if err != nil || len(rows) != 1 || rows[0].State != db.JobStateDead {
		t.Fatalf("permanent failure: rows %+v err %v, want dead", rows, err)
	}
}

func TestReclaim_ExpiredLeaseOnLastAttemptGoesDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 1)
	b.claimOne(t, "crashy", 100*time.Millisecond)
	b.waitForLeaseExpiry(t, job.ID)
	rows := b.reclaim(t, db.JobReclaimParams{MaxJobs: 10})
	if len(rows) != 1 || rows[0].State != db.JobStateDead || deref(rows[0].LastError) != "lease expired" || deref(rows[0].LeasedBy) != "crashy" {
		t.Fatalf("reclaim: %+v, want job dead with 'lease expired' from crashy", rows)
	}
}

func TestReclaim_WithinAWindowTakesOnlyTheLeasesThatExpiredInIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	long := b.enqueue(t, "noop", `{}`, 3)
	recent := b.enqueue(t, "noop", `{}`, 3)
	b.claim(t, "gone", 2, time.Minute)
	// One lease expired an hour ago, the other a second ago.
	if _, err := b.pool.Exec(b.ctx, `UPDATE jobs SET lease_expires_at = now() - CASE id WHEN $1 THEN interval '1 hour' ELSE interval '1 second' END`, long.ID); err != nil {
		t.Fatal(err)
	}
	reclaimed := func(since *time.Time) []int64 {
		t.Helper()
		var ids []int64
		for _, r := range b.reclaim(t, db.JobReclaimParams{MaxJobs: 10, ExpiredSince: since}) {
			ids = append(ids, r.ID)
		}
		return ids
	}
	now, err := b.q.DatabaseNow(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	tenSecondsAgo := now.Add(-10 * time.Second)
	if diff := cmp.Diff([]int64{recent.ID}, reclaimed(&tenSecondsAgo)); diff != "" {
		t.Errorf("reclaim of the leases that expired in the last 10 s (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int64{long.ID}, reclaimed(nil)); diff != "" {
		t.Errorf("reclaim of every expired lease (-want +got):\n%s", diff)
	}
}

func TestReclaim_LeavesLiveLeasesAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.enqueue(t, "noop", `{}`, 1)
	b.claimOne(t, "healthy", time.Minute)
	if rows := b.reclaim(t, db.JobReclaimParams{MaxJobs: 10}); len(rows) != 0 {
		t.Errorf("reclaimed %+v from a live lease of an unregistered worker", rows)
	}
}

func TestRelease_GivesTheAttemptBackAndMakesJobAvailableNow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 1)
	_, token := b.claimOne(t, "leaving", time.Minute)
	note := "released: worker shutting down"
	ids, err := b.q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{Note: &note, IDs: []int64{job.ID}, Tokens: []pgtype.UUID{token}})
	if err != nil || len(ids) != 1 {
		t.Fatalf("release: %v, %v", ids, err)
	}
	got := b.get(t, job.ID)
	if got.State != db.JobStateAvailable || got.Attempt != 0 || got.Fence != 1 {
		t.Errorf("released: state %s attempt %d fence %d; want available 0 1", got.State, got.Attempt, got.Fence)
	}
	if !strings.Contains(string(got.Errors), `"error": "released: worker shutting down"`) || !strings.Contains(string(got.Errors), `"worker": "leaving"`) {
		t.Errorf("history %s does not record the release by its worker", got.Errors)
	}
	// The single attempt it had is still there to use, and the fence grows.
	b.claimOne(t, "next", time.Minute)
	if got := b.get(t, job.ID); got.Attempt != 1 || got.Fence != 2 {
		t.Errorf("reclaimed: attempt %d fence %d; want 1 2", got.Attempt, got.Fence)
	}
}

// TestRelease_WithANoteRecordsItAsTheLastError: a release at shutdown
// records its note as the job's last error, as every other entry of its
// error history is, so that last_error (all that a listing shows of it)
// says why the newest attempt ended, rather than nothing, or the error
// of an attempt before it.
func TestRelease_WithANoteRecordsItAsTheLastError(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 3)
	id, token := b.claimOne(t, "first", time.Minute)
	if rows, err := b.q.JobFailMany(b.ctx, db.JobFailManyParams{
		IDs: []int64{id}, Tokens: []pgtype.UUID{token}, Errors: []string{"boom"}, Permanent: []bool{false}, RetryInMs: []int64{0},
	}); err != nil || len(rows) != 1 {
		t.Fatalf("fail: %v, %v", rows, err)
	}
	_, token = b.claimOne(t, "leaving", time.Minute)
	note := "released: worker shutting down"
	if ids, err := b.q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{Note: &note, IDs: []int64{job.ID}, Tokens: []pgtype.UUID{token}}); err != nil || len(ids) != 1 {
		t.Fatalf("release: %v, %v", ids, err)
	}
	got := b.get(t, job.ID)
	var history []struct {
		Attempt int32
		Worker  string
		Error   string
	}
	if err := json.Unmarshal(got.Errors, &history); err != nil {
		t.Fatalf("history %s: %v", got.Errors, err)
	}
	if deref(got.LastError) != note || got.ErrorCount != 2 || got.Attempt != 1 || len(history) != 2 ||
		history[1].Error != note || history[1].Attempt != 2 || history[1].Worker != "leaving" {
		t.Errorf("released: last error %q, error count %d, attempt %d, history %s; want last error %q, "+
			"2 errors, attempt 1, and the release, of attempt 2 by its worker, last in the history",
			deref(got.LastError), got.ErrorCount, got.Attempt, got.Errors, note)
	}
}

func TestRelease_WithoutANoteUndoesTheClaimButKeepsTheFenceAndTheHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 1)
	_, token := b.claimOne(t, "ahead", time.Minute)

	ids, err := b.q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{IDs: []int64{job.ID}, Tokens: []pgtype.UUID{newToken()}})
	if err != nil || len(ids) != 0 {
		t.Fatalf("release with a stranger's token: %v, %v; want nothing released", ids, err)
	}
	ids, err = b.q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{IDs: []int64{job.ID}, Tokens: []pgtype.UUID{token}})
	if err != nil || len(ids) != 1 {
		t.Fatalf("release: %v, %v", ids, err)
	}
	got := b.get(t, job.ID)
	if got.State != db.JobStateAvailable || got.Attempt != 0 || got.Fence != 1 || got.LeaseToken.Valid ||
		string(got.Errors) != "[]" || got.LastError != nil || !got.RunAt.Equal(job.RunAt) {
		t.Errorf("released: state %s attempt %d fence %d token %v errors %s last error %v run_at %s (was %s); "+
			"want available, attempt 0, fence 1, no lease, no history, run_at kept",
			got.State, got.Attempt, got.Fence, got.LeaseToken, got.Errors, deref(got.LastError), got.RunAt, job.RunAt)
	}
	if ok := b.complete(t, job.ID, token, `{}`); ok {
		t.Error("completion under the released claim was accepted")
	}

	// A job someone asked to cancel while it waited ends cancelled.
	_, token = b.claimOne(t, "ahead", time.Minute)
	if got, err := b.q.JobCancel(b.ctx, job.ID); err != nil || !got.Applied {
		t.Fatalf("cancel: applied %t, %v", got.Applied, err)
	}
	if _, err := b.q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{IDs: []int64{job.ID}, Tokens: []pgtype.UUID{token}}); err != nil {
		t.Fatalf("release: %v", err)
	}
	if got := b.get(t, job.ID); got.State != db.JobStateCancelled || got.FinishedAt == nil || got.Fence != 2 {
		t.Errorf("released after a cancel request: state %s finished %v fence %d; want cancelled, finished, fence 2", got.State, got.FinishedAt, got.Fence)
	}
}

func TestCancel_AvailableJobEndsAtOnceRunningJobIsMarked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	waiting := b.enqueue(t, "noop", `{}`, 1)
	got, err := b.q.JobCancel(b.ctx, waiting.ID)
	if err != nil || !got.Applied || got.State != db.JobStateCancelled || got.FinishedAt == nil {
		t.Fatalf("cancel available: %+v, %v", got, err)
	}

	running := b.enqueue(t, "noop", `{}`, 1)
	_, token := b.claimOne(t, "w", time.Minute)
	got, err = b.q.JobCancel(b.ctx, running.ID)
	if err != nil || !got.Applied || got.State != db.JobStateRunning || got.CancelRequestedAt == nil {
		t.Fatalf("cancel running: %+v, %v", got, err)
	}
	rows, err := b.q.JobHeartbeatMany(b.ctx, db.JobHeartbeatManyParams{LeaseMs: 60_000, IDs: []int64{running.ID}, Tokens: []pgtype.UUID{token}})
	if err != nil || len(rows) != 1 || !rows[0].Renewed || !rows[0].CancelRequested {
		t.Fatalf("heartbeat after cancel: %+v, %v; want renewed with cancel_requested", rows, err)
	}
	failed, err := b.q.JobFailMany(b.ctx, db.JobFailManyParams{
		IDs: []int64{running.ID}, Tokens: []pgtype.UUID{token}, Errors: []string{"context canceled"},
		Permanent: []bool{false}, RetryInMs: []int64{0},
	})
	if err != nil || len(failed) != 1 || failed[0].State != db.JobStateCancelled {
		t.Fatalf("failure of a cancelled job: %+v, %v; want cancelled", failed, err)
	}

	if got, err := b.q.JobCancel(b.ctx, running.ID); err != nil || got.Applied || got.State != db.JobStateCancelled {
		t.Errorf("cancel of a finished job: applied %t state %s, %v; want refused, cancelled", got.Applied, got.State, err)
	}
}

func TestRetry_MakesDeadJobAvailableWithFreshAttemptsAndGrowingFence(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 1)
	_, token := b.claimOne(t, "w", time.Minute)
	if _, err := b.q.JobFailMany(b.ctx, db.JobFailManyParams{
		IDs: []int64{job.ID}, Tokens: []pgtype.UUID{token}, Errors: []string{"x"}, Permanent: []bool{true}, RetryInMs: []int64{0},
	}); err != nil {
		t.Fatal(err)
	}
	got, err := b.q.JobRetry(b.ctx, job.ID)
	if err != nil || !got.Applied || got.State != db.JobStateAvailable || got.Attempt != 0 || got.FinishedAt != nil {
		t.Fatalf("retry: %+v, %v", got, err)
	}
	b.claimOne(t, "w", time.Minute)
	if got := b.get(t, job.ID); got.Attempt != 1 || got.Fence != 2 {
		t.Errorf("after retry and claim: attempt %d fence %d, want 1 2", got.Attempt, got.Fence)
	}
	if got, err := b.q.JobRetry(b.ctx, job.ID); err != nil || got.Applied || got.State != db.JobStateRunning {
		t.Errorf("retry of a running job: applied %t state %s, %v; want refused, running", got.Applied, got.State, err)
	}
}

func TestInsert_IdempotencyKeyReturnsExistingJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := "order-42"
	params := db.JobInsertParams{Queue: "default", Kind: "noop", Payload: json.RawMessage(`{"a": 1}`), MaxAttempts: 3, IdempotencyKey: &key}
	first, err := b.q.JobInsert(b.ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.q.JobInsert(b.ctx, params); !errors.Is(err, pgx.ErrNoRows) {
		t.Fatalf("second insert with the same key: err %v, want no rows", err)
	}
	existing, err := b.q.JobGetByIdempotencyKey(b.ctx, db.JobGetByIdempotencyKeyParams{Queue: "default", IdempotencyKey: &key})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(first, existing); diff != "" {
		t.Errorf("existing job differs from the first insert (-first +existing):\n%s", diff)
	}
	// The key is unique per queue, not across queues.
	params.Queue = "elsewhere"
	if _, err := b.q.JobInsert(b.ctx, params); err != nil {
		t.Errorf("same key on another queue: %v", err)
	}
}

func TestSchema_RejectsImpossibleStates(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 1)
	for _, stmt := range []string{
		"UPDATE jobs SET state = 'running' WHERE id = $1",               // running without a lease
		"UPDATE jobs SET lease_token = gen_random_uuid() WHERE id = $1", // lease while available
		"UPDATE jobs SET state = 'succeeded' WHERE id = $1",             // finished without finished_at
		"UPDATE jobs SET state = 'bogus' WHERE id = $1",                 // unknown state
		"UPDATE jobs SET max_attempts = 0 WHERE id = $1",                // no attempts
		"UPDATE jobs SET queue = '' WHERE id = $1",                      // empty queue
		"UPDATE jobs SET result = '{}' WHERE id = $1",                   // result before success
		"UPDATE jobs SET errors = '{}' WHERE id = $1",                   // history not an array
		"UPDATE jobs SET state = 'dead', finished_at = now(), lease_token = gen_random_uuid(), lease_expires_at = now() WHERE id = $1", // finished with a lease
	} {
		if _, err := b.pool.Exec(b.ctx, stmt, job.ID); err == nil {
			t.Errorf("%s: accepted, want a constraint violation", stmt)
		}
	}
}

func TestClaim_ScansItsIndexFromEachCursorAndSortsOnlyWhatItTakes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const rows = 100_000
	// A fixture: 100,000 available jobs over several queues, priorities
	// and times, then fresh statistics.
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO jobs (queue, kind, priority, run_at)
		SELECT CASE WHEN i % 4 = 0 THEN 'other' ELSE 'default' END, 'noop', (i % 5)::smallint,
		       now() - (i % 1000) * interval '1 second'
		FROM generate_series(1, $1) AS i`, rows); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, "ANALYZE jobs"); err != nil {
		t.Fatal(err)
	}

	const claim = 10
	for _, tc := range []struct {
		name       string
		priorities []int16
		since      []time.Time
	}{
		{name: "from the head"},
		{name: "from cursors at two priorities", priorities: []int16{1, 3},
			since: []time.Time{time.Now().Add(-time.Minute), time.Now().Add(-time.Hour)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := explain(t, b, func(q *db.Queries) error {
				_, err := q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
					CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
					CursorPriorities: tc.priorities, CursorSince: tc.since,
					Queue: "default", ClaimTokens: leaseTokens(claim), LeaseMs: 30_000, WorkerID: "explain",
				})
				return err
			}, nil)
			// A scan per cursor and per range of priorities around them.
			segments := 2*len(tc.priorities) + 1
			var claimScans int
			got.root.Walk(func(n pgplan.Node) {
				switch {
				case n.NodeType == "Seq Scan" && n.RelationName == "jobs":
					t.Errorf("claim scans the whole table")
				case n.IndexName == "jobs_claim_idx":
					claimScans++
					if !strings.Contains(n.IndexCond, "ROW(priority, run_at) >=") {
						t.Errorf("the claim's scan does not start at its cursor: %s", n.IndexCond)
					}
				case n.NodeType == "Sort" && n.ActualRows*n.ActualLoops > float64(claim*segments):
					t.Errorf("claim sorts %v rows, more than its %d scans return", n.ActualRows*n.ActualLoops, segments)
				}
			})
			if claimScans == 0 {
				t.Errorf("claim does not scan jobs_claim_idx:\n%s", got.plan)
			}
		})
	}
}

func TestReclaim_KeepsJobsPlaceAheadOfLaterJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.enqueue(t, "noop", `{}`, 5)
	b.claimOne(t, "crashed", 100*time.Millisecond)
	later := b.enqueue(t, "noop", `{}`, 5)
	b.waitForLeaseExpiry(t, first.ID)
	if _, err := b.q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 10}); err != nil {
		t.Fatal(err)
	}
	if id, _ := b.claimOne(t, "successor", time.Minute); id != first.ID {
		t.Errorf("claimed job %d first, want the reclaimed job %d, ready before job %d", id, first.ID, later.ID)
	}
}
