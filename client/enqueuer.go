package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
)

// DefaultAnnounceEvery is how far apart an Enqueuer spaces the
// notifications of the jobs it stores (EnqueuerConfig.AnnounceEvery): from
// the start of one notifying statement to the next.
const DefaultAnnounceEvery = 2 * time.Millisecond

// DefaultStoreTimeout bounds each statement an Enqueuer runs for its
// callers (EnqueuerConfig.StoreTimeout).
const DefaultStoreTimeout = 10 * time.Second

// EnqueuerConfig configures an Enqueuer. Its zero value is the defaults.
type EnqueuerConfig struct {
	// AnnounceEvery spaces the notifications that tell workers of the
	// jobs stored, whatever their queues: a group whose statement begins
	// sooner than AnnounceEvery after the latest notifying statement
	// began is announced, with the others stored meanwhile, AnnounceEvery
	// after that. Zero means DefaultAnnounceEvery; less than zero
	// announces each group at its commit.
	AnnounceEvery time.Duration
	// StoreTimeout bounds each statement that stores a group, or sends
	// what is owed, whatever the contexts of the callers waiting for it,
	// and Close. Zero or less means DefaultStoreTimeout.
	StoreTimeout time.Duration
	// Logger is told of a notification that could not be sent. Nil
	// discards it.
	Logger *slog.Logger
}

// Enqueuer stores jobs inserted one at a time by concurrent callers, such
// as the handlers of an HTTP server, together: the jobs of the callers
// that arrive while a statement stores others share the next statement
// and its commit (InsertAll). What bounds how many jobs a second one-job
// inserts store is the wait for each commit to reach the disk; an
// Enqueuer lets those that arrive during one commit share the next. A job
// that arrives alone, while no statement runs, is stored at once: it
// waits for no one. `relay serve` stores the jobs of its one-job requests
// through one.
//
// It also spaces the notifications of the jobs it stores
// (EnqueuerConfig.AnnounceEvery). PostgreSQL wakes every listening
// session of a database at each commit that notifies, whatever the
// channel, and each woken session reads the notifications in a
// transaction of its own; with the listeners of many queues, those
// wake-ups cost the server more than the inserts (docs/experiments.md,
// "Every listener hears every queue"). A group whose statement begins
// AnnounceEvery or more after the latest notifying statement began, while
// none is owed or being sent, is announced by its own commit. A group
// that comes sooner is stored unannounced, and
// once it has committed its queues are owed a notification. One statement
// announces every queue owed (JobAnnounceMany), AnnounceEvery after the
// latest notifying statement began; one at a time. Since a notification
// goes out at its statement's commit, two may go out closer together than
// AnnounceEvery by up to a commit's time. The workers' claims take every
// job ready when they run, so one notification serves all the groups
// stored meanwhile: a job so stored waits for its workers at most about
// AnnounceEvery longer than one announced by its commit. Close sends what
// is owed; if it cannot be sent (the database out of reach), the workers
// find those jobs at their next poll.
//
// Each Insert returns once its own job is committed, or with an error,
// which says whether the job may have been stored (see Insert). A job the
// database refuses fails alone: a statement the database refuses for a
// value it holds (a data exception, a constraint violation, or a
// statement too large or too complex, 54000 and 54001: each raised before
// the statement commits, so that nothing of it was stored) is replayed
// one job at a time. Any other error is not: it may have come after the
// commit, even one that arrives as a PostgreSQL error, as when a
// connection pooler between, such as PgBouncer at its query_timeout,
// answers with an error of its own while the server goes on to commit.
// Each Insert of the group then returns it, wrapped in ErrOutcomeUnknown
// where the statement may have committed, and nothing is stored again.
//
// An Enqueuer is safe for concurrent use; that is what it is for. It runs
// at most two statements that store groups at once, and one that sends
// what is owed, each on a connection of its pool: a pool of at least
// three connections spares them waiting for one another. (While Close
// runs, the groups being stored send their own notifications, beside
// Close's, and may briefly hold more.) Make one with
// NewEnqueuer; the zero value is not usable.
type Enqueuer struct {
	pool         *pgxpool.Pool
	storeTimeout time.Duration
	announcer    *announcer

	mu       sync.Mutex
	pending  []*pendingJob
	flushing int // goroutines storing groups, at most maxFlushers
	// flushed is closed when flushing falls back to zero; nil while it is.
	flushed chan struct{}
}

// maxFlushers is how many group statements run at once: one gathers
// callers while another commits. Each holds a connection of the pool
// while it runs, and the announcer one more while it sends; the others
// stay free for the rest of the program.
const maxFlushers = 2

// maxGroup is the most jobs one statement stores.
const maxGroup = MaxBatchJobs

