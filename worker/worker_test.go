package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/worker"
)

// These tests specify the worker loop: handlers, heartbeats, retries,
// cancellation and shutdown, against the real database.

func TestWorker_RunsHandlerAndStoresResult(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "greet", `{"name": "Ada"}`, 3)
	b.startWorker(t, worker.Config{Slots: 2}, func(w *worker.Worker) {
		w.HandleFunc("greet", func(ctx context.Context, j *worker.Job) (any, error) {
			var p struct{ Name string }
			if err := json.Unmarshal(j.Payload, &p); err != nil {
				return nil, worker.Permanent(err)
			}
			return map[string]any{"greeting": "hello " + p.Name, "attempt": j.Attempt, "fence": j.Fence}, nil
		})
	})
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	if string(got.Result) != `{"fence": 1, "attempt": 1, "greeting": "hello Ada"}` {
		t.Errorf("result %s", got.Result)
	}
	if got.LeaseToken.Valid || got.LeaseExpiresAt != nil || got.FinishedAt == nil {
		t.Errorf("succeeded job still holds a lease or has no finish time: %+v", got)
	}
}

// TestWorker_DrainsAQueueWhoseNameHoldsControlCharacters: enqueueing
// refuses control characters in a queue or a kind, but jobs stored before
// it did may have them, and a worker configured with such a queue still
// runs them.
func TestWorker_DrainsAQueueWhoseNameHoldsControlCharacters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	queue, kind := "old\nqueue\u0085", "old\tkind"
	// Stored as a job enqueued before the refusal was.
	job, err := b.q.JobInsert(b.ctx, db.JobInsertParams{Queue: queue, Kind: kind, Payload: json.RawMessage(`{}`), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := worker.Config{Queue: queue}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	b.startWorker(t, cfg, func(w *worker.Worker) {
		w.HandleFunc(kind, func(context.Context, *worker.Job) (any, error) { return "done", nil })
	})
	b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
}

func TestWorker_HeartbeatsKeepJobPastItsLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "slow", `{}`, 1)
	const lease = 600 * time.Millisecond
	var cause atomic.Value
	b.startWorker(t, worker.Config{Slots: 1, Lease: lease, HeartbeatInterval: 150 * time.Millisecond, ReclaimInterval: 50 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("slow", func(ctx context.Context, j *worker.Job) (any, error) {
			select {
			case <-time.After(4 * lease):
				return "done", nil
			case <-ctx.Done():
				cause.Store(context.Cause(ctx))
				return nil, ctx.Err()
			}
		})
	})
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 20*time.Second)
	if got.Attempt != 1 {
		t.Errorf("succeeded on attempt %d, want 1: the lease was not kept alive", got.Attempt)
	}
	if c := cause.Load(); c != nil {
		t.Errorf("handler was cancelled: %v", c)
	}
}

func TestWorker_ARowHeldElsewhereDoesNotHoldBackTheOtherLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lease = time.Second
	blocked := b.enqueue(t, "blocked", `{}`, 3)
	steady := b.enqueue(t, "steady", `{}`, 1)
	started := make(chan int64, 2)
	var steadyCause atomic.Value
	b.startWorker(t, worker.Config{Slots: 2, Lease: lease, HeartbeatInterval: 200 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("blocked", func(ctx context.Context, j *worker.Job) (any, error) {
			if j.Attempt == 1 {
				started <- j.ID
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return "later attempt", nil
		})
		w.HandleFunc("steady", func(ctx context.Context, j *worker.Job) (any, error) {
			started <- j.ID
			select {
			case <-time.After(3 * lease):
				return "done", nil
			case <-ctx.Done():
				steadyCause.Store(context.Cause(ctx))
				return nil, ctx.Err()
			}
		})
	})
	for range 2 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the handlers did not start")
		}
	}

	// Another transaction holds one job's row for longer than a lease.
	b.holdRowFor(t, blocked.ID, 2*lease)

	got := b.waitForState(t, steady.ID, db.JobStateSucceeded, 20*time.Second)
	if got.Attempt != 1 {
		t.Errorf("steady job succeeded on attempt %d, want 1: its lease was not renewed while the other job's row was held", got.Attempt)
	}
	if c := steadyCause.Load(); c != nil {
		t.Errorf("steady job's handler was cancelled: %v", c)
	}
	// The held job's lease ran out while its row was held; once the row
	// was free it was taken back and ran again.
	if got := b.waitForState(t, blocked.ID, db.JobStateSucceeded, 20*time.Second); got.Attempt < 2 {
		t.Errorf("held job succeeded on attempt %d, want a later attempt after its lease ran out", got.Attempt)
	}
}

func TestWorker_KeepsAJobWhoseRowIsHeldForLessThanALease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const lease = 2 * time.Second
	job := b.enqueue(t, "slow", `{}`, 1)
	started := make(chan struct{})
	var cause atomic.Value
	b.startWorker(t, worker.Config{Slots: 1, Lease: lease, HeartbeatInterval: 200 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("slow", func(ctx context.Context, j *worker.Job) (any, error) {
			close(started)
			select {
			case <-time.After(2 * lease):
				return "done", nil
			case <-ctx.Done():
				cause.Store(context.Cause(ctx))
				return nil, ctx.Err()
			}
		})
	})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler did not start")
	}

	// Held across several heartbeats, each of which leaves the job for
	// the next, but for less than a lease.
	b.holdRowFor(t, job.ID, lease*2/5)

	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 20*time.Second)
	if got.Attempt != 1 {
		t.Errorf("succeeded on attempt %d, want 1: a heartbeat that found the row held gave the job up", got.Attempt)
	}
	if c := cause.Load(); c != nil {
		t.Errorf("handler was cancelled: %v", c)
	}
}

func TestWorker_ReclaimsJobWhoseHeartbeatsStoppedAndRunsAttemptTwo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "once", `{}`, 3)
	// A worker that claimed the job and then went silent, without a
	// registered session: only its lease protects the job.
	b.claimOne(t, "silent", 300*time.Millisecond)

	b.startWorker(t, worker.Config{Slots: 1, ReclaimInterval: 50 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("once", func(ctx context.Context, j *worker.Job) (any, error) {
			return map[string]int{"attempt": j.Attempt}, nil
		})
	})
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	if got.Attempt != 2 || string(got.Result) != `{"attempt": 2}` {
		t.Errorf("attempt %d result %s, want attempt 2", got.Attempt, got.Result)
	}
	if !strings.Contains(string(got.Errors), `"worker": "silent"`) || !strings.Contains(string(got.Errors), "lease expired") {
		t.Errorf("history %s does not record the expired lease of the silent worker", got.Errors)
	}
}

