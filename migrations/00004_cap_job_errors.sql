-- +goose Up

-- A job's error history keeps its newest 20 entries, so that a job failed,
-- reclaimed or released again and again (a manual retry resets its
-- attempts, not its history) stays a bounded read. Every statement that
-- records an error appends it with this function, the one place the cap is
-- written, and counts it in error_count.
-- +goose StatementBegin
CREATE FUNCTION job_errors_append(errors jsonb, entry jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT COALESCE(jsonb_agg(e.entry ORDER BY e.n), '[]')
    FROM jsonb_array_elements(errors || jsonb_build_array(entry)) WITH ORDINALITY AS e (entry, n)
    WHERE e.n > jsonb_array_length(errors) + 1 - 20
$$;
-- +goose StatementEnd

-- Every error ever recorded for the job, those dropped from its history
-- included: the history shows the newest, and error_count less their
-- number says how many older ones were dropped.
ALTER TABLE jobs ADD COLUMN error_count integer NOT NULL DEFAULT 0;

-- Until now every error was kept, so a job's count is the length of its
-- history. A history longer than the cap keeps only its newest entries, in
-- order, as if each had been recorded through job_errors_append
-- (re-appending the newest entry to the others drops the oldest beyond the
-- cap). The entries dropped here are gone for good; error_count still
-- counts them.
UPDATE jobs
SET error_count = jsonb_array_length(errors),
    errors      = job_errors_append(errors - (-1), errors -> -1)
WHERE errors <> '[]';

-- +goose Down
-- Each history keeps the entries it holds; only the count of the dropped
-- ones, which the older schema has no place for, goes.
ALTER TABLE jobs DROP COLUMN error_count;
DROP FUNCTION job_errors_append(jsonb, jsonb);
