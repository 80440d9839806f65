package worker_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/worker"
)

func TestClaim_FromCursorsTakesWhatLiesAheadOfThemInPriorityOrder(t *testing.T) {
	t.Parallel()
	base := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	at := func(s int) time.Time { return base.Add(time.Duration(s) * time.Second) }
	// The jobs of every case: (priority, run_at in seconds after base).
	type job struct {
		priority int16
		at       int
	}
	jobs := []job{
		{-32768, 0}, {-1, 0}, {0, 0}, {0, 10}, {0, 20}, {1, 0}, {1, 10}, {32767, 0}, {32767, 10},
	}
	for _, tc := range []struct {
		name       string
		priorities []int16
		since      []time.Time
		want       []job // in the order claimed, one at a time
	}{
		{name: "no cursor takes everything from the head",
			want: jobs},
		{name: "a cursor skips its priority's jobs behind it, and only those",
			priorities: []int16{0}, since: []time.Time{at(10)},
			want: []job{{-32768, 0}, {-1, 0}, {0, 10}, {0, 20}, {1, 0}, {1, 10}, {32767, 0}, {32767, 10}}},
		{name: "a job at the cursor's run_at is taken",
			priorities: []int16{1}, since: []time.Time{at(10)},
			want: []job{{-32768, 0}, {-1, 0}, {0, 0}, {0, 10}, {0, 20}, {1, 10}, {32767, 0}, {32767, 10}}},
		{name: "cursors at the ends of the range of priorities",
			priorities: []int16{-32768, 32767}, since: []time.Time{at(5), at(5)},
			want: []job{{-1, 0}, {0, 0}, {0, 10}, {0, 20}, {1, 0}, {1, 10}, {32767, 10}}},
		{name: "cursors past everything of their priorities leave the others in order",
			priorities: []int16{-1, 1}, since: []time.Time{at(60), at(60)},
			want: []job{{-32768, 0}, {0, 0}, {0, 10}, {0, 20}, {32767, 0}, {32767, 10}}},
		{name: "a priority given twice starts at the earlier cursor",
			priorities: []int16{0, 0}, since: []time.Time{at(20), at(10)},
			want: []job{{-32768, 0}, {-1, 0}, {0, 10}, {0, 20}, {1, 0}, {1, 10}, {32767, 0}, {32767, 10}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ids := make(map[int64]job)
			for _, j := range jobs {
				runAt := at(j.at)
				row, err := b.q.JobInsert(b.ctx, db.JobInsertParams{
					Queue: "default", Kind: "noop", Payload: json.RawMessage(`{}`), Priority: j.priority, MaxAttempts: 1, RunAt: &runAt,
				})
				if err != nil {
					t.Fatal(err)
				}
				ids[row.ID] = j
			}
			var got []job
			for range len(jobs) + 1 {
				rows, err := b.q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
					CursorPriorities: tc.priorities, CursorSince: tc.since,
					Queue: "default", ClaimTokens: leaseTokens(1), LeaseMs: time.Minute.Milliseconds(), WorkerID: "w",
				})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range rows {
					if r.ID != nil {
						got = append(got, ids[*r.ID])
					}
				}
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(job{})); diff != "" {
				t.Errorf("claimed (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWorker_FindsAJobThatBecameReadyBehindItsCursor: a job inserted with
// a run_at behind the cursor a worker's claims start from, as by a
// transaction that began long before it committed, is run, by a worker
// that polls often and by one that polls once an hour. The job is
// announced as it is inserted, and the claim that announcement causes,
// made from the cursors less than a second after the claim from the head,
// steps over it: the worker must still look from the head once that is
// due, a second after the last, as every worker does, and not wait for
// its next poll.
func TestWorker_FindsAJobThatBecameReadyBehindItsCursor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		poll time.Duration // 0: the tests' 50 ms
	}{
		{"polling often", 0},
		{"polling once an hour", time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// Claimed from the head as the worker starts, which moves its
			// cursor there.
			first := b.enqueue(t, "noop", `{}`, 1)
			done := make(chan int64, 8)
			b.startWorker(t, worker.Config{Slots: 2, PollInterval: tc.poll}, func(w *worker.Worker) {
				w.HandleFunc("noop", func(ctx context.Context, j *worker.Job) (any, error) {
					done <- j.ID
					return nil, nil
				})
			})
			waitDone(t, done, first.ID)
			// A job of the same priority whose run_at is an hour behind.
			past := time.Now().Add(-time.Hour)
			behind, err := b.q.JobInsert(b.ctx, db.JobInsertParams{
				Queue: "default", Kind: "noop", Payload: json.RawMessage(`{}`), MaxAttempts: 1, RunAt: &past,
			})
			if err != nil {
				t.Fatal(err)
			}
			waitDone(t, done, behind.ID)
		})
	}
}

// waitDone waits for the job id among the handled ones, for up to 10 s.
func waitDone(t *testing.T, done <-chan int64, id int64) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-done:
			if got == id {
				return
			}
		case <-timeout:
			t.Fatalf("job %d was not run within 10 s", id)
		}
	}
}

