package worker_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/worker"
)

// These tests specify claiming ahead (Config.Prefetch): a worker whose jobs
// are short holds a few claimed jobs beyond its free slots, never runs more
// handlers than it has slots, and never keeps a job waiting long.

// heldWatch samples, until stop is called, how many jobs the database shows
// as running under a worker's lease, and reports the most it saw.
func (b *bundle) heldWatch(t *testing.T, workerID string) (stop func() int) {
	t.Helper()
	return b.mostWatch(t, "held jobs", "SELECT count(*) FROM jobs WHERE state = 'running' AND leased_by = $1", workerID)
}

// mostWatch runs count, a statement that counts something, every
// millisecond until stop is called, and reports the most it counted.
func (b *bundle) mostWatch(t *testing.T, what, count string, args ...any) (stop func() int) {
	t.Helper()
	var most atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			var n int64
			if err := b.pool.QueryRow(b.ctx, count, args...).Scan(&n); err != nil {
				t.Errorf("count %s: %v", what, err)
				return
			}
			if n > most.Load() {
				most.Store(n)
			}
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
		}
	})
	return func() int {
		close(done)
		wg.Wait()
		return int(most.Load())
	}
}

// concurrency counts handlers running at once and remembers the most.
type concurrency struct{ now, most atomic.Int64 }

func (c *concurrency) enter() {
	n := c.now.Add(1)
	for {
		m := c.most.Load()
		if n <= m || c.most.CompareAndSwap(m, n) {
			return
		}
	}
}

func (c *concurrency) leave() { c.now.Add(-1) }

func TestWorker_HoldsJobsAheadOnlyWhileTheyAreShortAndNeverRunsMoreThanItsSlots(t *testing.T) {
	t.Parallel()
	// The most jobs the worker held at once is between minHeld and
	// maxHeld.
	tests := []struct {
		name             string
		cfg              worker.Config
		run              time.Duration
		jobs             int
		minHeld, maxHeld int
	}{
		// A job claimed ahead of these short ones waits for a slot up to
		// 5s, not the default 100ms, so that a machine that stalls the
		// worker for longer does not have it released and claimed again.
		// (With prefetch off, none is claimed ahead.)
		{"short jobs: as many claimed ahead as asked", worker.Config{Slots: 2, Prefetch: 2, PrefetchWait: 5 * time.Second}, 3 * time.Millisecond, 80, 4, 4},
		{"short jobs, by default: more ahead than slots, up to the default's least", worker.Config{Slots: 2, PrefetchWait: 5 * time.Second}, 3 * time.Millisecond, 80, 5, 2 + worker.DefaultMinPrefetch},
		{"short jobs, prefetch off: only what runs", worker.Config{Slots: 2, Prefetch: -1}, 3 * time.Millisecond, 80, 2, 2},
		{"no more ahead than the slots start within half the prefetch wait", worker.Config{Slots: 1, Prefetch: 32, PrefetchWait: 100 * time.Millisecond}, 20 * time.Millisecond, 12, 2, 3},
		{"jobs longer than half the prefetch wait: only what runs", worker.Config{Slots: 1, PrefetchWait: 100 * time.Millisecond}, 60 * time.Millisecond, 6, 1, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var ids []int64
			for range tt.jobs {
				ids = append(ids, b.enqueue(t, "work", `{}`, 1).ID)
			}
			var c concurrency
			w, _ := b.startWorker(t, tt.cfg, func(w *worker.Worker) {
				w.HandleFunc("work", func(ctx context.Context, j *worker.Job) (any, error) {
					c.enter()
					defer c.leave()
					time.Sleep(tt.run)
					return nil, nil
				})
			})
			stop := b.heldWatch(t, w.ID())
			for _, id := range ids {
				b.waitForState(t, id, db.JobStateSucceeded, 30*time.Second)
			}
			if held := stop(); held < tt.minHeld || held > tt.maxHeld {
				t.Errorf("most jobs held at once: %d, want %d to %d", held, tt.minHeld, tt.maxHeld)
			}
			if most := c.most.Load(); most > int64(w.Config().Slots) {
				t.Errorf("%d handlers ran at once on %d slots", most, w.Config().Slots)
			}
			for _, id := range ids {
				if got := b.get(t, id); got.Attempt != 1 || got.Fence != 1 {
					t.Errorf("job %d: attempt %d fence %d, want 1 1: claimed ahead is claimed once", id, got.Attempt, got.Fence)
				}
			}
		})
	}
}

