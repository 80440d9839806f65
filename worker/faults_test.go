package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/faultproxy"
	"github.com/relayq/relay/internal/modelcheck"
	"github.com/relayq/relay/worker"
)

// These tests specify what a worker does when its connections fail or
// stall, and when its id is not its own, through a real TCP proxy between
// it and PostgreSQL.

// blockUntilCancelled is a handler that runs until its context ends.
func blockUntilCancelled(started chan<- int64) worker.HandlerFunc {
	return func(ctx context.Context, j *worker.Job) (any, error) {
		if started != nil {
			started <- j.ID
		}
		<-ctx.Done()
		return nil, context.Cause(ctx)
	}
}

// finishWhenTold is a handler that says on started that it runs, and
// returns "done" once finish is closed, whatever its context.
func finishWhenTold(started chan<- int64, finish <-chan struct{}) worker.HandlerFunc {
	return func(ctx context.Context, j *worker.Job) (any, error) {
		started <- j.ID
		<-finish
		return "done", nil
	}
}

// holder is a handler that runs its first job until its context ends, and
// tells when it started and why it stopped. Any later job, the same one
// claimed again included, succeeds at once.
type holder struct {
	calls   atomic.Int32
	started chan int64
	stopped chan error
	// ignoring, if not nil, keeps the first job's handler running once its
	// context has ended, until ignoring is closed: it ignores its
	// cancellation.
	ignoring chan struct{}
}

func newHolder() *holder {
	return &holder{started: make(chan int64, 1), stopped: make(chan error, 1)}
}

func (h *holder) Work(ctx context.Context, j *worker.Job) (any, error) {
	if h.calls.Add(1) > 1 {
		return "ran again", nil
	}
	h.started <- j.ID
	<-ctx.Done()
	h.stopped <- context.Cause(ctx)
	if h.ignoring != nil {
		<-h.ignoring
	}
	return nil, context.Cause(ctx)
}

// waitLeaseLost fails the test unless the handler stops, within 5s, because
// its lease was lost.
func (h *holder) waitLeaseLost(t *testing.T) {
	t.Helper()
	select {
	case cause := <-h.stopped:
		if !errors.Is(cause, worker.ErrLeaseLost) {
			t.Errorf("the handler stopped with %v, want %v", cause, worker.ErrLeaseLost)
		}
	case <-time.After(5 * time.Second):
		t.Errorf("the handler still runs 5s after its job was taken back")
	}
}

// receive waits up to 10s for c to be closed or sent on, and fails the
// test otherwise, saying what did not happen.
func receive(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not within 10s", what)
	}
}

func TestWorker_RefusesToStartUnderAnIDALiveSessionHolds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "long", `{}`, 1)
	started := make(chan int64, 1)
	first, _ := b.startWorker(t, worker.Config{ID: "pod-0", Slots: 1, ShutdownGrace: -1}, func(w *worker.Worker) {
		w.Handle("long", blockUntilCancelled(started))
	})
	<-started

	_, second := b.runWorker(t, b.pool, worker.Config{ID: first.ID(), Slots: 1}, func(w *worker.Worker) {})
	err := second.wait(t, 10*time.Second)
	var inUse *worker.IDInUseError
	host, _ := os.Hostname()
	want := `worker id "pod-0" is in use by a live session (pid ` + strconv.Itoa(os.Getpid()) + ` on host ` + host + `)`
	if !errors.As(err, &inUse) || err.Error() != want {
		t.Fatalf("second worker under the same id: Run returned %v, want %q", err, want)
	}
	if got := b.get(t, job.ID); got.State != db.JobStateRunning || got.Attempt != 1 {
		t.Errorf("the first worker's job is %s at attempt %d, want still running its first attempt", got.State, got.Attempt)
	}
}

func TestWorker_RestartedUnderTheSameIDGetsItsPredecessorsJobsBackAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "task", `{}`, 3)
	proxy, through := b.proxied(t)
	started := make(chan int64, 1)
	var attempt atomic.Int32
	handler := worker.HandlerFunc(func(ctx context.Context, j *worker.Job) (any, error) {
		if attempt.Add(1) == 1 {
			started <- j.ID
			<-ctx.Done()
			return nil, context.Cause(ctx)
		}
		return "done by the restarted process", nil
	})
	const lease = time.Minute
	b.runWorker(t, dbtest.Connect(t, through), worker.Config{ID: "pod-0", Slots: 1, Lease: lease, ShutdownGrace: -1}, func(w *worker.Worker) {
		w.Handle("task", handler)
	})
	<-started
	session := b.holderOf(t, "pod-0").SessionKey
	// The process is gone: every connection it had closes, and the server
	// sees its session end. The worker, which lives on here, may see its
	// session connection close before its pool's and release the id at
	// once: the session, not the id's row, is what ends.
	proxy.Cut()
	b.waitSessionEnded(t, session, 10*time.Second)
	b.startWorker(t, worker.Config{ID: "pod-0", Slots: 1, Lease: lease, ReclaimInterval: 50 * time.Millisecond}, func(w *worker.Worker) {
		w.Handle("task", handler)
	})
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 5*time.Second)
	if got.Attempt != 2 || !strings.Contains(string(got.Errors), "worker session ended") {
		t.Errorf("succeeded at attempt %d with history %s; want attempt 2, after a reclaim for the ended session", got.Attempt, got.Errors)
	}
}

func TestWorker_ShutdownThatCannotReleaseLeavesItsJobsToComeBackAtOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "task", `{}`, 3)
	proxy, through := b.proxied(t)
	started := make(chan int64, 1)
	acks := make(chan worker.Ack, 10)
	// The worker's statements go through the proxy; its session does not.
	_, run := b.runWorker(t, dbtest.Connect(t, through), worker.Config{
		Slots: 1, Lease: time.Minute, ShutdownGrace: -1, SessionDatabaseURL: b.url,
		OnAck: func(a worker.Ack) { acks <- a },
	}, func(w *worker.Worker) {
		w.Handle("task", blockUntilCancelled(started))
	})
	<-started
	proxy.Cut()
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	// The release failed, and is reported so, before Run returned.
	close(acks)
	var reported []string
	for a := range acks {
		reported = append(reported, fmt.Sprintf("%s accepted=%t", a.Outcome, a.Accepted))
	}
	if want := []string{"released accepted=false"}; !slices.Equal(reported, want) {
		t.Errorf("reported %q, want %q", reported, want)
	}
	// The session is gone (once the server has seen its connection
	// close): any worker takes the job back at once, not after its lease.
	b.wantReclaimedForItsEndedSession(t, job.ID)
}

// wantReclaimedForItsEndedSession fails the test unless job id is taken
// back within 5s because its worker's session ended, and no other job with
// it. The test's own reclaims look for it; a reclaim the stopped worker
// sent before its connections were cut may take it first, since the server
// can run a statement it has received after the session ended.
func (b *bundle) wantReclaimedForItsEndedSession(t *testing.T, id int64) {
	t.Helper()
	var rows []modelcheck.Reclaimed
	got := b.get(t, id)
	for deadline := time.Now().Add(5 * time.Second); got.State == db.JobStateRunning && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		rows = append(rows, b.reclaim(t, db.JobReclaimParams{MaxJobs: 10})...)
		got = b.get(t, id)
	}
	if len(rows) > 1 || (len(rows) == 1 && rows[0].ID != id) {
		t.Errorf("the test's reclaims after the shutdown took %+v, want job %d alone or nothing", rows, id)
	}
	if got.State == db.JobStateRunning || deref(got.LastError) != "worker session ended" {
		t.Errorf("job %d after the shutdown: %s, last error %q; want it taken back for its ended session", id, got.State, deref(got.LastError))
	}
}