// TestWorker_ReclaimsAnExpiredLeaseSoonAfterTheTransactionHoldingItsRowEnds
// holds the row of a silent worker's job in another transaction from
// before its lease expires until 3 s after. The worker's reclaims skip the
// held row meanwhile; once it is free, the next reclaim takes the job back,
// not the full pass that comes once every 40 reclaims (10 s).
func TestWorker_ReclaimsAnExpiredLeaseSoonAfterTheTransactionHoldingItsRowEnds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "once", `{}`, 3)
	b.claimOne(t, "silent", 500*time.Millisecond)
	holder, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.WithoutCancel(b.ctx))
	if _, err := holder.Exec(b.ctx, "SELECT FROM jobs WHERE id = $1 FOR UPDATE", job.ID); err != nil {
		t.Fatal(err)
	}
	b.startWorker(t, worker.Config{Slots: 1}, func(w *worker.Worker) {
		w.HandleFunc("once", func(ctx context.Context, j *worker.Job) (any, error) { return nil, nil })
	})
	time.Sleep(3500 * time.Millisecond)
	if got := b.get(t, job.ID); got.State != db.JobStateRunning || got.Attempt != 1 {
		t.Fatalf("while its row was held the job became %s at attempt %d, want still running at 1", got.State, got.Attempt)
	}
	if err := holder.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 4*time.Second)
	if got.Attempt != 2 || !strings.Contains(string(got.Errors), "lease expired") {
		t.Errorf("attempt %d, history %s; want attempt 2 after the expired lease", got.Attempt, got.Errors)
	}
}

func TestWorker_RetriesWithBackoffThenDeadAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "flaky", `{}`, 3)
	var calls atomic.Int32
	b.startWorker(t, worker.Config{Slots: 1, Backoff: func(int) time.Duration { return 100 * time.Millisecond }}, func(w *worker.Worker) {
		w.HandleFunc("flaky", func(ctx context.Context, j *worker.Job) (any, error) {
			calls.Add(1)
			return nil, errors.New("still broken")
		})
	})
	got := b.waitForState(t, job.ID, db.JobStateDead, 15*time.Second)
	if calls.Load() != 3 || got.Attempt != 3 {
		t.Errorf("handler called %d times, attempt %d; want 3 and 3", calls.Load(), got.Attempt)
	}
	var history []map[string]any
	if err := json.Unmarshal(got.Errors, &history); err != nil || len(history) != 3 {
		t.Fatalf("history %s: %v", got.Errors, err)
	}
	// Each retry waited for its backoff, by the database clock.
	var gaps []float64
	rows, err := b.pool.Query(b.ctx, `
		SELECT extract(epoch FROM (e->>'at')::timestamptz - lag((e->>'at')::timestamptz) OVER (ORDER BY (e->>'attempt')::int))
		FROM jobs, jsonb_array_elements(errors) AS e WHERE id = $1`, job.ID)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var gap *float64
		if err := rows.Scan(&gap); err != nil {
			t.Fatal(err)
		}
		if gap != nil {
			gaps = append(gaps, *gap)
		}
	}
	for _, g := range gaps {
		if g < 0.1 {
			t.Errorf("retry came %.3f s after the previous failure, before its 100ms backoff", g)
		}
	}
}

func TestWorker_PermanentErrorGoesDeadAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "invalid", `{}`, 10)
	b.startWorker(t, worker.Config{Slots: 1}, func(w *worker.Worker) {
		w.HandleFunc("invalid", func(ctx context.Context, j *worker.Job) (any, error) {
			return nil, worker.Permanent(errors.New("payload makes no sense"))
		})
	})
	got := b.waitForState(t, job.ID, db.JobStateDead, 10*time.Second)
	if got.Attempt != 1 || deref(got.LastError) != "permanent: payload makes no sense" {
		t.Errorf("attempt %d last error %q", got.Attempt, deref(got.LastError))
	}
}

func TestWorker_RecordsPanicAndUnknownKindAndKeepsWorking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	panicky := b.enqueue(t, "panic", `{}`, 1)
	unknown := b.enqueue(t, "no-such-kind", `{}`, 5)
	fine := b.enqueue(t, "fine", `{}`, 1)
	b.startWorker(t, worker.Config{Slots: 1}, func(w *worker.Worker) {
		w.HandleFunc("panic", func(ctx context.Context, j *worker.Job) (any, error) {
			var m map[string]int
			m["boom"]++ // assignment to entry in nil map
			return nil, nil
		})
		w.HandleFunc("fine", func(ctx context.Context, j *worker.Job) (any, error) { return "ok", nil })
	})

	got := b.waitForState(t, panicky.ID, db.JobStateDead, 10*time.Second)
	if !strings.Contains(deref(got.LastError), "handler panicked: assignment to entry in nil map") ||
		!strings.Contains(deref(got.LastError), "worker_test.go") {
		t.Errorf("panic recorded as %q, want the panic value and a stack", deref(got.LastError))
	}
	got = b.waitForState(t, unknown.ID, db.JobStateDead, 10*time.Second)
	if got.Attempt != 1 || !strings.Contains(deref(got.LastError), `no handler registered for kind "no-such-kind"`) {
		t.Errorf("unknown kind: attempt %d error %q; want dead on attempt 1", got.Attempt, deref(got.LastError))
	}
	b.waitForState(t, fine.ID, db.JobStateSucceeded, 10*time.Second)
}

func TestWorker_HandlerThatEndsItsGoroutineFailsItsAttemptAndTheSlotCarriesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	exits := b.enqueue(t, "exits", `{}`, 1)
	b.startWorker(t, worker.Config{Slots: 1}, func(w *worker.Worker) {
		w.HandleFunc("exits", func(ctx context.Context, j *worker.Job) (any, error) {
			runtime.Goexit() // as t.FailNow does
			return "never", nil
		})
		w.HandleFunc("fine", func(ctx context.Context, j *worker.Job) (any, error) { return "ok", nil })
	})

	got := b.waitForState(t, exits.ID, db.JobStateDead, 10*time.Second)
	if got.Attempt != 1 || !strings.Contains(deref(got.LastError), "runtime.Goexit") {
		t.Errorf("attempt %d error %q; want dead on attempt 1, the Goexit recorded", got.Attempt, deref(got.LastError))
	}
	// The worker's only slot runs the next job.
	fine := b.enqueue(t, "fine", `{}`, 1)
	b.waitForState(t, fine.ID, db.JobStateSucceeded, 10*time.Second)
}

