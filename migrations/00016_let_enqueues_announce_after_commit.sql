-- +goose Up

-- A commit that notifies takes a lock of the whole server before its WAL
-- is flushed and keeps it until it ends (PreCommit_Notify), so commits
-- that notify go one at a time and share no flush. One-job inserts, each
-- notifying its queue's listeners from this trigger, committed about 4,700
-- times a second here against 9,200 to 9,800 with the trigger disabled;
-- with the flush made a millisecond longer (commit_delay), client.Insert
-- stored 735 to 738 jobs a second from eight goroutines (docs/experiments.md,
-- "Enqueues announced after their commit").
--
-- An insert that commits on its own can instead have its job announced by
-- a statement of its own once it has committed, which holds that lock only
-- briefly. Such an insert says so by setting relay.announce to
-- 'after_commit' for its transaction (JobInsert), and this trigger then
-- leaves the notification to the caller (JobAnnounce). Every other insert,
-- among them those in a transaction of the caller's, which may commit much
-- later, and the grouped inserts of relay serve, still notifies at its
-- commit.

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION jobs_notify_available() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('relay.announce', true) IS DISTINCT FROM 'after_commit' THEN
        PERFORM pg_notify(relay_queue_channel('available', NEW.queue), NEW.queue);
    END IF;
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

-- +goose Down

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION jobs_notify_available() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(relay_queue_channel('available', NEW.queue), NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd
