-- name: DatabaseExists :one
-- Whether a database of this name exists on the server; for the test helper
-- that creates a database per test.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_database AS d WHERE d.datname = @name::text)::boolean AS exists;

-- name: BackendPID :one
-- The server process the calling session talks to. A connection whose
-- server process differs from the one it announced when it connected goes
-- through a connection pooler, which may hand each transaction to another
-- server session.
SELECT pg_backend_pid()::integer AS backend_pid;

-- name: DatabaseNow :one
-- The database clock: the start of the calling transaction, the instant
-- every fence in a statement of that transaction compares with.
SELECT now()::timestamptz AS now;

-- name: JobsAutovacuumOff :one
-- Why autovacuum will not vacuum the jobs table, or '' if it will: vacuum
-- alone reuses the space of the jobs that pruning deletes and of the
-- versions every transition leaves behind. The table's own setting first,
-- then what the server's settings leave autovacuum: to notice that a table
-- needs it, autovacuum reads the counts of its changes that track_counts
-- keeps.
SELECT (CASE
    WHEN EXISTS (SELECT FROM pg_catalog.pg_options_to_table(c.reloptions) AS o
                 WHERE o.option_name = 'autovacuum_enabled' AND NOT o.option_value::boolean)
        THEN 'autovacuum is off for the jobs table (its storage parameter autovacuum_enabled)'
    WHEN NOT current_setting('track_counts')::boolean
        THEN 'track_counts is off, so autovacuum never learns that the jobs table needs it'
    WHEN NOT current_setting('autovacuum')::boolean
        THEN 'autovacuum is off on the database server'
    ELSE ''
END)::text AS why
FROM pg_catalog.pg_class AS c
WHERE c.oid = 'jobs'::regclass;

-- name: JobCount :one
-- How many jobs the database holds, in every state, for the tests'
-- checks: it reads the whole table.
SELECT count(*)::bigint AS jobs FROM jobs;

-- name: JobStatisticsDue :one
-- Whether the planner's statistics of the jobs table are due, and why:
--
--   - 'autovacuum is off': autovacuum, off on the server or for the table,
--     will not gather them, and more rows were inserted, updated or
--     deleted since the last ANALYZE than autovacuum's rule allows with
--     the server's settings (autovacuum_analyze_threshold, plus
--     autovacuum_analyze_scale_factor of the rows): the table's own,
--     lower, scale factor (migrations/00001) is meant for autovacuum,
--     whose rounds come a minute apart, not for a look every second;
--   - 'the table outgrew them': more rows changed since the last ANALYZE
--     than the table then held (plus autovacuum_analyze_threshold), so
--     that the plans kept were made for a table less than half its size.
--     Autovacuum gathers them too, but only at its next round of the
--     database, up to autovacuum_naptime (a minute) later.
--
-- When they are due, it takes a lock for the caller's transaction, so
-- that of many workers asking at once one analyzes, and the others find
-- the lock taken and answer false; reason says why all the same, and is
-- empty when they are not due.
--
-- Statistics matter beyond the choice of one plan: a worker's connection
-- keeps the plan PostgreSQL chose for each of its statements, and makes it
-- anew only when the statistics of a table it reads change. A plan made
-- while the table was nearly empty reads the whole table where it should
-- look a job up by id, and it is kept as the table grows until the next
-- ANALYZE: after 200,000 jobs were enqueued at once, a worker that had
-- started on an empty queue completed a third as many jobs per second as
-- one started after them, until autovacuum analyzed the table
-- (docs/experiments.md, "Plans kept from an empty table").
SELECT (CASE WHEN d.reason IS NOT NULL
             -- Relay's advisory locks: a worker's session holds the pair
             -- (1380273241, its session key); this single key ("RELYSTAT",
             -- as bytes) is the lock of the one worker that analyzes.
             THEN pg_try_advisory_xact_lock(5928228431036957012)
             ELSE false
        END)::boolean AS due,
       COALESCE(d.reason, '')::text AS reason
FROM (
    SELECT CASE
        -- ANALYZE skips, with a warning, a table its role does not own.
        WHEN NOT pg_catalog.pg_has_role(c.relowner, 'USAGE') THEN NULL
        WHEN (NOT current_setting('autovacuum')::boolean
              OR EXISTS (SELECT FROM pg_catalog.pg_options_to_table(c.reloptions) AS o
                         WHERE o.option_name = 'autovacuum_enabled' AND NOT o.option_value::boolean))
         AND s.n_mod_since_analyze > current_setting('autovacuum_analyze_threshold')::float8
                                   + current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(c.reltuples, 0)
            THEN 'autovacuum is off'
        WHEN s.n_mod_since_analyze > current_setting('autovacuum_analyze_threshold')::float8
                                   + greatest(c.reltuples, 0)
            THEN 'the table outgrew them'
    END AS reason
    FROM pg_catalog.pg_class AS c
    JOIN pg_catalog.pg_stat_all_tables AS s ON s.relid = c.oid
    WHERE c.oid = 'jobs'::regclass
) AS d;

-- name: JobLockForAnalyze :exec
-- Takes the lock ANALYZE takes on the jobs table, for the caller's
-- transaction, or fails at once (lock_not_available) if another holds
-- it: autovacuum, while it vacuums or analyzes the table. An ANALYZE that
-- waited for it instead would, after deadlock_timeout, cancel
-- autovacuum's work on the table.
LOCK TABLE jobs IN SHARE UPDATE EXCLUSIVE MODE NOWAIT;

-- name: JobAnalyze :exec
-- Gathers the planner's statistics of the jobs table (see
-- JobStatisticsDue).
ANALYZE jobs;

-- name: RelayTablesFound :one
-- Which of the relations Relay's first migrations create the first schema
-- of the search_path holds: 00001's table jobs, 00002's workers, 00003's
-- worker_sessions and 00005's view job_summaries. relay migrate reads them
-- to tell whether the versions goose's default table goose_db_version
-- records are Relay's, as builds before relay_migrations recorded them
-- there, or another program's. That schema, current_schema(), is where
-- goose looks for its version table and where the migrations created
-- them: a relation of that name in a schema later on the search_path is
-- not one of them.
SELECT
    (to_regclass(quote_ident(current_schema()) || '.jobs') IS NOT NULL)::boolean AS jobs,
    (to_regclass(quote_ident(current_schema()) || '.workers') IS NOT NULL)::boolean AS workers,
    (to_regclass(quote_ident(current_schema()) || '.worker_sessions') IS NOT NULL)::boolean AS worker_sessions,
    (to_regclass(quote_ident(current_schema()) || '.job_summaries') IS NOT NULL)::boolean AS job_summaries;
