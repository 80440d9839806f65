package dbtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
)

// Heard returns the notifications conn receives until none comes for half
// a second. Notifications are sent when their transaction commits, so
// after a commit what is coming is already in the server's queue. Any
// other failure to receive fails the test, so that a lost connection does
// not pass for silence.
func Heard(t testing.TB, ctx context.Context, conn *pgx.Conn) []*pgconn.Notification {
	t.Helper()
	var heard []*pgconn.Notification
	for {
		waitCtx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		n, err := conn.WaitForNotification(waitCtx)
		quiet := waitCtx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case err == nil:
			heard = append(heard, n)
		case quiet && !conn.IsClosed():
			return heard
		default:
			t.Fatalf("wait for notifications: %v", err)
		}
	}
}

// Listen connects to pool's database and listens there as a worker of
// queue does (WorkerListen), until the test ends. It returns the
// connection, to read with Heard, and the channels it listens on.
func Listen(t testing.TB, pool *pgxpool.Pool, queue string) (*pgx.Conn, db.WorkerListenRow) {
	t.Helper()
	conn, err := pgx.ConnectConfig(t.Context(), pool.Config().ConnConfig)
	if err != nil {
		t.Fatalf("dbtest: connect a listener: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	channels, err := db.New(conn).WorkerListen(t.Context(), queue)
	if err != nil {
		t.Fatalf("dbtest: listen for queue %q: %v", queue, err)
	}
	return conn, channels
}

// CountJobs returns how many jobs pool's database holds.
func CountJobs(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	n, err := db.New(pool).JobCount(context.Background())
	if err != nil {
		t.Fatalf("dbtest: count jobs: %v", err)
	}
	return int(n)
}