// TestWorker_ShutdownAcknowledgesWhileTheLeaseLasts has a worker stop
// just after its handler succeeded, while the database cannot be reached.
// If the database is back within the job's lease, a second later, or a
// second before a short lease runs out, the worker keeps sending the
// completion, backing off to a quarter of the heartbeat interval, until
// it lands: the job succeeds at its first attempt and runs once, rather
// than being taken back and run again. If it is not back before the lease
// runs out, the worker stops trying then, and reports the completion
// unsent.
func TestWorker_ShutdownAcknowledgesWhileTheLeaseLasts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		lease time.Duration
		// back is how long after the handler returns the database is
		// back; zero: not before the lease runs out.
		back     time.Duration
		state    db.JobState
		result   string
		reported []string
	}{
		{"database back within the lease", time.Minute, time.Second, db.JobStateSucceeded, `"done"`, []string{"completed accepted=true"}},
		{"database still away when the lease runs out", 2 * time.Second, 0, db.JobStateRunning, "", []string{"completed accepted=false"}},
		// The handler returns as its lease, claimed a moment before,
		// has 3 s left. Tries backing off to 2 s, at 1.55 s and then
		// 3.15 s, would give up as the lease ran out.
		{"database back a second before a short lease runs out", 3 * time.Second, 2 * time.Second, db.JobStateSucceeded, `"done"`, []string{"completed accepted=true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			job := b.enqueue(t, "task", `{}`, 3)
			proxy, through := b.proxied(t)
			started, finish := make(chan int64, 1), make(chan struct{})
			var runs atomic.Int32
			acks := make(chan worker.Ack, 10)
			// The worker's statements go through the proxy; its session
			// does not, so no reclaim takes the job back meanwhile.
			_, run := b.runWorker(t, dbtest.Connect(t, through), worker.Config{
				Slots: 1, Lease: tc.lease, SessionDatabaseURL: b.url,
				OnAck: func(a worker.Ack) { acks <- a },
			}, func(w *worker.Worker) {
				w.HandleFunc("task", func(ctx context.Context, j *worker.Job) (any, error) {
					runs.Add(1)
					started <- j.ID
					<-finish
					return "done", nil
				})
			})
			<-started
			proxy.Cut()
			close(finish)
			run.cancel()
			if tc.back > 0 {
				time.Sleep(tc.back)
				proxy.Heal()
			}
			if err := run.wait(t, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			got := b.get(t, job.ID)
			if got.State != tc.state || got.Attempt != 1 || string(got.Result) != tc.result || runs.Load() != 1 {
				t.Errorf("job %d: %s at attempt %d with result %q, run %d times; want %s at attempt 1 with result %q, run once",
					job.ID, got.State, got.Attempt, got.Result, runs.Load(), tc.state, tc.result)
			}
			// Run has returned: every acknowledgement is reported.
			close(acks)
			var reported []string
			for a := range acks {
				reported = append(reported, fmt.Sprintf("%s accepted=%t", a.Outcome, a.Accepted))
			}
			if !slices.Equal(reported, tc.reported) {
				t.Errorf("reported %q, want %q", reported, tc.reported)
			}
		})
	}
}

// TestWorker_AnOutcomeNeverSentIsNotReportedInDoubt has a handler return
// while the worker's pool cannot connect to the database at all: no
// statement that carries the completion ever leaves the worker, so when
// the shutdown gives up on it once its lease has run out, it reports the
// completion not accepted and not in doubt, as the database cannot have
// recorded it.
func TestWorker_AnOutcomeNeverSentIsNotReportedInDoubt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "task", `{}`, 3)
	proxy, through := b.proxied(t)
	pool := dbtest.Connect(t, through)
	started, finish := make(chan int64, 1), make(chan struct{})
	acks := make(chan worker.Ack, 10)
	// The worker's statements go through the proxy; its session does
	// not, so no reclaim takes the job back meanwhile.
	_, run := b.runWorker(t, pool, worker.Config{
		Slots: 1, Lease: 2 * time.Second, SessionDatabaseURL: b.url,
		OnAck: func(a worker.Ack) { acks <- a },
	}, func(w *worker.Worker) { w.HandleFunc("task", finishWhenTold(started, finish)) })
	<-started
	proxy.Cut()
	// Once the worker's other statements have found every connection of
	// the pool closed, a statement can only ask for a new one, which the
	// proxy refuses: none is sent.
	for deadline := time.Now().Add(10 * time.Second); pool.Stat().TotalConns() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the pool still holds %d connections 10s after the proxy cut them", pool.Stat().TotalConns())
		}
	}
	close(finish)
	time.Sleep(200 * time.Millisecond) // a few rounds fail to connect
	run.cancel()
	if err := run.wait(t, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := b.get(t, job.ID); got.State != db.JobStateRunning || got.Attempt != 1 {
		t.Errorf("job %d: %s at attempt %d, want still running at attempt 1", job.ID, got.State, got.Attempt)
	}
	if reported, want := reportedAcks(acks, job.ID), []string{"completed accepted=false in_doubt=false"}; !slices.Equal(reported, want) {
		t.Errorf("reported %q, want %q", reported, want)
	}
}

// TestWorker_AnOutcomeThatWaitedForAConnectionIsNotReportedInDoubt gives
// the worker a pool of one connection, which its other statements hold
// while the database answers nothing. The round that carries a finished
// job's completion (and a claim) waits for that connection until the
// shutdown gives it up: nothing of it was sent, so the completion is
// reported not accepted and not in doubt, and no claim is looked for.
func TestWorker_AnOutcomeThatWaitedForAConnectionIsNotReportedInDoubt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "task", `{}`, 3)
	proxy, through := b.proxied(t)
	pool := dbtest.Connect(t, through+"&pool_max_conns=1")
	started, finish := make(chan int64, 1), make(chan struct{})
	acks := make(chan worker.Ack, 10)
	var logs syncBuffer
	// The session does not go through the proxy, so no reclaim takes the
	// job back meanwhile.
	_, run := b.runWorker(t, pool, worker.Config{
		Slots: 1, Lease: 3 * time.Second, SessionDatabaseURL: b.url, ShutdownGrace: 200 * time.Millisecond,
		Logger: logs.logger(),
		OnAck:  func(a worker.Ack) { acks <- a },
	}, func(w *worker.Worker) { w.HandleFunc("task", finishWhenTold(started, finish)) })
	<-started
	proxy.Blackhole()
	// A reclaim, sent every 250 ms, now holds the pool's one connection
	// while it waits for an answer, for up to a lease.
	time.Sleep(700 * time.Millisecond)
	close(finish)
	time.Sleep(100 * time.Millisecond)
	run.cancel()
	if err := run.wait(t, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	proxy.Heal()
	if got := b.get(t, job.ID); got.State != db.JobStateRunning || got.Attempt != 1 {
		t.Errorf("job %d: %s at attempt %d, want still running at attempt 1", job.ID, got.State, got.Attempt)
	}
	if reported, want := reportedAcks(acks, job.ID), []string{"completed accepted=false in_doubt=false"}; !slices.Equal(reported, want) {
		t.Errorf("reported %q, want %q", reported, want)
	}
	if strings.Contains(logs.String(), "answer to a claim was lost") {
		t.Errorf("a claim never sent was taken for one whose answer was lost:\n%s", logs.String())
	}
}