// maxGroupBytes bounds the bytes of the jobs one statement stores (their
// payloads and names; see size), unless its first job alone is larger. A
// group bounded by its count alone could gather maxGroup jobs of the
// largest body the API takes (1 MiB) into one statement of a gigabyte,
// PostgreSQL's limit for a message, built in memory beside the callers'
// own copies.
const maxGroupBytes = 8 << 20

// The states of a pendingJob.
const (
	jobWaiting   int32 = iota // in pending, not yet taken
	jobTaken                  // in a statement, which will answer it
	jobAbandoned              // its caller gave up before it was taken
)

// pendingJob is one caller's job, waiting to be stored.
type pendingJob struct {
	job   Job
	state atomic.Int32
	done  chan stored // buffered: the flusher never waits for the caller
}

// stored is what became of a pendingJob.
type stored struct {
	job db.Job
	err error
}

// NewEnqueuer returns an Enqueuer that stores jobs through pool, with cfg.
// Close it before closing pool. It panics if pool is nil.
func NewEnqueuer(pool *pgxpool.Pool, cfg EnqueuerConfig) *Enqueuer {
	if pool == nil {
		panic("client.NewEnqueuer: nil pool")
	}
	every := cfg.AnnounceEvery
	if every == 0 {
		every = DefaultAnnounceEvery
	}
	timeout := cfg.StoreTimeout
	if timeout <= 0 {
		timeout = DefaultStoreTimeout
	}
	return &Enqueuer{
		pool:         pool,
		storeTimeout: timeout,
		announcer:    newAnnouncer(pool, every, timeout, cfg.Logger),
	}
}

// Insert stores job, together with the jobs of the callers that arrive
// meanwhile, and returns it as stored. A job with an idempotency key is
// refused with ErrNoIdempotencyInBatch: store it with the package's
// Insert function, which looks up the key. If ctx has ended as Insert is
// called, or ends before a statement takes the job, nothing is stored
// and Insert returns ctx's error (its cause, if it has one); once taken,
// it waits for the statement's outcome, which StoreTimeout bounds,
// whatever ctx. When the database refuses a job of the group, the
// group's jobs are stored again one at a time, each within a StoreTimeout
// of its own, so that a job late in such a group waits for those before
// it; if one of them fails for another reason than a refusal, those after
// it fail at once, unsent.
//
// An error says whether the job may have been stored. One that wraps
// ErrOutcomeUnknown says that its statement was sent and the answer lost:
// StoreTimeout passed while the statement ran, the connection failed, or
// a pooler answered in the server's place. The job may have been stored,
// and inserting it again may store it twice: a job that must be stored
// once whatever happens is inserted, from its first attempt, with an
// idempotency key, through the package's Insert. One that wraps
// ErrJobsDropped (a JobsDroppedError) says that the database stored fewer
// of the group's jobs than it was sent, as when a trigger on the
// jobs table drops rows: those it stored are committed, and since which
// they are is not known, the job may be one of them unless it stored
// none. Any other error says that nothing was stored: ctx's, a context
// error of StoreTimeout passing before the statement was sent (while it
// waited for a connection), one for which RefusedAValue reports true, a
// job left unsent behind another of its group, or another error
// PostgreSQL answered with, which rolled the statement back.
func (e *Enqueuer) Insert(ctx context.Context, job Job) (db.Job, error) {
	if job.IdempotencyKey != nil {
		return db.Job{}, fmt.Errorf("insert job: %w", ErrNoIdempotencyInBatch)
	}
	if err := context.Cause(ctx); err != nil {
		return db.Job{}, fmt.Errorf("insert job: %w", err)
	}
	p := &pendingJob{job: job, done: make(chan stored, 1)}
	e.mu.Lock()
	e.pending = append(e.pending, p)
	start := e.flushing < maxFlushers
	if start {
		if e.flushing == 0 {
			e.flushed = make(chan struct{})
		}
		e.flushing++
	}
	e.mu.Unlock()
	if start {
		go e.flush()
	}
	select {
	case s := <-p.done:
		return s.job, s.err
	case <-ctx.Done():
		if p.state.CompareAndSwap(jobWaiting, jobAbandoned) {
			return db.Job{}, fmt.Errorf("insert job: %w", context.Cause(ctx))
		}
		s := <-p.done
		return s.job, s.err
	}
}