// queueBehindBlocker enqueues short jobs that switch claiming ahead on, then
// a job of kind "block", then one of kind "next", which the worker claims
// ahead while "block" runs.
func (b *bundle) queueBehindBlocker(t *testing.T) (blocker, next db.Job) {
	t.Helper()
	for range 12 {
		b.enqueue(t, "quick", `{}`, 1)
	}
	return b.enqueue(t, "block", `{}`, 1), b.enqueue(t, "next", `{}`, 1)
}

func quick(ctx context.Context, j *worker.Job) (any, error) {
	time.Sleep(time.Millisecond)
	return nil, nil
}

// waitHeldBy waits until the job is running under the given worker's lease.
func (b *bundle) waitHeldBy(t *testing.T, id int64, workerID string) {
	t.Helper()
	b.waitFor(t, id, 10*time.Second, "running under "+workerID, func(j db.Job) bool {
		return j.State == db.JobStateRunning && deref(j.LeasedBy) == workerID
	})
}

// waitForRenewal waits until a heartbeat has moved the job's lease expiry
// past since, and returns the new expiry.
func (b *bundle) waitForRenewal(t *testing.T, id int64, since time.Time) time.Time {
	t.Helper()
	job := b.waitFor(t, id, 10*time.Second, "lease renewed past "+since.String(), func(j db.Job) bool {
		return j.LeaseExpiresAt != nil && j.LeaseExpiresAt.After(since)
	})
	return *job.LeaseExpiresAt
}

func TestWorker_ReleasesAJobWaitingLongerThanPrefetchWaitSoAnIdleWorkerRunsIt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	blocker, next := b.queueBehindBlocker(t)
	release := make(chan struct{})
	blocking := make(chan struct{})
	b.startWorker(t, worker.Config{Slots: 1, PrefetchWait: 150 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("quick", quick)
		w.HandleFunc("block", func(ctx context.Context, j *worker.Job) (any, error) {
			close(blocking)
			<-release
			return nil, nil
		})
		w.HandleFunc("next", func(ctx context.Context, j *worker.Job) (any, error) {
			t.Errorf("next ran on the busy worker")
			return nil, nil
		})
	})
	defer close(release)
	<-blocking
	// The busy worker, the only one running yet, claims next ahead while
	// blocker fills its one slot. It may release next before this sees it
	// held, so wait for the claim itself, which grows next's fence.
	b.waitFor(t, next.ID, 10*time.Second, "claimed by the busy worker", func(j db.Job) bool { return j.Fence > 0 })

	// An idle worker, started now, can run next only once the busy one
	// releases it.
	ranBy := make(chan string, 1)
	idle, _ := b.startWorker(t, worker.Config{Slots: 1}, func(w *worker.Worker) {
		w.HandleFunc("next", func(ctx context.Context, j *worker.Job) (any, error) {
			ranBy <- j.WorkerID
			return nil, nil
		})
	})
	select {
	case who := <-ranBy:
		if who != idle.ID() {
			t.Errorf("next ran on %s, want the idle worker %s", who, idle.ID())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("next was never released to the idle worker")
	}
	got := b.waitForState(t, next.ID, db.JobStateSucceeded, 10*time.Second)
	if got.Attempt != 1 || got.Fence != 2 || string(got.Errors) != "[]" {
		t.Errorf("next: attempt %d fence %d errors %s; want attempt 1 (the released claim undone), fence 2, no history",
			got.Attempt, got.Fence, got.Errors)
	}
	if got := b.get(t, blocker.ID); got.State != db.JobStateRunning {
		t.Errorf("blocker is %s, want still running on the busy worker", got.State)
	}
}

func TestWorker_ShutdownReleasesJobsClaimedAheadWithoutTouchingTheirHistory(t *testing.T) {
	t.Parallel()
	b := setup(t)
	blocker, next := b.queueBehindBlocker(t)
	blocking := make(chan struct{})
	w, stop := b.startWorker(t, worker.Config{Slots: 1, ShutdownGrace: 100 * time.Millisecond, PrefetchWait: 10 * time.Second}, func(w *worker.Worker) {
		w.HandleFunc("quick", quick)
		w.HandleFunc("block", func(ctx context.Context, j *worker.Job) (any, error) {
			close(blocking)
			<-ctx.Done()
			return nil, context.Cause(ctx)
		})
		w.HandleFunc("next", func(ctx context.Context, j *worker.Job) (any, error) {
			t.Errorf("next started during shutdown")
			return nil, nil
		})
	})
	<-blocking
	b.waitHeldBy(t, next.ID, w.ID())
	stop()

	got := b.get(t, next.ID)
	if got.State != db.JobStateAvailable || got.Attempt != 0 || got.Fence != 1 || string(got.Errors) != "[]" {
		t.Errorf("next after shutdown: state %s attempt %d fence %d errors %s; want available, attempt 0, fence 1, no history",
			got.State, got.Attempt, got.Fence, got.Errors)
	}
	got = b.get(t, blocker.ID)
	if got.State != db.JobStateAvailable || got.Attempt != 0 || !strings.Contains(string(got.Errors), "released") {
		t.Errorf("blocker after shutdown: state %s attempt %d errors %s; want released", got.State, got.Attempt, got.Errors)
	}
}

