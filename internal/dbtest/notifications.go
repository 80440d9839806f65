package dbtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