// TestWorker_ShutdownKeepsItsGracePeriodThoughTheDatabaseHangs stops a
// worker of two slots, has one job's handler return within the grace
// period while the database answers nothing, and leaves the other running.
// The acknowledgement that hangs does not stretch the grace period (300
// ms here, against a lease of a minute): the running handler is cancelled
// as it ends. Once the database answers again, the first job is
// acknowledged, at its first attempt.
func TestWorker_ShutdownKeepsItsGracePeriodThoughTheDatabaseHangs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	draining := &logSignal{want: "waiting for running jobs", seen: make(chan struct{})}
	g := b.startGraceWorker(t, slog.New(slog.NewTextHandler(draining, nil)), 0)
	g.run.cancel()
	select {
	case <-draining.seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never began to wait for its running jobs")
	}
	g.proxy.Blackhole()
	close(g.finishFirst)
	g.wantSecondCancelledAndFirstSucceeded(t, 10*time.Second, 20*time.Second)
}

// TestWorker_ShutdownKeepsItsGracePeriodThoughARoundInFlightHangs stops a
// worker of two slots while the round acknowledging one job's handler is
// in flight and its answer never comes, and leaves the other handler
// running. The grace period (300 ms here, against a lease of a minute)
// runs from the moment Run's context is cancelled, and the round in
// flight does not stretch it past a second (minRoundWait): the round is
// then given up and the running handler cancelled, well within the lease.
// Once the database answers again, what the round carried is sent again,
// and the first job has succeeded at its first attempt. The completion
// sent again is refused, as the round given up had recorded it: the worker
// cannot tell this from a lease lost, and reports it not accepted, in
// doubt.
func TestWorker_ShutdownKeepsItsGracePeriodThoughARoundInFlightHangs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := b.startGraceWorker(t, nil, -1)
	// The first job's completion waits for its row, held here, so that its
	// round is surely in flight as the database stops answering; then the
	// row is let go, and the completion commits with its answer lost.
	blocker := b.holdRow(t, g.first.ID)
	close(g.finishFirst)
	b.waitBlocks(t, blocker, "the first job's completion")
	g.proxy.Blackhole()
	if err := blocker.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	g.run.cancel()
	g.wantSecondCancelledAndFirstSucceeded(t, 20*time.Second, 90*time.Second)
	if got, want := g.reportedFirst(), []string{"completed accepted=false in_doubt=true"}; !slices.Equal(got, want) {
		t.Errorf("reported of the first job %q, want %q", got, want)
	}
}

// graceWorker is a worker of two slots, lease a minute and grace period
// 300 ms, whose statements go through proxy (its session does not): the
// handler of first waits for finishFirst to return "done", that of a
// second job runs until its context ends and sends the cause to
// cancelled. Its acknowledgements go to acks.
type graceWorker struct {
	b           *bundle
	first       db.Job
	proxy       *faultproxy.Proxy
	run         *running
	finishFirst chan struct{}
	cancelled   chan error
	acks        chan worker.Ack
}

// startGraceWorker starts a graceWorker, with logger (nil for the test's)
// and prefetch, and returns once both handlers run.
func (b *bundle) startGraceWorker(t *testing.T, logger *slog.Logger, prefetch int) *graceWorker {
	t.Helper()
	g := &graceWorker{b: b, first: b.enqueue(t, "first", `{}`, 1), finishFirst: make(chan struct{}), cancelled: make(chan error, 1),
		acks: make(chan worker.Ack, 10)}
	b.enqueue(t, "second", `{}`, 1)
	proxy, through := b.proxied(t)
	g.proxy = proxy
	started := make(chan struct{}, 2)
	_, g.run = b.runWorker(t, dbtest.Connect(t, through), worker.Config{
		Slots: 2, Lease: time.Minute, ShutdownGrace: 300 * time.Millisecond, SessionDatabaseURL: b.url,
		Prefetch: prefetch, Logger: logger, OnAck: func(a worker.Ack) { g.acks <- a },
	}, func(w *worker.Worker) {
		w.HandleFunc("first", func(ctx context.Context, j *worker.Job) (any, error) {
			started <- struct{}{}
			<-g.finishFirst
			return "done", nil
		})
		w.HandleFunc("second", func(ctx context.Context, j *worker.Job) (any, error) {
			started <- struct{}{}
			<-ctx.Done()
			g.cancelled <- context.Cause(ctx)
			return nil, context.Cause(ctx)
		})
	})
	for range 2 {
		receive(t, started, "a handler started")
	}
	return g
}

// wantSecondCancelledAndFirstSucceeded fails the test unless the second
// job's handler is cancelled for the shutdown within cancelWithin; then
// heals the proxy, waits up to runWithin for Run to return, and checks
// that the first job succeeded at its first attempt.
func (g *graceWorker) wantSecondCancelledAndFirstSucceeded(t *testing.T, cancelWithin, runWithin time.Duration) {
	t.Helper()
	select {
	case cause := <-g.cancelled:
		if !errors.Is(cause, worker.ErrShutdown) {
			t.Errorf("the running handler stopped with %v, want %v", cause, worker.ErrShutdown)
		}
	case <-time.After(cancelWithin):
		t.Errorf("the running handler was not cancelled %s after Run's context, with a grace period of 300ms", cancelWithin)
	}
	g.proxy.Heal()
	if err := g.run.wait(t, runWithin); err != nil {
		t.Fatal(err)
	}
	if got := g.b.get(t, g.first.ID); got.State != db.JobStateSucceeded || got.Attempt != 1 {
		t.Errorf("first job after shutdown: state %s attempt %d, want succeeded at attempt 1", got.State, got.Attempt)
	}
}

// reportedFirst lists what the worker, once Run has returned, reported of
// the first job's acknowledgements.
func (g *graceWorker) reportedFirst() []string { return reportedAcks(g.acks, g.first.ID) }

// reportedAcks closes acks, which a worker whose Run has returned fed from
// OnAck, and lists what it reported of job id's acknowledgements.
func reportedAcks(acks chan worker.Ack, id int64) []string {
	close(acks)
	var reported []string
	for a := range acks {
		if a.Job.ID == id {
			reported = append(reported, fmt.Sprintf("%s accepted=%t in_doubt=%t", a.Outcome, a.Accepted, a.InDoubt))
		}
	}
	return reported
}

