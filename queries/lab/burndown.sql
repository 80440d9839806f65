-- Read-only statements of relay experiment burndown, which measures what a
-- burn-down of pre-filled no-op jobs costs the server.

-- name: BurndownCounters :one
-- The server's cumulative counters that a burn-down moves, read before and
-- after it: WAL (pg_stat_wal, the whole server's: other databases' writes
-- count too), this database's commits (pg_stat_database), and the writes
-- to the queue's table, @table_name (Relay's jobs, or River's river_job),
-- from pg_stat_user_tables. A non-HOT update writes an entry in every index
-- of the table (table_indexes) whose predicate the new row meets; a HOT
-- update writes none. The statistics
-- collector reports a backend's counts when its transaction ends and at
-- most once a second while it is busy, so read them after the workers'
-- sessions have ended.
SELECT w.wal_records::bigint                              AS wal_records,
       w.wal_fpi::bigint                                  AS wal_fpi,
       w.wal_bytes::bigint                                AS wal_bytes,
       d.xact_commit::bigint                              AS commits,
       COALESCE(t.n_tup_ins, 0)::bigint                   AS table_inserted,
       COALESCE(t.n_tup_upd, 0)::bigint                   AS table_updated,
       COALESCE(t.n_tup_hot_upd, 0)::bigint               AS table_hot_updated,
       COALESCE(t.n_tup_del, 0)::bigint                   AS table_deleted,
       (SELECT count(*) FROM pg_catalog.pg_index AS i
         WHERE i.indrelid = to_regclass(@table_name::text))::bigint AS table_indexes
FROM pg_catalog.pg_stat_wal AS w
CROSS JOIN pg_catalog.pg_stat_database AS d
LEFT JOIN pg_catalog.pg_stat_user_tables AS t
       ON t.relid = to_regclass(@table_name::text)
WHERE d.datname = current_database();

-- name: BurndownSpan :one
-- The jobs of a queue as the burn-down ends: how many succeeded, how many
-- took more than one attempt, and the span from the first claim to the
-- last finish, on the database's clock.
SELECT count(*) FILTER (WHERE j.state = 'succeeded')::bigint AS succeeded,
       count(*) FILTER (WHERE j.attempt <> 1)::bigint        AS retried,
       count(*)::bigint                                       AS total,
       min(j.started_at)::timestamptz                         AS first_claim,
       max(j.finished_at)::timestamptz                        AS last_finish
FROM jobs AS j
WHERE j.queue = @queue;

-- name: BurndownFlushStats :exec
-- Has this session report its pending statistics (its inserts, commits
-- and WAL written among them) as soon as it goes idle, before the answer
-- reaches the client, rather than up to 10 s later when it reported less
-- than a second before: the burn-down runs it at the end of the fill, so
-- that the counters read next hold the whole fill and the burn-down's
-- counts none of it.
SELECT pg_catalog.pg_stat_force_next_flush();

-- name: BurndownOtherSessions :one
-- How many client sessions other than the harness's own (whose
-- application_name is given) are connected to this database: a worker's
-- sessions report their statistics as they end, so the counters are read
-- once this is zero.
SELECT count(*)::bigint AS sessions
FROM pg_catalog.pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.backend_type = 'client backend'
  AND a.application_name <> @own_application_name::text;

-- name: BurndownOwnBackends :many
-- The process ids of the harness's own sessions on this database (whose
-- application_name is given): their CPU time, such as the progress counts'
-- while the workers drain the queue, is the harness's and not the queue's.
SELECT a.pid::integer AS pid
FROM pg_catalog.pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.backend_type = 'client backend'
  AND a.application_name = @own_application_name::text;

-- name: BurndownForgetWarmUp :execrows
-- Deletes the finished jobs of a queue: the warm-up jobs a burn-down's
-- workers ran before the queue was filled, so that the span, the counts
-- and the progress are the burn-down's alone.
DELETE FROM jobs AS j
WHERE j.queue = @queue
  AND j.state IN ('succeeded', 'dead', 'cancelled');

-- name: BurndownSessionActivity :many
-- What the client sessions on this database, other than the harness's own
-- (whose application_name is given), are doing at this instant, counted
-- by state and wait event: an active session with no wait event is
-- running on a CPU, or ready to and waiting for one; an idle one waits for
-- its client's next statement. Sampled through a burn-down, it shows how
-- many backends the workers kept busy and what held the others up.
SELECT COALESCE(a.state, '')::text           AS state,
       COALESCE(a.wait_event_type, '')::text AS wait_event_type,
       COALESCE(a.wait_event, '')::text      AS wait_event,
       count(*)::integer                     AS sessions
FROM pg_catalog.pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.backend_type = 'client backend'
  AND a.pid <> pg_backend_pid()
  AND a.application_name <> @own_application_name::text
GROUP BY 1, 2, 3;