// Not parallel: GODEBUG is the process's. Under panicnil=1, as a program
// may set it, recover returns nil for panic(nil), as it does while a
// goroutine ends with runtime.Goexit, but the function goes on.
func TestWorker_HandlerThatPanicsWithNilUnderPanicnilFailsItsAttemptOnce(t *testing.T) {
	godebug := "panicnil=1"
	if old := os.Getenv("GODEBUG"); old != "" {
		godebug = old + "," + godebug
	}
	t.Setenv("GODEBUG", godebug)
	b := setup(t)
	panics := b.enqueue(t, "panics", `{}`, 1)
	var mu sync.Mutex
	var acks []worker.Ack
	var running, most atomic.Int32
	b.startWorker(t, worker.Config{
		Slots: 1,
		OnAck: func(a worker.Ack) {
			mu.Lock()
			defer mu.Unlock()
			acks = append(acks, a)
		},
	}, func(w *worker.Worker) {
		w.HandleFunc("panics", func(ctx context.Context, j *worker.Job) (any, error) {
			panic(nil)
		})
		w.HandleFunc("fine", func(ctx context.Context, j *worker.Job) (any, error) {
			n := running.Add(1)
			defer running.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			time.Sleep(20 * time.Millisecond)
			return "ok", nil
		})
	})

	got := b.waitFor(t, panics.ID, 10*time.Second, "finished", func(j db.Job) bool { return j.FinishedAt != nil })
	if got.State != db.JobStateDead || !strings.Contains(deref(got.LastError), "handler panicked") {
		t.Errorf("state %s error %q; want dead, the panic recorded", got.State, deref(got.LastError))
	}
	// The worker's only slot runs the next jobs, one at a time.
	var fine []db.Job
	for range 4 {
		fine = append(fine, b.enqueue(t, "fine", `{}`, 1))
	}
	for _, j := range fine {
		b.waitForState(t, j.ID, db.JobStateSucceeded, 10*time.Second)
	}
	if n := most.Load(); n != 1 {
		t.Errorf("%d handlers ran at once on a worker of one slot", n)
	}
	mu.Lock()
	defer mu.Unlock()
	var reported []worker.Outcome
	for _, a := range acks {
		if a.Job.ID == panics.ID {
			reported = append(reported, a.Outcome)
		}
	}
	if !slices.Equal(reported, []worker.Outcome{worker.OutcomeFailed}) {
		t.Errorf("the attempt was reported %v; want failed, once", reported)
	}
}

func TestWorker_HandlerThatIgnoresItsCancellationAndSucceedsEndsSucceeded(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "ignores", `{}`, 5)
	started := make(chan struct{})
	b.startWorker(t, worker.Config{Slots: 1, Lease: time.Second, HeartbeatInterval: 100 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("ignores", func(ctx context.Context, j *worker.Job) (any, error) {
			close(started)
			<-ctx.Done() // told, and finishes its work all the same
			return map[string]bool{"done": true}, nil
		})
	})
	b.cancelOnceStarted(t, started, job.ID)
	got := b.waitFor(t, job.ID, 10*time.Second, "finished", func(j db.Job) bool { return j.FinishedAt != nil })
	if got.State != db.JobStateSucceeded || string(got.Result) != `{"done": true}` || got.CancelRequestedAt != nil {
		t.Errorf("state %s result %s cancel requested at %v; want succeeded with the handler's result",
			got.State, got.Result, got.CancelRequestedAt)
	}
}

func TestWorker_CancelReachesRunningHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "long", `{}`, 5)
	started := make(chan struct{})
	causes := make(chan error, 1)
	b.startWorker(t, worker.Config{Slots: 1, Lease: time.Second, HeartbeatInterval: 100 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("long", func(ctx context.Context, j *worker.Job) (any, error) {
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return nil, ctx.Err()
		})
	})
	b.cancelOnceStarted(t, started, job.ID)
	select {
	case cause := <-causes:
		if !errors.Is(cause, worker.ErrJobCancelled) {
			t.Errorf("context cause %v, want ErrJobCancelled", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancel never reached the handler")
	}
	got := b.waitForState(t, job.ID, db.JobStateCancelled, 10*time.Second)
	if got.Attempt != 1 {
		t.Errorf("cancelled job ran %d attempts, want 1", got.Attempt)
	}
}

func TestWorker_LostLeaseCancelsHandlerAndDropsItsOutcome(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "stuck", `{}`, 5)
	started := make(chan struct{})
	causes := make(chan error, 1)
	var acks sync.Map
	b.startWorker(t, worker.Config{
		Slots: 1, Lease: time.Second, HeartbeatInterval: 100 * time.Millisecond,
		OnAck: func(a worker.Ack) { acks.Store(a.Job.Attempt, a) },
	}, func(w *worker.Worker) {
		w.HandleFunc("stuck", func(ctx context.Context, j *worker.Job) (any, error) {
			if j.Attempt > 1 {
				return "second attempt", nil
			}
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return "stale result", nil // must never be recorded
		})
	})
	<-started
	// Someone else takes the job over: here, by ending the lease in the
	// database as a reclaim would after the lease expired.
	if _, err := b.pool.Exec(b.ctx, "UPDATE jobs SET lease_expires_at = now() WHERE id = $1", job.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case cause := <-causes:
		if !errors.Is(cause, worker.ErrLeaseLost) {
			t.Errorf("cause %v, want ErrLeaseLost", cause)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("lost lease never cancelled the handler")
	}
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	if string(got.Result) != `"second attempt"` {
		t.Errorf("result %s, want the second attempt's", got.Result)
	}
	if a, ok := acks.Load(1); !ok || a.(worker.Ack).Outcome != worker.OutcomeLeaseLost || a.(worker.Ack).Accepted {
		t.Errorf("first attempt's ack %+v, want lease_lost, not accepted", a)
	}
}

func TestWorker_GracefulShutdownReleasesHeldJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stubborn := b.enqueue(t, "stubborn", `{}`, 1)
	started := make(chan struct{})
	causes := make(chan error, 1)
	_, stop := b.startWorker(t, worker.Config{Slots: 2, ShutdownGrace: 300 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("stubborn", func(ctx context.Context, j *worker.Job) (any, error) {
			close(started)
			<-ctx.Done()
			causes <- context.Cause(ctx)
			return "too late", nil // dropped: the job was released
		})
	})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never started")
	}
	begun := time.Now()
	stop()
	if took := time.Since(begun); took > 5*time.Second {
		t.Errorf("shutdown took %s", took)
	}
	if cause := <-causes; !errors.Is(cause, worker.ErrShutdown) {
		t.Errorf("handler's context cause %v, want ErrShutdown", cause)
	}
	got := b.get(t, stubborn.ID)
	if got.State != db.JobStateAvailable || got.Attempt != 0 || got.LeaseToken.Valid {
		t.Errorf("stubborn job after shutdown: state %s attempt %d; want available with its attempt given back", got.State, got.Attempt)
	}
	if !strings.Contains(string(got.Errors), "released: worker shutting down") || deref(got.LastError) != "released: worker shutting down" {
		t.Errorf("history %s, last error %q: want both to record the release", got.Errors, deref(got.LastError))
	}
	var workers int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM workers").Scan(&workers); err != nil || workers != 0 {
		t.Errorf("%d workers registered after shutdown (err %v), want 0", workers, err)
	}
}