// TestNotifications_ReachTheirQueuesListenersAlone listens as a worker of
// the default queue does and checks what it hears: jobs that become
// available in its queue, on one channel; jobs that go back to available
// there (and so may wait behind its claim cursors), on another; and
// nothing of another queue. It also listens on the channels shared by all
// queues, where workers of builds before migration 00014 listen, and
// checks that nothing is sent there any more (migration 00015).
func TestNotifications_ReachTheirQueuesListenersAlone(t *testing.T) {
	t.Parallel()
	const (
		available = "available"
		returned  = "returned"
	)
	enqueueIn := func(t *testing.T, b *bundle, queue string) db.Job {
		t.Helper()
		job, err := b.q.JobInsert(b.ctx, db.JobInsertParams{Queue: queue, Kind: "noop", Payload: json.RawMessage(`{}`), MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		return job
	}
	cancelAndRetry := func(t *testing.T, b *bundle, queue string) {
		t.Helper()
		job := enqueueIn(t, b, queue)
		if got, err := b.q.JobCancel(b.ctx, job.ID); err != nil || !got.Applied {
			t.Fatalf("cancel: applied %t, %v", got.Applied, err)
		}
		if got, err := b.q.JobRetry(b.ctx, job.ID); err != nil || !got.Applied {
			t.Fatalf("retry: applied %t, %v", got.Applied, err)
		}
	}
	for _, tc := range []struct {
		name string
		do   func(t *testing.T, b *bundle)
		// heard lists what the listener hears, in order: each job's
		// enqueue is heard too.
		heard []string
	}{
		{name: "a job enqueued", heard: []string{available}, do: func(t *testing.T, b *bundle) {
			enqueueIn(t, b, "default")
		}},
		{name: "a job enqueued in another queue", heard: nil, do: func(t *testing.T, b *bundle) {
			enqueueIn(t, b, "other")
		}},
		{name: "a job released", heard: []string{available, available, returned}, do: func(t *testing.T, b *bundle) {
			b.enqueue(t, "noop", `{}`, 3)
			id, token := b.claimOne(t, "w", time.Minute)
			if _, err := b.q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{IDs: []int64{id}, Tokens: []pgtype.UUID{token}}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a job taken back", heard: []string{available, available, returned}, do: func(t *testing.T, b *bundle) {
			job := b.enqueue(t, "noop", `{}`, 3)
			b.claimOne(t, "w", 50*time.Millisecond)
			b.waitForLeaseExpiry(t, job.ID)
			if rows := b.reclaim(t, db.JobReclaimParams{MaxJobs: 10}); len(rows) != 1 {
				t.Fatalf("reclaim took %+v, want 1 job", rows)
			}
		}},
		{name: "a job retried", heard: []string{available, available, returned}, do: func(t *testing.T, b *bundle) {
			cancelAndRetry(t, b, "default")
		}},
		{name: "a job retried in another queue", heard: nil, do: func(t *testing.T, b *bundle) {
			cancelAndRetry(t, b, "other")
		}},
		{name: "a failure retried later", heard: []string{available}, do: func(t *testing.T, b *bundle) {
			b.enqueue(t, "noop", `{}`, 3)
			id, token := b.claimOne(t, "w", time.Minute)
			if _, err := b.q.JobFailMany(b.ctx, db.JobFailManyParams{
				IDs: []int64{id}, Tokens: []pgtype.UUID{token}, Errors: []string{"boom"}, Permanent: []bool{false}, RetryInMs: []int64{60_000},
			}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			listener, err := pgx.Connect(b.ctx, b.url)
			if err != nil {
				t.Fatal(err)
			}
			defer listener.Close(context.Background())
			channels, err := db.New(listener).WorkerListen(b.ctx, "default")
			if err != nil {
				t.Fatal(err)
			}
			for _, shared := range []string{"relay_jobs_available", "relay_jobs_returned"} {
				if _, err := listener.Exec(b.ctx, "LISTEN "+shared); err != nil {
					t.Fatal(err)
				}
			}
			// What the listener would hear before tc.do is not part of it.
			tc.do(t, b)
			// Notifications are sent at commit, and each transaction of
			// tc.do has committed: what is coming is in the server's queue.
			var heard []string
			for _, n := range dbtest.Heard(t, b.ctx, listener) {
				switch {
				case n.Payload != "default":
					t.Errorf("notification %q on %s, want only the listener's queue, default", n.Payload, n.Channel)
				case n.Channel == channels.AvailableChannel:
					heard = append(heard, available)
				case n.Channel == channels.ReturnedChannel:
					heard = append(heard, returned)
				default:
					t.Errorf("notification %q on %s, want %s or %s", n.Payload, n.Channel, channels.AvailableChannel, channels.ReturnedChannel)
				}
			}
			if diff := cmp.Diff(tc.heard, heard); diff != "" {
				t.Errorf("heard (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWorker_LooksAgainForAReturnedJobItsClaimSkippedAsLocked tells a
// worker that a job came back to its queue while another transaction holds
// the job's row locked, as another worker's reclaim that found the job no
// longer abandoned does until it commits, and checks that the worker runs
// the job once the row is free, with no further notification and no poll.
func TestWorker_LooksAgainForAReturnedJobItsClaimSkippedAsLocked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "noop", `{}`, 1)
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	if _, err := tx.Exec(b.ctx, `SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE`, job.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan int64, 1)
	b.startWorker(t, worker.Config{Slots: 1, PollInterval: time.Hour}, func(w *worker.Worker) {
		w.HandleFunc("noop", func(ctx context.Context, j *worker.Job) (any, error) {
			done <- j.ID
			return nil, nil
		})
	})
	// Registered, and listening by the time its first claims, which skip
	// the locked row, are made.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		workers, err := b.q.WorkerList(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(workers) == 1 && workers[0].SessionAlive {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no live worker session after 10 s: %+v", workers)
		}
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := b.pool.Exec(b.ctx, `SELECT pg_notify(relay_queue_channel('returned', 'default'), 'default')`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := tx.Rollback(b.ctx); err != nil {
		t.Fatal(err)
	}
	waitDone(t, done, job.ID)
}

// TestWorker_DrainsABacklogBehindItsCursorAsFastAsAnyOther gives a worker
// of one slot, which claims nothing ahead, a backlog of jobs of the
// priority it has a cursor for, all with a run_at an hour behind it, as a
// batch enqueued with a run_at in the past, or jobs taken back from a dead
// worker, look. The claim from the head finds the first of them; the
// others must not wait for one claim from the head each, a second apart,
// but follow at the pace of the slot.
func TestWorker_DrainsABacklogBehindItsCursorAsFastAsAnyOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := make(chan int64, 64)
	b.startWorker(t, worker.Config{Slots: 1, Prefetch: -1}, func(w *worker.Worker) {
		w.HandleFunc("noop", func(ctx context.Context, j *worker.Job) (any, error) {
			done <- j.ID
			return nil, nil
		})
	})
	// The worker claims a job ready now, and moves its cursor there.
	first := b.enqueue(t, "noop", `{}`, 1)
	waitDone(t, done, first.ID)
	const backlog = 20
	past := time.Now().Add(-time.Hour)
	params := db.JobInsertManyParams{}
	for range backlog {
		params.Queues = append(params.Queues, "default")
		params.Kinds = append(params.Kinds, "noop")
		params.Payloads = append(params.Payloads, []byte(`{}`))
		params.Priorities = append(params.Priorities, 0)
		params.MaxAttempts = append(params.MaxAttempts, 1)
		params.RunAts = append(params.RunAts, past)
		params.DelaysMs = append(params.DelaysMs, 0)
	}
	ids, err := b.q.JobInsertMany(b.ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	// One claim from the head a second would take backlog seconds.
	deadline := time.After(backlog / 2 * time.Second)
	left := make(map[int64]bool, len(ids))
	for _, id := range ids {
		left[id] = true
	}
	for len(left) > 0 {
		select {
		case id := <-done:
			delete(left, id)
		case <-deadline:
			t.Fatalf("%d of the %d jobs behind the cursor not run within %d s", len(left), backlog, backlog/2)
		}
	}
}
