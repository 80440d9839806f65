package worker

import (
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/pgurl"
)

// Defaults for every timing knob and limit of a Worker. A zero field in
// Config takes the default named here.
const (
	// DefaultQueue is the queue a worker serves when none is given: the
	// queue of a job enqueued without one.
	DefaultQueue = client.DefaultQueue
	// DefaultSlots is how many jobs a worker runs at once.
	DefaultSlots = 10
	// DefaultLease is how long a claim holds a job without a heartbeat.
	// A worker that dies is detected through its session well before this;
	// the lease governs a worker that is alive but stalled or cut off.
	DefaultLease = 30 * time.Second
	// DefaultHeartbeatDivisor sets the heartbeat interval to a third of the
	// lease, so that two heartbeats in a row can fail before a lease lapses.
	DefaultHeartbeatDivisor = 3
	// DefaultPollInterval is how often an idle worker looks for work that no
	// notification announced (jobs scheduled for later, retries after their
	// backoff, notifications lost with a connection).
	DefaultPollInterval = time.Second
	// DefaultReclaimInterval is how often each worker looks for jobs whose
	// worker died or whose lease expired. It bounds how long a dead
	// worker's job waits to be taken back. In a fleet of more than 16 live
	// workers, each waits longer in proportion, so that the fleet as a
	// whole still looks 16 times per interval; each reclaim counts the
	// live workers for the next (JobReclaim).
	DefaultReclaimInterval = 250 * time.Millisecond
	// DefaultQueueListeners is how many workers of a queue listen for its
	// notifications at most. See Config.QueueListeners.
	DefaultQueueListeners = 16
	// DefaultReclaimBatch is how many jobs one reclaim statement takes back.
	DefaultReclaimBatch = 1000
	// DefaultPrefetchWait is the longest a job claimed ahead of a free slot
	// waits for one before it is released. See Config.PrefetchWait.
	DefaultPrefetchWait = 100 * time.Millisecond
	// DefaultMinPrefetch is the fewest jobs a worker may claim ahead by
	// default, however few its slots. A statement that acknowledges and
	// claims costs the database nearly as much for 4 jobs as for 61, and a
	// worker of 4 slots that holds 4 more ahead sends one for every 4 jobs
	// or so: 16 such processes ran half as many jobs a second as when
	// allowed 28 ahead (docs/experiments.md, "Where a small process's time
	// goes" and "Small processes claim more ahead"). See Config.Prefetch.
	DefaultMinPrefetch = 32
	// DefaultShutdownGrace is how long a stopping worker lets running
	// handlers finish before it cancels them and releases their jobs.
	DefaultShutdownGrace = 10 * time.Second
	// DefaultBackoffBase and DefaultBackoffMax shape the default retry
	// backoff: BackoffBase·2^(attempt-1), capped at BackoffMax, jittered.
	DefaultBackoffBase = time.Second
	DefaultBackoffMax  = time.Hour
	// DefaultRetainSucceeded is how long a succeeded job is kept after it
	// finished, DefaultRetainDead and DefaultRetainCancelled how long a
	// dead or cancelled one is: long enough to read a result and look
	// into a failure, short enough that the history stays the size of a
	// few days' work. See Config.RetainSucceeded.
	DefaultRetainSucceeded = 24 * time.Hour
	DefaultRetainDead      = 7 * 24 * time.Hour
	DefaultRetainCancelled = 7 * 24 * time.Hour
	// KeepForever, as a retention, keeps finished jobs until someone
	// deletes them.
	KeepForever time.Duration = -1
	// DefaultPruneInterval is how often each worker deletes the finished
	// jobs whose retention has passed.
	DefaultPruneInterval = 10 * time.Second
	// DefaultPruneBatch is how many jobs of each finished state one prune
	// statement deletes; a worker runs up to ten of them in a row while
	// each comes back full, and, while the tenth does too, ten more after
	// a pause as long as those took rather than after PruneInterval.
	DefaultPruneBatch = 1000
	// MaxErrorLength is how much of an error message is recorded.
	MaxErrorLength = 4096
	// DefaultMaxResultBytes is the largest result, encoded as JSON, that a
	// job may store. See Config.MaxResultBytes.
	DefaultMaxResultBytes = 1 << 20
)

