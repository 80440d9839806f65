-- Read-only statements of the lab over River's job table (river_job), for
-- the experiments that run River beside Relay as a reference. River's
-- tables exist only in the databases that relaylab-river migrate
-- migrated, so `sqlc vet` (which prepares every query against a database
-- migrated with Relay's schema alone) skips them; the burn-down's test
-- runs each of them on a River database. sqlc types them from
-- experiment/river/schema/river.sql.

-- name: BurndownRiverSpan :one
-- River's jobs of a queue as the burn-down ends, as BurndownSpan reads
-- Relay's: how many completed, how many took more than one attempt, and
-- the span from the first fetch (attempted_at, set by the fetching
-- statement on the database's clock) to the last finish (finalized_at,
-- which River's completer writes from its client's clock: the same clock
-- when River runs on the database's host, as in the lab).
-- @sqlc-vet-disable sqlc/db-prepare
SELECT count(*) FILTER (WHERE j.state = 'completed')::bigint AS succeeded,
       count(*) FILTER (WHERE j.attempt <> 1)::bigint        AS retried,
       count(*)::bigint                                       AS total,
       min(j.attempted_at)::timestamptz                       AS first_claim,
       max(j.finalized_at)::timestamptz                       AS last_finish
FROM river_job AS j
WHERE j.queue = @queue;

-- name: ExperimentRiverQueueProgress :one
-- How many of River's jobs of a queue are finished (in any of River's
-- final states) and in all: the progress bar's numbers, as
-- ExperimentQueueProgress reads Relay's.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT count(*) FILTER (WHERE j.state IN ('completed', 'discarded', 'cancelled'))::bigint AS finished,
       count(*)::bigint                                                                   AS total
FROM river_job AS j
WHERE j.queue = @queue;

-- name: ExperimentRiverQueueDrained :one
-- Whether every one of River's jobs of a queue is in one of River's final
-- states, as ExperimentQueueDrained reads Relay's: whether a job that
-- waits, is scheduled or runs is left, looked up as the first in the
-- order of River's fetching index, river_job_prioritized_fetching_index
-- (state, queue, priority, scheduled_at, id).
-- @sqlc-vet-disable sqlc/db-prepare
SELECT ((SELECT j.id FROM river_job AS j
         WHERE j.state IN ('available', 'pending', 'retryable', 'running', 'scheduled')
           AND j.queue = @queue
         ORDER BY j.state, j.queue, j.priority, j.scheduled_at, j.id
         LIMIT 1) IS NULL)::boolean AS drained;

-- name: SoakRiverJobWindow :one
-- River's jobs of a queue over one sampling window (since, until], as
-- SoakJobWindow reads Relay's: enqueued (created_at), claimed
-- (attempted_at, set by the fetching statement), finished (finalized_at,
-- written by River's completer from its client's clock, the database
-- host's in the lab) and succeeded (completed) in it; the pickup latency
-- of each job claimed in it, from the later of scheduled_at and
-- created_at; and next_from_id, the lowest id of a job not finalized by
-- until, which bounds the next window's rows by the primary key.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT count(*) FILTER (WHERE j.created_at > sqlc.arg(since)::timestamptz
                          AND j.created_at <= sqlc.arg(until)::timestamptz)::bigint AS enqueued,
       count(*) FILTER (WHERE j.attempted_at > sqlc.arg(since)::timestamptz
                          AND j.attempted_at <= sqlc.arg(until)::timestamptz)::bigint AS claimed,
       count(*) FILTER (WHERE j.finalized_at > sqlc.arg(since)::timestamptz
                          AND j.finalized_at <= sqlc.arg(until)::timestamptz)::bigint AS finished,
       count(*) FILTER (WHERE j.state = 'completed'
                          AND j.finalized_at > sqlc.arg(since)::timestamptz
                          AND j.finalized_at <= sqlc.arg(until)::timestamptz)::bigint AS succeeded,
       COALESCE(array_agg((extract(epoch FROM j.attempted_at - greatest(j.scheduled_at, j.created_at)) * 1000)::float8)
                  FILTER (WHERE j.attempted_at > sqlc.arg(since)::timestamptz
                            AND j.attempted_at <= sqlc.arg(until)::timestamptz),
                '{}')::float8[] AS pickup_ms,
       COALESCE(min(j.id) FILTER (WHERE j.finalized_at IS NULL OR j.finalized_at > sqlc.arg(until)::timestamptz),
                max(j.id) + 1,
                sqlc.arg(from_id)::bigint)::bigint AS next_from_id
FROM river_job AS j
WHERE j.queue = sqlc.arg(queue)::text
  AND j.id >= sqlc.arg(from_id)::bigint;

-- name: SoakRiverBacklog :one
-- River's jobs of a queue waiting now, as SoakBacklog reads Relay's: ready
-- (available, scheduled_at reached) and how long the oldest has waited,
-- and running.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT count(*) FILTER (WHERE j.state = 'available' AND j.scheduled_at <= now())::bigint AS ready,
       count(*) FILTER (WHERE j.state = 'running')::bigint                              AS running,
       COALESCE(extract(epoch FROM now() - min(greatest(j.scheduled_at, j.created_at))
                  FILTER (WHERE j.state = 'available' AND j.scheduled_at <= now())) * 1000,
                0)::float8                                                             AS oldest_ready_ms
FROM river_job AS j
WHERE j.queue = sqlc.arg(queue)::text
  AND j.state IN ('available', 'running');

-- name: SoakRiverReaderCount :one
-- What each REPEATABLE READ reader of the soak's readers phase runs over
-- River's job table, as SoakReaderCount does over Relay's.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT count(*)::bigint AS jobs
FROM river_job;

-- name: BurndownRiverForgetWarmUp :execrows
-- Deletes River's finalized jobs of a queue, as BurndownForgetWarmUp
-- deletes Relay's: the warm-up jobs of a burn-down whose workers started
-- first.
-- @sqlc-vet-disable sqlc/db-prepare
DELETE FROM river_job AS j
WHERE j.queue = @queue
  AND j.state IN ('completed', 'cancelled', 'discarded');