// TestWorker_ShutdownAtOnceLetsARoundInFlightBeAnswered stops a worker
// whose grace period is negative ("release at once") while its completion
// waits, in flight, for a row held a moment longer: the round is not
// given up at once, and its completion is accepted.
func TestWorker_ShutdownAtOnceLetsARoundInFlightBeAnswered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "quick", `{}`, 1)
	var logs syncBuffer
	acks := make(chan worker.Ack, 4)
	finish := make(chan struct{})
	_, run := b.runWorker(t, b.pool, worker.Config{
		Slots: 1, Lease: time.Minute, ShutdownGrace: -1, Prefetch: -1,
		Logger: logs.logger(),
		OnAck:  func(a worker.Ack) { acks <- a },
	}, func(w *worker.Worker) {
		w.HandleFunc("quick", func(ctx context.Context, j *worker.Job) (any, error) {
			<-finish
			return "done", nil
		})
	})
	b.waitForState(t, job.ID, db.JobStateRunning, 10*time.Second)
	blocker := b.holdRow(t, job.ID)
	close(finish)
	b.waitBlocks(t, blocker, "the completion")
	// Let go of the row soon after the cancel, well within minRoundWait
	// (a second) and long after a grace of none would end.
	run.cancel()
	time.Sleep(50 * time.Millisecond)
	if err := blocker.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := run.wait(t, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-acks:
		if a.Outcome != worker.OutcomeCompleted || !a.Accepted {
			t.Errorf("acknowledgement %s, accepted %v; want the completion accepted", a.Outcome, a.Accepted)
		}
	default:
		t.Error("no acknowledgement reported once Run returned")
	}
	if got := b.get(t, job.ID); got.State != db.JobStateSucceeded || got.Attempt != 1 {
		t.Errorf("job after shutdown: state %s attempt %d, want succeeded at attempt 1", got.State, got.Attempt)
	}
	if strings.Contains(logs.String(), "grace period ended with acknowledgements in flight") {
		t.Errorf("a round a healthy database was answering was given up:\n%s", logs.String())
	}
}

func TestWorker_AdoptsTheJobsOfAClaimWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// One attempt only: a claim charged without running would end it dead.
	job := b.enqueue(t, "once", `{}`, 1)
	proxy, through := b.proxied(t)
	cut := make(chan faultproxy.CutEvent, 1)
	proxy.CutAfterCommit(faultproxy.CommitCut{Statement: "JobCompleteAndClaim", OnCut: func(e faultproxy.CutEvent) { cut <- e }})
	b.runWorker(t, dbtest.Connect(t, through), worker.Config{Slots: 1, Lease: time.Minute}, func(w *worker.Worker) {
		w.HandleFunc("once", func(ctx context.Context, j *worker.Job) (any, error) { return "ran", nil })
	})
	<-cut
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 5*time.Second)
	if got.Attempt != 1 || string(got.Result) != `"ran"` {
		t.Errorf("succeeded at attempt %d with result %s, want attempt 1, run once", got.Attempt, got.Result)
	}
}

