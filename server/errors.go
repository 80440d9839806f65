package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/client"
)

// apiError is an error with the status and message a client should see. Its
// cause, if any, is only logged.
type apiError struct {
	status int
	msg    string
	field  string
	cause  error
}

func (e *apiError) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%d %s: %v", e.status, e.msg, e.cause)
	}
	return fmt.Sprintf("%d %s", e.status, e.msg)
}

func (e *apiError) Unwrap() error { return e.cause }

// badRequest returns a 400 about field (which may be empty).
func badRequest(field, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, field: field, msg: fmt.Sprintf(format, args...)}
}

func notFound(msg string) *apiError {
	return &apiError{status: http.StatusNotFound, msg: msg}
}

func conflict(field, msg string) *apiError {
	return &apiError{status: http.StatusConflict, field: field, msg: msg}
}

var errUnavailable = errors.New("database unavailable")

// outcomeUnknown answers a request whose statement was sent and whose
// answer was lost (client.ErrOutcomeUnknown, pgerr.AnswerLost) with a 504,
// as a gateway that got no answer from the server behind it answers: the
// jobs may have been stored, or the change made. Unlike a 503, which says
// that nothing was, it carries no Retry-After, and msg says what a retry
// does.
func outcomeUnknown(msg string, err error) *apiError {
	return &apiError{status: http.StatusGatewayTimeout, msg: "the database's answer was lost: " + msg, cause: err}
}

// jobsDropped answers with a 500 an enqueue that the database stored
// fewer jobs of than it was sent (client.JobsDroppedError), as when a
// trigger on the jobs table drops rows: no job is answered as
// stored, since which were is not known, and msg says what became of
// them.
func jobsDropped(msg string, err error) *apiError {
	return &apiError{status: http.StatusInternalServerError, msg: msg, cause: err}
}

// respondError writes err as a JSON error. An *apiError is shown as is;
// any other error is classified (see classify) and shown only as a generic
// message, while the real error is logged.
func respondError(logger *slog.Logger, w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = classify(err)
	}
	switch {
	case r.Context().Err() != nil:
		// The client went away or gave up; nobody will read the answer.
		logger.InfoContext(r.Context(), "request abandoned by the client",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
	case ae.status >= 500:
		logger.ErrorContext(r.Context(), "request failed",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", ae.status), slog.Any("error", err))
	case ae.cause != nil:
		// A database error mapped to a 4xx: the client sees a generic
		// message; keep the real one for whoever reads the logs.
		logger.WarnContext(r.Context(), "request rejected by the database",
			slog.String("method", r.Method), slog.String("path", r.URL.Path),
			slog.Int("status", ae.status), slog.Any("error", err))
	}
	if ae.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	writeJSON(w, ae.status, errorBody{Error: ae.msg, Field: ae.field})
}

// classify maps an error from the database to what a client may see:
// constraint violations and bad values that slipped through validation
// (client.RefusedAValue, the errors a group of one-job requests is stored
// again one job at a time for) are 400 or 409, an insert whose answer was
// lost (client.ErrOutcomeUnknown) is 504, an unreachable or overloaded
// database is 503, anything else is 500. The message never includes the
// database's own text.
func classify(err error) *apiError {
	if errors.Is(err, client.ErrOutcomeUnknown) {
		return outcomeUnknown("what it stored is not known", err)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		code := pgErr.Code
		if client.RefusedAValue(err) {
			// Refused before the commit: the request's own doing.
			switch code[:2] {
			case "23": // integrity constraint violation
				if code == "23505" { // unique_violation
					return &apiError{status: http.StatusConflict, msg: "the request conflicts with an existing job", cause: err}
				}
				return &apiError{status: http.StatusBadRequest, msg: "the request has a value the database does not accept", cause: err}
			case "22": // data exception
				return &apiError{status: http.StatusBadRequest, msg: "the request has a value the database cannot store", cause: err}
			default: // program limit exceeded, statement too complex
				return &apiError{status: http.StatusBadRequest, msg: "the request is too large or too deeply nested for the database", cause: err}
			}
		}
		switch {
		case len(code) == 5 && (code[:2] == "08" || code[:2] == "53" || code[:2] == "40"),
			code == "57014", code == "57P01", code == "57P02", code == "57P03", code == "57P05":
			// Connection exceptions, insufficient resources, transaction
			// rollbacks (serialization, deadlock), query cancelled or
			// timed out, server shutting down: all worth a retry.
			return &apiError{status: http.StatusServiceUnavailable, msg: errUnavailable.Error(), cause: err}
		}
		return &apiError{status: http.StatusInternalServerError, msg: "internal server error", cause: err}
	}
	if unreachable(err) {
		return &apiError{status: http.StatusServiceUnavailable, msg: errUnavailable.Error(), cause: err}
	}
	return &apiError{status: http.StatusInternalServerError, msg: "internal server error", cause: err}
}

// unreachable reports whether err means the database could not be reached
// or did not answer in time.
func unreachable(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	return errors.As(err, &connectErr) ||
		errors.As(err, &netErr) ||
		pgconn.Timeout(err) ||
		pgconn.SafeToRetry(err) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled) ||
		errors.Is(err, io.EOF) ||
		errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, errUnavailable)
}
