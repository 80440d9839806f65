package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/db"
)

// runSession keeps this worker's session alive: a connection of its own
// that holds the advisory lock registered in the workers table (so that
// reclaims see at once when this process dies) and listens for jobs that
// become available. It reconnects whenever the session is lost.
func (w *Worker) runSession(ctx context.Context) {
	delay := minRetryDelay
	for ctx.Err() == nil {
		err := w.holdSession(ctx)
		w.sessionUp.Store(false)
		if ctx.Err() != nil {
			return
		}
		w.log.Warn("worker session lost; reconnecting", "err", err, "retry_in", delay)
		// Other workers may already have taken back our jobs: find out
		// now rather than at the next scheduled heartbeat.
		notify(w.beatNow)
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
		delay = min(2*delay, maxRetryDelay)
	}
}

// holdSession registers the worker on a new connection and serves
// notifications until the connection fails or ctx is cancelled.
func (w *Worker) holdSession(ctx context.Context) error {
	connectCtx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	conn, err := pgx.ConnectConfig(connectCtx, w.pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	// Closing the connection ends the session and drops its lock.
	defer conn.Close(context.Background())

	q := db.New(conn)
	host, _ := os.Hostname()
	key, err := q.WorkerRegister(connectCtx, db.WorkerRegisterParams{
		ID:    w.cfg.ID,
		Queue: w.cfg.Queue,
		Pid:   int32(os.Getpid()),
		Host:  host,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return errors.New("register worker: session lock already taken")
	}
	if err != nil {
		return fmt.Errorf("register worker: %w", err)
	}
	if err := q.WorkerListen(connectCtx); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	w.sessionUp.Store(true)
	w.log.Debug("worker session registered", "session_key", key)
	// Jobs may have become ready while no one was listening.
	notify(w.wake)
	notify(w.beatNow)

	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := q.WorkerUnregister(ctx, db.WorkerUnregisterParams{ID: w.cfg.ID, SessionKey: key}); err != nil {
			w.log.Debug("unregister worker failed", "err", err)
		}
	}()

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
			if n.Payload == w.cfg.Queue {
				notify(w.wake)
			}
		case waitCtx.Err() != nil && !conn.PgConn().IsClosed():
			pingCtx, cancel := context.WithTimeout(ctx, w.cfg.HeartbeatInterval)
			err := conn.Ping(pingCtx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return fmt.Errorf("session ping: %w", err)
			}
		default:
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}
