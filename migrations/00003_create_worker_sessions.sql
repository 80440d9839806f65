-- +goose Up

-- Every session a worker process has held: one row per registration, never
-- updated, under a session key drawn once from worker_session_key_seq. A
-- job records the session it was claimed under (jobs.lease_session), and
-- whether its worker is gone is judged from that session alone: its lock is
-- gone from pg_locks. A key is never registered twice, so a session whose
-- lock is gone has ended for good, whatever later sessions of the same
-- worker id do. The workers table keeps, for each worker id, the session
-- that holds it now.
CREATE TABLE worker_sessions (
    session_key integer     PRIMARY KEY,
    worker_id   text        NOT NULL,
    queue       text        NOT NULL,
    pid         integer     NOT NULL,
    host        text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now()
);

INSERT INTO worker_sessions (session_key, worker_id, queue, pid, host, started_at)
SELECT w.session_key, w.id, w.queue, w.pid, w.host, w.started_at
FROM workers AS w;

-- The session a running job was claimed under; null for a job claimed by a
-- worker that has no session (one that reaches the database only through a
-- transaction-mode pooler), which only its lease governs.
ALTER TABLE jobs ADD COLUMN lease_session integer;

UPDATE jobs AS j
SET lease_session = w.session_key
FROM workers AS w
WHERE j.state = 'running' AND w.id = j.leased_by;

ALTER TABLE jobs ADD CONSTRAINT jobs_lease_session_only_running
    CHECK (lease_session IS NULL OR state = 'running');

-- Serves the reclaim of jobs whose session ended, which looks them up by
-- session; it replaces the lookup by worker id.
CREATE INDEX jobs_lease_session_idx ON jobs (lease_session) WHERE state = 'running';
DROP INDEX jobs_leased_by_idx;

-- The session keys whose worker session holds its lock now: one scan of
-- pg_locks, however many sessions there are. Only the exclusive,
-- session-level lock a worker takes when it registers counts; a claim
-- probing a key takes a shared one for its transaction.
CREATE VIEW worker_sessions_live AS
SELECT l.objid::integer AS session_key
FROM pg_catalog.pg_locks AS l
WHERE l.locktype = 'advisory'
  AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
  AND l.classid = 1380273241::oid
  AND l.objsubid = 2
  AND l.mode = 'ExclusiveLock'
  AND l.granted;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION worker_session_alive(session_key integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM worker_sessions_live AS l WHERE l.session_key = worker_session_alive.session_key)
$$;
-- +goose StatementEnd

-- +goose Down
-- +goose StatementBegin
CREATE OR REPLACE FUNCTION worker_session_alive(session_key integer) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1
        FROM pg_catalog.pg_locks AS l
        WHERE l.locktype = 'advisory'
          AND l.database = (SELECT d.oid FROM pg_catalog.pg_database AS d WHERE d.datname = current_database())
          AND l.classid = 1380273241::oid
          AND l.objid = session_key::oid
          AND l.objsubid = 2
          AND l.granted
    )
$$;
-- +goose StatementEnd
DROP VIEW worker_sessions_live;
CREATE INDEX jobs_leased_by_idx ON jobs (leased_by) WHERE state = 'running';
DROP INDEX jobs_lease_session_idx;
ALTER TABLE jobs DROP CONSTRAINT jobs_lease_session_only_running;
ALTER TABLE jobs DROP COLUMN lease_session;
DROP TABLE worker_sessions;
