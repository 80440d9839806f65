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
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/jsonb"
)

// Worker runs handlers for the jobs of one queue. Create it with New,
// register handlers with Handle, then call Run.
type Worker struct {
	pool *pgxpool.Pool
	q    *db.Queries
	cfg  Config
	log  *slog.Logger

	handlersMu sync.RWMutex
	handlers   map[string]Handler

	// sessionConfig opens the session connection: Config.SessionDatabaseURL,
	// or the pool's own settings.
	sessionConfig *pgx.ConnConfig
	session       session

	started  atomic.Bool
	wake     chan struct{} // a claim may find work
	beatNow  chan struct{} // renew leases now, without waiting for the ticker
	outcomes chan outcome
	mu       sync.Mutex
	// held holds every job this worker holds a lease on, from its claim
	// until its outcome is collected: those claimed ahead and waiting for
	// a slot, and those started.
	held map[int64]*execution
	// ahead lists the held jobs waiting for a slot, oldest claim first.
	ahead []*execution
	// startedJobs counts the held jobs started and not yet collected.
	startedJobs int
	// slotsBusy counts the slot goroutines running; at most Slots.
	slotsBusy int
	// stopping keeps slots from starting jobs once shutdown began.
	stopping bool
}

// execution is one claimed job, from its claim until its outcome is known.
type execution struct {
	job    Job
	token  uuid.UUID
	ctx    context.Context
	cancel context.CancelCauseFunc
	// renewedAt is when the statement behind the latest successful claim or
	// renewal was sent, by this process's monotonic clock. It never decides
	// whether an acknowledgement is accepted (the database does); it lets a
	// worker that cannot reach the database stop handlers whose leases have
	// surely run out.
	renewedAt time.Time
	// claimedAt is when the claim came back, by the same clock.
	claimedAt time.Time
	// lost is set, under Worker.mu, once the lease is known lost or the
	// job released: the outcome is then dropped, never written.
	lost bool
}

type outcome struct {
	exec   *execution
	result json.RawMessage
	err    error
	// ran is how long the handler took; negative when it never ran.
	ran time.Duration
}