func TestWorker_JobCancelledWhileWaitingForASlotEndsCancelledWithoutRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, next := b.queueBehindBlocker(t)
	release := make(chan struct{})
	blocking := make(chan struct{})
	var ran atomic.Bool
	w, _ := b.startWorker(t, worker.Config{Slots: 1, Lease: 5 * time.Second, HeartbeatInterval: 50 * time.Millisecond, PrefetchWait: 4 * time.Second}, func(w *worker.Worker) {
		w.HandleFunc("quick", quick)
		w.HandleFunc("block", func(ctx context.Context, j *worker.Job) (any, error) {
			close(blocking)
			<-release
			return nil, nil
		})
		w.HandleFunc("next", func(ctx context.Context, j *worker.Job) (any, error) {
			ran.Store(true)
			return nil, nil
		})
	})
	<-blocking
	b.waitHeldBy(t, next.ID, w.ID())
	cancelled, err := b.q.JobCancel(b.ctx, next.ID)
	if err != nil || !cancelled.Applied {
		t.Fatalf("cancel: applied %t, %v", cancelled.Applied, err)
	}
	// The worker learns of the cancel from the first heartbeat to renew the
	// lease after it. Heartbeats run one after another, so once a second
	// renewal shows, the worker has handled the first.
	renewed := b.waitForRenewal(t, next.ID, *cancelled.LeaseExpiresAt)
	b.waitForRenewal(t, next.ID, renewed)
	close(release)

	got := b.waitForState(t, next.ID, db.JobStateCancelled, 10*time.Second)
	if ran.Load() {
		t.Error("the handler of a job cancelled before it started ran")
	}
	if !strings.Contains(deref(got.LastError), worker.ErrJobCancelled.Error()) {
		t.Errorf("last error %q, want it to say the job was cancelled", deref(got.LastError))
	}
}

// TestWorker_KeepsClaimingWithALeaseAndPrefetchWaitOfWeeks: a prefetch
// wait long enough that slots·PrefetchWait/2 passes an int64 must not stop
// the worker claiming once its first handler has returned.
func TestWorker_KeepsClaimingWithALeaseAndPrefetchWaitOfWeeks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.enqueue(t, "short", `{}`, 1)
	b.startWorker(t, worker.Config{Slots: worker.MaxSlots, Lease: 31 * 24 * time.Hour, PrefetchWait: 30 * 24 * time.Hour},
		func(w *worker.Worker) {
			w.HandleFunc("short", func(ctx context.Context, j *worker.Job) (any, error) { return nil, nil })
		})
	b.waitForState(t, first.ID, db.JobStateSucceeded, 10*time.Second)
	second := b.enqueue(t, "short", `{}`, 1)
	b.waitForState(t, second.ID, db.JobStateSucceeded, 10*time.Second)
}

// TestWorker_ReleasesNoJobClaimedForAFreeSlotHoweverShortThePrefetchWait:
// a job claimed for a free slot waits only for the slot's goroutine to
// start, not for a slot: however short PrefetchWait, it is started, not
// released.
func TestWorker_ReleasesNoJobClaimedForAFreeSlotHoweverShortThePrefetchWait(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var last db.Job
	for range 100 {
		last = b.enqueue(t, "slow", `{}`, 1)
	}
	var released atomic.Int32
	b.startWorker(t, worker.Config{
		Slots: 4, PrefetchWait: time.Microsecond,
		OnAck: func(a worker.Ack) {
			if a.Outcome == worker.OutcomeReleased {
				released.Add(1)
			}
		},
	}, func(w *worker.Worker) {
		// Longer than half the wait: the worker claims nothing ahead.
		w.HandleFunc("slow", func(ctx context.Context, j *worker.Job) (any, error) {
			time.Sleep(time.Millisecond)
			return nil, nil
		})
	})
	b.waitForState(t, last.ID, db.JobStateSucceeded, 30*time.Second)
	if n := released.Load(); n > 0 {
		t.Errorf("%d jobs claimed for free slots were released before their slots started them", n)
	}
}
