-- Statements of the recorded experiments (relay experiment crash and
-- burst, and the harness they share). None of them changes a job; all but
-- the four that set up a private cluster, and the two that open and close
-- a window on the WAL, only read.

-- name: ExperimentClock :one
-- The database clock at this very instant (clock_timestamp(), not the
-- transaction's now()), to place an event the experiment caused, such as
-- the moment a worker was killed, on the same clock as the jobs' timestamps.
SELECT clock_timestamp()::timestamptz AS now;

-- name: ExperimentServerInfo :one
-- The server settings that bear on the experiments' figures: durability
-- and how long a commit waits to share its flush (commit_delay),
-- memory, and vacuum, which decides whether dead row versions are ever
-- reclaimed (the shared server of these machines runs without it); JIT,
-- which can turn a costly plan's every run into a compilation; and the
-- preloaded libraries, such as pg_stat_statements, that add to every
-- statement's cost.
SELECT current_setting('server_version')                  AS server_version,
       current_setting('synchronous_commit')              AS synchronous_commit,
       current_setting('commit_delay')                    AS commit_delay,
       current_setting('commit_siblings')                 AS commit_siblings,
       current_setting('fsync')                           AS fsync,
       current_setting('full_page_writes')                AS full_page_writes,
       current_setting('shared_buffers')                  AS shared_buffers,
       current_setting('work_mem')                        AS work_mem,
       current_setting('maintenance_work_mem')            AS maintenance_work_mem,
       current_setting('max_connections')                 AS max_connections,
       current_setting('max_wal_size')                    AS max_wal_size,
       current_setting('checkpoint_timeout')              AS checkpoint_timeout,
       current_setting('autovacuum')                      AS autovacuum,
       current_setting('autovacuum_naptime')              AS autovacuum_naptime,
       current_setting('autovacuum_max_workers')          AS autovacuum_max_workers,
       current_setting('autovacuum_vacuum_scale_factor')  AS autovacuum_vacuum_scale_factor,
       current_setting('autovacuum_vacuum_threshold')     AS autovacuum_vacuum_threshold,
       current_setting('autovacuum_vacuum_cost_delay')    AS autovacuum_vacuum_cost_delay,
       current_setting('autovacuum_vacuum_cost_limit')    AS autovacuum_vacuum_cost_limit,
       current_setting('track_counts')                    AS track_counts,
       current_setting('jit')                             AS jit,
       current_setting('shared_preload_libraries')        AS shared_preload_libraries;

-- name: ExperimentJobTimes :many
-- Every job of a queue with the timestamps and the facts the burst
-- experiment checks: how many attempts it took, whether it holds a result,
-- and which attempt and worker the result says produced it (0 and ''
-- without a result).
SELECT j.id,
       j.state,
       j.attempt,
       j.created_at,
       j.started_at,
       j.finished_at,
       j.error_count,
       (j.result IS NOT NULL)::boolean          AS has_result,
       COALESCE((j.result ->> 'attempt')::integer, 0)::integer AS result_attempt,
       COALESCE(j.result ->> 'worker', '')::text   AS result_worker
FROM jobs AS j
WHERE j.queue = @queue
ORDER BY j.id;

-- name: ExperimentQueueProgress :one
-- How many jobs of a queue are finished (in any terminal state), running,
-- and in all: the progress bar's numbers.
SELECT count(*) FILTER (WHERE j.state IN ('succeeded', 'dead', 'cancelled'))::bigint AS finished,
       count(*) FILTER (WHERE j.state = 'running')::bigint                          AS running,
       count(*)::bigint                                                              AS total
FROM jobs AS j
WHERE j.queue = @queue;

-- name: ExperimentQueueDrained :one
-- Whether every job of a queue has finished: none is available and none
-- runs. Each is looked up as the first in an index's order, as the claim
-- finds its jobs: the available ones in jobs_claim_idx, the running ones
-- among the running entries of jobs_active_state_idx. An EXISTS may be
-- planned as a sequential scan, which during a burn-down reads past every
-- job finished so far. ExperimentQueueProgress counts the whole queue,
-- with parallel workers once it is large; a burn-down looks every second,
-- and a count would take cores, and hold back the horizon, in the middle
-- of what it measures.
SELECT ((SELECT a.id FROM jobs AS a
         WHERE a.lease_token IS NULL AND a.finished_at IS NULL AND a.queue = @queue
         ORDER BY a.priority, a.run_at, a.id
         LIMIT 1) IS NULL
        AND (SELECT r.id FROM jobs AS r
             WHERE r.state = 'running' AND r.finished_at IS NULL AND r.queue = @queue
             ORDER BY r.id
             LIMIT 1) IS NULL)::boolean AS drained;

-- name: ExperimentSkipCommitWait :exec
-- In the caller's transaction only (set_config's is_local), lets COMMIT
-- return before the transaction's WAL is flushed to disk, as SET LOCAL
-- synchronous_commit = off does. Only the burst experiment's probe uses it,
-- to tell the cost of the flush apart from the rest of a statement's time;
-- Relay itself always commits synchronously.
SELECT set_config('synchronous_commit', 'off', true);

