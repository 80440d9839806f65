package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/builtin"
	"github.com/relayq/relay/worker"
)

// The job kinds a chaos worker adds to the built-in ones (hash, sleep, fail,
// noop). Every payload is a JSON object; an unknown field fails the job
// permanently. Errors and panics name the claim's fence ("fence=N") so that
// the checker can tell which claim a recorded failure came from.
const (
	// KindPanic panics on every attempt: it must end dead after
	// max_attempts claims. Payload {}.
	KindPanic = "chaos_panic"
	// KindFail fails on every attempt with an ordinary, retryable
	// error: it must end dead after max_attempts claims, each retry after
	// its backoff. Payload {}.
	KindFail = "chaos_fail"
	// KindExit kills its own worker process (os.Exit with
	// ExitCode) on every attempt, after recording a self_exit fault:
	// it must end dead after max_attempts claims. Payload {}.
	KindExit = "chaos_exit"
	// KindHoldConns acquires every connection of the handlers' pool
	// and holds them for hold_ms: heartbeats, which use the worker's own
	// pool, must go on. Payload {"hold_ms": 1000}.
	KindHoldConns = "chaos_hold_conns"
	// KindFlaky waits Millis, then fails while its attempt is at most
	// fail_attempts, and succeeds after. Payload {"Millis": 100,
	// "fail_attempts": 1}.
	KindFlaky = "chaos_flaky"
)

// ExitCode is the status a chaos worker exits with when a chaos_exit
// job kills it.
const ExitCode = 3

// DefaultHandlerPoolSize is the size of a chaos worker's handlers'
// pool, the one chaos_hold_conns exhausts.
const DefaultHandlerPoolSize = 2

// WorkerConfig configures one chaos worker process: the standard
// worker library with the built-in handlers and the chaos kinds, every
// execution recorded in the run's database.
type WorkerConfig struct {
	// DatabaseURL is what the worker's own connections use: its statements,
	// its session, and its handlers' pool. In the partition scenario it
	// points at a fault proxy.
	DatabaseURL string
	// RecordURL is where executions and self-inflicted faults are recorded,
	// directly, never through a proxy. Default: DatabaseURL.
	RecordURL string
	// HandlerPoolSize is the size of the pool handlers use (and
	// chaos_hold_conns exhausts), separate from the worker's.
	// Default: DefaultHandlerPoolSize.
	HandlerPoolSize int
	// Worker configures the worker. ID is required: the worker's
	// connections are named relay-worker-<ID> (application_name), which is
	// how the backend-kill scenario finds them. RunWorker sets its
	// OnAck (to record acknowledgements) and its Logger (to Logger below),
	// replacing any given.
	Worker worker.Config
	// Logger receives the logs. Default: slog.Default().
	Logger *slog.Logger
}

// connectTimeout bounds each connection attempt of a chaos worker's
// pools, whose database may be out of reach (a blackhole never answers).
const connectTimeout = 5 * time.Second

// recordTimeout bounds one statement of the execution record.
const recordTimeout = 5 * time.Second