// TestWorker_ACompletionWhoseAnswerWasLostLandsOnceAndIsReportedInDoubt
// commits a worker's completion and loses its answer. The worker cannot
// tell whether it landed, and sends it again; the fence refuses the
// repeat, as the job has succeeded. The job runs once and keeps its
// result; the worker warns that the repeat was rejected, in doubt, and
// reports the completion to OnAck as not accepted and in doubt, which the
// job's row settles.
func TestWorker_ACompletionWhoseAnswerWasLostLandsOnceAndIsReportedInDoubt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "once", `{}`, 1)
	proxy, through := b.proxied(t)
	var logs syncBuffer
	acks := make(chan worker.Ack, 10)
	started, finish := make(chan int64, 1), make(chan struct{})
	_, run := b.runWorker(t, dbtest.Connect(t, through), worker.Config{
		Slots: 1, Prefetch: -1, Lease: time.Minute, SessionDatabaseURL: b.url,
		Logger: logs.logger(), OnAck: func(a worker.Ack) { acks <- a },
	}, func(w *worker.Worker) {
		w.HandleFunc("once", finishWhenTold(started, finish))
	})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never started")
	}
	// With its one slot busy, the worker sends no statement that
	// completes until the handler returns.
	cut := make(chan faultproxy.CutEvent, 1)
	proxy.CutAfterCommit(faultproxy.CommitCut{Statement: "-- name: JobComplete", Times: 1, OnCut: func(e faultproxy.CutEvent) { cut <- e }})
	close(finish)
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the completion was never cut after its commit")
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "completion rejected, in doubt") {
		if time.Now().After(deadline) {
			t.Fatalf("the completion sent again was not logged as rejected in doubt:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := run.stop(); err != nil {
		t.Fatal(err)
	}
	got := b.get(t, job.ID)
	if got.State != db.JobStateSucceeded || got.Attempt != 1 || string(got.Result) != `"done"` || string(got.Errors) != "[]" {
		t.Errorf("job: %s at attempt %d with %s, history %s; want succeeded at attempt 1 with \"done\", no history",
			got.State, got.Attempt, got.Result, got.Errors)
	}
	if got, want := reportedAcks(acks, job.ID), []string{"completed accepted=false in_doubt=true"}; !slices.Equal(got, want) {
		t.Errorf("reported to OnAck %q, want %q", got, want)
	}
}

// TestWorker_CountsALostClaimAgainstItsSlotsUntilItsJobsAreFound has a
// worker of one slot lose the answer of its claim of the first of two
// jobs. The round that finds that job claims nothing beside it: until the
// worker knows what its lost claim took, the claim's tokens fill the slot.
// While the first job's handler runs, the second is left to the queue;
// then it runs too, and each runs once.
func TestWorker_CountsALostClaimAgainstItsSlotsUntilItsJobsAreFound(t *testing.T) {
	t.Parallel()
	b := setup(t)
	first := b.enqueue(t, "counted", `{}`, 1)
	second := b.enqueue(t, "counted", `{}`, 1)
	proxy, through := b.proxied(t)
	cut := make(chan faultproxy.CutEvent, 1)
	proxy.CutAfterCommit(faultproxy.CommitCut{Statement: "JobCompleteAndClaim", OnCut: func(e faultproxy.CutEvent) { cut <- e }})
	secondWhileFirstRan := make(chan db.Job, 1)
	b.runWorker(t, dbtest.Connect(t, through), worker.Config{Slots: 1, Lease: time.Minute}, func(w *worker.Worker) {
		w.HandleFunc("counted", func(ctx context.Context, j *worker.Job) (any, error) {
			if j.ID == first.ID {
				got, err := b.q.JobGet(ctx, second.ID)
				if err != nil {
					return nil, err
				}
				secondWhileFirstRan <- got
			}
			return "ran", nil
		})
	})
	<-cut
	if got := <-secondWhileFirstRan; got.State != db.JobStateAvailable || got.LeaseToken.Valid {
		t.Errorf("while the first job ran in the only slot, the second was %s, leased by %v; want available, leased by no one",
			got.State, deref(got.LeasedBy))
	}
	for _, job := range []db.Job{first, second} {
		got := b.waitForState(t, job.ID, db.JobStateSucceeded, 5*time.Second)
		if got.Attempt != 1 {
			t.Errorf("job %d succeeded at attempt %d, want 1", job.ID, got.Attempt)
		}
	}
}

// waitSessionEnded waits, up to timeout, until the worker session
// registered under key is no longer alive: until the server has seen its
// connection close.
func (b *bundle) waitSessionEnded(t *testing.T, key int32, timeout time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(10 * time.Millisecond) {
		alive, err := b.q.WorkerSessionAlive(b.ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !alive {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker session %d still alive after %s", key, timeout)
		}
	}
}

// steadyThroughProxy enqueues a job whose handler runs for runs and then
// succeeds with "done", and starts a worker of one slot with lease and
// heartbeat, on a pool that goes through a fault proxy. It returns the job
// and the proxy once the handler has started.
func (b *bundle) steadyThroughProxy(t *testing.T, lease, heartbeat, runs time.Duration) (db.Job, *faultproxy.Proxy) {
	t.Helper()
	job := b.enqueue(t, "steady", `{}`, 5)
	proxy, through := b.proxied(t)
	started := make(chan int64, 1)
	b.runWorker(t, dbtest.Connect(t, through), worker.Config{
		Slots: 1, Lease: lease, HeartbeatInterval: heartbeat, PollInterval: 100 * time.Millisecond, ShutdownGrace: -1,
	}, func(w *worker.Worker) {
		w.HandleFunc("steady", func(ctx context.Context, j *worker.Job) (any, error) {
			started <- j.ID
			select {
			case <-time.After(runs):
				return "done", nil
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
		})
	})
	<-started
	return job, proxy
}

// renewedThroughProxy enqueues a job whose handler succeeds with "done"
// once finish is closed, and starts a worker of one slot, claiming none
// ahead, with lease and heartbeat, whose statements go through a fault
// proxy and whose session reaches the database directly. It returns the
// job, the proxy and finish once the handler has started and a heartbeat
// has renewed the job's lease.
func (b *bundle) renewedThroughProxy(t *testing.T, lease, heartbeat time.Duration) (db.Job, *faultproxy.Proxy, chan struct{}) {
	t.Helper()
	job := b.enqueue(t, "steady", `{}`, 5)
	proxy, through := b.proxied(t)
	started, finish := make(chan int64, 1), make(chan struct{})
	b.runWorker(t, dbtest.Connect(t, through), worker.Config{
		Slots: 1, Prefetch: -1, Lease: lease, HeartbeatInterval: heartbeat, ShutdownGrace: -1, SessionDatabaseURL: b.url,
	}, func(w *worker.Worker) {
		w.HandleFunc("steady", finishWhenTold(started, finish))
	})
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never started")
	}
	claimed := b.get(t, job.ID)
	b.waitForRenewal(t, job.ID, *claimed.LeaseExpiresAt)
	return job, proxy, finish
}

// wantRanOnce fails the test unless job, by timeout, succeeded at its first
// attempt with the result "done" and no reclaim in its history; after says
// what it went through.
func (b *bundle) wantRanOnce(t *testing.T, job db.Job, timeout time.Duration, after string) {
	t.Helper()
	got := b.waitFor(t, job.ID, timeout, "finished", func(j db.Job) bool { return j.FinishedAt != nil || j.Attempt > 1 })
	if got.State != db.JobStateSucceeded || got.Attempt != 1 || string(got.Errors) != "[]" || string(got.Result) != `"done"` {
		t.Errorf("%s: %s at attempt %d, result %s, history %s; want succeeded at attempt 1 with result \"done\" and no reclaim",
			after, got.State, got.Attempt, got.Result, got.Errors)
	}
}

func TestWorker_SessionSurvivesAStallShorterThanTheLease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The stall is twice a heartbeat interval, so that a session whose
	// ping gave up after an interval, or sooner, would end during it, and
	// have the job taken back at once. The lease leaves the stall room to
	// spare on a loaded machine: the last renewal before the stall was
	// sent at most a heartbeat interval before it began, so the lease runs
	// out lease-heartbeat = 5 s after the stall begins at the earliest,
	// two and a half times the stall, while the renewal the stall held up
	// lands as it ends, at 2 s: 3 s to spare. The session's ping waits a
	// lease, 6 s, three times the stall.
	const (
		lease     = 6 * time.Second
		heartbeat = time.Second
		stall     = 2 * time.Second
	)
	// The session pings every 100 ms, so it is pinging when the stall
	// begins, and its ping outlasts a heartbeat interval.
	job, proxy := b.steadyThroughProxy(t, lease, heartbeat, stall+2*heartbeat)
	// Every connection of the worker stalls, in both directions, for less
	// than the lease.
	proxy.Blackhole()
	time.Sleep(stall)
	proxy.Heal()
	b.wantRanOnce(t, job, 15*time.Second, fmt.Sprintf("after a %s stall", stall))
}

func TestWorker_KeepsItsLeaseThroughHeartbeatsSlowerThanTheirInterval(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A renewal may take three round trips: the pool's ping of a
	// connection idle for a second, and the statement's preparation and
	// execution on a connection that has not run it yet.
	const (
		lease     = 5 * time.Second
		heartbeat = 500 * time.Millisecond
		late      = 600 * time.Millisecond // every answer, more than a heartbeat interval
	)
	job, proxy := b.steadyThroughProxy(t, lease, heartbeat, lease+2*time.Second)
	// From now on the database answers each of the worker's statements
	// later than a heartbeat interval, and well within the lease: each
	// renewal takes long, and each one succeeds.
	proxy.Slow(late)
	b.wantRanOnce(t, job, 30*time.Second, fmt.Sprintf("with every answer %s late", late))
}

// TestWorker_CutOffFromTheDatabaseStopsItsHandlerOnceItsLeaseHasRunOut
// cuts a worker's statements off from the database just after its handler
// starts, every renewal failing at once, as when the database or a pooler
// in front of it refuses connections, while its session, reached
// directly, lives on. The lease then runs out by the worker's clock at the
// latest a lease after the claim was sent, before the handler started, and
// the handler is stopped then, not at the first heartbeat after it, up to
// an interval later, while another worker may run the job again. The job
// is claimed as the worker starts, just after its first heartbeat was due,
// so that the heartbeats come as late after the lease as they can.
func TestWorker_CutOffFromTheDatabaseStopsItsHandlerOnceItsLeaseHasRunOut(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const (
		lease     = 3 * time.Second
		heartbeat = time.Second
		// How late the handler may stop, for a loaded machine: less than
		// the half interval the heartbeats would come after the lease.
		late = 400 * time.Millisecond
	)
	b.enqueue(t, "task", `{}`, 3)
	proxy, through := b.proxied(t)
	started, stopped := make(chan time.Time, 1), make(chan time.Time, 1)
	causes := make(chan error, 1)
	b.runWorker(t, dbtest.Connect(t, through), worker.Config{
		Slots: 1, Lease: lease, HeartbeatInterval: heartbeat, ShutdownGrace: -1, SessionDatabaseURL: b.url,
	}, func(w *worker.Worker) {
		w.HandleFunc("task", func(ctx context.Context, j *worker.Job) (any, error) {
			started <- time.Now()
			<-ctx.Done()
			stopped <- time.Now()
			causes <- context.Cause(ctx)
			return nil, context.Cause(ctx)
		})
	})
	var begun time.Time
	select {
	case begun = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler never started")
	}
	proxy.Cut()
	select {
	case at := <-stopped:
		if ran := at.Sub(begun); ran > lease+late {
			t.Errorf("the handler was stopped %s after it started, more than %s after its lease ran out", ran, late)
		}
		if cause := <-causes; !errors.Is(cause, worker.ErrLeaseLost) {
			t.Errorf("the handler stopped with %v, want %v", cause, worker.ErrLeaseLost)
		}
	case <-time.After(lease + 5*time.Second):
		t.Fatalf("the handler still runs %s after its lease ran out", 5*time.Second)
	}
}

// TestWorker_RenewsItsLeaseSoonAfterTheDatabaseComesBack cuts a worker's
// statements off from the database, every renewal failing at once, for
// less than a lease, while its session, reached directly, lives on: a
// pooler restarting, say. The database comes back half a second before
// the lease runs out, and after the last heartbeat due before then: a
// renewal that fails is tried again soon, so the job keeps its lease and
// runs once, rather than waiting for the next heartbeat due, after the
// lease ran out.
func TestWorker_RenewsItsLeaseSoonAfterTheDatabaseComesBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Heartbeats come 1.2 s, 2.4 s and 3.6 s after a renewal, the last
	// after the lease ran out, at 3 s. The outage runs from 0.5 s after a
	// renewal to 2.5 s.
	const (
		lease     = 3 * time.Second
		heartbeat = 1200 * time.Millisecond
		after     = 500 * time.Millisecond
		outage    = 2 * time.Second
	)
	job, proxy, finish := b.renewedThroughProxy(t, lease, heartbeat)
	time.Sleep(after)
	proxy.Cut()
	time.Sleep(outage)
	proxy.Heal()
	time.Sleep(lease - outage)
	close(finish)
	b.wantRanOnce(t, job, 15*time.Second, fmt.Sprintf("after its statements failed for %s, from %s after a renewal", outage, after))
}

