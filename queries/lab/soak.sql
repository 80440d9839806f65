-- Statements of relay experiment soak, which runs a steady load through
-- phases that pin the xmin horizon and samples the queue's health. The
-- first three read job rows, and are the only ones that know the layout of
-- Relay's jobs table: a change of that layout changes them, and nothing
-- else of the soak. The others read the server's statistics, for every
-- table of the database, whatever its name.

-- name: SoakJobWindow :one
-- The jobs of a queue over one sampling window (since, until] of the
-- database clock: how many were enqueued (created_at), claimed
-- (started_at) and finished (finished_at, succeeded or not) in it; the
-- pickup latency of each job claimed in it, from the moment it was ready
-- (the later of run_at and created_at) to its claim, in milliseconds; and
-- next_from_id, the lowest id of a job not finished by until. A job
-- enqueued, claimed or finished after since was not finished at since, so
-- the caller passes the previous window's next_from_id as from_id: the
-- primary key then bounds the rows read to the backlog and the jobs of the
-- window, however long the history.
SELECT count(*) FILTER (WHERE j.created_at > sqlc.arg(since)::timestamptz
                          AND j.created_at <= sqlc.arg(until)::timestamptz)::bigint AS enqueued,
       count(*) FILTER (WHERE j.started_at > sqlc.arg(since)::timestamptz
                          AND j.started_at <= sqlc.arg(until)::timestamptz)::bigint AS claimed,
       count(*) FILTER (WHERE j.finished_at > sqlc.arg(since)::timestamptz
                          AND j.finished_at <= sqlc.arg(until)::timestamptz)::bigint AS finished,
       count(*) FILTER (WHERE j.state = 'succeeded'
                          AND j.finished_at > sqlc.arg(since)::timestamptz
                          AND j.finished_at <= sqlc.arg(until)::timestamptz)::bigint AS succeeded,
       COALESCE(array_agg((extract(epoch FROM j.started_at - greatest(j.run_at, j.created_at)) * 1000)::float8)
                  FILTER (WHERE j.started_at > sqlc.arg(since)::timestamptz
                            AND j.started_at <= sqlc.arg(until)::timestamptz),
                '{}')::float8[] AS pickup_ms,
       COALESCE(min(j.id) FILTER (WHERE j.finished_at IS NULL OR j.finished_at > sqlc.arg(until)::timestamptz),
                max(j.id) + 1,
                sqlc.arg(from_id)::bigint)::bigint AS next_from_id
FROM jobs AS j
WHERE j.queue = sqlc.arg(queue)::text
  AND j.id >= sqlc.arg(from_id)::bigint;

-- name: SoakOldestOpenTransaction :one
-- When the oldest transaction open on this database began, among the
-- client sessions other than this one and the soak's own pins (the
-- sessions that hold the horizon, whose application_name is given, and
-- which write no job); this statement's own transaction start if none is
-- open. A claim, a completion or an enqueue is stamped with its
-- transaction's start and visible only once it commits, so a sampling
-- window read now must end before this, or a transaction still open
-- would commit rows stamped in a window already read, never to be
-- counted.
SELECT COALESCE(min(a.xact_start), now())::timestamptz AS oldest
FROM pg_catalog.pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.backend_type = 'client backend'
  AND a.pid <> pg_backend_pid()
  AND a.application_name <> sqlc.arg(pin_application_name)::text
  AND a.xact_start IS NOT NULL;

-- name: SoakBacklog :one
-- The jobs of a queue waiting now: ready (available, run_at reached) and
-- how long the oldest of them has waited since it was ready, and running
-- (claimed, not finished). Reads jobs_active_state_idx, over the jobs not
-- finished.
SELECT count(*) FILTER (WHERE j.state = 'available' AND j.run_at <= now())::bigint AS ready,
       count(*) FILTER (WHERE j.state = 'running')::bigint                        AS running,
       COALESCE(extract(epoch FROM now() - min(greatest(j.run_at, j.created_at))
                  FILTER (WHERE j.state = 'available' AND j.run_at <= now())) * 1000,
                0)::float8                                                       AS oldest_ready_ms
FROM jobs AS j
WHERE j.queue = sqlc.arg(queue)::text
  AND j.state IN ('available', 'running')
  AND j.finished_at IS NULL;

-- name: SoakReaderCount :one
-- What each REPEATABLE READ reader of the readers phase runs every 100 ms
-- in its long transaction: a report over the whole jobs table, whose
-- snapshot, taken by the first count, pins the xmin horizon until the
-- transaction ends.
SELECT count(*)::bigint AS jobs
FROM jobs;

