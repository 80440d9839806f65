-- +goose Up

-- Every worker process holds a PostgreSQL session with an advisory lock on
-- its session_key (the two-key form, with 1380273241, 'RELY', as the first
-- key). PostgreSQL drops the lock the moment that session ends, when the
-- process dies or its connection is cut, so a reclaim can tell a dead worker
-- from a slow one without waiting for its leases to expire: a worker that is
-- stalled but alive keeps its session and is governed by its leases alone.
CREATE SEQUENCE worker_session_key_seq AS integer MINVALUE 1 CYCLE;

CREATE TABLE workers (
    id          text        PRIMARY KEY,
    session_key integer     NOT NULL UNIQUE,
    queue       text        NOT NULL,
    pid         integer     NOT NULL,
    host        text        NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT workers_id_valid CHECK (id <> '' AND length(id) <= 128)
);

-- Whether the session that registered under this key still holds its lock.
-- pg_locks shows every session's locks to every role, so this works for
-- any user that can connect, unlike pg_stat_activity.
-- +goose StatementBegin
CREATE FUNCTION worker_session_alive(session_key integer) RETURNS boolean
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

-- Wakes idle workers of a queue as soon as a job becomes ready there, so
-- that they need not poll. Notifications with the same payload are merged
-- within a transaction, so a batch insert sends one per queue.
-- +goose StatementBegin
CREATE FUNCTION jobs_notify_available() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_jobs_available', NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER jobs_notify_available
    AFTER INSERT OR UPDATE OF state ON jobs
    FOR EACH ROW
    WHEN (NEW.state = 'available' AND NEW.run_at <= now())
    EXECUTE FUNCTION jobs_notify_available();

-- +goose Down
DROP TRIGGER jobs_notify_available ON jobs;
DROP FUNCTION jobs_notify_available();
DROP FUNCTION worker_session_alive(integer);
DROP TABLE workers;
DROP SEQUENCE worker_session_key_seq;
