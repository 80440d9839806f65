package worker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/faultproxy"
	"github.com/relayq/relay/worker"
)

// TestWorker_ListensOnlyInOneOfTheQueuesSeats starts more workers on a
// queue than it has listener seats and checks that as many listen as there
// are seats, each holding one, that a worker of another queue has seats of
// its own, that the seat of a worker that stops passes to one that had
// none, and that with QueueListeners negative every worker listens.
func TestWorker_ListensOnlyInOneOfTheQueuesSeats(t *testing.T) {
	t.Parallel()
	noHandlers := func(*worker.Worker) {}
	start := func(t *testing.T, b *bundle, id, queue string, listeners int) (*worker.Worker, func()) {
		t.Helper()
		return b.startWorker(t, worker.Config{ID: id, Queue: queue, Slots: 1, QueueListeners: listeners, PollInterval: 100 * time.Millisecond}, noHandlers)
	}
	// settle waits until the workers given report told as want, and the
	// database holds seats listener seats, and fails after a few seconds.
	settle := func(t *testing.T, b *bundle, ws []*worker.Worker, want []bool, seats int) {
		t.Helper()
		var told []bool
		var held int
		for deadline := time.Now().Add(5 * time.Second); ; {
			told = told[:0]
			for _, w := range ws {
				told = append(told, w.Told())
			}
			if err := b.pool.QueryRow(b.ctx, `SELECT count(*) FROM pg_locks
				WHERE locktype = 'advisory' AND classid = 1380273243 AND granted
				  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&held); err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(told) == fmt.Sprint(want) && held == seats {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("workers told %v with %d seats held, want %v with %d", told, held, want, seats)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	t.Run("seats are few", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first, stopFirst := start(t, b, "first", "default", 2)
		settle(t, b, []*worker.Worker{first}, []bool{true}, 1)
		second, _ := start(t, b, "second", "default", 2)
		settle(t, b, []*worker.Worker{first, second}, []bool{true, true}, 2)
		third, _ := start(t, b, "third", "default", 2)
		other, _ := start(t, b, "other", "other", 2)
		// The third finds both seats taken, and keeps trying, taking none.
		time.Sleep(300 * time.Millisecond)
		settle(t, b, []*worker.Worker{first, second, third, other}, []bool{true, true, false, true}, 3)
		stopFirst()
		settle(t, b, []*worker.Worker{second, third, other}, []bool{true, true, true}, 3)
	})
	t.Run("every worker listens", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var ws []*worker.Worker
		for i := range 3 {
			w, _ := start(t, b, fmt.Sprint("w", i), "default", -1)
			ws = append(ws, w)
		}
		settle(t, b, ws, []bool{true, true, true}, 0)
	})
}

// TestWorker_WithoutASeatRunsWhatTheSeatedCannot fills the one seated
// worker's only slot and checks that a worker without a seat runs the next
// job, which it finds by its poll. The worker without a seat starts only
// once the seated one holds the first job: both idle, either may take it,
// the seated when told and the other when its poll comes first.
func TestWorker_WithoutASeatRunsWhatTheSeatedCannot(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	ran := make(chan string, 2)
	handle := func(id string) func(*worker.Worker) {
		return func(w *worker.Worker) {
			w.HandleFunc("hold", func(ctx context.Context, j *worker.Job) (any, error) {
				ran <- id
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil, nil
			})
		}
	}
	defer close(release)
	cfg := worker.Config{Slots: 1, QueueListeners: 1, Prefetch: -1, PollInterval: 200 * time.Millisecond}
	cfg.ID = "seated"
	seated, _ := b.startWorker(t, cfg, handle("seated"))
	waitTold(t, seated, true)
	// next waits up to 10 seconds for a job to start, and returns the
	// worker it started on.
	next := func(what string) string {
		t.Helper()
		select {
		case got := <-ran:
			return got
		case <-time.After(10 * time.Second):
			t.Fatalf("%s never ran", what)
			return ""
		}
	}
	b.enqueue(t, "hold", `{}`, 1)
	if got := next("the first job, with the seated worker alone,"); got != "seated" {
		t.Fatalf("the first job ran on %s, want the only worker", got)
	}
	cfg.ID = "unseated"
	unseated, _ := b.startWorker(t, cfg, handle("unseated"))
	time.Sleep(500 * time.Millisecond)
	if unseated.Told() {
		t.Fatal("the second worker listens, though the queue's one seat is taken")
	}
	b.enqueue(t, "hold", `{}`, 1)
	if got := next("the job the seated worker had no slot for"); got != "unseated" {
		t.Fatalf("the second job ran on %s, want the worker without a seat", got)
	}
}

// TestWorker_ClaimsUnderASessionOnlyOnceItListens cuts a worker's session
// and, while the worker registers the next, cuts that one's connection
// just after it took its listener seat: after it registered, before it
// listens. Every statement of the session is slowed, so that the worker
// polls many times meanwhile. A job enqueued then must run once, at its
// first attempt: a claim made under the session that failed would be taken
// back as soon as its connection closed, although the worker lives.
func TestWorker_ClaimsUnderASessionOnlyOnceItListens(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, through := b.proxied(t)
	w, _ := b.startWorker(t, worker.Config{Slots: 1, Lease: 10 * time.Second, SessionDatabaseURL: through}, func(w *worker.Worker) {
		// Long enough to be running when a session it was claimed under
		// fails.
		w.HandleFunc("sleep", func(ctx context.Context, j *worker.Job) (any, error) {
			select {
			case <-time.After(2 * time.Second):
			case <-ctx.Done():
			}
			return nil, ctx.Err()
		})
	})
	waitTold(t, w, true)
	proxy.Slow(300 * time.Millisecond)
	proxy.CutAfterCommit(faultproxy.CommitCut{Statement: "-- name: WorkerTakeListenerSeat", Times: 1})
	proxy.Cut()
	proxy.Heal()
	waitTold(t, w, false)
	job := b.enqueue(t, "sleep", `{}`, 5)
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 30*time.Second)
	if proxy.Armed() != 0 {
		t.Fatal("the session's connection was never cut after it took its seat")
	}
	if got.Attempt != 1 {
		t.Errorf("the job succeeded at attempt %d, want 1; its errors: %s", got.Attempt, got.Errors)
	}
}

// waitTold waits up to 10 seconds for w to be told of its queue's new jobs,
// or to stop being told, as want says.
func waitTold(t *testing.T, w *worker.Worker, want bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); w.Told() != want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker told %v after 10s, want %v", w.Told(), want)
		}
	}
}

// TestWorker_TakesAListenerSeatAtOnceHoweverManySeatsTheQueueHas starts
// two workers of a queue with as many listener seats as Config allows:
// each takes a seat, and listens, as soon as it has registered. A look for
// a free seat costs the seats it tries, not the seats the queue has. The
// lease, which bounds the statements of the session, is short, so that a
// look that costs more fails rather than run for minutes.
func TestWorker_TakesAListenerSeatAtOnceHoweverManySeatsTheQueueHas(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := worker.Config{Slots: 1, Lease: time.Second, QueueListeners: worker.MaxQueueListeners}
	for _, id := range []string{"first", "second"} {
		cfg.ID = id
		w, _ := b.startWorker(t, cfg, func(*worker.Worker) {})
		waitTold(t, w, true)
	}
}

// TestWorker_ThatLosesItsSeatPollsAtThePollIntervalAtOnce seats a worker
// in a fleet of 64 on its queue, where the seated poll every four poll
// intervals, and then ends its session while another takes its seat. The
// worker, back without a seat, learns of new jobs only by its polls, so it
// polls at the interval from then on, not once the long wait it began
// while seated has run out: a job that becomes ready with time, which no
// notification announces, starts within a poll interval.
func TestWorker_ThatLosesItsSeatPollsAtThePollIntervalAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// 63 live sessions of the queue, held by one connection.
	crowd := b.crowd(t, 63)
	const poll = 2 * time.Second
	started := make(chan int64, 1)
	begun := time.Now()
	w, _ := b.startWorker(t, worker.Config{ID: "seated", Slots: 1, QueueListeners: 1, PollInterval: poll}, func(w *worker.Worker) {
		w.HandleFunc("task", func(_ context.Context, j *worker.Job) (any, error) {
			started <- j.ID
			return nil, nil
		})
	})
	waitTold(t, w, true)
	waitFleet(t, w, 64, 64, 5*time.Second)
	// The first poll, at one interval, waits four until the next.
	time.Sleep(time.Until(begun.Add(poll + 500*time.Millisecond)))

	seated := make(chan error, 1)
	go func() {
		_, err := crowd.Exec(b.ctx, `SELECT pg_advisory_lock(1380273243, hashtext('default/0'))`)
		seated <- err
	}()
	old := b.holderOf(t, "seated").SessionKey
	if _, err := b.pool.Exec(b.ctx, `
		SELECT pg_terminate_backend(l.pid)
		FROM pg_locks AS l
		WHERE l.locktype = 'advisory' AND l.classid = 1380273241 AND l.objsubid = 2 AND l.objid::integer = $1
		  AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())`, old); err != nil {
		t.Fatal(err)
	}
	if err := <-seated; err != nil {
		t.Fatalf("take the worker's seat: %v", err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var renewed bool
		if err := b.pool.QueryRow(b.ctx, `
			SELECT EXISTS (SELECT FROM worker_sessions AS s JOIN worker_sessions_live AS l USING (session_key)
			               WHERE s.worker_id = 'seated' AND s.session_key <> $1)`, old).Scan(&renewed); err != nil {
			t.Fatal(err)
		}
		if renewed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the worker holds no new session 5s after it lost its own")
		}
	}
	if w.Told() {
		t.Fatal("the worker is told of new jobs without a seat")
	}

	runAt := time.Now().Add(500 * time.Millisecond)
	job, err := b.q.JobInsert(b.ctx, db.JobInsertParams{Queue: "default", Kind: "task", Payload: []byte(`{}`), MaxAttempts: 1, RunAt: &runAt})
	if err != nil {
		t.Fatal(err)
	}
	within := poll + poll/5 + 500*time.Millisecond
	select {
	case <-started:
	case <-time.After(time.Until(runAt.Add(within))):
		t.Fatalf("job %d, ready at %s, not started %s later: the worker without a seat did not poll at its interval",
			job.ID, runAt.Format("15:04:05.000"), within)
	}
}
