-- name: JobInsert :one
-- Inserts one job to run at run_at, or delay_ms after now() in the database.
-- With an idempotency key the queue already holds, it inserts nothing and
-- returns no row; the caller then reads the existing job with
-- JobGetByIdempotencyKey.
INSERT INTO jobs (queue, kind, payload, priority, max_attempts, run_at, idempotency_key)
VALUES (
    @queue, @kind, @payload, @priority, @max_attempts,
    COALESCE(sqlc.narg(run_at)::timestamptz, now() + interval '1 millisecond' * @delay_ms::bigint),
    sqlc.narg(idempotency_key)
)
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: JobInsertMany :many
-- Inserts many jobs in one statement, all or none, and returns their ids in
-- the order given. A run_at of year 1 (the zero time.Time) means delay_ms
-- after now() in the database, since an array parameter cannot carry nulls
-- through sqlc.
INSERT INTO jobs (queue, kind, payload, priority, max_attempts, run_at)
SELECT b.queue, b.kind, b.payload, b.priority, b.max_attempts,
       COALESCE(NULLIF(b.run_at, '0001-01-01 00:00:00+00'), now() + interval '1 millisecond' * b.delay_ms)
FROM (
    SELECT unnest(@queues::text[])           AS queue,
           unnest(@kinds::text[])            AS kind,
           unnest(@payloads::jsonb[])        AS payload,
           unnest(@priorities::smallint[])   AS priority,
           unnest(@max_attempts::integer[])  AS max_attempts,
           unnest(@run_ats::timestamptz[])   AS run_at,
           unnest(@delays_ms::bigint[])      AS delay_ms
) AS b
RETURNING id;

-- name: JobGet :one
SELECT * FROM jobs WHERE id = @id;

-- name: JobGetMany :many
-- The jobs with the ids given, whole, in id order; ids that name no job
-- are left out.
SELECT * FROM jobs WHERE id = ANY (@ids::bigint[]) ORDER BY id;

-- name: JobGetByIdempotencyKey :one
SELECT * FROM jobs WHERE queue = @queue AND idempotency_key = @idempotency_key;

-- name: JobList :many
-- Lists the summaries of jobs in id order, a page at a time: pass the last
-- id of one page as after_id to get the next. Each filter applies only when
-- given.
SELECT * FROM job_summaries
WHERE id > @after_id
  AND (sqlc.narg(queue)::text IS NULL OR queue = sqlc.narg(queue))
  AND (sqlc.narg(state)::job_state IS NULL OR state = sqlc.narg(state))
  AND (sqlc.narg(kind)::text IS NULL OR kind = sqlc.narg(kind))
ORDER BY id
LIMIT @max_jobs;

-- name: JobQueueStats :many
-- Counts jobs by state for every queue, with the age of the oldest job that
-- is ready to run and waiting for a worker, by the database clock.
SELECT
    queue,
    count(*) FILTER (WHERE state = 'available')::bigint AS available,
    count(*) FILTER (WHERE state = 'running')::bigint   AS running,
    count(*) FILTER (WHERE state = 'succeeded')::bigint AS succeeded,
    count(*) FILTER (WHERE state = 'dead')::bigint      AS dead,
    count(*) FILTER (WHERE state = 'cancelled')::bigint AS cancelled,
    COALESCE(EXTRACT(EPOCH FROM now() - min(run_at) FILTER (WHERE state = 'available' AND run_at <= now())), 0)::float8
        AS oldest_ready_age_seconds
FROM jobs
GROUP BY queue
ORDER BY queue;

-- name: JobCancel :one
-- Cancels an available job at once. A running job is only marked: its
-- worker learns of it at its next heartbeat, cancels the context of the handler,
-- and its failure then ends the job as cancelled. Returns no row for a job
-- that is missing or already finished.
UPDATE jobs AS j
SET state               = CASE WHEN j.state = 'available' THEN 'cancelled'::job_state ELSE j.state END,
    finished_at         = CASE WHEN j.state = 'available' THEN now() ELSE j.finished_at END,
    cancel_requested_at = CASE WHEN j.state = 'running' THEN COALESCE(j.cancel_requested_at, now()) END
WHERE j.id = @id
  AND j.state IN ('available', 'running')
RETURNING *;

-- name: JobRetry :one
-- Makes a dead or cancelled job available again now, with a fresh set of
-- attempts. Its fence keeps growing, so its new claims still outrank every
-- old one. Returns no row for a job in any other state.
UPDATE jobs
SET state       = 'available',
    attempt     = 0,
    run_at      = now(),
    finished_at = NULL,
    result      = NULL
WHERE id = @id
  AND state IN ('dead', 'cancelled')
RETURNING *;