// Upper bounds of Config's counts, past which New refuses a Config.
const (
	// MaxSlots is the most handlers one worker runs at once. Each slot is
	// a goroutine and a job held, and every job the worker holds is
	// claimed, renewed and acknowledged through its one pool; more are
	// better spread over several processes.
	MaxSlots = 10_000
	// MaxPrefetch is the most jobs one worker may claim ahead of a free
	// slot. A worker claims up to Slots+Prefetch jobs in one statement and
	// keeps room for as many outcomes.
	MaxPrefetch = 10_000
	// MaxQueueListeners is the most listener seats Config.QueueListeners
	// may ask for: the database counts them in an int4.
	MaxQueueListeners = math.MaxInt32
)

// MinInterval is the shortest HeartbeatInterval, PollInterval,
// ReclaimInterval and PruneInterval New accepts. Each runs a statement
// every interval, so one of a few nanoseconds (a plain number meant as
// seconds, say) would send them one after another without pause.
const MinInterval = time.Millisecond

// Config configures a Worker. The zero value is usable: every zero field
// takes its default.
type Config struct {
	// Queue is the one queue this worker claims from: at most 128 bytes
	// of UTF-8, without NUL.
	Queue string
	// Slots is how many handlers run at once, at most MaxSlots.
	Slots int
	// ID names this worker in leases, logs and error histories. It must be
	// unique among live workers: Run refuses to start (IDInUseError) while
	// another live session holds it. A process restarted under the same
	// id (a pod name, say) takes it over at once, and the jobs its dead
	// predecessor held come back as quickly as any dead worker's.
	// At most 128 bytes of UTF-8, without NUL. Default: host-pid-random,
	// the host's name cut short if the id would be longer.
	ID string
	// SessionDatabaseURL is where the worker opens its session: the one
	// connection that holds the lock showing it alive (so that its jobs
	// come back at once when it dies) and listens for new jobs. It must
	// reach PostgreSQL itself or a session-mode pool, not a
	// transaction-mode pooler such as PgBouncer's, which hands each
	// transaction to another server session, and it must reach the pool's
	// database: a session the pool cannot see is given up, with an error
	// in the log, and the worker claims nothing. Default: the settings of
	// the pool given to New. A session connection found to go through a pooler
	// is not used for the lock: the worker then runs on its leases alone,
	// and says so when it starts. A URL that sets no application_name
	// takes the pool's, so that the session shows in pg_stat_activity
	// beside its worker's other connections.
	SessionDatabaseURL string
	// Lease is how long each claim lasts unless renewed.
	Lease time.Duration
	// HeartbeatInterval is how often held leases are renewed, together, in
	// one statement. It must be shorter than Lease, and at least
	// MinInterval. Default: Lease/3. A renewal whose answer takes longer
	// than the interval is waited for while the leases it renews last,
	// and the next follows when it ends. One that fails is tried again
	// sooner, backing off from 50 ms up to a quarter of the interval; so
	// is a statement that acknowledges or claims, 2 s apart at most.
	HeartbeatInterval time.Duration
	// PollInterval is how often an idle worker checks for ready jobs when no
	// notification woke it. While notifications tell it of new jobs, a
	// worker of a fleet of more than 16 live workers on its queue waits
	// longer, in proportion to the whole fleet: a fleet that all listens
	// (QueueListeners negative) checks the queue 16 times per interval,
	// and one with 16 seats, fewer. A worker without a seat checks every
	// interval, since its polls are how it finds new jobs. The worker's
	// session checks its connection every PollInterval too: after a
	// network cut long enough for the database to end the session, the
	// worker claims nothing until that check has found the connection
	// gone and opened another. At least MinInterval.
	PollInterval time.Duration
	// QueueListeners is how many workers of the queue, at most, listen for
	// its notifications, each in a seat its session holds. PostgreSQL
	// wakes every listening session of the database, and each wakes its
	// worker, at every commit that notifies, whatever the channel, so a
	// fleet that all listens pays each new job once per worker. A worker
	// that finds every seat taken polls at PollInterval instead, tries for
	// a seat as often, and looks for work with every completion; the seat
	// of a worker that stops or dies is free at once. So in a fleet larger
	// than this a new job waits for a poll only while every seated worker
	// is busy. Default: DefaultQueueListeners. At most MaxQueueListeners.
	// Negative: every worker listens.
	QueueListeners int
	// ReclaimInterval is how often this worker takes back jobs of dead
	// workers and expired leases. At least MinInterval.
	ReclaimInterval time.Duration
	// Prefetch is how many jobs the worker may claim ahead of a free slot
	// and hold ready, so that a slot starts its next job the moment its
	// handler returns instead of waiting for the statement that records the
	// outcome and claims the next. The worker claims ahead only while its
	// handlers are short (under PrefetchWait/2 on average, by a running
	// mean): for jobs that long, that round trip is a small part of a job.
	// It holds no more ahead than its slots would start, at that mean,
	// within PrefetchWait/2. Default: Slots, and at least
	// DefaultMinPrefetch. At most MaxPrefetch. Negative: never claim
	// ahead, only for free slots.
	Prefetch int
	// PrefetchWait is the longest a job claimed ahead waits for a slot.
	// Past it, the job is released to the queue with its attempt
	// undone and its place kept, and the worker stops claiming ahead until
	// its handlers are short again, so a job is never held back for long
	// behind a slow one while other workers could run it. It must be
	// shorter than Lease. Default: DefaultPrefetchWait, or half the lease
	// if that is not shorter.
	PrefetchWait time.Duration
	// RetainSucceeded is how long a succeeded job is kept after it
	// finished (for GET /v1/jobs/{id}, the listings, its result, and its
	// idempotency key, which a new enqueue may use again once the job is
	// gone); then the workers' maintenance deletes it. RetainDead and
	// RetainCancelled do the same for dead and cancelled jobs. Every
	// worker prunes, so the shortest retention among the live workers is
	// the one that holds. Default: DefaultRetainSucceeded,
	// DefaultRetainDead, DefaultRetainCancelled. Negative (KeepForever):
	// keep forever.
	RetainSucceeded time.Duration
	RetainDead      time.Duration
	RetainCancelled time.Duration
	// PruneInterval is how often this worker deletes the finished jobs
	// whose retention has passed. It also looks every second, or every
	// PruneInterval if that is shorter, whether the planner's statistics
	// of the jobs table are due to be gathered again: where autovacuum is
	// off, or once the table outgrew them. At least MinInterval.
	// Default: DefaultPruneInterval.
	PruneInterval time.Duration
	// ShutdownGrace is how long Run lets running handlers finish once its
	// context is cancelled, counted from the cancellation: an
	// acknowledgement in flight then gives up when the grace period ends
	// (or after a second, if that is later), rather than stretch it, and
	// is sent again; one that had landed is then reported in doubt
	// (Ack.InDoubt).
	// Negative means release at once. Run may take up to a lease longer
	// to return while the database cannot be reached: it keeps sending the
	// outcomes of the handlers that finished for as long as their leases
	// last (see Run).
	ShutdownGrace time.Duration
	// MaxResultBytes is the largest result, encoded as JSON, that a
	// handler may return: a job whose result is larger fails permanently,
	// since every read of the job would carry it. Default:
	// DefaultMaxResultBytes. Negative: no limit but PostgreSQL's, and the
	// 1 GiB less 16 MiB that one statement carries. A result
	// whose arrays and objects nest deeper than a payload may
	// (client.MaxPayloadDepth) fails its job permanently too.
	MaxResultBytes int
	// Backoff returns how long to wait before the retry that follows the
	// given failed attempt (1 for the first). It is asked only of an
	// attempt that a retry follows: not of a job's last attempt, nor of a
	// permanent failure, nor of an attempt whose handler was cancelled
	// because someone cancelled its job (ErrJobCancelled), which ends
	// cancelled. A negative duration waits not at all, as zero does. If it
	// panics, or ends its goroutine with runtime.Goexit, that is logged
	// and the retry waits DefaultBackoff. It is called one call at a
	// time, as the worker sends the failure: keep it fast, as the
	// statement that sends the failure waits for it, and so does Run's
	// return. Default: DefaultBackoff.
	Backoff func(attempt int) time.Duration
	// Logger receives the worker's logs. Default: slog.Default().
	Logger *slog.Logger
	// OnAck, if set, is called after every acknowledgement the worker makes
	// or drops, one call at a time, while the goroutine that claims jobs
	// and sends their outcomes waits for it: keep it fast. While it runs
	// the worker claims no more jobs and sends no more outcomes;
	// heartbeats go on, and so do the handlers, but no heartbeat renews
	// the lease of a job whose handler has returned, so a call that takes
	// longer than a Lease costs the outcomes waiting to be sent their
	// leases, and their jobs run again. Run returns only once the last
	// call has returned. A panic in OnAck, or a call that ends its
	// goroutine with runtime.Goexit (as testing.T.FailNow does), is
	// logged, and the worker carries on.
	OnAck func(Ack)
}

