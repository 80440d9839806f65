// Package worker runs job handlers against Relay's queue in PostgreSQL.
//
// A Worker claims ready jobs of one queue, as many as it has free slots
// (and, while its jobs are short, a few ahead of them), in one statement;
// runs their handlers in its slots, each slot a goroutine that runs one job
// after another; renews all the leases it holds in one heartbeat statement;
// and acknowledges each outcome under the lease token of its claim, so that
// an acknowledgement from a claim that is no longer current is refused by
// the database. It also takes back the jobs of workers that died, which it
// recognises at once by their ended PostgreSQL session, and of leases that
// expired.
//
// Delivery is at least once: a job whose worker dies or stalls past its lease
// runs again, so handlers must tolerate running more than once for the same
// job. See docs/failure-semantics.md.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgurl"
)

// Worker runs handlers for the jobs of one queue. Create it with New,
// register handlers with Handle, then call Run.
type Worker struct {
	pool *pgxpool.Pool
	q    *db.Queries
	cfg  Config
	log  *slog.Logger
	// leases drives the statements of queries/leases.sql.
	leases leases
	// cursors are where this worker's claims start, per priority.
	cursors claimCursors

	handlersMu sync.RWMutex
	handlers   map[string]Handler

	// backoffMu makes the calls of Config.Backoff one at a time: the two
	// rounds a worker may have in flight each ask it of their failures.
	backoffMu sync.Mutex

	// sessionConfig opens the session connection: Config.SessionDatabaseURL,
	// or the pool's own settings.
	sessionConfig *pgx.ConnConfig
	session       session

	started atomic.Bool
	// fleet is how many workers' sessions were live when the last reclaim
	// that succeeded counted them (JobReclaim); zero until one has.
	fleet atomic.Int32
	// queueFleet is how many of them work on this worker's queue.
	queueFleet atomic.Int32
	// returned is when (Unix nanoseconds) this worker last learned that a
	// job of its queue went back to available, taken back from a dead
	// worker or released; zero: never (see dispatcher.recheckReturned).
	returned     atomic.Int64
	wake         chan struct{} // a claim may find work
	heartbeatNow chan struct{} // renew leases now, without waiting for the ticker
	outcomes     chan outcome
	mu           sync.Mutex
	// held holds every job this worker holds a lease on, from its claim
	// until its outcome is collected: those claimed ahead and waiting for
	// a slot, and those started.
	held map[int64]*execution
	// ahead lists the held jobs waiting for a slot, oldest claim first.
	ahead []*execution
	// running holds the jobs started and not yet collected: held, or
	// taken out of held by a newer claim of the same job while their
	// handlers still ran (see unhold), so that a shutdown reports each.
	running map[*execution]bool
	// slotsBusy counts the slot goroutines running; at most Slots.
	slotsBusy int
	// slotsStarting counts those started that have not yet taken their
	// first job: as many of the oldest in ahead are theirs, not waiting
	// for a slot.
	slotsStarting int
	// stopping keeps slots from starting jobs once shutdown began.
	stopping bool
}

