package client

import (
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrOutcomeUnknown is wrapped by the error of an insert whose statement,
// committing on its own, was sent and whose answer was lost, and by that
// of a Tx's Commit whose answer was lost (see Tx.Commit): the wait for
// it timed out, the connection failed, or a connection pooler between
// answered with an error of its own (a connection exception, class 08,
// such as PgBouncer's at its query_timeout) while the server may go on.
// The jobs may have been stored. Inserting them again may store them
// twice, unless the job has an idempotency key: Insert with the same key returns
// the job the first attempt stored, if it did (docs/failure-semantics.md,
// "An enqueue's answer is lost").
//
// Such an error is not a context error even where a context's end cut
// the wait short: errors.Is(err, context.DeadlineExceeded) or
// context.Canceled reports true only for an insert that stored nothing.
// The message holds the error that lost the answer.
var ErrOutcomeUnknown = errors.New("the statement was sent but its answer was lost: the jobs may have been stored")

// answerLostError is ErrOutcomeUnknown for one insert. It keeps the error
// that lost the answer out of the chain: that error is often a context's,
// which from an insert means that nothing was stored.
type answerLostError struct {
	cause error
}

func (e *answerLostError) Error() string {
	return ErrOutcomeUnknown.Error() + ": " + e.cause.Error()
}

func (e *answerLostError) Unwrap() error { return ErrOutcomeUnknown }

// outcome returns err, the error of a statement that stores jobs and
// commits on its own, as ErrOutcomeUnknown where it leaves unknown
// whether the statement committed (answerLost), and otherwise as it is.
func outcome(err error) error {
	if !answerLost(err) {
		return err
	}
	return &answerLostError{cause: err}
}

// answerLost reports whether err, the error of a statement that commits
// on its own, leaves it unknown whether the statement committed: it was
// sent, and no answer from the server came back (the connection failed,
// or the wait for the answer timed out, by the caller's context or its
// own), or a pooler answered in the server's place (class 08). An error
// pgx marks safe to retry came before anything was sent; pgx.ErrNoRows
// and any other error PostgreSQL answered with mean that the statement
// returned, or failed and rolled back.
//
// It is the worker's answerLost (worker/leases.go), with pgx.ErrNoRows
// and the pooler's errors set apart, since an insert is answered with
// both.
func answerLost(err error) bool {
	if err == nil || pgconn.SafeToRetry(err) || errors.Is(err, pgx.ErrNoRows) {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return strings.HasPrefix(pgErr.Code, "08")
	}
	return true
}

// unsent marks the error of a step that runs before a statement is sent,
// such as its preparation, as safe to retry, as pgx marks its own: nothing
// of the statement was sent.
type unsent struct{ err error }

func (e unsent) Error() string     { return e.err.Error() }
func (e unsent) Unwrap() error     { return e.err }
func (e unsent) SafeToRetry() bool { return true }