// New returns a Worker that uses pool for its statements, and a connection
// of its own, opened with pool's settings, for its session and
// notifications. Give the worker a pool its handlers do not use, so that
// handlers holding connections can never starve its heartbeats.
func New(pool *pgxpool.Pool, cfg Config) (*Worker, error) {
	if pool == nil {
		return nil, errors.New("worker: nil pool")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	sessionConfig := pool.Config().ConnConfig.Copy()
	if cfg.SessionDatabaseURL != "" {
		if sessionConfig, err = pgx.ParseConfig(cfg.SessionDatabaseURL); err != nil {
			return nil, fmt.Errorf("worker config: invalid session database URL: %w", err)
		}
	}
	// The session's few statements run as unnamed statements, each in one
	// round trip, so that they work, and find out, when the connection
	// goes through a transaction-mode pooler, where a prepared statement
	// may not outlive its transaction.
	sessionConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	return &Worker{
		pool:          pool,
		sessionConfig: sessionConfig,
		q:             db.New(pool),
		cfg:           cfg,
		log:           cfg.Logger.With("worker", cfg.ID, "queue", cfg.Queue),
		handlers:      map[string]Handler{},
		wake:          make(chan struct{}, 1),
		beatNow:       make(chan struct{}, 1),
		// One outcome per held job at most, so sending never blocks.
		outcomes: make(chan outcome, cfg.Slots+max(cfg.Prefetch, 0)),
		held:     map[int64]*execution{},
	}, nil
}

// ID returns the worker's id, as recorded in leases and error histories.
func (w *Worker) ID() string { return w.cfg.ID }

// Config returns the worker's configuration with defaults applied.
func (w *Worker) Config() Config { return w.cfg }

// Handle registers h for jobs of the given kind, replacing any handler
// registered for it before. A job whose kind has no handler fails
// permanently.
func (w *Worker) Handle(kind string, h Handler) {
	w.handlersMu.Lock()
	defer w.handlersMu.Unlock()
	w.handlers[kind] = h
}

// HandleFunc registers f for jobs of the given kind.
func (w *Worker) HandleFunc(kind string, f func(ctx context.Context, job *Job) (any, error)) {
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
func (w *Worker) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("worker: Run called more than once")
	}
	w.log.Info("worker starting", "slots", w.cfg.Slots, "lease", w.cfg.Lease,
		"heartbeat", w.cfg.HeartbeatInterval, "reclaim_interval", w.cfg.ReclaimInterval)

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
		func(ctx context.Context) { w.runSession(ctx, firstSession, stopRun) },
		w.runHeartbeats,
		w.runReclaims,
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

// runSlot is one slot: it runs the first job waiting for a slot, then the
// next, as long as jobs are waiting, so that a job claimed ahead starts the
// moment the one before it returns. It hands each outcome to the
// dispatcher.
func (w *Worker) runSlot() {
	e := w.nextForSlot()
	for e != nil {
		o := w.execute(e)
		e = w.nextForSlot()
		// The channel holds an outcome for every job held, so this never
		// blocks.
		w.outcomes <- o
	}
}

// nextForSlot returns the next job waiting for a slot, marked started, or
// nil when none is waiting or the worker is stopping, in which case the slot
// ends.
func (w *Worker) nextForSlot() *execution {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopping || len(w.ahead) == 0 {
		w.slotsBusy--
		return nil
	}
	e := w.ahead[0]
	w.ahead[0] = nil
	w.ahead = w.ahead[1:]
	w.startedJobs++
	return e
}

// execute runs one job's handler, unless its lease was lost or someone
// cancelled it while it waited for a slot, and returns its outcome.
func (w *Worker) execute(e *execution) outcome {
	if e.ctx.Err() != nil {
		return outcome{exec: e, err: context.Cause(e.ctx), ran: -1}
	}
	began := time.Now()
	result, err := w.call(e)
	o := outcome{exec: e, err: err, ran: time.Since(began)}
	if err == nil && result != nil {
		o.result, o.err = w.encodeResult(result)
	}
	return o
}

// encodeResult encodes a handler's result for the database. A result that
// cannot be stored fails its job permanently, here, before it is sent: in
// a batch acknowledgement it would make the database refuse the others.
func (w *Worker) encodeResult(result any) (json.RawMessage, error) {
	b, err := json.Marshal(result)
	if err != nil {
		return nil, Permanent(fmt.Errorf("encode result: %w", err))
	}
	if limit := w.cfg.MaxResultBytes; limit > 0 && len(b) > limit {
		return nil, Permanent(fmt.Errorf("result is %d bytes encoded, more than the %d allowed (Config.MaxResultBytes)", len(b), limit))
	}
	if err := jsonb.Check(b); err != nil {
		return nil, Permanent(fmt.Errorf("%s: %w", errResultNotStorable, err))
	}
	return b, nil
}

// errResultNotStorable begins the error of a job whose result PostgreSQL's
// jsonb cannot hold.
const errResultNotStorable = "result is not storable as jsonb"

// call runs the handler, turning a panic or a missing handler into an error.
func (w *Worker) call(e *execution) (result any, err error) {
	h, ok := w.handler(e.job.Kind)
	if !ok {
		return nil, Permanent(fmt.Errorf("no handler registered for kind %q", e.job.Kind))
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("handler panicked: %v\n%s", r, debug.Stack())
			result = nil
		}
	}()
	job := e.job
	result, err = h.Work(e.ctx, &job)
	if err == nil && e.ctx.Err() != nil && context.Cause(e.ctx) == ErrJobCancelled {
		// A handler that swallowed its cancellation still ends cancelled.
		err = ErrJobCancelled
	}
	return result, err
}