// New returns a Worker that uses pool for its statements, and a connection
// of its own, opened with pool's settings, for its session and
// notifications. Give the worker a pool its handlers do not use, so that
// handlers holding connections can never starve its heartbeats.
func New(pool *pgxpool.Pool, cfg Config) (*Worker, error) {
	if pool == nil {
		return nil, errors.New("worker: nil pool")
	}
	if err := pgurl.CheckExecMode(pool.Config().ConnConfig.DefaultQueryExecMode); err != nil {
		return nil, fmt.Errorf("worker: the pool's %w", err)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	poolConfig := pool.Config().ConnConfig
	sessionConfig := poolConfig.Copy()
	if cfg.SessionDatabaseURL != "" {
		if sessionConfig, err = parseSessionURL(cfg.SessionDatabaseURL); err != nil {
			return nil, err
		}
		// The session shows in pg_stat_activity under the pool's name,
		// unless its own URL gives it one, as a parameter or among its
		// options (options=--application_name=...).
		_, named := sessionConfig.RuntimeParams["application_name"]
		if !named && !strings.Contains(sessionConfig.RuntimeParams["options"], "application_name") {
			if name, ok := poolConfig.RuntimeParams["application_name"]; ok {
				sessionConfig.RuntimeParams["application_name"] = name
			}
		}
	}
	// The session's few statements run as unnamed statements, each in one
	// round trip, so that they work, and find out, when the connection
	// goes through a transaction-mode pooler, where a prepared statement
	// may not outlive its transaction.
	sessionConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	w := &Worker{
		pool:          pool,
		sessionConfig: sessionConfig,
		q:             db.New(pool),
		cfg:           cfg,
		log:           cfg.Logger.With("worker", cfg.ID, "queue", cfg.Queue),
		handlers:      map[string]Handler{},
		wake:          make(chan struct{}, 1),
		heartbeatNow:  make(chan struct{}, 1),
		// One outcome per held job at most, so sending never blocks.
		outcomes: make(chan outcome, cfg.Slots+max(cfg.Prefetch, 0)),
		held:     map[int64]*execution{},
		running:  map[*execution]bool{},
	}
	w.leases = leases{w: w, q: w.q}
	w.session.w = w
	return w, nil
}

// ID returns the worker's id, as recorded in leases and error histories.
func (w *Worker) ID() string { return w.cfg.ID }

// Config returns the worker's configuration with defaults applied.
func (w *Worker) Config() Config { return w.cfg }

// Handle registers h for jobs of the given kind, replacing any handler
// registered for it before. A job whose kind has no handler fails
// permanently. Handle panics if h is nil, as a nil handler would fail
// every attempt of every job of its kind.
func (w *Worker) Handle(kind string, h Handler) {
	if h == nil {
		panic(fmt.Sprintf("worker: nil handler for kind %q", kind))
	}
	w.handlersMu.Lock()
	defer w.handlersMu.Unlock()
	w.handlers[kind] = h
}

// HandleFunc registers f for jobs of the given kind. It panics if f is nil,
// as Handle does.
func (w *Worker) HandleFunc(kind string, f func(ctx context.Context, job *Job) (any, error)) {
	if f == nil {
		panic(fmt.Sprintf("worker: nil handler for kind %q", kind))
	}
	w.Handle(kind, HandlerFunc(f))
}

func (w *Worker) handler(kind string) (Handler, bool) {
	w.handlersMu.RLock()
	defer w.handlersMu.RUnlock()
	h, ok := w.handlers[kind]
	return h, ok
}

// Run works until ctx is cancelled, then shuts down gracefully: it stops
// claiming, lets running handlers finish for up to Config.ShutdownGrace,
// cancels the rest and releases their jobs at once, and returns nil.
// Database errors while running are logged and retried, never returned.
// It returns an *IDInUseError instead when another live session holds
// the worker's id (see Config.ID): at once, having claimed nothing, or,
// should its session find the id taken later, once it has shut down as
// above. A Worker runs once: a second call of Run returns an error at
// once.
// The grace period runs from ctx's cancellation: the acknowledgements in
// flight then (given a second at least), and those sent during it, give
// up when it ends, so that a database that hangs does not stretch it.
// At shutdown, acknowledgements the database does not take are sent again
// for as long as their leases may last, so that a database away for a
// moment costs no job a second run: a worker stopping while its database
// cannot be reached may take up to a Config.Lease longer to return, after
// the grace period and the release of the handlers still running (which
// waits a HeartbeatInterval at most, or a second if that is longer).
// Run does not wait for the handlers it cancelled to return: one that
// ignores its context goes on after Run has returned, while its released
// job may already run elsewhere. Its attempt is reported (Config.OnAck)
// before Run returns, as released, or as lost if its lease was lost first.
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("worker: Run called more than once")
	}
	w.log.Info("worker starting", "slots", w.cfg.Slots, "lease", w.cfg.Lease,
		"heartbeat", w.cfg.HeartbeatInterval, "reclaim_interval", w.cfg.ReclaimInterval,
		"retain_succeeded", retention(w.cfg.RetainSucceeded), "retain_dead", retention(w.cfg.RetainDead),
		"retain_cancelled", retention(w.cfg.RetainCancelled))

	// Background loops outlive ctx until the drain below is done: leases
	// must still be renewed while running handlers finish. A fatal error
	// of the session (the worker id taken by another live process) stops
	// the worker as a cancelled ctx would.
	runCtx, stopRun := context.WithCancelCause(ctx)
	defer stopRun(nil)
	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	firstSession := make(chan error, 1)
	var wg sync.WaitGroup
	for _, loop := range []func(context.Context){
		func(ctx context.Context) { w.session.run(ctx, firstSession, stopRun) },
		heartbeater{w: w}.run,
		reclaimer{w: w}.run,
		pruner{w: w}.run,
		statistician{w: w}.run,
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			loop(bg)
		}()
	}

	// A worker whose id is taken stops before it claims anything.
	select {
	case err := <-firstSession:
		var inUse *IDInUseError
		if errors.As(err, &inUse) {
			stopBackground()
			wg.Wait()
			return err
		}
	case <-ctx.Done():
	}

	d := &dispatcher{w: w}
	d.dispatch(runCtx)
	d.drain(bg)

	stopBackground()
	wg.Wait()
	var inUse *IDInUseError
	if err := context.Cause(runCtx); errors.As(err, &inUse) {
		return err
	}
	w.log.Info("worker stopped")
	return nil
}

