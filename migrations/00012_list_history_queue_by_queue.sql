-- +goose NO TRANSACTION

-- +goose Up

-- The history was listed through four indexes over the finished jobs, one
-- for each combination of filters (00011), and each job wrote an entry in
-- all four as it finished: four of the ten index entries a job writes
-- from its claim to its end, and four indexes as long as the history
-- kept. Two of them go. A listing of the history by state alone, or by
-- kind, now reads it queue by queue: through jobs_finished_queue_state_idx
-- or jobs_finished_queue_kind_state_idx, one descent for each queue that
-- holds finished jobs (found as JobQueueStats finds them), at most a page
-- from each, of which the first page's worth is kept (JobList in
-- queries/jobs.sql). A page still costs the same however long the
-- history; it grows with the number of queues instead.
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_kind_state_idx;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_kind_state_idx;
CREATE INDEX CONCURRENTLY jobs_finished_kind_state_idx ON jobs (kind, state, id) WHERE finished_at IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_state_idx;
CREATE INDEX CONCURRENTLY jobs_finished_state_idx ON jobs (state, id) WHERE finished_at IS NOT NULL;