// drain runs after dispatch, which stopped slots from starting jobs: it
// hands back the jobs claimed ahead, acknowledges what finishes within the
// grace period, then releases the rest.
func (d *dispatcher) drain(ctx context.Context) {
	w := d.w
	w.mu.Lock()
	d.p.toHandBack = append(d.p.toHandBack, w.ahead...)
	w.ahead = nil
	w.mu.Unlock()
	d.acknowledgeAtShutdown(ctx)
	grace := time.NewTimer(max(w.cfg.ShutdownGrace, 0))
	defer grace.Stop()
	if n := w.numStarted(); n > 0 {
		w.log.Info("waiting for running jobs", "running", n, "grace", w.cfg.ShutdownGrace)
	}
	for w.numStarted() > 0 {
		select {
		case o := <-w.outcomes:
			d.collect(o)
			d.acknowledgeAtShutdown(ctx)
			continue
		case <-grace.C:
		}
		break
	}
	d.acknowledgeAtShutdown(ctx)
	w.release(ctx)
}

// numStarted returns how many jobs were started and their outcomes not yet
// collected.
func (w *Worker) numStarted() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.startedJobs
}

func (d *dispatcher) acknowledgeAtShutdown(ctx context.Context) {
	for attempt := 0; (!d.p.empty() || len(d.lostClaims) > 0) && attempt < 3; attempt++ {
		r := d.newRound(0)
		d.w.acknowledge(ctx, r)
		d.finish(r)
		if r.err != nil {
			d.w.log.Warn("acknowledge at shutdown failed", "err", r.err)
			time.Sleep(minRetryDelay)
		}
	}
}

// releaseNote is what a release at shutdown adds to a job's error history.
const releaseNote = "released: worker shutting down"

// release cancels the handlers still running and hands their jobs back.
func (w *Worker) release(ctx context.Context) {
	w.mu.Lock()
	var left []*execution
	for _, e := range w.held {
		if !e.lost {
			e.lost = true
			left = append(left, e)
		}
		e.cancel(ErrShutdown)
	}
	w.mu.Unlock()
	if len(left) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatInterval)
	defer cancel()
	note := releaseNote
	released, err := w.handBack(ctx, left, &note)
	if err != nil {
		w.log.Warn("release failed; the jobs will be reclaimed when this worker's session ends", "err", err, "jobs", len(left))
		return
	}
	for _, e := range left {
		w.log.Info("released job", "job", e.job.ID, "accepted", released[e.job.ID])
		w.report(outcome{exec: e, err: ErrShutdown}, OutcomeReleased, released[e.job.ID])
	}
}

// runHeartbeats renews every held lease together, every HeartbeatInterval,
// and cancels the handlers whose lease was lost or whose job was cancelled.
func (w *Worker) runHeartbeats(ctx context.Context) {
	t := time.NewTicker(w.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.beatNow:
		}
		w.heartbeat(ctx)
	}
}

func (w *Worker) heartbeat(ctx context.Context) {
	w.mu.Lock()
	held := make([]*execution, 0, len(w.held))
	for _, e := range w.held {
		if !e.lost {
			held = append(held, e)
		}
	}
	w.mu.Unlock()
	if len(held) == 0 {
		return
	}
	params := db.JobHeartbeatManyParams{
		LeaseMs: w.cfg.Lease.Milliseconds(),
		IDs:     make([]int64, len(held)),
		Tokens:  make([]uuid.UUID, len(held)),
	}
	for i, e := range held {
		params.IDs[i] = e.job.ID
		params.Tokens[i] = e.token
	}
	sentAt := time.Now()
	hbCtx, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatInterval)
	rows, err := w.q.JobHeartbeatMany(hbCtx, params)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		w.log.Warn("heartbeat failed", "err", err, "jobs", len(held))
		// The database cannot tell us, but our own clock can: a lease not
		// renewed for a whole lease period has expired.
		for _, e := range held {
			if time.Since(e.renewedAt) >= w.cfg.Lease {
				w.lose(e, "lease ran out while the database was unreachable")
			}
		}
		return
	}
	renewed := make(map[int64]bool, len(rows))
	cancelled := make(map[int64]bool)
	for _, r := range rows {
		renewed[r.ID] = true
		if r.CancelRequested {
			cancelled[r.ID] = true
		}
	}
	for _, e := range held {
		switch {
		case !renewed[e.job.ID]:
			w.lose(e, "heartbeat rejected")
		case cancelled[e.job.ID]:
			w.mu.Lock()
			e.renewedAt = sentAt
			w.mu.Unlock()
			e.cancel(ErrJobCancelled)
		default:
			w.mu.Lock()
			e.renewedAt = sentAt
			w.mu.Unlock()
		}
	}
}