// Ack reports what became of one execution's outcome.
type Ack struct {
	Job *Job
	// Outcome is what the worker tried to record.
	Outcome Outcome
	// Accepted is whether the database is known to have taken it. An
	// outcome that failed the fence, or that was never sent because the
	// lease was already lost, is not accepted; nor is one in doubt.
	Accepted bool
	// InDoubt is set on an outcome not accepted that the database may have
	// recorded all the same: a statement that carried it got no answer (its
	// connection failed after it was sent, or its round was given up as
	// the shutdown's grace period ended), and the worker could not learn
	// more. A round that never got a connection to send it on, its pool's
	// busy or the database out of reach, leaves nothing in doubt. Sent
	// again, such an outcome is refused by the fence, which refuses an
	// outcome recorded already as it refuses one whose lease was lost; or
	// the shutdown gave up sending it again. The job's row tells which for
	// a completion: it landed if the job succeeded at this attempt.
	InDoubt bool
	// Err is the handler's error, for failures and leases lost (for a
	// lease lost with the handler still running at shutdown, why the lease
	// was lost); for a release, why it was released (see OutcomeReleased).
	Err error
}

// Outcome names what a worker records for an execution.
type Outcome string

// The outcomes a worker can record.
const (
	OutcomeCompleted Outcome = "completed"
	OutcomeFailed    Outcome = "failed"
	// OutcomeLeaseLost is an execution whose lease was lost before it
	// finished: its outcome is dropped, never written.
	OutcomeLeaseLost Outcome = "lease_lost"
	// OutcomeReleased is a job given back to the queue for another
	// attempt to run: a handler still running when the shutdown's grace
	// period ended, or a job claimed ahead and never started, released as
	// the worker stopped (Err is ErrShutdown for both) or after it waited
	// Config.PrefetchWait for a slot (Err is nil). Accepted is false when
	// the lease was no longer the worker's, or the release went unsent.
	OutcomeReleased Outcome = "released"
)

