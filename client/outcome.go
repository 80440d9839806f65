package client

import (
	"errors"

	"github.com/relayq/relay/internal/pgerr"
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
// whether the statement committed (pgerr.AnswerLost), and otherwise as it
// is.
func outcome(err error) error {
	if !pgerr.AnswerLost(err) {
		return err
	}
	return &answerLostError{cause: err}
}

// unsent marks the error of a step that runs before a statement is sent,
// such as its preparation, as safe to retry, as pgx marks its own: nothing
// of the statement was sent.
type unsent struct{ err error }

func (e unsent) Error() string     { return e.err.Error() }
func (e unsent) Unwrap() error     { return e.err }
func (e unsent) SafeToRetry() bool { return true }