// lose marks e's lease lost and cancels its handler; its outcome will be
// dropped.
func (w *Worker) lose(e *execution, why string) {
	w.mu.Lock()
	stillHeld := w.held[e.job.ID] == e
	already := e.lost
	if stillHeld {
		e.lost = true
	}
	w.mu.Unlock()
	if !stillHeld || already {
		return
	}
	w.log.Warn("lease lost; cancelling handler", "job", e.job.ID, "attempt", e.job.Attempt, "why", why)
	e.cancel(ErrLeaseLost)
}

// runReclaims takes back the jobs of dead workers and expired leases every
// ReclaimInterval (longer in a large fleet, see reclaimInterval), and now
// and then forgets workers that are gone.
func (w *Worker) runReclaims(ctx context.Context) {
	live := 1
	for round := 0; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(reclaimInterval(w.cfg.ReclaimInterval, live))):
		}
		for {
			n, err := w.reclaim(ctx)
			if err != nil || n < DefaultReclaimBatch {
				break
			}
		}
		if round%forgetWorkersEvery == 0 {
			rctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
			if _, err := w.q.WorkerForgetEnded(rctx); err != nil && ctx.Err() == nil {
				w.log.Warn("forget ended worker sessions failed", "err", err)
			}
			if n, err := w.q.WorkerSessionsLiveCount(rctx); err == nil {
				live = int(n)
			}
			cancel()
		}
	}
}

// forgetWorkersEvery is how many reclaim rounds pass between two clean-ups
// of the sessions that ended.
const forgetWorkersEvery = 40

// reclaimersPerInterval is how many reclaims a fleet of workers makes, in
// all, per ReclaimInterval once it has more workers than that.
const reclaimersPerInterval = 16

// reclaimInterval is how long one worker of a fleet of live workers waits
// between two reclaims: base while the fleet is small; in a larger one,
// longer in proportion, so that the fleet as a whole still reclaims
// reclaimersPerInterval times per base (a dead worker's jobs come back
// about as fast) while the database runs a constant number of reclaim
// statements per second instead of one per worker, each of which reads
// every lock of the server.
func reclaimInterval(base time.Duration, live int) time.Duration {
	if live <= reclaimersPerInterval {
		return base
	}
	return base * time.Duration(live) / reclaimersPerInterval
}

func (w *Worker) reclaim(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	rows, err := w.q.JobReclaim(ctx, DefaultReclaimBatch)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("reclaim failed", "err", err)
		}
		return 0, err
	}
	for _, r := range rows {
		w.log.Info("reclaimed job", "job", r.ID, "reason", deref(r.LastError),
			"from_worker", deref(r.LeasedBy), "attempt", r.Attempt, "now", r.State)
	}
	if len(rows) > 0 {
		notify(w.wake)
	}
	return len(rows), nil
}

func (w *Worker) report(o outcome, kind Outcome, accepted bool) {
	if w.cfg.OnAck == nil {
		return
	}
	job := o.exec.job
	w.cfg.OnAck(Ack{Job: &job, Outcome: kind, Accepted: accepted, Err: o.err})
}

// notify signals c without blocking; one pending signal is enough.
func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// jitter spreads d by ±20% so that many workers do not act in lockstep.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	spread := d / 5
	if spread <= 0 {
		return d
	}
	return d - spread + rand.N(2*spread)
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

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