// DefaultBackoff waits DefaultBackoffBase·2^(attempt-1), capped at
// DefaultBackoffMax, with "equal jitter": half the delay fixed, half random,
// so that jobs that failed together do not all retry at the same instant.
func DefaultBackoff(attempt int) time.Duration {
	return ExponentialBackoff(DefaultBackoffBase, DefaultBackoffMax)(attempt)
}

// ExponentialBackoff returns a backoff of base·2^(attempt-1), capped at max,
// with equal jitter. It is never negative: a base or max that is not
// positive waits not at all.
func ExponentialBackoff(base, max time.Duration) func(attempt int) time.Duration {
	return func(attempt int) time.Duration {
		d := min(base, max)
		if d <= 0 {
			return 0
		}
		for i := 1; i < attempt && d < max; i++ {
			// Past max/2, doubling reaches the cap, and near
			// math.MaxInt64 it would wrap negative.
			if d > max/2 {
				d = max
				break
			}
			d *= 2
		}
		if d <= 1 {
			return d
		}
		half := d / 2
		return half + rand.N(d-half)
	}
}

// Validate reports what New would refuse in c, without a pool: the error
// New returns for it.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}

// parseSessionURL parses Config.SessionDatabaseURL, or returns the error
// New and Validate return for it. A URL whose password holds an unescaped
// '@', or a '/' and an '@', is refused before it is parsed, with an error
// that shows no part of it (pgurl.CheckURLText, pgurl.CheckHosts).
func parseSessionURL(url string) (*pgx.ConnConfig, error) {
	if err := pgurl.CheckURLText(url); err != nil {
		return nil, fmt.Errorf("worker config: invalid session database URL: %w", err)
	}
	c, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("worker config: invalid session database URL: %w", err)
	}
	if err := pgurl.CheckHosts(&c.Config); err != nil {
		return nil, fmt.Errorf("worker config: invalid session database URL: %w", err)
	}
	return c, nil
}

