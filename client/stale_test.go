package client

import (
	"fmt"
	"io"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestStale_IsTheServersRefusalOfAPreparedStatementOnly specifies which
// errors send an insert once more (storeThenAnnounce): the server's
// refusal of a stale statement, which stored nothing, and never a
// connection lost with the outcome unknown.
func TestStale_IsTheServersRefusalOfAPreparedStatementOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"statement gone", &pgconn.PgError{Code: "26000"}, true},
		{"plan no longer fits", &pgconn.PgError{Code: "0A000"}, true},
		{"statement gone, read at the commit", fmt.Errorf("commit: %w", &pgconn.PgError{Code: "26000"}), true},
		{"constraint broken", &pgconn.PgError{Code: "23514"}, false},
		{"connection lost at the commit", fmt.Errorf("commit: %w", io.ErrUnexpectedEOF), false},
		{"connection lost", io.ErrUnexpectedEOF, false},
		{"none", nil, false},
	} {
		if got := stale(tc.err); got != tc.want {
			t.Errorf("%s: stale(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
