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
