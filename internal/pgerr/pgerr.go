// Package pgerr reads what an error from pgx leaves known about a
// statement that commits on its own: whether it may have committed.
package pgerr

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// AnswerLost reports whether err, the error of a statement that commits
// on its own, leaves it unknown whether the statement committed: it was
// sent, and no answer from the server came back (the connection failed,
// or the wait for the answer timed out), or a connection pooler between
// answered in the server's place with a connection exception (class 08,
// as PgBouncer at its query_timeout) while the server may go on. An error
// pgx marks safe to retry came before anything was sent, and so did a
// failure to connect (a pool's, as it opened a connection for the
// statement, while the server could not be reached): the statement had no
// connection to go on. pgx.ErrNoRows and any other error PostgreSQL
// answered with mean that the statement returned, or failed and rolled
// back.
func AnswerLost(err error) bool {
	var connectErr *pgconn.ConnectError
	if err == nil || pgconn.SafeToRetry(err) || errors.Is(err, pgx.ErrNoRows) || errors.As(err, &connectErr) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08")
	}
	return true
}
