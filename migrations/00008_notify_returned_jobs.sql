-- +goose Up

-- Tells the workers of a queue when a job there goes back to available
-- with its run_at already passed: taken back from a dead worker, released
-- by one, or retried. Such a job keeps its run_at, which may lie behind
-- where the workers' claims of its priority start (the cursors of
-- JobCompleteAndClaim), so a worker told on this channel makes its next
-- claim from the head. These jobs also notify relay_jobs_available, as
-- every job that becomes ready does.
-- +goose StatementBegin
CREATE FUNCTION jobs_notify_returned() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('relay_jobs_returned', NEW.queue);
    RETURN NULL;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER jobs_notify_returned
    AFTER UPDATE OF state ON jobs
    FOR EACH ROW
    WHEN (OLD.state <> 'available' AND NEW.state = 'available' AND NEW.run_at <= now())
    EXECUTE FUNCTION jobs_notify_returned();

-- +goose Down
DROP TRIGGER jobs_notify_returned ON jobs;
DROP FUNCTION jobs_notify_returned();
