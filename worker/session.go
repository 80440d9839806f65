package worker

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgerr"
)

// IDInUseError is returned by Run when another live session holds the
// worker's id: two processes were started under one Config.ID.
type IDInUseError struct {
	ID   string
	PID  int32
	Host string
}

// Error names the id and the process whose live session holds it.
func (e *IDInUseError) Error() string {
	return fmt.Sprintf("worker id %q is in use by a live session (pid %d on host %s)", e.ID, e.PID, e.Host)
}

// errSessionElsewhere is why a session the pool does not see alive is
// given up: its connection reaches another database, or another server,
// than the pool's.
var errSessionElsewhere = errors.New("the pool does not see the session's lock: the session connection " +
	"(Config.SessionDatabaseURL, relay --session-database-url) reaches another database than the worker's pool, " +
	"whose claims would take the session for ended and claim nothing under it")

// session keeps the worker's PostgreSQL session (see run), and tells the
// rest of the worker whether, and under which session, it may claim.
type session struct {
	w *Worker

	// key is the session key of the live registered session, 0 while there
	// is none. Claims are made under it.
	key atomic.Int32
	// leaseOnly is set when the session connection goes through a pooler
	// that cannot keep a session: the worker then claims without one, and
	// only leases govern its jobs.
	leaseOnly atomic.Bool
	// listening is set while a live session listens for jobs that become
	// available: the worker is then told of every job it could claim,
	// except those that become ready with time (see Config.PollInterval).
	listening atomic.Bool
}

// told reports whether the worker is told of jobs that become available,
// by a live session listening for them. Through a pooler that cannot keep
// a session, LISTEN hears nothing.
func (s *session) told() bool { return s.listening.Load() }

// claimSession returns the session to claim under, and whether the worker
// may claim at all: with a live session, or without one when it runs on
// leases alone.
func (s *session) claimSession() (*int32, bool) {
	if s.leaseOnly.Load() {
		return nil, true
	}
	key := s.key.Load()
	if key == 0 {
		return nil, false
	}
	return &key, true
}

// ownSessions are the sessions a worker registered that it may replace
// when it registers again, though the server may not have seen their
// connections end: the last it knows it registered, and those whose
// registrations' answers it lost, which may have committed.
type ownSessions struct {
	last int32
	lost []int32
}

// sessionLossRecheck is how many reclaim intervals after losing its session
// a worker renews its leases again, to learn which of its jobs were taken
// back.
const sessionLossRecheck = 3

// run keeps this worker's session alive: a connection of its own that
// holds the advisory lock of a session registered in worker_sessions
// (so that reclaims see at once when this process dies) and listens for
// jobs that become available. It reconnects whenever the session is lost.
// It sends the outcome of its first registration on first. A refused
// registration (the id is in use) is fatal: stop is called with it. The
// wait before it reconnects doubles, up to maxRetryDelay, while attempts
// fail or their sessions are lost at once, and is the shortest again after
// a session it held for maxRetryDelay at least.
func (s *session) run(ctx context.Context, first chan<- error, stop func(error)) {
	w := s.w
	delay := minRetryDelay
	var own ownSessions
	for attempt := 0; ctx.Err() == nil; attempt++ {
		var registered time.Time
		err := s.hold(ctx, &own, func(err error) {
			if attempt == 0 {
				first <- err
			}
			if err == nil {
				registered = time.Now()
			}
		})
		if !registered.IsZero() && time.Since(registered) >= maxRetryDelay {
			delay = minRetryDelay
		}
		w.session.key.Store(0)
		if ctx.Err() != nil {
			return
		}
		var inUse *IDInUseError
		if errors.As(err, &inUse) {
			w.log.Error("worker id taken by another live session; stopping", "err", err)
			stop(err)
			return
		}
		if errors.Is(err, errSessionElsewhere) {
			w.log.Error("worker session registered where its pool cannot see it; claiming nothing until it can", "err", err, "retry_in", delay)
		} else {
			w.log.Warn("worker session lost; reconnecting", "err", err, "retry_in", delay)
		}
		// Other workers take back the jobs claimed under that session as
		// soon as they see it ended: find out now, and again once they
		// surely have, rather than at the next scheduled heartbeat, so that
		// the handlers of those jobs stop.
		notify(w.heartbeatNow)
		recheck := time.Duration(math.MaxInt64)
		if w.cfg.ReclaimInterval <= recheck/sessionLossRecheck {
			recheck = sessionLossRecheck * w.cfg.ReclaimInterval
		}
		time.AfterFunc(recheck, func() { notify(w.heartbeatNow) })
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, maxRetryDelay)
	}
}