// TestWorker_RecordsACompletionSoonAfterTheDatabaseComesBack cuts a
// worker's statements off from the database just after a renewal, while
// its session, reached directly, lives on, and its handler returns during
// the outage. No heartbeat renews the lease of a job whose handler has
// returned, so its completion must land before that lease runs out: a
// round that fails is sent again backing off to a quarter of the
// heartbeat interval, as a renewal is, and the database, back a second
// before the lease runs out, records the job once. Backing off to 2 s,
// the completion would come after the lease ran out, and the job run
// again.
func TestWorker_RecordsACompletionSoonAfterTheDatabaseComesBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// The handler returns 100 ms into the outage; its completion fails and
	// is sent again 50, 100, 200 ms later and so on: at 1.55 s, then,
	// backing off to 2 s, at 3.15 s, after the lease ran out, at 2.9 s.
	const (
		lease     = 3 * time.Second
		heartbeat = 1200 * time.Millisecond
		returns   = 100 * time.Millisecond
		outage    = 2 * time.Second
	)
	job, proxy, finish := b.renewedThroughProxy(t, lease, heartbeat)
	proxy.Cut()
	time.Sleep(returns)
	close(finish)
	time.Sleep(outage - returns)
	proxy.Heal()
	b.wantRanOnce(t, job, 15*time.Second, fmt.Sprintf("after its handler returned while its statements failed for %s", outage))
}

func TestWorker_WhoseSessionEndsStopsTheHandlersOfTheJobsTakenBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "task", `{}`, 3)
	first := newHolder()
	// Heartbeats every 20s: the worker must not wait for one to learn.
	b.startWorker(t, worker.Config{ID: "first", Slots: 1, Lease: time.Minute, ShutdownGrace: -1}, func(w *worker.Worker) {
		w.Handle("task", first)
	})
	<-first.started
	// The server ends the worker's session; the worker reconnects at once.
	var n int
	if err := b.pool.QueryRow(b.ctx, `
		SELECT count(pg_terminate_backend(l.pid))
		FROM pg_locks AS l JOIN worker_sessions AS s ON l.objid::integer = s.session_key
		WHERE l.locktype = 'advisory' AND l.classid = 1380273241 AND l.objsubid = 2 AND s.worker_id = 'first'
		  AND l.database = (SELECT d.oid FROM pg_database AS d WHERE d.datname = current_database())`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("terminate the worker's session: %d backends, %v", n, err)
	}
	b.startWorker(t, worker.Config{ID: "second", Slots: 1, Lease: time.Minute}, func(w *worker.Worker) {
		w.HandleFunc("task", func(ctx context.Context, j *worker.Job) (any, error) { return "second", nil })
	})
	b.waitForState(t, job.ID, db.JobStateSucceeded, 5*time.Second)
	first.waitLeaseLost(t)
}

// TestWorker_ARowHeldElsewhereCostsOnlyItsOwnJob holds one finished job's
// row, as an operator's SELECT ... FOR UPDATE would, for three leases. The
// completion of another job, finished just after it, waits behind the
// round that waits for that row. That round gives up after lock_wait_ms,
// sets the held job aside and the other job's completion goes, before its
// lease, which no heartbeat renews once its handler returned, runs out;
// the worker goes on claiming and completing jobs meanwhile.
func TestWorker_ARowHeldElsewhereCostsOnlyItsOwnJob(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		outcome error // of the held job's first run
	}{
		{"a completion waits for the row", nil},
		{"a failure waits for the row", errors.New("the held job failed")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var logs syncBuffer
			var runs [3]atomic.Int32
			started := make(chan struct{}, 2)
			finish := make(chan struct{})
			b.startWorker(t, worker.Config{
				Slots: 2, Lease: 2 * time.Second, Prefetch: -1,
				Logger: logs.logger(),
			}, func(w *worker.Worker) {
				for i, kind := range []string{"held", "beside", "later"} {
					w.HandleFunc(kind, func(ctx context.Context, j *worker.Job) (any, error) {
						if runs[i].Add(1) > 1 || i == 2 {
							return "done", nil
						}
						started <- struct{}{}
						<-finish
						if kind == "held" {
							return nil, tc.outcome
						}
						// After the held job's round has gone out, so that
						// this job's completion waits behind it.
						time.Sleep(20 * time.Millisecond)
						return "done", nil
					})
				}
			})
			held := b.enqueue(t, "held", `{}`, 5)
			beside := b.enqueue(t, "beside", `{}`, 5)
			for range 2 {
				select {
				case <-started:
				case <-time.After(10 * time.Second):
					t.Fatal("the first two jobs did not start")
				}
			}
			blocker := b.holdRow(t, held.ID)
			close(finish)

			b.wantSucceededAtFirstAttempt(t, beside.ID, "the job beside the held one")
			later := b.enqueue(t, "later", `{}`, 5)
			b.wantSucceededAtFirstAttempt(t, later.ID, "a job enqueued while the row was held")
			// Three leases, as the row is held: the held job's lease runs out.
			time.Sleep(6 * time.Second)
			if err := blocker.Commit(b.ctx); err != nil {
				t.Fatal(err)
			}
			b.waitForState(t, held.ID, db.JobStateSucceeded, 20*time.Second)
			if n := runs[1].Load(); n != 1 {
				t.Errorf("the job beside the held one ran %d times, want once", n)
			}
			if n := runs[2].Load(); n != 1 {
				t.Errorf("the job enqueued while the row was held ran %d times, want once", n)
			}
			if !strings.Contains(logs.String(), "another transaction holds the row of a finished job") {
				t.Errorf("the worker did not say it set a job aside; the logs:\n%s", logs.String())
			}
		})
	}
}

