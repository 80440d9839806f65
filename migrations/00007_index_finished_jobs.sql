-- +goose NO TRANSACTION

-- +goose Up

-- Finished jobs are deleted once their retention has passed (JobPrune in
-- queries/jobs.sql), oldest first, a bounded batch at a time, by every
-- worker's maintenance. This index finds them in that order, by state and
-- finish time, however long the history kept: a prune that finds nothing
-- to delete reads one leaf page per state.
--
-- It is partial, over finished jobs alone, so that claims, heartbeats and
-- retries never write to it: a job adds one entry, when it finishes.
--
-- Built concurrently, as the indexes of 00006 are, so that work goes on
-- while it is built over a long history; a build cut short leaves an
-- invalid index, dropped first on the next run.
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_idx;
CREATE INDEX CONCURRENTLY jobs_finished_idx ON jobs (state, finished_at) WHERE finished_at IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_idx;