// TestWorker_ShutdownDoesNotWaitForAHandlerThatIgnoresItsCancellation: a
// handler still running when the grace period ends is cancelled and its
// job released; Run returns without waiting for it. One that ignores its
// context runs on in the process while another worker runs its job
// again: at-least-once, as after a crash. What it returns at last is
// recorded nowhere, and the newer attempt's outcome stands.
func TestWorker_ShutdownDoesNotWaitForAHandlerThatIgnoresItsCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "stubborn", `{}`, 5)
	started, unblock, returned := make(chan struct{}), make(chan struct{}), make(chan struct{})
	_, first := b.runWorker(t, b.pool, worker.Config{Slots: 1, ShutdownGrace: 100 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("stubborn", func(ctx context.Context, j *worker.Job) (any, error) {
			defer close(returned)
			close(started)
			<-unblock // ignores its context
			return "zombie", nil
		})
	})
	t.Cleanup(func() {
		select {
		case <-unblock:
		default:
			close(unblock)
		}
	})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never started")
	}
	if err := first.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	select {
	case <-returned:
		t.Fatal("the handler returned before Run did, though it ignores its context")
	default:
	}
	if got := b.get(t, job.ID); got.State != db.JobStateAvailable || got.Attempt != 0 {
		t.Fatalf("after Run returned: %s at attempt %d; want available, its attempt given back", got.State, got.Attempt)
	}

	b.startWorker(t, worker.Config{Slots: 1}, func(w *worker.Worker) {
		w.HandleFunc("stubborn", func(ctx context.Context, j *worker.Job) (any, error) { return "second", nil })
	})
	b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	select {
	case <-returned:
		t.Fatal("the first handler returned before the job ran again")
	default:
	}
	close(unblock)
	<-returned
	time.Sleep(200 * time.Millisecond)
	if got := b.get(t, job.ID); got.State != db.JobStateSucceeded || string(got.Result) != `"second"` || got.Attempt != 1 {
		t.Errorf("after the first handler returned: %s at attempt %d with %s; want succeeded at attempt 1 with the second run's result",
			got.State, got.Attempt, got.Result)
	}
}

func TestWorker_ShutdownReleasesARunningJobThoughItsHeartbeatIntervalIsAMillisecond(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stubborn := b.enqueue(t, "stubborn", `{}`, 1)
	started := make(chan struct{})
	acks := make(chan worker.Ack, 1)
	_, stop := b.startWorker(t, worker.Config{
		Slots: 1, HeartbeatInterval: time.Millisecond, ShutdownGrace: -1,
		OnAck: func(a worker.Ack) { acks <- a },
	}, func(w *worker.Worker) {
		w.HandleFunc("stubborn", func(ctx context.Context, j *worker.Job) (any, error) {
			close(started)
			<-ctx.Done()
			return nil, ctx.Err()
		})
	})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never started")
	}
	stop()
	if a := <-acks; a.Outcome != worker.OutcomeReleased || !a.Accepted {
		t.Errorf("reported %s, accepted %v; want released, accepted", a.Outcome, a.Accepted)
	}
	got := b.get(t, stubborn.ID)
	if got.State != db.JobStateAvailable || got.Attempt != 0 {
		t.Errorf("job after shutdown: state %s attempt %d; want available with its attempt given back", got.State, got.Attempt)
	}
}

func TestWorker_ShutdownWaitsForHandlersWithinGrace(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "finishing", `{}`, 1)
	started := make(chan struct{})
	_, stop := b.startWorker(t, worker.Config{Slots: 1, ShutdownGrace: 5 * time.Second}, func(w *worker.Worker) {
		w.HandleFunc("finishing", func(ctx context.Context, j *worker.Job) (any, error) {
			close(started)
			time.Sleep(300 * time.Millisecond) // ignores ctx: it is not cancelled during grace
			return "done", ctx.Err()
		})
	})
	<-started
	stop()
	if got := b.get(t, job.ID); got.State != db.JobStateSucceeded {
		t.Errorf("state %s after graceful shutdown, want succeeded", got.State)
	}
}

// logSignal is a log's writer that closes seen at the first line holding
// want.
type logSignal struct {
	want string
	seen chan struct{}
	once sync.Once
}

func (l *logSignal) Write(p []byte) (int, error) {
	if strings.Contains(string(p), l.want) {
		l.once.Do(func() { close(l.seen) })
	}
	return len(p), nil
}