// TestWorker_AHeldRowOfAJobClaimedAheadHoldsBackOnlyItsRelease has a
// worker of one slot claim a job ahead while a long job fills its slot,
// and another transaction hold that job's row as the worker releases it,
// having waited PrefetchWait for the slot. The release waits lock_wait_ms
// for the row, then is set aside: the long job, finishing meanwhile, is
// completed at its first attempt and runs once, a job enqueued while the
// row is held runs, and the job claimed ahead runs once its row is free.
func TestWorker_AHeldRowOfAJobClaimedAheadHoldsBackOnlyItsRelease(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs syncBuffer
	var runs [3]atomic.Int32
	blocking, finish := make(chan struct{}), make(chan struct{})
	b.startWorker(t, worker.Config{
		Slots: 1, Lease: 4 * time.Second, PrefetchWait: time.Second,
		Logger: logs.logger(),
	}, func(w *worker.Worker) {
		w.HandleFunc("quick", quick)
		for i, kind := range []string{"block", "next", "later"} {
			w.HandleFunc(kind, func(ctx context.Context, j *worker.Job) (any, error) {
				if runs[i].Add(1) == 1 && kind == "block" {
					close(blocking)
					<-finish
				}
				return "done", nil
			})
		}
	})
	for range 12 {
		b.enqueue(t, "quick", `{}`, 1)
	}
	// One attempt: a long job whose completion came too late would end
	// dead. The job claimed ahead may be taken back after its lease, if
	// the row is held that long, and still run once.
	blocker, next := b.enqueue(t, "block", `{}`, 1), b.enqueue(t, "next", `{}`, 3)
	<-blocking
	// The quick jobs made the worker claim ahead: next, while blocker fills
	// the slot. Its row is held before it has waited PrefetchWait.
	b.waitFor(t, next.ID, 10*time.Second, "claimed ahead", func(j db.Job) bool { return j.Fence > 0 })
	held := b.holdRow(t, next.ID)
	b.waitFor(t, next.ID, 10*time.Second, "still claimed", func(j db.Job) bool { return j.State == db.JobStateRunning })
	// The long job finishes while the release waits for the row.
	for deadline := time.Now().Add(10 * time.Second); !b.blocks(t, held); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no release waited for the held row within 10s")
		}
	}
	close(finish)

	b.wantSucceededAtFirstAttempt(t, blocker.ID, "the long job")
	later := b.enqueue(t, "later", `{}`, 1)
	b.wantSucceededAtFirstAttempt(t, later.ID, "a job enqueued while the row was held")
	if err := held.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.waitForState(t, next.ID, db.JobStateSucceeded, 20*time.Second)
	for i, name := range []string{"the long job", "the job claimed ahead", "the job enqueued while the row was held"} {
		if n := runs[i].Load(); n != 1 {
			t.Errorf("%s ran %d times, want once", name, n)
		}
	}
	if !strings.Contains(logs.String(), "another transaction holds the row of a job claimed ahead") {
		t.Errorf("the worker did not say it set a release aside; the logs:\n%s", logs.String())
	}
}

// TestWorker_ACompletionSetAsideLandsOnceItsRowIsFreeThoughEverySlotIsBusy
// has another transaction hold a finished job's row through its
// completion's lock wait (2 s here), so that the completion is set aside,
// and the worker's one slot then fill with a long job. The row is freed
// well within the lease (8 s). The worker, with no slot free to claim for,
// still asks again about the completion set aside and sends it: the job
// succeeds at its first attempt and runs once, rather than being taken
// back when its lease runs out.
func TestWorker_ACompletionSetAsideLandsOnceItsRowIsFreeThoughEverySlotIsBusy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var heldRuns atomic.Int32
	heldStarted, finishHeld := make(chan struct{}), make(chan struct{})
	longStarted, finishLong := make(chan struct{}), make(chan struct{})
	b.startWorker(t, worker.Config{Slots: 1, Lease: 8 * time.Second, Prefetch: -1}, func(w *worker.Worker) {
		w.HandleFunc("held", func(ctx context.Context, j *worker.Job) (any, error) {
			if heldRuns.Add(1) == 1 {
				close(heldStarted)
				<-finishHeld
			}
			return "done", nil
		})
		w.HandleFunc("long", func(ctx context.Context, j *worker.Job) (any, error) {
			close(longStarted)
			select {
			case <-finishLong:
			case <-ctx.Done():
			}
			return "done", nil
		})
	})
	// Before the worker stops, which waits for its handlers.
	t.Cleanup(func() { close(finishLong) })
	held := b.enqueue(t, "held", `{}`, 5)
	receive(t, heldStarted, "the held job's handler started")
	b.enqueue(t, "long", `{}`, 5)
	blocker := b.holdRow(t, held.ID)
	close(finishHeld)
	// The round that claims the long job is the one sent after the held
	// job's completion was set aside: the round that waited for the row
	// committed nothing, its claim included.
	receive(t, longStarted, "the long job started")
	if err := blocker.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	got := b.waitFor(t, held.ID, 30*time.Second, "no longer running", func(j db.Job) bool { return j.State != db.JobStateRunning })
	if got.State != db.JobStateSucceeded || got.Attempt != 1 || heldRuns.Load() != 1 {
		t.Errorf("the job whose row was freed within its lease: %s at attempt %d (last error %q), run %d times; want succeeded at attempt 1, run once",
			got.State, got.Attempt, deref(got.LastError), heldRuns.Load())
	}
}

// TestWorker_AReleaseSetAsideGoesOnceItsRowIsFreeThoughEverySlotIsBusy has
// a worker of one slot release a job claimed ahead, which waited
// PrefetchWait while a long job fills the slot, and another transaction
// hold that job's row through the release's lock wait, so that the
// release is set aside. Once the row is free, the worker, with no slot
// free to claim for and its long job still running, asks again and
// releases the job, rather than keep it under heartbeats for as long as
// the long job runs: an idle worker then runs it.
func TestWorker_AReleaseSetAsideGoesOnceItsRowIsFreeThoughEverySlotIsBusy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, next := b.queueBehindBlocker(t)
	blocking, finish := make(chan struct{}), make(chan struct{})
	busy, _ := b.startWorker(t, worker.Config{Slots: 1, Lease: 4 * time.Second, PrefetchWait: 2 * time.Second}, func(w *worker.Worker) {
		w.HandleFunc("quick", quick)
		w.HandleFunc("block", func(ctx context.Context, j *worker.Job) (any, error) {
			close(blocking)
			select {
			case <-finish:
			case <-ctx.Done():
			}
			return "done", nil
		})
		w.HandleFunc("next", func(ctx context.Context, j *worker.Job) (any, error) {
			t.Errorf("the job claimed ahead ran on the busy worker")
			return "done", nil
		})
	})
	// Before the worker stops, which waits for its handlers.
	t.Cleanup(func() { close(finish) })
	receive(t, blocking, "the long job started")
	b.waitHeldBy(t, next.ID, busy.ID())
	held := b.holdRow(t, next.ID)
	for deadline := time.Now().Add(10 * time.Second); !b.blocks(t, held); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no release waited for the held row within 10s")
		}
	}
	// The release gives up after its lock wait (1 s here) and is set aside.
	for deadline := time.Now().Add(10 * time.Second); b.blocks(t, held); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the release still waited for the held row after 10s")
		}
	}
	if err := held.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	b.startWorker(t, worker.Config{Slots: 1}, func(w *worker.Worker) {
		w.HandleFunc("next", func(ctx context.Context, j *worker.Job) (any, error) { return "done", nil })
	})
	b.waitForState(t, next.ID, db.JobStateSucceeded, 20*time.Second)
}