// withDefaults returns c with every zero field set to its default, or an
// error naming the first invalid field.
func (c Config) withDefaults() (Config, error) {
	if c.Queue == "" {
		c.Queue = DefaultQueue
	}
	if c.Slots == 0 {
		c.Slots = DefaultSlots
	}
	if c.ID == "" {
		c.ID = defaultID(hostname(), os.Getpid(), rand.N(1<<16))
	}
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = c.Lease / DefaultHeartbeatDivisor
	}
	if c.PollInterval == 0 {
		c.PollInterval = DefaultPollInterval
	}
	if c.ReclaimInterval == 0 {
		c.ReclaimInterval = DefaultReclaimInterval
	}
	if c.QueueListeners == 0 {
		c.QueueListeners = DefaultQueueListeners
	}
	if c.RetainSucceeded == 0 {
		c.RetainSucceeded = DefaultRetainSucceeded
	}
	if c.RetainDead == 0 {
		c.RetainDead = DefaultRetainDead
	}
	if c.RetainCancelled == 0 {
		c.RetainCancelled = DefaultRetainCancelled
	}
	if c.PruneInterval == 0 {
		c.PruneInterval = DefaultPruneInterval
	}
	if c.Prefetch == 0 {
		c.Prefetch = max(c.Slots, DefaultMinPrefetch)
	}
	if c.PrefetchWait == 0 {
		c.PrefetchWait = DefaultPrefetchWait
		if c.PrefetchWait >= c.Lease {
			// The shortest lease, which the default would not fit.
			c.PrefetchWait = c.Lease / 2
		}
	}
	if c.ShutdownGrace == 0 {
		c.ShutdownGrace = DefaultShutdownGrace
	}
	if c.MaxResultBytes == 0 {
		c.MaxResultBytes = DefaultMaxResultBytes
	}
	if c.Backoff == nil {
		c.Backoff = DefaultBackoff
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	switch {
	case len(c.Queue) > maxNameBytes:
		return c, fmt.Errorf("worker config: queue name longer than %d bytes", maxNameBytes)
	case len(c.ID) > maxNameBytes:
		return c, fmt.Errorf("worker config: id longer than %d bytes", maxNameBytes)
	case !textValue(c.Queue):
		return c, fmt.Errorf("worker config: queue name %q must be valid UTF-8 without NUL, which PostgreSQL text cannot hold", c.Queue)
	case !textValue(c.ID):
		return c, fmt.Errorf("worker config: id %q must be valid UTF-8 without NUL, which PostgreSQL text cannot hold", c.ID)
	case c.Slots < 1 || c.Slots > MaxSlots:
		return c, fmt.Errorf("worker config: slots must be from 1 to %d (MaxSlots), got %d", MaxSlots, c.Slots)
	case c.Prefetch > MaxPrefetch:
		return c, fmt.Errorf("worker config: prefetch must be at most %d (MaxPrefetch), got %d", MaxPrefetch, c.Prefetch)
	case c.QueueListeners > MaxQueueListeners:
		return c, fmt.Errorf("worker config: queue listeners must be at most %d (MaxQueueListeners), got %d", MaxQueueListeners, c.QueueListeners)
	case c.Lease < 100*time.Millisecond:
		return c, fmt.Errorf("worker config: lease must be at least 100ms, got %s", c.Lease)
	case c.HeartbeatInterval <= 0 || c.HeartbeatInterval >= c.Lease:
		return c, fmt.Errorf("worker config: heartbeat interval %s must be positive and shorter than the lease %s", c.HeartbeatInterval, c.Lease)
	case c.PrefetchWait < 0 || c.PrefetchWait >= c.Lease:
		return c, fmt.Errorf("worker config: prefetch wait %s must be positive and shorter than the lease %s", c.PrefetchWait, c.Lease)
	case c.HeartbeatInterval < MinInterval:
		return c, shortInterval("heartbeat", c.HeartbeatInterval)
	case c.PollInterval < MinInterval:
		return c, shortInterval("poll", c.PollInterval)
	case c.ReclaimInterval < MinInterval:
		return c, shortInterval("reclaim", c.ReclaimInterval)
	case c.PruneInterval < MinInterval:
		return c, shortInterval("prune", c.PruneInterval)
	}
	if c.SessionDatabaseURL != "" {
		if _, err := parseSessionURL(c.SessionDatabaseURL); err != nil {
			return c, err
		}
	}
	return c, nil
}