-- name: ExperimentBackendPID :one
-- The process id of the server process serving this connection, whose CPU
-- time the burst experiment's probe reads from /proc, and whose priority
-- the soak's readers lower with --readers-nice.
SELECT pg_backend_pid()::integer AS pid;

-- name: ExperimentPlanSettings :one
-- The settings that decide how this connection plans a prepared
-- statement and whether it compiles the plan: a probe that times a
-- worker's statement records them, since it measures that statement as
-- the worker runs it only under the worker's settings
-- (worker.KeepGenericPlans).
SELECT current_setting('plan_cache_mode') AS plan_cache_mode,
       current_setting('jit')             AS jit;

-- name: ExperimentRestoreFsync :exec
-- The three statements below undo what devdb relaxes for a throwaway
-- cluster (fsync, full_page_writes, synchronous_commit off), so that an
-- experiment on a private cluster runs with PostgreSQL's own defaults, as
-- a production server does. ALTER SYSTEM overrides postgresql.conf, where
-- devdb wrote its settings; they take effect with ExperimentReloadConfig.
-- Need a superuser.
-- @sqlc-vet-disable sqlc/db-prepare
ALTER SYSTEM SET fsync = 'on';

-- name: ExperimentRestoreFullPageWrites :exec
-- @sqlc-vet-disable sqlc/db-prepare
ALTER SYSTEM SET full_page_writes = 'on';

-- name: ExperimentRestoreSynchronousCommit :exec
-- @sqlc-vet-disable sqlc/db-prepare
ALTER SYSTEM SET synchronous_commit = 'on';

-- name: ExperimentReloadConfig :one
-- @sqlc-vet-disable sqlc/db-prepare
SELECT pg_reload_conf()::boolean AS reloaded;

-- name: ExperimentWALWindowOpen :one
-- Opens a window on the WAL the server writes from now on: a physical
-- replication slot, reserved at once, keeps every segment from its
-- restart point until the slot is dropped, so that pg_waldump can read
-- the window after it ends even if checkpoints came in between; lsn is
-- where the window begins. Also the server's data directory, where
-- pg_wal lies, and its major version, which pg_waldump must share. Needs
-- a role that may create replication slots and read the settings.
SELECT s.slot_name::text                                     AS slot_name,
       pg_current_wal_insert_lsn()::text                     AS lsn,
       current_setting('data_directory')                     AS data_directory,
       (current_setting('server_version_num')::integer / 10000)::integer AS major_version
FROM pg_create_physical_replication_slot(@slot_name::text, true) AS s;

-- name: ExperimentWALFlushed :one
-- Where the WAL flushed to disk ends now: the end of a window whose
-- transactions have committed.
SELECT pg_current_wal_flush_lsn()::text AS lsn;

-- name: ExperimentWALWindowClose :exec
-- Drops the slot of a WAL window, which lets the server recycle its
-- segments again.
SELECT pg_drop_replication_slot(@slot_name::text);

-- name: ExperimentFleetLoad :one
-- What became of the jobs put on a busy fleet's queue: how many finished,
-- run or wait, and how long those that started waited for it (from their
-- creation to their latest attempt's start, on the database clock), at the
-- 50th, 95th and 99th percentiles, in milliseconds (an empty array while
-- none has started).
SELECT count(*) FILTER (WHERE j.state = 'succeeded')::bigint           AS succeeded,
       count(*) FILTER (WHERE j.state = 'running')::bigint             AS running,
       count(*) FILTER (WHERE j.state = 'available')::bigint           AS available,
       count(*) FILTER (WHERE j.state IN ('dead', 'cancelled'))::bigint AS failed,
       COALESCE(percentile_disc(ARRAY[0.5, 0.95, 0.99]::float8[])
                    WITHIN GROUP (ORDER BY extract(epoch FROM j.started_at - j.created_at) * 1000)
                    FILTER (WHERE j.started_at IS NOT NULL),
                '{}')::float8[]                                         AS pickup_ms
FROM jobs AS j
WHERE j.queue = @queue;

-- name: ExperimentFleetCount :one
-- Counts the worker sessions alive now, as a worker's reclaim does
-- (JobReclaim's live and live_in_queue): all of them, and those working
-- on queue.
SELECT count(*)::integer AS live,
       count(*) FILTER (WHERE s.queue = @queue::text)::integer AS live_in_queue
FROM worker_sessions_live AS l
LEFT JOIN worker_sessions AS s ON s.session_key = l.session_key;