// RunWorker runs a chaos worker until ctx is cancelled, then shuts it
// down gracefully (as worker.Run does), flushes its record and returns.
func RunWorker(ctx context.Context, cfg WorkerConfig) error {
	if cfg.Worker.ID == "" {
		return errors.New("chaos worker: an id is required")
	}
	if cfg.DatabaseURL == "" {
		return errors.New("chaos worker: a database URL is required")
	}
	if cfg.RecordURL == "" {
		cfg.RecordURL = cfg.DatabaseURL
	}
	if cfg.HandlerPoolSize <= 0 {
		cfg.HandlerPoolSize = DefaultHandlerPoolSize
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	id := cfg.Worker.ID

	// Its connections keep their plans as relay work's do.
	workerPool, err := harness.OpenPool(ctx, cfg.DatabaseURL, "relay-worker-"+id, 0, connectTimeout, worker.KeepGenericPlans)
	if err != nil {
		return fmt.Errorf("chaos worker: worker pool: %w", err)
	}
	defer workerPool.Close()
	handlerPool, err := harness.OpenPool(ctx, cfg.DatabaseURL, "relay-handlers-"+id, int32(cfg.HandlerPoolSize), connectTimeout)
	if err != nil {
		return fmt.Errorf("chaos worker: handlers' pool: %w", err)
	}
	defer handlerPool.Close()
	recordPool, err := harness.OpenPool(ctx, cfg.RecordURL, "relay-chaos-record-"+id, 4, connectTimeout)
	if err != nil {
		return fmt.Errorf("chaos worker: record pool: %w", err)
	}
	defer recordPool.Close()

	rec := newRecorder(labdb.New(recordPool), id, cfg.Logger)
	recDone := make(chan struct{})
	recCtx, stopRecorder := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(recDone)
		rec.run(recCtx)
	}()

	wcfg := cfg.Worker
	wcfg.Logger = cfg.Logger
	wcfg.OnAck = rec.ack
	w, err := worker.New(workerPool, wcfg)
	if err != nil {
		stopRecorder()
		<-recDone
		return fmt.Errorf("chaos worker: %w", err)
	}
	for kind, h := range builtin.Handlers() {
		w.Handle(kind, rec.wrap(h))
	}
	k := &kindHandlers{rec: rec, handlers: handlerPool, log: cfg.Logger, acquiring: make(chan struct{}, 1)}
	w.Handle(KindPanic, rec.wrap(worker.HandlerFunc(k.panic)))
	w.Handle(KindFail, rec.wrap(worker.HandlerFunc(k.fail)))
	w.Handle(KindExit, rec.wrap(worker.HandlerFunc(k.exit)))
	w.Handle(KindHoldConns, rec.wrap(worker.HandlerFunc(k.holdConns)))
	w.Handle(KindFlaky, rec.wrap(worker.HandlerFunc(k.flaky)))

	runErr := w.Run(ctx)
	stopRecorder()
	<-recDone
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*recordTimeout)
	defer cancel()
	flushErr := rec.flushAll(flushCtx)
	if runErr != nil {
		return fmt.Errorf("chaos worker: %w", runErr)
	}
	if flushErr != nil {
		return fmt.Errorf("chaos worker: record: %w", flushErr)
	}
	return nil
}

// recorder writes the record of a chaos worker's executions: the
// start of each synchronously, before the handler does anything, and its
// end and acknowledgement in batches, in the background, retried until
// they are written (the database may be restarting).
type recorder struct {
	q      *labdb.Queries
	worker string
	pid    int
	log    *slog.Logger

	mu   sync.Mutex
	ends []execEnd
	acks []execAck
	kick chan struct{}
}

type execEnd struct {
	jobID, fence int64
	at           time.Time
	outcome      string
	cause        string
}

type execAck struct {
	jobID, fence int64
	ack          string
	accepted     bool
	at           time.Time
}

// flushEvery is how often a chaos worker writes its pending
// records.
const flushEvery = 25 * time.Millisecond

func newRecorder(q *labdb.Queries, workerID string, logger *slog.Logger) *recorder {
	return &recorder{q: q, worker: workerID, pid: os.Getpid(), log: logger, kick: make(chan struct{}, 1)}
}