// maxNameBytes is the longest queue name or worker id, in bytes.
const maxNameBytes = 128

// defaultID is the id of a worker given none: host-pid-random, with the
// host's name cut, at a rune boundary, so that the id fits in
// maxNameBytes however long the name (up to 255 bytes where hosts may
// have such names, as on macOS and the BSDs).
func defaultID(host string, pid int, random int) string {
	suffix := fmt.Sprintf("-%d-%04x", pid, random)
	if n := maxNameBytes - len(suffix); len(host) > n {
		for n > 0 && !utf8.RuneStart(host[n]) {
			n--
		}
		host = host[:n]
	}
	return host + suffix
}

// shortInterval is the error for the interval of the given name, d,
// shorter than MinInterval.
func shortInterval(name string, d time.Duration) error {
	return fmt.Errorf("worker config: %s interval %s is shorter than %s (MinInterval); a time.Duration counts nanoseconds, so 1 is 1ns, not 1s", name, d, MinInterval)
}

// textValue reports whether PostgreSQL text can hold s: valid UTF-8,
// without NUL. A queue name or worker id it cannot hold would otherwise be
// refused by every statement, and the worker would retry forever.
func textValue(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// maxLockWait bounds how long a completion or failure waits for a job's
// row another transaction holds before its round gives up, sets that
// outcome aside and sends the others: longer than PostgreSQL's default
// deadlock_timeout (1 s), so that a circle of waits is still broken as a
// deadlock where leases allow.
const maxLockWait = 2 * time.Second

// lockWaitMs is how long, in milliseconds, a round's completions and
// failures wait for a row another transaction holds: a quarter of the
// lease, at most maxLockWait, so that the other outcomes of a round that
// waits keep their leases.
func (c Config) lockWaitMs() int32 {
	return int32(min(c.Lease/4, maxLockWait).Milliseconds())
}