// unhold forgets e, unless a newer claim of the same job has taken its
// place in held: an attempt whose lease was lost may outlive it, while this
// worker runs the job's next attempt. w.mu must be held.
func (w *Worker) unhold(e *execution) {
	if w.held[e.job.ID] == e {
		delete(w.held, e.job.ID)
	}
}

// stillHolding counts the executions of execs the worker still holds: not
// superseded by a newer claim of the same job.
func (w *Worker) stillHolding(execs []*execution) int {
	if len(execs) == 0 {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, e := range execs {
		if w.held[e.job.ID] == e {
			n++
		}
	}
	return n
}

// holding returns how many jobs the worker holds, how many of them wait for
// a slot, and when the oldest of those was claimed. The jobs that slots
// just started are about to take do not wait for one.
func (w *Worker) holding() (held, waiting int, oldest time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	taken := w.takenAhead()
	if len(w.ahead) > taken {
		oldest = w.ahead[taken].claimedAt
	}
	return len(w.held), len(w.ahead) - taken, oldest
}

// takenAhead counts the jobs at the head of ahead that the slots started
// and not yet running take first. w.mu must be held.
func (w *Worker) takenAhead() int { return min(w.slotsStarting, len(w.ahead)) }

// nextForSlot marks done, the job whose handler the slot ran last (nil at
// first), returned, and returns the next job waiting for a slot, marked
// started, or nil when none is waiting or the worker is stopping, in which
// case the slot ends.
func (w *Worker) nextForSlot(done *execution) *execution {
	w.mu.Lock()
	defer w.mu.Unlock()
	if done != nil {
		done.returned = true
	} else {
		w.slotsStarting--
	}
	if w.stopping || len(w.ahead) == 0 {
		w.slotsBusy--
		return nil
	}
	e := w.ahead[0]
	w.ahead[0] = nil
	w.ahead = w.ahead[1:]
	w.running[e] = true
	return e
}

// numStarted returns how many jobs were started and their outcomes not yet
// collected.
func (w *Worker) numStarted() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.running)
}

