package worker

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// Job is one claim of a job, as a handler sees it.
type Job struct {
	ID          int64
	Queue       string
	Kind        string
	Payload     json.RawMessage
	Priority    int16
	Attempt     int
	MaxAttempts int
	// Fence grows with every claim of this job and never goes back. Pass it
	// with any write to another system, and have that system refuse a write
	// whose fence is lower than one it has seen for the same job: then a
	// worker that lost its lease cannot overwrite the work of the worker
	// that took the job over.
	Fence     int64
	CreatedAt time.Time
	// WorkerID is the worker running this claim.
	WorkerID string
}

// Handler runs jobs of one kind. The result, if not nil, is stored as JSON
// with the completed job, as PostgreSQL's jsonb: a result jsonb cannot
// store (a NUL escape, an unpaired surrogate, a number beyond numeric) or
// would store only in part (an object with a key given twice, of which
// jsonb keeps the last value) fails its job permanently instead, as does
// one too large (Config.MaxResultBytes). ctx is cancelled when the job's lease is lost,
// when someone cancels the job, and when the worker gives up waiting for
// it at shutdown; context.Cause(ctx) says which (ErrLeaseLost,
// ErrJobCancelled or ErrShutdown). A handler should return promptly then,
// with ctx's error: a handler that returns no error has succeeded, even
// after its job was cancelled, and its job ends succeeded with its result.
// A result returned with an error is dropped, not encoded. A handler holds
// its slot until it returns, whatever became of its lease: one that
// ignores its cancellation leaves the worker a slot short meanwhile. The
// worker sets no time limit on a handler: its heartbeats renew the lease
// for as long as the handler runs, so one that never returns holds its
// job running until the worker stops.
type Handler interface {
	Work(ctx context.Context, job *Job) (result any, err error)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, job *Job) (any, error)

// Work calls f.
func (f HandlerFunc) Work(ctx context.Context, job *Job) (any, error) { return f(ctx, job) }

var (
	// ErrLeaseLost is the cause of a handler's cancelled context when its
	// lease was not renewed: the job may already run elsewhere, and this
	// execution's outcome will not be recorded.
	ErrLeaseLost = errors.New("lease lost")
	// ErrJobCancelled is the cause when someone cancelled the running job.
	ErrJobCancelled = errors.New("job cancelled")
	// ErrShutdown is the cause when the worker stopped waiting for the
	// handler at shutdown; the job is released to run again.
	ErrShutdown = errors.New("worker shutting down")
)

// PermanentError marks an error that retrying cannot fix: the job goes to
// dead at once, whatever attempts it has left.
type PermanentError struct{ Err error }

// Error returns the wrapped error's message, marked permanent.
func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent wraps err so that the job fails without further retries.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &PermanentError{Err: err}
}

// IsPermanent reports whether err, or any error it wraps, is permanent.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}