// start records that job's handler starts. It retries until the record is
// written or ctx (the handler's) ends: an execution is never run without
// being recorded first.
func (r *recorder) start(ctx context.Context, job *worker.Job) error {
	delay := 20 * time.Millisecond
	for {
		sctx, cancel := context.WithTimeout(ctx, recordTimeout)
		err := r.q.ChaosExecutionStart(sctx, labdb.ChaosExecutionStartParams{
			JobID:   job.ID,
			Kind:    job.Kind,
			Attempt: int32(job.Attempt),
			Fence:   job.Fence,
			Worker:  r.worker,
			PID:     int32(r.pid),
		})
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("record the start of job %d (fence %d): %w", job.ID, job.Fence, context.Cause(ctx))
		}
		r.log.Warn("recording an execution's start failed; retrying", "job", job.ID, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// wrap records every execution of h: its start before h runs, its end
// (and, if its context was cancelled, why) when h returns or panics.
func (r *recorder) wrap(h worker.Handler) worker.Handler {
	return worker.HandlerFunc(func(ctx context.Context, job *worker.Job) (any, error) {
		if err := r.start(ctx, job); err != nil {
			return nil, err
		}
		outcome := "panic" // unless h returns
		defer func() {
			cause := ""
			if ctx.Err() != nil {
				cause = context.Cause(ctx).Error()
			}
			r.mu.Lock()
			r.ends = append(r.ends, execEnd{jobID: job.ID, fence: job.Fence, at: time.Now(), outcome: outcome, cause: cause})
			r.mu.Unlock()
			notify(r.kick)
		}()
		res, err := h.Work(ctx, job)
		outcome = "ok"
		if err != nil {
			outcome = "error"
		}
		return res, err
	})
}

// ack is the worker's OnAck: it files the acknowledgement's fate, without
// blocking, for the background writer.
func (r *recorder) ack(a worker.Ack) {
	r.mu.Lock()
	r.acks = append(r.acks, execAck{jobID: a.Job.ID, fence: a.Job.Fence, ack: string(a.Outcome), accepted: a.Accepted, at: time.Now()})
	r.mu.Unlock()
	notify(r.kick)
}

// run writes pending records until ctx is cancelled.
func (r *recorder) run(ctx context.Context) {
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-r.kick:
			// Let a few more arrive, then write them together.
			select {
			case <-ctx.Done():
				return
			case <-time.After(flushEvery / 5):
			}
		}
		if err := r.flush(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("recording executions failed; will retry", "err", err)
		}
	}
}