// report tells Config.OnAck what became of o. A panic in OnAck is
// logged, and the worker goes on: the outcome is already recorded or
// dropped, and a callback's bug must not end the process that holds other
// jobs' leases. Nor does an OnAck that ends its goroutine (see
// callContained).
func (w *Worker) report(o outcome, kind Outcome, accepted bool) {
	if w.cfg.OnAck == nil {
		return
	}
	job := o.exec.job
	ack := Ack{Job: &job, Outcome: kind, Accepted: accepted, InDoubt: !accepted && o.exec.unanswered, Err: o.err}
	switch c := callContained(func() { w.cfg.OnAck(ack) }); {
	case c.panic != nil:
		w.log.Error("OnAck panicked; the worker carries on", "job", job.ID, "outcome", kind,
			"panic", fmt.Sprint(c.panic.value), "stack", string(c.panic.stack))
	case c.exited:
		w.log.Error("OnAck exited its goroutine (runtime.Goexit) without returning; the worker carries on",
			"job", job.ID, "outcome", kind)
	}
}

// backoff returns how long the retry that follows job's failed attempt
// waits: Config.Backoff's answer, or DefaultBackoff's if Backoff panics or
// ends its goroutine (see callContained), which is logged, so that the
// failure is recorded all the same. A negative answer waits not at all:
// a run_at before the failure would put the retry ahead of jobs that have
// waited longer.
func (w *Worker) backoff(job Job) time.Duration {
	w.backoffMu.Lock()
	defer w.backoffMu.Unlock()
	var d time.Duration
	switch c := callContained(func() { d = w.cfg.Backoff(job.Attempt) }); {
	case c.panic != nil:
		w.log.Error("Backoff panicked; the retry waits DefaultBackoff", "job", job.ID, "attempt", job.Attempt,
			"panic", fmt.Sprint(c.panic.value), "stack", string(c.panic.stack))
		return DefaultBackoff(job.Attempt)
	case c.exited:
		w.log.Error("Backoff exited its goroutine (runtime.Goexit) without returning; the retry waits DefaultBackoff",
			"job", job.ID, "attempt", job.Attempt)
		return DefaultBackoff(job.Attempt)
	}
	return max(d, 0)
}

// contained is how a call of callContained ended: with a panic, or with
// runtime.Goexit, or else, both zero, by returning.
type contained struct {
	panic  *caught
	exited bool
}

// callContained calls f, a callback of the application's, on a goroutine
// of its own, and waits for it to end. A panic in f is recovered (see
// protect), and an f that ends its goroutine with runtime.Goexit (as
// testing.T.FailNow does), which nothing can stop, ends that goroutine
// alone: called on the worker's, it would end the dispatcher, or a round,
// and leave the leases it holds renewed by heartbeats for ever.
func callContained(f func()) (c contained) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		protected := false
		defer func() { c.exited = !protected }()
		c.panic = protect(f)
		protected = true
	}()
	<-done
	return c
}

// notify signals c without blocking; one pending signal is enough.
func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// fleetSize is how many live workers share the fleet's duties, as last
// counted: at least this one.
func (w *Worker) fleetSize() int32 { return max(w.fleet.Load(), 1) }

// jobReturned records that a job of the worker's queue went back to
// available: it may wait behind the claim cursors, so the next claim
// starts from the head, and a claim that comes back short soon after
// looks again (dispatcher.recheckReturned).
func (w *Worker) jobReturned() {
	w.cursors.fromHead()
	w.returned.Store(time.Now().UnixNano())
}

// pollEvery is how long the worker waits between two polls for jobs no
// notification announced: PollInterval; while notifications tell it of new
// jobs, in a fleet of more than fleetShare live workers on its queue,
// longer in proportion to the fleet, so that the workers told of new
// jobs poll the queue together at most as often as fleetShare workers
// would (as often, when every worker is told). A worker that is not told polls at
// PollInterval, since polls are then how it finds every new job.
func (w *Worker) pollEvery() time.Duration {
	if !w.session.told() {
		return w.cfg.PollInterval
	}
	return fleetInterval(w.cfg.PollInterval, max(w.queueFleet.Load(), 1))
}

// jitter spreads d by ±20% so that many workers do not act in lockstep,
// up to the largest time.Duration: a longer one would wrap around to a
// negative one, which a timer takes as no wait at all.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	spread := d / 5
	if spread <= 0 {
		return d
	}
	off := rand.N(2*spread) - spread
	if off > 0 && d > math.MaxInt64-off {
		return math.MaxInt64
	}
	return d + off
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
