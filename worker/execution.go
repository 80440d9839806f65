package worker

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
)

// execution is one claimed job, from its claim until its outcome is known.
type execution struct {
	job    Job
	token  pgtype.UUID
	ctx    context.Context
	cancel context.CancelCauseFunc
	// renewedAt is when the statement behind the latest successful claim or
	// renewal was sent, by this process's monotonic clock. It never decides
	// whether an acknowledgement is accepted (the database does); it lets a
	// worker that cannot reach the database stop handlers whose leases have
	// surely run out.
	renewedAt time.Time
	// claimedAt is when the claim came back, by the same clock.
	claimedAt time.Time
	// lost is set, under Worker.mu, once the lease is known lost or the
	// job released: the outcome is then dropped, never written.
	lost bool
	// releasing is set, under Worker.mu, once the dispatcher takes the
	// job, claimed ahead and never started, to be released: from then on
	// the release's answer, not a heartbeat nor a newer claim of the job,
	// tells whether the worker gave the lease back or had lost it.
	releasing bool
	// releaseCause is why the job, claimed ahead, is released, set with
	// releasing: ErrShutdown when the worker stops, nil when it waited
	// too long for a slot. OnAck reports it as the release's Err.
	releaseCause error
	// returned is set, under Worker.mu, once the handler has returned: its
	// outcome is on its way to the dispatcher, and the job is no longer
	// one a shutdown may release.
	returned bool
	// unanswered is set once a statement carrying the outcome, or the
	// release, got no answer (pgerr.AnswerLost): that statement may have
	// recorded it, and a refusal from the fence later no longer says that
	// nothing was (Ack.InDoubt). Whoever sends the statement sets it, a
	// round or the shutdown, and the dispatcher reads it once that is
	// done.
	unanswered bool
}

// newExecution makes the execution of a job just claimed by the worker
// workerID.
func newExecution(r db.JobCompleteAndClaimRow, workerID string, sentAt time.Time) *execution {
	job := Job{
		ID:          *r.ID,
		Queue:       deref(r.Queue),
		Kind:        deref(r.Kind),
		Payload:     r.Payload,
		Priority:    deref(r.Priority),
		Attempt:     int(deref(r.Attempt)),
		MaxAttempts: int(deref(r.MaxAttempts)),
		Fence:       deref(r.Fence),
		WorkerID:    workerID,
	}
	if r.CreatedAt != nil {
		job.CreatedAt = *r.CreatedAt
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	return &execution{job: job, token: r.LeaseToken, ctx: ctx, cancel: cancel,
		renewedAt: sentAt, claimedAt: time.Now()}
}
