-- +goose Up

-- Since migration 00014 each queue's jobs are announced on channels of the
-- queue's own (relay_queue_channel), and workers listen there alone. The
-- channels shared by all queues (relay_jobs_available,
-- relay_jobs_returned) were still notified for workers started before
-- 00014, so that they could keep running through the upgrade. From here on
-- they are not: a notification costs its commit even when no one listens,
-- and every notifying commit of the server goes one at a time
-- (docs/experiments.md, "The shared channels, no longer notified").
--
-- A worker of a build before migration 00014 that still runs after this
-- one hears of no new job and finds its jobs by polling alone, once per
-- poll interval (a second by default). Restart such workers with the new
-- build before applying this migration (README, "Upgrading").

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION jobs_notify_available() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(relay_queue_channel('available', NEW.queue), NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION jobs_notify_returned() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(relay_queue_channel('returned', NEW.queue), NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down

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
