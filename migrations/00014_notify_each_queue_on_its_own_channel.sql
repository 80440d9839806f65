-- +goose Up

-- Until now every job that became ready notified one channel for all
-- queues (relay_jobs_available, relay_jobs_returned), with the queue as
-- payload, so that every worker's session was sent every queue's
-- notifications and its process woken for each, to throw away those of
-- other queues. With 50 idle workers of another queue listening, one-job
-- inserts committed 630-756 times a second against 4,061 with none
-- (docs/experiments.md, "Every listener hears every queue"). From here on
-- each queue has a channel of its own for each event, and a worker listens
-- only to its queue's.
--
-- The channels of all queues are still notified too, for workers started
-- before this migration, which listen there. Listened to by no one, they
-- wake no one, but a second notification costs one-job inserts about 5%
-- of their rate. A later migration stops notifying them.

-- relay_queue_channel names the channel of one queue's notifications of
-- event ('available' or 'returned'). A queue name may be 128 characters
-- long and a channel's 63 bytes at most, so the name holds the first 128
-- bits of the queue's SHA-256 (not MD5, which servers in FIPS mode
-- refuse): two queues whose hashes agree would share a channel, and the
-- workers, which check the payload, still act on their own queue's
-- notifications alone.
CREATE FUNCTION relay_queue_channel(event text, queue text) RETURNS text
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN 'relay_' || event || '_' || left(encode(sha256(convert_to(queue, 'UTF8')), 'hex'), 32);

-- worker_listen subscribes the calling session to the notifications of
-- queue: jobs that became available there, and jobs that went back to
-- available there. LISTEN takes a name, not a value, hence the function.
-- +goose StatementBegin
CREATE FUNCTION worker_listen(queue text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE format('LISTEN %I', relay_queue_channel('available', queue));
    EXECUTE format('LISTEN %I', relay_queue_channel('returned', queue));
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION jobs_notify_available() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(relay_queue_channel('available', NEW.queue), NEW.queue);
    PERFORM pg_notify('relay_jobs_available', NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION jobs_notify_returned() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(relay_queue_channel('returned', NEW.queue), NEW.queue);
    PERFORM pg_notify('relay_jobs_returned', NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION jobs_notify_returned() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_jobs_returned', NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION jobs_notify_available() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_jobs_available', NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

DROP FUNCTION worker_listen(text);
DROP FUNCTION relay_queue_channel(text, text);