// hold registers a new session of the worker on a new connection and
// serves notifications until the connection fails or ctx is cancelled.
// own are the worker's sessions registered before, which it replaces, and
// which hold keeps up to date. registered is called once the registration
// is done, with nil or the error that ended it.
func (s *session) hold(ctx context.Context, own *ownSessions, registered func(error)) (err error) {
	w := s.w
	done := false
	defer func() {
		if !done {
			registered(err)
		}
	}()
	connectCtx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	conn, err := pgx.ConnectConfig(connectCtx, w.sessionConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	// Closing the connection ends the session and drops its lock.
	defer conn.Close(context.Background())
	q := db.New(conn)

	key, err := s.register(connectCtx, conn, q, own)
	if err != nil {
		return err
	}
	if key != 0 {
		*own = ownSessions{last: key}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			// Through the pool: the session's own connection may be
			// closed by now, since the shutdown that ends the wait for
			// notifications can close it ("conn closed", seen in one run
			// of TestWorker_GracefulShutdownReleasesHeldJobs in 40 under
			// load). The lock that shows the session alive is held until
			// that connection closes, after this.
			// The session's row stays for a reclaim's forgetEnded to
			// remove once the session has ended.
			params := db.WorkerUnregisterParams{ID: w.cfg.ID, SessionKey: key}
			if _, err := w.q.WorkerUnregister(ctx, params); err != nil {
				w.log.Debug("unregister worker failed", "err", err)
			}
		}()
		// Claims and reclaims read the session's lock through the pool.
		// One that cannot see it takes the session for ended: the worker
		// would claim nothing, and not know why.
		alive, err := w.q.WorkerSessionAlive(connectCtx, key)
		if err != nil {
			return fmt.Errorf("ask through the pool whether the session is alive: %w", err)
		}
		if !alive {
			return errSessionElsewhere
		}
	}
	defer s.listening.Store(false)
	listening, channels, err := s.listen(connectCtx, q, key)
	if err != nil {
		return err
	}
	// Only now may the worker claim under the session: a claim made under
	// it before a failure here would be taken back at once, as the session
	// ends with this connection, although the worker lives.
	if key != 0 {
		w.session.key.Store(key)
		w.log.Debug("worker session registered", "session_key", key)
	}
	done = true
	registered(nil)
	// Jobs may have become ready, or gone back behind the claim cursors,
	// while no one was listening.
	w.cursors.fromHead()
	notify(w.wake)
	notify(w.heartbeatNow)

	for {
		// Wake at least every poll interval to check that the session is
		// still there: a connection cut without a reset is silent.
		waitCtx, cancel := context.WithTimeout(ctx, w.cfg.PollInterval)
		n, err := conn.WaitForNotification(waitCtx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil:
			// Queues whose names hash alike share a channel.
			if n.Payload != w.cfg.Queue {
				break
			}
			if n.Channel == channels.ReturnedChannel {
				w.jobReturned()
			}
			notify(w.wake)
		case waitCtx.Err() != nil && !conn.PgConn().IsClosed():
			// A ping that is merely slow is no reason to end the session:
			// that would drop its lock and have every job it holds taken
			// back at once, though their leases would have outlived the
			// stall. The session gives up on a definite loss of the
			// connection, or once a whole lease has passed. A session
			// without a listener seat tries for one in place of the ping,
			// which shows the connection alive as well.
			pingCtx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
			seated := false
			if listening {
				err = conn.Ping(pingCtx)
			} else {
				seated, channels, err = s.listen(pingCtx, q, key)
			}
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("session ping: %w", err)
			}
			if seated {
				listening = true
				w.log.Debug("worker took a listener seat of its queue")
				w.cursors.fromHead()
				notify(w.wake)
			}
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}

// listen subscribes the session on conn to its queue's notifications if
// it may, and reports whether it does, with the channels it listens on. A
// registered session (key not 0) listens only once it holds one of the
// queue's listener seats, unless Config.QueueListeners is negative, and
// the worker is told of new jobs while it does. A session through a pooler
// (key 0) holds no seat, since a seat taken through a transaction pooler
// would stay with whichever server session ran it, and listens without
// one: through a session-mode pool it hears, through a transaction pooler
// nothing.
func (s *session) listen(ctx context.Context, q *db.Queries, key int32) (bool, db.WorkerListenRow, error) {
	w := s.w
	if key != 0 && w.cfg.QueueListeners > 0 {
		// Config.Validate keeps QueueListeners within MaxQueueListeners,
		// an int32.
		_, err := q.WorkerTakeListenerSeat(ctx, db.WorkerTakeListenerSeatParams{Seats: int32(w.cfg.QueueListeners), Queue: w.cfg.Queue})
		if errors.Is(err, pgx.ErrNoRows) {
			return false, db.WorkerListenRow{}, nil
		}
		if err != nil {
			return false, db.WorkerListenRow{}, fmt.Errorf("take a listener seat: %w", err)
		}
	}
	channels, err := q.WorkerListen(ctx, w.cfg.Queue)
	if err != nil {
		return false, db.WorkerListenRow{}, fmt.Errorf("listen for the queue's jobs: %w", err)
	}
	if key != 0 {
		s.listening.Store(true)
	}
	return true, channels, nil
}

// register registers a new session on conn, replacing the worker's own
// sessions, and returns its key, or 0 when conn goes through a connection
// pooler that cannot hold a session: the worker then runs on leases
// alone, which it says once. A registration whose answer is lost is noted
// in own.lost: it may have committed, and its session, if the server has
// not seen the connection end, holds the worker's id, which the next
// registration takes over.
func (s *session) register(ctx context.Context, conn *pgx.Conn, q *db.Queries, own *ownSessions) (int32, error) {
	w := s.w
	backend, err := q.BackendPID(ctx)
	if err != nil {
		return 0, fmt.Errorf("read the session's server process: %w", err)
	}
	if announced := int32(conn.PgConn().PID()); backend != announced {
		if !w.session.leaseOnly.Swap(true) {
			w.log.Warn("the worker's session connection goes through a connection pooler (its server process is not the one it announced), "+
				"so it cannot hold the session that shows this worker alive: the jobs of a worker that dies come back only when their leases expire, "+
				"and a second worker under this id is not detected; point the session at PostgreSQL itself (Config.SessionDatabaseURL, relay --session-database-url) to detect a dead worker at once",
				"lease", w.cfg.Lease, "announced_pid", announced, "server_pid", backend)
		}
		return 0, nil
	}
	w.session.leaseOnly.Store(false)
	// Before the session takes anything a vanished worker would keep;
	// not needed where the connection's settings, such as those
	// EndSilentConnections gave the pool the session's were copied from,
	// set them all.
	if silent := endWhenSilent(w.cfg.Lease, w.sessionConfig.RuntimeParams); silent != (db.WorkerSessionEndWhenSilentParams{}) {
		if err := q.WorkerSessionEndWhenSilent(ctx, silent); err != nil {
			return 0, fmt.Errorf("have the server end the session once its connection goes silent: %w", err)
		}
	}
	// Drawn first, so that the key of a registration whose answer is lost
	// is known.
	key, err := q.WorkerDrawSessionKey(ctx)
	if err != nil {
		return 0, fmt.Errorf("draw a session key: %w", err)
	}
	params := db.WorkerRegisterParams{
		SessionKey:      &key,
		ID:              w.cfg.ID,
		Queue:           w.cfg.Queue,
		PID:             int32(os.Getpid()),
		Host:            hostname(),
		LostSessionKeys: own.lost,
	}
	if own.last != 0 {
		params.PreviousSessionKey = &own.last
	}
	reg, err := q.WorkerRegister(ctx, params)
	if err == nil {
		return reg.SessionKey, nil
	}
	if pgerr.AnswerLost(err) {
		own.lost = append(own.lost, key)
	}
	if !errors.Is(err, pgx.ErrNoRows) {
		return 0, fmt.Errorf("register worker: %w", err)
	}
	holder, err := q.WorkerHolder(ctx, w.cfg.ID)
	if err != nil {
		return 0, fmt.Errorf("register worker: id taken, and its holder could not be read: %w", err)
	}
	if !holder.SessionAlive {
		// It ended between the two statements: the next attempt takes it.
		return 0, errors.New("register worker: the id's holder ended while this worker registered")
	}
	return 0, &IDInUseError{ID: w.cfg.ID, PID: holder.PID, Host: holder.Host}
}

// osHostname is os.Hostname; tests replace it.
var osHostname = os.Hostname

// hostname returns the name of this host, made text PostgreSQL can hold
// (valid UTF-8, without NUL), or "unknown".
func hostname() string {
	host, err := osHostname()
	host = strings.ReplaceAll(strings.ToValidUTF8(host, "?"), "\x00", "")
	if err != nil || host == "" {
		return "unknown"
	}
	return host
}
