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
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pgerr.AnswerLost(tc.err); got != tc.lost {
				t.Errorf("AnswerLost(%v) = %t, want %t", tc.err, got, tc.lost)
			}
		})
	}
}