-- name: SoakTakeXID :one
-- Assigns the caller's transaction an id, as an application does with its
-- first write, so that an idle transaction holds back the xmin horizon
-- (backend_xid in pg_stat_activity) until it ends: the idle-in-transaction
-- phase runs it in a transaction it then leaves idle.
SELECT txid_current()::bigint AS xid;

-- name: SoakTables :many
-- Every user table of this database (Relay's, and any other): its size on
-- disk (pg_table_size, TOAST and maps included) and its indexes'
-- (pg_indexes_size), and what the statistics say of its rows: live and dead
-- versions, and how often (auto)vacuum has processed it. The statistics
-- lag the writes by up to a second.
SELECT t.schemaname::text                  AS schema_name,
       t.relname::text                     AS table_name,
       pg_table_size(t.relid)::bigint      AS table_bytes,
       pg_indexes_size(t.relid)::bigint    AS index_bytes,
       t.n_live_tup::bigint                AS live_tuples,
       t.n_dead_tup::bigint                AS dead_tuples,
       t.autovacuum_count::bigint          AS autovacuums,
       t.vacuum_count::bigint              AS vacuums
FROM pg_catalog.pg_stat_user_tables AS t
ORDER BY t.schemaname, t.relname;

-- name: SoakIndexes :many
-- Every index of a user table of this database and its size on disk: the
-- claim's index is where the dead versions of a pinned horizon pile up.
SELECT i.schemaname::text                       AS schema_name,
       i.relname::text                          AS table_name,
       i.indexrelname::text                     AS index_name,
       pg_relation_size(i.indexrelid)::bigint   AS index_bytes
FROM pg_catalog.pg_stat_user_indexes AS i
ORDER BY i.schemaname, i.relname, i.indexrelname;

-- name: SoakServer :one
-- The server's WAL written so far (pg_stat_wal, cumulative and
-- server-wide), and the age of the xmin horizon as this database sees it:
-- the oldest snapshot (backend_xmin) and the oldest transaction id
-- (backend_xid) of its other sessions, in transactions, and since when the
-- oldest of those transactions has been open; the replication slots'
-- (xmin, catalog_xmin) and the prepared transactions', which hold the
-- horizon as well; and how many autovacuum workers run on it.
SELECT w.wal_bytes::bigint   AS wal_bytes,
       w.wal_records::bigint AS wal_records,
       w.wal_fpi::bigint     AS wal_fpi,
       (SELECT COALESCE(max(age(a.backend_xmin)), 0)
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid())::bigint AS oldest_xmin_age,
       (SELECT COALESCE(max(age(a.backend_xid)), 0)
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid())::bigint AS oldest_xid_age,
       (SELECT COALESCE(extract(epoch FROM now() - min(a.xact_start)) * 1000, 0)
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.datname = current_database() AND a.pid <> pg_backend_pid()
           AND (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL))::float8 AS oldest_transaction_ms,
       (SELECT COALESCE(max(greatest(age(s.xmin), age(s.catalog_xmin))), 0)
          FROM pg_catalog.pg_replication_slots AS s)::bigint AS slot_xmin_age,
       (SELECT COALESCE(max(age(p.transaction)), 0)
          FROM pg_catalog.pg_prepared_xacts AS p
         WHERE p.database = current_database())::bigint AS prepared_xid_age,
       (SELECT count(*)
          FROM pg_catalog.pg_stat_activity AS a
         WHERE a.datname = current_database() AND a.backend_type = 'autovacuum worker')::bigint AS autovacuum_workers
FROM pg_catalog.pg_stat_wal AS w;

-- name: SoakFillApart :exec
-- Adds @rows jobs, waiting in a queue no worker serves, to the jobs table
-- of the readers' own database (relay experiment soak --readers-apart):
-- rows of a job's width for the readers to count, which no statement of
-- the queue under test reads or writes.
INSERT INTO jobs (queue, kind, payload)
SELECT 'apart', 'sleep', '{"ms": 1}'::jsonb
FROM generate_series(1, sqlc.arg(rows)::integer);

-- name: SoakTableBytes :one
-- The size on disk of the table @table_name, without its indexes; 0 when
-- there is no such table.
SELECT COALESCE(pg_catalog.pg_table_size(to_regclass(sqlc.arg(table_name)::text)), 0)::bigint AS bytes;

-- name: SoakApartUnvacuumed :exec
-- Keeps autovacuum off the readers' table apart, so that, like the
-- queue's table under a pinned horizon, it is never marked all-visible
-- and each count reads its heap.
ALTER TABLE jobs SET (autovacuum_enabled = false);

-- name: SoakFlushStats :exec
-- Has this session report its pending statistics, its WAL written among
-- them, as soon as it goes idle, rather than up to 10 s later: the soak
-- runs it after filling the readers' table apart, so that the fill's WAL
-- is counted before the readers phase starts.
SELECT pg_catalog.pg_stat_force_next_flush();