func TestWorker_NewJobWakesIdleWorkerWithoutPolling(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := make(chan time.Time, 1)
	b.startWorker(t, worker.Config{Slots: 1, PollInterval: time.Hour}, func(w *worker.Worker) {
		w.HandleFunc("ping", func(ctx context.Context, j *worker.Job) (any, error) {
			done <- time.Now()
			return nil, nil
		})
	})
	// Let the worker register, claim nothing, and go idle.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var n int
		if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM workers").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n == 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	enqueued := time.Now()
	b.enqueue(t, "ping", `{}`, 1)
	select {
	case at := <-done:
		if wait := at.Sub(enqueued); wait > 5*time.Second {
			t.Errorf("worker took %s to notice a new job", wait)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("an idle worker with an hour-long poll never ran a new job: notifications do not wake it")
	}
}

func TestNew_RejectsInvalidConfigWithTheErrorValidateReturns(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name      string
		cfg       worker.Config
		wantInErr string
	}{
		{"negative slots", worker.Config{Slots: -1}, "slots must be from 1 to 10000 (MaxSlots), got -1"},
		{"slots beyond MaxSlots", worker.Config{Slots: worker.MaxSlots + 1}, "slots must be from 1 to 10000 (MaxSlots), got 10001"},
		{"slots that would overflow Slots+Prefetch", worker.Config{Slots: math.MaxInt, Prefetch: 1}, "slots must be from 1 to 10000"},
		{"prefetch beyond MaxPrefetch", worker.Config{Prefetch: worker.MaxPrefetch + 1}, "prefetch must be at most 10000 (MaxPrefetch), got 10001"},
		{"prefetch that would overflow Slots+Prefetch", worker.Config{Prefetch: math.MaxInt}, "prefetch must be at most 10000"},
		{"session database URL that does not parse", worker.Config{SessionDatabaseURL: "postgres://h:notaport/db"}, "invalid session database URL"},
		{"tiny lease", worker.Config{Lease: time.Millisecond}, "lease must be at least 100ms"},
		{"heartbeat not shorter than lease", worker.Config{Lease: time.Second, HeartbeatInterval: time.Second}, "heartbeat interval"},
		{"long queue name", worker.Config{Queue: strings.Repeat("q", 129)}, "queue name longer than 128 bytes"},
		{"queue name not UTF-8", worker.Config{Queue: "q\xff"}, `queue name "q\xff" must be valid UTF-8 without NUL`},
		{"queue name with NUL", worker.Config{Queue: "q\x00"}, `queue name "q\x00" must be valid UTF-8 without NUL`},
		{"id not UTF-8", worker.Config{ID: "w\xff"}, `id "w\xff" must be valid UTF-8 without NUL`},
		{"id with NUL", worker.Config{ID: "w\x00"}, `id "w\x00" must be valid UTF-8 without NUL`},
		{"negative prefetch wait", worker.Config{PrefetchWait: -time.Millisecond}, "prefetch wait"},
		{"prefetch wait not shorter than lease", worker.Config{Lease: time.Second, PrefetchWait: time.Second}, "prefetch wait"},
		// A plain number is nanoseconds: meant as seconds, it would make
		// an idle worker send thousands of statements a second.
		{"poll interval of a nanosecond", worker.Config{PollInterval: 1}, "poll interval 1ns is shorter than 1ms (MinInterval)"},
		{"reclaim interval of 5ns", worker.Config{ReclaimInterval: 5}, "reclaim interval 5ns is shorter than 1ms (MinInterval)"},
		{"prune interval under a millisecond", worker.Config{PruneInterval: time.Millisecond - 1}, "prune interval 999.999µs is shorter than 1ms (MinInterval)"},
		{"heartbeat interval of 10ns", worker.Config{HeartbeatInterval: 10}, "heartbeat interval 10ns is shorter than 1ms (MinInterval)"},
		{"negative poll interval", worker.Config{PollInterval: -time.Second}, "poll interval -1s is shorter than 1ms (MinInterval)"},
	} {
		t.Run(tc.name, func(t *testing.T) { wantRefused(t, b, tc.cfg, tc.wantInErr) })
	}
	t.Run("queue listeners beyond an int32", func(t *testing.T) {
		if strconv.IntSize == 32 {
			t.Skip("an int of 32 bits holds no more than an int32")
		}
		// Not a constant, so that this compiles where an int has 32 bits.
		beyondInt32 := int64(math.MaxInt32) + 1
		wantRefused(t, b, worker.Config{QueueListeners: int(beyondInt32)},
			"queue listeners must be at most 2147483647 (MaxQueueListeners), got 2147483648")
	})
}

// wantRefused fails the test unless New refuses cfg with an error that
// holds wantInErr, and Validate returns the same error.
func wantRefused(t *testing.T, b *bundle, cfg worker.Config, wantInErr string) {
	t.Helper()
	_, err := worker.New(b.pool, cfg)
	if err == nil || !strings.Contains(err.Error(), wantInErr) {
		t.Fatalf("New: %v, want an error containing %q", err, wantInErr)
	}
	if verr := cfg.Validate(); verr == nil || verr.Error() != err.Error() {
		t.Errorf("Validate: %v, want New's error %q", verr, err)
	}
}

// TestNew_RefusesAPoolWhoseExecModeCannotRunItsStatements: of pgx's
// default_query_exec_mode values, exec and simple_protocol send a jsonb
// document as bytea, which the server refuses: a worker on such a pool is
// refused at once, with what to use instead, and the modes that learn
// their arguments' types from the server are accepted.
func TestNew_RefusesAPoolWhoseExecModeCannotRunItsStatements(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(setup(t).url)
	if err != nil {
		t.Fatal(err)
	}
	for mode, want := range map[pgx.QueryExecMode]string{
		pgx.QueryExecModeExec:           "worker: the pool's default_query_exec_mode=exec cannot run Relay's statements",
		pgx.QueryExecModeSimpleProtocol: "worker: the pool's default_query_exec_mode=simple_protocol cannot run Relay's statements",
		pgx.QueryExecModeCacheStatement: "",
		pgx.QueryExecModeCacheDescribe:  "",
		pgx.QueryExecModeDescribeExec:   "",
	} {
		modal := cfg.Copy()
		modal.ConnConfig.DefaultQueryExecMode = mode
		pool, err := pgxpool.NewWithConfig(context.Background(), modal)
		if err != nil {
			t.Fatal(err)
		}
		_, err = worker.New(pool, worker.Config{})
		pool.Close()
		switch {
		case want == "" && err != nil:
			t.Errorf("%s: %v, want a worker", mode, err)
		case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
			t.Errorf("%s: error %v, want one containing %q", mode, err, want)
		}
	}
}

func TestNew_AcceptsTheUpperBoundsOfSlotsPrefetchAndQueueListeners(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := worker.Config{Slots: worker.MaxSlots, Prefetch: worker.MaxPrefetch, QueueListeners: worker.MaxQueueListeners}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if _, err := worker.New(b.pool, cfg); err != nil {
		t.Errorf("New: %v", err)
	}
}

// TestNew_AcceptsTheShortestLeaseWithEveryOtherFieldDefault: every field
// left zero takes a default that fits the lease given, down to the
// shortest New accepts.
func TestNew_AcceptsTheShortestLeaseWithEveryOtherFieldDefault(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, lease := range []time.Duration{100 * time.Millisecond, 150 * time.Millisecond, 200 * time.Millisecond} {
		cfg := worker.Config{Lease: lease}
		if err := cfg.Validate(); err != nil {
			t.Errorf("lease %s: Validate: %v", lease, err)
		}
		w, err := worker.New(b.pool, cfg)
		if err != nil {
			t.Errorf("lease %s: New: %v", lease, err)
			continue
		}
		if got := w.Config(); got.PrefetchWait <= 0 || got.PrefetchWait >= lease || got.PrefetchWait > worker.DefaultPrefetchWait {
			t.Errorf("lease %s: prefetch wait %s, want positive, shorter than the lease and at most %s", lease, got.PrefetchWait, worker.DefaultPrefetchWait)
		}
	}
}