// flushAll writes everything pending, retrying until ctx ends.
func (r *recorder) flushAll(ctx context.Context) error {
	for {
		err := r.flush(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("flush the execution record: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// flush writes what is pending; what fails to be written stays pending.
func (r *recorder) flush(ctx context.Context) error {
	r.mu.Lock()
	ends, acks := r.ends, r.acks
	r.ends, r.acks = nil, nil
	r.mu.Unlock()
	if len(ends) == 0 && len(acks) == 0 {
		return nil
	}
	var errs []error
	if len(ends) > 0 {
		p := labdb.ChaosExecutionsEndParams{}
		for _, e := range ends {
			p.JobIDs = append(p.JobIDs, e.jobID)
			p.Fences = append(p.Fences, e.fence)
			p.EndedAts = append(p.EndedAts, e.at)
			p.Outcomes = append(p.Outcomes, e.outcome)
			p.Causes = append(p.Causes, e.cause)
		}
		sctx, cancel := context.WithTimeout(ctx, recordTimeout)
		err := r.q.ChaosExecutionsEnd(sctx, p)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("record %d execution ends: %w", len(ends), err))
			r.mu.Lock()
			r.ends = append(ends, r.ends...)
			r.mu.Unlock()
		}
	}
	if len(acks) > 0 {
		p := labdb.ChaosExecutionsAckParams{}
		for _, a := range acks {
			p.JobIDs = append(p.JobIDs, a.jobID)
			p.Fences = append(p.Fences, a.fence)
			p.Acks = append(p.Acks, a.ack)
			p.Accepted = append(p.Accepted, a.accepted)
			p.AckedAts = append(p.AckedAts, a.at)
		}
		sctx, cancel := context.WithTimeout(ctx, recordTimeout)
		err := r.q.ChaosExecutionsAck(sctx, p)
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("record %d acknowledgements: %w", len(acks), err))
			r.mu.Lock()
			r.acks = append(acks, r.acks...)
			r.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}

// notify signals c without blocking.
func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// kindHandlers implements the chaos job kinds.
type kindHandlers struct {
	rec      *recorder
	handlers *pgxpool.Pool
	log      *slog.Logger
	// acquiring is held while one chaos_hold_conns job takes the whole
	// pool, so that two of them never hold half of it each, waiting for
	// each other forever.
	acquiring chan struct{}
}

func (k *kindHandlers) panic(_ context.Context, job *worker.Job) (any, error) {
	if err := builtin.DecodePayload(job, &struct{}{}); err != nil {
		return nil, err
	}
	panic(fmt.Sprintf("chaos_panic: deliberate panic (fence=%d)", job.Fence))
}

func (k *kindHandlers) fail(_ context.Context, job *worker.Job) (any, error) {
	if err := builtin.DecodePayload(job, &struct{}{}); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("chaos_fail: deliberate failure (fence=%d)", job.Fence)
}

// exit records a self_exit fault, then ends the process at once, as a
// crash would: no deferred function runs, nothing is flushed or released.
func (k *kindHandlers) exit(ctx context.Context, job *worker.Job) (any, error) {
	if err := builtin.DecodePayload(job, &struct{}{}); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		rctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := k.rec.q.ChaosFaultRecord(rctx, labdb.ChaosFaultRecordParams{
			Kind:   "self_exit",
			Target: k.rec.worker,
			PID:    int32(k.rec.pid),
			Detail: fmt.Sprintf("job %d attempt %d (fence=%d) exits with status %d", job.ID, job.Attempt, job.Fence, ExitCode),
		})
		cancel()
		if err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	k.log.Warn("chaos_exit: exiting on purpose", "job", job.ID, "attempt", job.Attempt, "fence", job.Fence)
	os.Exit(ExitCode)
	return nil, nil
}

// HoldConnsPayload is the payload of a chaos_hold_conns job.
type HoldConnsPayload struct {
	// HoldMs is how long to hold the connections once all are taken.
	HoldMs int64 `json:"hold_ms"`
}

func (k *kindHandlers) holdConns(ctx context.Context, job *worker.Job) (any, error) {
	var p HoldConnsPayload
	if err := builtin.DecodePayload(job, &p); err != nil {
		return nil, err
	}
	if p.HoldMs < 0 || p.HoldMs > builtin.MaxSleepMs {
		return nil, worker.Permanent(fmt.Errorf("chaos_hold_conns: hold_ms must be between 0 and %d", builtin.MaxSleepMs))
	}
	n := int(k.handlers.Config().MaxConns)
	held := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	select {
	case k.acquiring <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("chaos_hold_conns: wait for the pool (fence=%d): %w", job.Fence, context.Cause(ctx))
	}
	for range n {
		c, err := k.handlers.Acquire(ctx)
		if err != nil {
			<-k.acquiring
			return nil, fmt.Errorf("chaos_hold_conns: acquire connection %d of %d (fence=%d): %w", len(held)+1, n, job.Fence, err)
		}
		held = append(held, c)
	}
	<-k.acquiring
	if err := builtin.Sleep(ctx, time.Duration(p.HoldMs)*time.Millisecond); err != nil {
		return nil, fmt.Errorf("chaos_hold_conns: interrupted (fence=%d): %w", job.Fence, err)
	}
	return builtin.NewResult(job), nil
}

// FlakyPayload is the payload of a chaos_flaky job.
type FlakyPayload struct {
	// Ms is how long to wait before returning.
	Ms int64 `json:"ms"`
	// FailAttempts is how many attempts fail, from the first (default 1).
	FailAttempts int64 `json:"fail_attempts"`
}

func (k *kindHandlers) flaky(ctx context.Context, job *worker.Job) (any, error) {
	p := FlakyPayload{FailAttempts: 1}
	if err := builtin.DecodePayload(job, &p); err != nil {
		return nil, err
	}
	if p.Ms < 0 || p.Ms > builtin.MaxSleepMs {
		return nil, worker.Permanent(fmt.Errorf("chaos_flaky: ms must be between 0 and %d", builtin.MaxSleepMs))
	}
	if err := builtin.Sleep(ctx, time.Duration(p.Ms)*time.Millisecond); err != nil {
		return nil, fmt.Errorf("chaos_flaky: interrupted (fence=%d): %w", job.Fence, err)
	}
	if int64(job.Attempt) <= p.FailAttempts {
		return nil, fmt.Errorf("chaos_flaky: attempt %d fails as asked (fence=%d)", job.Attempt, job.Fence)
	}
	return builtin.NewResult(job), nil
}
