-- +goose Up

-- A job as a listing shows it: every column a reader of many jobs needs,
-- and none that can be large. The payload (up to the API's body limit),
-- the result and the error history are read one job at a time, and the
-- lease token and idempotency key are never shown.
CREATE VIEW job_summaries AS
SELECT j.id, j.queue, j.kind, j.state, j.priority, j.attempt, j.max_attempts, j.fence,
       j.run_at, j.created_at, j.started_at, j.finished_at, j.leased_by, j.lease_expires_at,
       j.cancel_requested_at, j.last_error, j.error_count
FROM jobs AS j;

-- +goose Down
DROP VIEW job_summaries;
