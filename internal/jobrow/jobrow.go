// Package jobrow turns the rows of statements that return a job beside
// other columns back into the job: sqlc gives such a row a type of its
// own, with the job's fields and the others side by side.
package jobrow

import "github.com/relayq/relay/db"

// OfTransition returns the job of a row of JobCancel or JobRetry, whose
// rows have the same columns: the job's, and whether the change applied
// (db.JobRetryRow converts to db.JobCancelRow).
func OfTransition(r db.JobCancelRow) db.Job {
	return db.Job{
		ID:                r.ID,
		Queue:             r.Queue,
		Kind:              r.Kind,
		Payload:           r.Payload,
		Priority:          r.Priority,
		State:             r.State,
		Attempt:           r.Attempt,
		MaxAttempts:       r.MaxAttempts,
		Fence:             r.Fence,
		RunAt:             r.RunAt,
		LeaseToken:        r.LeaseToken,
		LeaseExpiresAt:    r.LeaseExpiresAt,
		LeasedBy:          r.LeasedBy,
		CancelRequestedAt: r.CancelRequestedAt,
		CreatedAt:         r.CreatedAt,
		StartedAt:         r.StartedAt,
		FinishedAt:        r.FinishedAt,
		LastError:         r.LastError,
		Errors:            r.Errors,
		Result:            r.Result,
		IdempotencyKey:    r.IdempotencyKey,
		LeaseSession:      r.LeaseSession,
		ErrorCount:        r.ErrorCount,
	}
}