// TestWorker_StopsPromptlyThoughAJobClaimedAheadHasItsRowHeld stops a
// worker whose job claimed ahead has its row held by another transaction.
// The release waits lock_wait_ms (2 s here) for the row, not the round's
// time limit of a lease, and the worker returns, leaving that job to be
// taken back once its session has ended; the job never runs on it.
func TestWorker_StopsPromptlyThoughAJobClaimedAheadHasItsRowHeld(t *testing.T) {
	t.Parallel()
	b := setup(t)
	blocker, next := b.queueBehindBlocker(t)
	acks := make(chan worker.Ack, 100) // more than the jobs
	blocking := make(chan int64, 1)
	w, run := b.runWorker(t, b.pool, worker.Config{Slots: 1, Lease: 30 * time.Second, ShutdownGrace: -1, PrefetchWait: 10 * time.Second,
		OnAck: func(a worker.Ack) { acks <- a }},
		func(w *worker.Worker) {
			w.HandleFunc("quick", quick)
			w.HandleFunc("block", blockUntilCancelled(blocking))
			w.HandleFunc("next", func(ctx context.Context, j *worker.Job) (any, error) {
				t.Errorf("next started")
				return nil, nil
			})
		})
	<-blocking
	b.waitHeldBy(t, next.ID, w.ID())
	held := b.holdRow(t, next.ID)
	run.cancel() // the lock wait is 2 s
	if err := run.wait(t, 15*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := held.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.get(t, blocker.ID); got.State != db.JobStateAvailable {
		t.Errorf("the interrupted job is %s after the shutdown, want released (available)", got.State)
	}
	// Run has returned: every acknowledgement is reported. The job claimed
	// ahead ran no handler, and its release, left unsent with its row
	// held, is reported not accepted.
	close(acks)
	var reported []string
	for a := range acks {
		if a.Job.ID == blocker.ID || a.Job.ID == next.ID {
			reported = append(reported, fmt.Sprintf("job %d %s accepted=%t", a.Job.ID, a.Outcome, a.Accepted))
		}
	}
	want := []string{fmt.Sprintf("job %d released accepted=true", blocker.ID), fmt.Sprintf("job %d released accepted=false", next.ID)}
	if !slices.Equal(reported, want) {
		t.Errorf("reported %q, want %q", reported, want)
	}
	b.wantReclaimedForItsEndedSession(t, next.ID)
}

func TestWorker_RoundTheDatabaseEndsAsADeadlockIsSentAgainAndLosesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs syncBuffer
	var firstRuns, nextRuns atomic.Int32
	started := make(chan struct{})
	finish := make(chan struct{})
	b.startWorker(t, worker.Config{
		Slots: 1, Lease: 10 * time.Second,
		Logger: logs.logger(),
	}, func(w *worker.Worker) {
		w.HandleFunc("first", func(ctx context.Context, j *worker.Job) (any, error) {
			if firstRuns.Add(1) == 1 {
				close(started)
			}
			<-finish
			return "done", nil
		})
		w.HandleFunc("next", func(ctx context.Context, j *worker.Job) (any, error) {
			nextRuns.Add(1)
			return "done", nil
		})
	})
	first := b.enqueue(t, "first", `{}`, 1)
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the first job did not start")
	}
	next := b.enqueue(t, "next", `{}`, 1)

	// The round that completes the first job claims the next one, locking
	// its row, then waits for the first job's row, which another
	// transaction holds. That transaction then asks for the next job's row:
	// each waits on the other. Its own deadlock_timeout is the longer, so
	// PostgreSQL breaks the circle by failing the round.
	blocker := b.holdRow(t, first.ID)
	close(finish)
	deadline := time.Now().Add(10 * time.Second)
	for !b.blocks(t, blocker) {
		if time.Now().After(deadline) {
			t.Fatal("no round waited for the row held")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := blocker.Exec(b.ctx, "SET LOCAL deadlock_timeout = '1min'"); err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(b.ctx, "SELECT FROM jobs WHERE id = $1 FOR UPDATE", next.ID); err != nil {
		t.Fatalf("the transaction holding the row: %v", err)
	}
	if err := blocker.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}

	for _, j := range []db.Job{first, next} {
		if got := b.waitForState(t, j.ID, db.JobStateSucceeded, 20*time.Second); got.Attempt != 1 {
			t.Errorf("job %s succeeded on attempt %d, want 1: the failed round's completion or claim was lost", j.Kind, got.Attempt)
		}
	}
	if n := firstRuns.Load(); n != 1 {
		t.Errorf("the first job's handler ran %d times, want once", n)
	}
	if n := nextRuns.Load(); n != 1 {
		t.Errorf("the next job's handler ran %d times, want once", n)
	}
	if !strings.Contains(logs.String(), "40P01") {
		t.Errorf("no round failed as a deadlock (SQLSTATE 40P01); the logs:\n%s", logs.String())
	}
}

// wantSucceededAtFirstAttempt waits up to 10s for job id, which what
// names, to succeed, and fails the test unless it did at its first attempt.
func (b *bundle) wantSucceededAtFirstAttempt(t *testing.T, id int64, what string) {
	t.Helper()
	if got := b.waitForState(t, id, db.JobStateSucceeded, 10*time.Second); got.Attempt != 1 {
		t.Errorf("%s succeeded on attempt %d, want 1", what, got.Attempt)
	}
}

// TestWorker_ReclaimsALeaseThatExpiredWhileAReclaimWasOnItsWay runs a
// worker that reclaims every 2 s, whose statements, just after a reclaim
// that took every expired lease it found, take 2.5 s to reach the
// database, as they do while its pool has no free connection or the
// network is slow. A lease that expires 200 ms after that reclaim is taken
// back by the next ones, rather than left to a reclaim that reads every
// expired lease, 40 rounds later: the window of the next reclaim reaches
// back to when the last one ran on the database, however long its own
// statement took to get there.
func TestWorker_ReclaimsALeaseThatExpiredWhileAReclaimWasOnItsWay(t *testing.T) {
	b := setup(t)
	const interval = 2 * time.Second
	proxy, through := b.proxied(t)
	pool := dbtest.Connect(t, through)
	// Claimed by a worker without a session, which only its lease governs.
	claim := func(lease time.Duration) int64 {
		t.Helper()
		b.enqueue(t, "noop", `{}`, 3)
		id, _ := b.claimOne(t, "stalled", lease)
		return id
	}
	reclaimed := func(id int64, within time.Duration) bool {
		t.Helper()
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			if job := b.get(t, id); job.State != db.JobStateRunning {
				return true
			}
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}
	marker := claim(time.Millisecond)
	b.waitForLeaseExpiry(t, marker)
	// The worker serves another queue, so that it claims none of these.
	_, run := b.runWorker(t, pool, worker.Config{Queue: "elsewhere", ReclaimInterval: interval}, func(*worker.Worker) {})
	defer run.stop() //nolint:errcheck // the test's outcome is the job's
	if !reclaimed(marker, 3*interval) {
		t.Fatalf("the first reclaim did not take back an expired lease within %s", 3*interval)
	}
	job := claim(200 * time.Millisecond)
	proxy.Slow(2500 * time.Millisecond)
	time.Sleep(3 * time.Second)
	proxy.Slow(0)
	if !reclaimed(job, 3*interval) {
		t.Fatalf("a lease that expired 200 ms after a reclaim is still held %s later, after two more rounds",
			3*time.Second+3*interval)
	}
}
