-- +goose NO TRANSACTION

-- +goose Up

-- 00012 dropped the history's indexes by state and by kind, and listed
-- the history by state alone, or by kind, queue by queue. A job wrote two
-- index entries fewer as it finished, but such a page read up to a page
-- of every queue that holds finished jobs: over 100 queues and a million
-- finished jobs, a page of 100 jobs by state took 11.6 ms and touched
-- 10,706 buffers where it had taken 0.2 ms and 11 buffers, and a page of
-- 1,000 by kind 131-142 ms where it had taken 2.1-2.8 ms (docs/experiments.md,
-- "The history's indexes by state and by kind, back"). A listing must not
-- grow with the number of queues either, so both indexes are built again,
-- as 00011 built them, and the listings read them (JobList in
-- queries/jobs.sql).
--
-- Built concurrently, so that work goes on while they are built over a
-- long history; a build cut short leaves an invalid index, dropped first
-- on the next run.
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_state_idx;
CREATE INDEX CONCURRENTLY jobs_finished_state_idx ON jobs (state, id) WHERE finished_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_kind_state_idx;
CREATE INDEX CONCURRENTLY jobs_finished_kind_state_idx ON jobs (kind, state, id) WHERE finished_at IS NOT NULL;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_kind_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_state_idx;