// Close sends at once the notifications still owed for the jobs stored,
// so that their workers need not wait for their next poll, and has each
// group stored after it announced at its commit: Insert still works. A
// group being stored unannounced as it is called sends its own
// notification once it has committed, and Close waits until no group is
// being stored, those of Insert calls made after it began included: a
// steady stream of them keeps it waiting. It returns then, or once ctx
// has ended, or StoreTimeout has passed. Given a ctx already cancelled,
// Close itself sends nothing (the groups being stored still send their
// own), so a program that closes it as it stops passes
// context.WithoutCancel of its own. A group whose statement is still
// running when Close returns is announced once it commits, if the pool
// is still open then; otherwise its workers find its jobs at their next
// poll.
func (e *Enqueuer) Close(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, e.storeTimeout)
	defer cancel()
	e.announcer.Close(ctx)
	e.mu.Lock()
	flushed := e.flushed
	e.mu.Unlock()
	if flushed != nil {
		select {
		case <-flushed:
		case <-ctx.Done():
		}
	}
}

// flush stores groups of pending jobs until none is left.
func (e *Enqueuer) flush() {
	for {
		group := e.take()
		if group == nil {
			return
		}
		e.store(group)
	}
}

// take removes up to maxGroup waiting jobs, of maxGroupBytes at most,
// from pending and marks them taken, skipping those whose caller gave up.
// With none left, it counts the calling flusher out and returns nil.
func (e *Enqueuer) take() []*pendingJob {
	e.mu.Lock()
	defer e.mu.Unlock()
	var group []*pendingJob
	n, bytes := 0, 0
	for ; n < len(e.pending) && len(group) < maxGroup; n++ {
		p := e.pending[n]
		if p.state.Load() != jobWaiting {
			continue // its caller gave up
		}
		size := size(p.job)
		if len(group) > 0 && bytes+size > maxGroupBytes {
			break
		}
		if p.state.CompareAndSwap(jobWaiting, jobTaken) {
			group = append(group, p)
			bytes += size
		}
	}
	clear(e.pending[:n])
	e.pending = e.pending[n:]
	if len(e.pending) == 0 {
		e.pending = nil // let the backing array go
	}
	if len(group) == 0 {
		e.flushing--
		if e.flushing == 0 {
			close(e.flushed)
			e.flushed = nil
		}
		return nil
	}
	return group
}

// size is what a job adds to the statement that stores it: its payload and
// its names, the fields that can be large.
func size(job Job) int {
	return len(job.Payload) + len(job.Queue) + len(job.Kind)
}

// store stores a group in one statement, answers each of its callers, and
// returns the statement's error.
func (e *Enqueuer) store(group []*pendingJob) error {
	ctx, cancel := context.WithTimeout(context.Background(), e.storeTimeout)
	defer cancel()
	jobs := make([]Job, len(group))
	for i, p := range group {
		jobs[i] = p.job
	}
	announced := e.announcer.lead()
	rows, err := insertAll(ctx, e.pool, jobs, announced)
	refused := RefusedAValue(err) // false for nil
	var dropped *JobsDroppedError
	if !announced && (err == nil || errors.Is(err, ErrOutcomeUnknown) || errors.As(err, &dropped) && dropped.Stored > 0) {
		// Committed, some of it at least, or its outcome unknown. Any
		// other error stored nothing, and a notification would wake
		// workers for nothing.
		e.announcer.owe(jobs, rows)
	}
	if refused && len(group) > 1 {
		// Nothing of the statement was stored: store each job alone, so
		// that the one the database refuses fails alone, each as a group
		// of its own: in a statement of its own time, StoreTimeout, and
		// announced as the spacing allows. Once one fails for another
		// reason than a refusal, as when the database stops answering,
		// those after it fail at once, unsent, rather than each waiting
		// out a StoreTimeout of its own.
		// Their errors wrap the cause of that failure, not
		// ErrOutcomeUnknown: nothing of theirs was sent.
		var failed error
		for _, p := range group {
			if failed != nil {
				p.done <- stored{err: fmt.Errorf("insert job: not sent, as a job before it in its group failed: %w", failed)}
				continue
			}
			if err := e.store([]*pendingJob{p}); err != nil && !RefusedAValue(err) {
				failed = err
				if lost := (*answerLostError)(nil); errors.As(err, &lost) {
					failed = lost.cause
				}
			}
		}
		return err
	}
	for i, p := range group {
		if err != nil {
			p.done <- stored{err: err}
			continue
		}
		p.done <- stored{job: rows[i]}
	}
	return err
}

// RefusedAValue reports whether err is PostgreSQL refusing a value a
// statement was to store: a data exception (class 22), an integrity
// constraint violation (class 23), or a statement too large or too
// complex (54000, 54001). Each is raised before the statement commits, so
// that an insert that fails with one stored nothing, and the same insert
// sent again fails again. Any other error may have come after a commit
// (see Enqueuer). They are the errors the HTTP API answers with a 4xx.
func RefusedAValue(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) != 5 {
		return false
	}
	class := pgErr.Code[:2]
	return class == "22" || class == "23" || pgErr.Code == "54000" || pgErr.Code == "54001"
}
