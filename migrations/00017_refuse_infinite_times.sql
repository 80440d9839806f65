-- +goose Up

-- PostgreSQL holds 'infinity' and '-infinity' in a timestamptz; Go's
-- time.Time holds neither, and a row holding one cannot be read. Relay's
-- own statements write only finite times, but an application's INSERT INTO
-- jobs may write any: a job whose run_at is '-infinity' is claimed at
-- once, and the worker that claimed it then failed each round that reads
-- its row, finishing nothing more; one whose run_at is 'infinity' failed
-- every listing page and the GET of the job. A time of a job is finite,
-- or null where the column allows it.
--
-- NOT VALID: the rows already stored are not read, so the migration takes
-- the table's lock only to record the constraint, and loses no row; every
-- row inserted or updated from now on is checked. A job stored earlier
-- with an infinite time is found with
--   SELECT id FROM jobs WHERE NOT (isfinite(run_at) AND isfinite(created_at)
--     AND isfinite(started_at) AND isfinite(finished_at)
--     AND isfinite(lease_expires_at) AND isfinite(cancel_requested_at));
--
-- The lock waits behind every transaction that has read the table, and
-- every statement on the table that comes after waits behind the lock:
-- behind a long report, the queue would stop. Waiting at most 10 s, the
-- migration fails instead, changing nothing, and can be run again.
SET LOCAL lock_timeout = '10s';

ALTER TABLE jobs ADD CONSTRAINT jobs_times_finite CHECK (
    isfinite(run_at) AND isfinite(created_at) AND isfinite(started_at)
    AND isfinite(finished_at) AND isfinite(lease_expires_at) AND isfinite(cancel_requested_at)
) NOT VALID;

-- +goose Down

SET LOCAL lock_timeout = '10s';

ALTER TABLE jobs DROP CONSTRAINT jobs_times_finite;