// TestNew_AcceptsNamesWithControlCharacters: enqueueing refuses control
// characters in a queue's name, but jobs stored before it did may have
// them, and a worker must still be able to drain their queue.
func TestNew_AcceptsNamesWithControlCharacters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := worker.Config{Queue: "old\tqueue\u0085", ID: "worker\x1b[0m"}
	if err := cfg.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if _, err := worker.New(b.pool, cfg); err != nil {
		t.Errorf("New: %v", err)
	}
}

func TestExponentialBackoff_GrowsAndStaysWithinCap(t *testing.T) {
	t.Parallel()
	backoff := worker.ExponentialBackoff(time.Second, 10*time.Second)
	for _, tc := range []struct {
		attempt  int
		min, max time.Duration
	}{
		{1, 500 * time.Millisecond, time.Second},
		{2, time.Second, 2 * time.Second},
		{3, 2 * time.Second, 4 * time.Second},
		{10, 5 * time.Second, 10 * time.Second},
		{1000, 5 * time.Second, 10 * time.Second},
	} {
		for range 100 {
			if d := backoff(tc.attempt); d < tc.min || d > tc.max {
				t.Fatalf("backoff(%d) = %s, want within [%s, %s]", tc.attempt, d, tc.min, tc.max)
			}
		}
	}
}

func TestExponentialBackoff_NeverExceedsItsCapNorGoesNegative(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		base, cap time.Duration
	}{
		{"default", worker.DefaultBackoffBase, worker.DefaultBackoffMax},
		{"cap of math.MaxInt64", time.Second, math.MaxInt64},
		{"odd base, cap of math.MaxInt64", 3 * time.Nanosecond, math.MaxInt64},
		{"cap just past a doubling of the base", time.Second, 1<<62 + 1},
		{"cap of half math.MaxInt64", time.Millisecond, math.MaxInt64 / 2},
		{"base beyond the cap", time.Hour, time.Second},
		{"base of math.MaxInt64", math.MaxInt64, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backoff := worker.ExponentialBackoff(tc.base, tc.cap)
			for attempt := 1; attempt <= 100; attempt++ {
				// Equal jitter: between half the capped delay and all of it.
				want := min(float64(tc.base)*math.Pow(2, float64(attempt-1)), float64(tc.cap))
				for range 10 {
					d := backoff(attempt)
					if d <= 0 || d > tc.cap || float64(d) < want/2-1 {
						t.Fatalf("backoff(%d) = %d, want within [%.0f, %d]", attempt, d, want/2, tc.cap)
					}
				}
			}
		})
	}
}

func TestWorker_AnAttemptOutlivingItsLostLeaseLeavesTheNextAttemptsLeaseAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "stubborn", `{}`, 5)
	started := make(chan int, 2)
	release := map[int]chan struct{}{1: make(chan struct{}), 2: make(chan struct{})}
	lostAck := make(chan struct{})
	b.startWorker(t, worker.Config{
		Slots: 2, Lease: time.Second, HeartbeatInterval: 100 * time.Millisecond, ReclaimInterval: 50 * time.Millisecond,
		OnAck: func(a worker.Ack) {
			if a.Job.Attempt == 1 && a.Outcome == worker.OutcomeLeaseLost {
				close(lostAck)
			}
		},
	}, func(w *worker.Worker) {
		w.HandleFunc("stubborn", func(ctx context.Context, j *worker.Job) (any, error) {
			started <- j.Attempt
			// Attempt 1 ignores its cancellation and runs on after its
			// lease is lost, while the same worker runs attempt 2.
			<-release[j.Attempt]
			return fmt.Sprintf("attempt %d", j.Attempt), nil
		})
	})
	if a := <-started; a != 1 {
		t.Fatalf("first run is attempt %d, want 1", a)
	}
	if _, err := b.pool.Exec(b.ctx, "UPDATE jobs SET lease_expires_at = now() WHERE id = $1", job.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-started:
		if a != 2 {
			t.Fatalf("second run is attempt %d, want 2", a)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the job was never run again")
	}

	// Attempt 1 ends; its outcome is dropped. Attempt 2's lease must still
	// be renewed.
	close(release[1])
	select {
	case <-lostAck:
	case <-time.After(10 * time.Second):
		t.Fatal("attempt 1's outcome was never dropped")
	}
	before := deref(b.get(t, job.ID).LeaseExpiresAt)
	b.waitFor(t, job.ID, 3*time.Second, "attempt 2's lease renewed", func(j db.Job) bool {
		return j.Attempt == 2 && j.LeaseExpiresAt != nil && j.LeaseExpiresAt.After(before)
	})

	close(release[2])
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	if got.Attempt != 2 || string(got.Result) != `"attempt 2"` {
		t.Errorf("job ended on attempt %d with %s, want attempt 2's result", got.Attempt, got.Result)
	}
}

// TestWorker_ShutdownReportsALostAttemptWhoseHandlerStillRuns loses the
// lease of a job whose handler, cancelled then, runs on past the worker's
// shutdown. The attempt lost is reported once, before Run returns, as lost
// and not accepted: whether it is still the worker's last claim of the
// job, or the worker claimed the job again beside it and ran its next
// attempt to the end.
func TestWorker_ShutdownReportsALostAttemptWhoseHandlerStillRuns(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// slots: with two, the worker claims the job again beside the
		// attempt lost; with one, it has no slot to claim it with.
		slots    int
		reported []string
	}{
		{"its last claim of the job", 1, []string{"attempt 1 lease_lost accepted=false"}},
		{"claimed again and run to the end", 2, []string{"attempt 2 completed accepted=true", "attempt 1 lease_lost accepted=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			job := b.enqueue(t, "stubborn", `{}`, 5)
			// Attempt 1 runs on past Run's return.
			h := newHolder()
			h.ignoring = make(chan struct{})
			t.Cleanup(func() { close(h.ignoring) })
			acks := make(chan worker.Ack, 10)
			_, run := b.runWorker(t, b.pool, worker.Config{
				Slots: tc.slots, Lease: time.Second, HeartbeatInterval: 100 * time.Millisecond,
				ReclaimInterval: 50 * time.Millisecond, ShutdownGrace: 200 * time.Millisecond,
				OnAck: func(a worker.Ack) { acks <- a },
			}, func(w *worker.Worker) { w.Handle("stubborn", h) })
			<-h.started
			if _, err := b.pool.Exec(b.ctx, "UPDATE jobs SET lease_expires_at = now() WHERE id = $1", job.ID); err != nil {
				t.Fatal(err)
			}
			h.waitLeaseLost(t)
			if tc.slots > 1 {
				if got := b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second); got.Attempt != 2 {
					t.Fatalf("the job succeeded at attempt %d, want 2", got.Attempt)
				}
			}
			if err := run.stop(); err != nil {
				t.Fatal(err)
			}
			// Run has returned: every acknowledgement is reported.
			close(acks)
			var reported []string
			for a := range acks {
				reported = append(reported, fmt.Sprintf("attempt %d %s accepted=%t", a.Job.Attempt, a.Outcome, a.Accepted))
			}
			if !slices.Equal(reported, tc.reported) {
				t.Errorf("reported %q, want %q", reported, tc.reported)
			}
		})
	}
}

// TestWorker_HandleRefusesANilHandler: a nil handler would panic at every
// job of its kind, each panic a failed attempt retried with backoff until
// the job died; Handle and HandleFunc refuse it where it is registered.
func TestWorker_RunsOnceAndASecondRunReturnsAnErrorAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, run := b.runWorker(t, b.pool, worker.Config{}, func(*worker.Worker) {})
	// The first Run runs once its session is live.
	waitLive(t, b, 1, 10*time.Second)
	second := make(chan error, 1)
	go func() { second <- w.Run(b.ctx) }()
	select {
	case err := <-second:
		if err == nil || !strings.Contains(err.Error(), "Run called more than once") {
			t.Errorf("second Run returned %v, want an error saying it was called more than once", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("second Run did not return")
	}
	if err := run.stop(); err != nil {
		t.Errorf("first Run returned %v", err)
	}
	if err := w.Run(b.ctx); err == nil {
		t.Error("Run after the first returned nil, want an error")
	}
}

func TestWorker_HandleRefusesANilHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, tc := range []struct {
		name     string
		register func(*worker.Worker)
	}{
		{"Handle", func(w *worker.Worker) { w.Handle("nil", nil) }},
		{"HandleFunc", func(w *worker.Worker) { w.HandleFunc("nil", nil) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := worker.New(b.pool, worker.Config{Logger: testLogger(t)})
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			defer func() {
				r := recover()
				if r == nil || !strings.Contains(r.(string), `nil handler for kind "nil"`) {
					t.Errorf("%s with a nil handler: recovered %v, want a panic naming the kind", tc.name, r)
				}
			}()
			tc.register(w)
		})
	}
}

// nilPointerError is an error whose Error method reads its receiver, so
// that a nil *nilPointerError in an error panics when asked its message.
type nilPointerError struct{ msg string }

func (e *nilPointerError) Error() string { return e.msg }

// TestWorker_AnErrorWhoseMessagePanicsFailsItsAttemptAndTheWorkerCarriesOn:
// a handler that returns a nil pointer of its error type as a non-nil
// error (the usual way to get one by mistake) has failed its attempt; the
// panic of asking that error its message must not stop the worker.
func TestWorker_AnErrorWhoseMessagePanicsFailsItsAttemptAndTheWorkerCarriesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	bad := b.enqueue(t, "typed-nil", `{}`, 1)
	fine := b.enqueue(t, "fine", `{}`, 1)
	b.startWorker(t, worker.Config{Slots: 1}, func(w *worker.Worker) {
		w.HandleFunc("typed-nil", func(ctx context.Context, j *worker.Job) (any, error) {
			var err *nilPointerError
			return nil, err
		})
		w.HandleFunc("fine", func(ctx context.Context, j *worker.Job) (any, error) { return "ok", nil })
	})
	got := b.waitForState(t, bad.ID, db.JobStateDead, 10*time.Second)
	if !strings.Contains(deref(got.LastError), "whose methods panicked when asked its message") {
		t.Errorf("last error %q, want one saying the error's methods panicked", deref(got.LastError))
	}
	b.waitForState(t, fine.ID, db.JobStateSucceeded, 10*time.Second)
}

// TestWorker_BackoffIsAskedOnlyForAttemptsARetryFollows: Config.Backoff
// says how long to wait before a retry; a job's last attempt, and a
// permanent failure, have none, and a backoff written for the retries
// alone (a table of the waits between attempts) must not be asked.
func TestWorker_BackoffIsAskedOnlyForAttemptsARetryFollows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flaky := b.enqueue(t, "flaky", `{}`, 3)
	permanent := b.enqueue(t, "permanent", `{}`, 3)
	waits := []time.Duration{10 * time.Millisecond, 20 * time.Millisecond} // before attempts 2 and 3
	var asked sync.Map
	b.startWorker(t, worker.Config{Slots: 1, Backoff: func(attempt int) time.Duration {
		asked.Store(attempt, true)
		return waits[attempt-1]
	}}, func(w *worker.Worker) {
		w.HandleFunc("flaky", func(ctx context.Context, j *worker.Job) (any, error) { return nil, errors.New("still broken") })
		w.HandleFunc("permanent", func(ctx context.Context, j *worker.Job) (any, error) {
			return nil, worker.Permanent(errors.New("never"))
		})
	})
	if got := b.waitForState(t, flaky.ID, db.JobStateDead, 15*time.Second); got.Attempt != 3 {
		t.Errorf("flaky job dead at attempt %d, want 3", got.Attempt)
	}
	b.waitForState(t, permanent.ID, db.JobStateDead, 15*time.Second)
	if _, ok := asked.Load(3); ok {
		t.Error("Backoff asked for attempt 3, the job's last")
	}
}

// TestWorker_BackoffIsNotAskedForAnAttemptOfACancelledJob: a job cancelled
// while its handler runs ends cancelled whatever its attempts left, so no
// retry follows its attempt, and Backoff is not asked of it.
func TestWorker_BackoffIsNotAskedForAnAttemptOfACancelledJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "long", `{}`, 5)
	started := make(chan struct{})
	var asked atomic.Int32
	b.startWorker(t, worker.Config{
		Slots: 1, Lease: time.Second, HeartbeatInterval: 100 * time.Millisecond,
		Backoff: func(int) time.Duration { asked.Add(1); return time.Millisecond },
	}, func(w *worker.Worker) {
		w.HandleFunc("long", func(ctx context.Context, j *worker.Job) (any, error) {
			close(started)
			<-ctx.Done()
			return nil, context.Cause(ctx)
		})
	})
	b.cancelOnceStarted(t, started, job.ID)
	if got := b.waitForState(t, job.ID, db.JobStateCancelled, 10*time.Second); got.Attempt != 1 {
		t.Errorf("cancelled job ran %d attempts, want 1", got.Attempt)
	}
	if n := asked.Load(); n != 0 {
		t.Errorf("Backoff asked %d times for the attempt of a cancelled job, which no retry follows", n)
	}
}

