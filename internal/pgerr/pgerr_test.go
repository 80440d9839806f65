package pgerr_test

import (
	"context"
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/internal/pgerr"
)

// safeToRetry is an error pgx would mark as raised before anything was
// sent.
type safeToRetry struct{}

func (safeToRetry) Error() string     { return "not sent" }
func (safeToRetry) SafeToRetry() bool { return true }

func TestAnswerLost_OnlyWhereTheStatementMayHaveCommitted(t *testing.T) {
	// A pool opening a connection for a statement to a server it cannot
	// reach fails with pgx's error of a connection attempt.
	_, connectErr := pgconn.Connect(t.Context(), "postgres://relay@127.0.0.1:1/relay?connect_timeout=5")
	if connectErr == nil {
		t.Fatal("connected to a port no server listens on")
	}
	for _, tc := range []struct {
		name string
		err  error
		lost bool
	}{
		{"no error", nil, false},
		{"not sent", fmt.Errorf("insert: %w", safeToRetry{}), false},
		{"no row, an answer", fmt.Errorf("get: %w", pgx.ErrNoRows), false},
		{"refused by the server", &pgconn.PgError{Code: "23505"}, false},
		{"cancelled by the server", &pgconn.PgError{Code: "57014"}, false},
		{"a pooler's own error", fmt.Errorf("insert: %w", &pgconn.PgError{Code: "08P01"}), true},
		{"the connection failed", fmt.Errorf("insert: %w", io.ErrUnexpectedEOF), true},
		{"the wait timed out", fmt.Errorf("insert: timeout: %w", context.DeadlineExceeded), true},
		{"no connection to send it on", fmt.Errorf("complete: %w", connectErr), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pgerr.AnswerLost(tc.err); got != tc.lost {
				t.Errorf("AnswerLost(%v) = %t, want %t", tc.err, got, tc.lost)
			}
		})
	}
}