// TestWorker_ANegativeBackoffRetriesAtOnceWithoutJumpingTheQueue: a
// Backoff that returns less than nothing (a deadline already passed, say)
// retries the job at once, as a zero does, and never dates its run_at
// before the failure: a run_at in the past would put the retry ahead of
// jobs that have waited longer, and make the queue's oldest ready job
// look that much older.
func TestWorker_ANegativeBackoffRetriesAtOnceWithoutJumpingTheQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	flaky := b.enqueue(t, "flaky", `{}`, 2)
	b.startWorker(t, worker.Config{Slots: 1, Backoff: func(int) time.Duration { return -time.Hour }}, func(w *worker.Worker) {
		w.HandleFunc("flaky", func(ctx context.Context, j *worker.Job) (any, error) {
			if j.Attempt == 1 {
				return nil, errors.New("first attempt fails")
			}
			return "ok", nil
		})
	})
	b.waitForState(t, flaky.ID, db.JobStateSucceeded, 10*time.Second)
	// The claim and the completion leave run_at as the failure set it.
	var runAt, failedAt time.Time
	if err := b.pool.QueryRow(b.ctx, `SELECT run_at, (errors->0->>'at')::timestamptz FROM jobs WHERE id = $1`,
		flaky.ID).Scan(&runAt, &failedAt); err != nil {
		t.Fatal(err)
	}
	if runAt.Before(failedAt) {
		t.Errorf("retry's run_at %s is %s before the failure at %s", runAt, failedAt.Sub(runAt), failedAt)
	}
}

// TestWorker_BackoffIsAskedOneCallAtATime: a worker of many slots with
// failures to record sends a second round beside the first, and each asks
// Backoff of its failures; a Backoff with state of its own, as a
// *rand.Rand, needs no lock.
func TestWorker_BackoffIsAskedOneCallAtATime(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const jobs = 300
	for range jobs {
		b.enqueue(t, "fails", `{}`, 2)
	}
	var calls, in, most atomic.Int32
	b.startWorker(t, worker.Config{Slots: 100, Backoff: func(int) time.Duration {
		n := in.Add(1)
		defer in.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		calls.Add(1)
		return time.Hour
	}}, func(w *worker.Worker) {
		w.HandleFunc("fails", func(ctx context.Context, j *worker.Job) (any, error) {
			time.Sleep(time.Millisecond)
			return nil, errors.New("fails")
		})
	})
	for deadline := time.Now().Add(30 * time.Second); calls.Load() < jobs; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("Backoff asked %d times in 30s, want %d", calls.Load(), jobs)
		}
	}
	if n := most.Load(); n != 1 {
		t.Errorf("Backoff was asked by %d goroutines at once", n)
	}
}

// TestWorker_ACallbackThatPanicsOrEndsItsGoroutineIsLoggedAndTheWorkerGoesOn:
// a Backoff or an OnAck that panics, or calls runtime.Goexit as t.FailNow
// does in a test, is a bug in the application's callback, not in the job:
// it is logged, the failure is recorded with DefaultBackoff's wait, and
// the worker, which holds other jobs' leases, goes on recording, claiming
// and renewing, and stops when told.
func TestWorker_ACallbackThatPanicsOrEndsItsGoroutineIsLoggedAndTheWorkerGoesOn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name               string
		backoff            func(int) time.Duration
		onAck              func(worker.Ack)
		backoffLog, ackLog []string
	}{
		{
			name:       "panics",
			backoff:    func(int) time.Duration { panic("boom in Backoff") },
			onAck:      func(worker.Ack) { panic("boom in OnAck") },
			backoffLog: []string{"Backoff panicked", "boom in Backoff"},
			ackLog:     []string{"OnAck panicked", "boom in OnAck"},
		},
		{
			name:       "ends its goroutine",
			backoff:    func(int) time.Duration { runtime.Goexit(); return 0 },
			onAck:      func(worker.Ack) { runtime.Goexit() },
			backoffLog: []string{"Backoff exited its goroutine"},
			ackLog:     []string{"OnAck exited its goroutine"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var logs syncBuffer
			flaky := b.enqueue(t, "flaky", `{}`, 2)
			_, stop := b.startWorker(t, worker.Config{
				Slots: 1, Logger: logs.logger(), Backoff: tc.backoff, OnAck: tc.onAck,
			}, func(w *worker.Worker) {
				w.HandleFunc("flaky", func(ctx context.Context, j *worker.Job) (any, error) {
					if j.Attempt == 1 {
						return nil, errors.New("first attempt fails")
					}
					return "ok", nil
				})
				w.HandleFunc("fine", func(ctx context.Context, j *worker.Job) (any, error) { return "ok", nil })
			})
			got := b.waitForState(t, flaky.ID, db.JobStateSucceeded, 15*time.Second)
			if got.Attempt != 2 {
				t.Errorf("flaky succeeded at attempt %d, want 2", got.Attempt)
			}
			logs.waitForLog(t, 5*time.Second, tc.backoffLog...)
			logs.waitForLog(t, 5*time.Second, tc.ackLog...)
			fine := b.enqueue(t, "fine", `{}`, 1)
			b.waitForState(t, fine.ID, db.JobStateSucceeded, 10*time.Second)
			stop()
		})
	}
}

// TestNew_TheDefaultIDFitsHoweverLongTheHostName: a Config without an id
// is usable on a host whose name is as long as a system allows (255
// bytes), or is not valid text: the id made for it stays within 128 bytes
// of UTF-8. Not parallel: it replaces the host's name for the package.
func TestNew_TheDefaultIDFitsHoweverLongTheHostName(t *testing.T) {
	b := setup(t)
	for _, host := range []string{strings.Repeat("h", 255), strings.Repeat("é", 127) + "x", "host\xff\x00name"} {
		worker.SetHostname(t, host)
		if err := (worker.Config{}).Validate(); err != nil {
			t.Errorf("host %q: Validate: %v", host, err)
		}
		w, err := worker.New(b.pool, worker.Config{})
		if err != nil {
			t.Errorf("host %q: New: %v", host, err)
			continue
		}
		if id := w.ID(); len(id) > 128 || !utf8.ValidString(id) || strings.ContainsRune(id, 0) {
			t.Errorf("host %q: default id %q, %d bytes", host, id, len(id))
		}
	}
}
