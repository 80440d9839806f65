-- +goose NO TRANSACTION

-- +goose Up

-- The listing's indexes (jobs_queue_state_idx of 00001, and those of
-- 00006) covered every job, so every transition of every job wrote an
-- entry in each of the four: twelve of the nineteen index entries a job
-- wrote between its insert and its end (docs/experiments.md, "Burn-down:
-- what a job costs the server").
--
-- They are replaced by indexes over the finished jobs alone, which a job
-- enters once, when it finishes, and one index over the jobs not finished,
-- by state and id, which a job enters at its insert and at its claim (and
-- whenever it goes back to available). A job now writes thirteen entries
-- in all. The history, however long, is listed through the first, as
-- before; the backlog through the second, which holds only the jobs
-- waiting or running: a listing of the backlog that filters by queue or
-- kind reads the entries of its state and checks each job's queue and
-- kind, so that it costs at most the backlog of that state, never the
-- history.
--
-- Built concurrently, as the indexes of 00006 to 00010 are, each new one
-- before the old ones are dropped, so that listings always have an index.
-- A build cut short leaves an invalid index, dropped first on the next
-- run.
DROP INDEX CONCURRENTLY IF EXISTS jobs_active_state_idx;
CREATE INDEX CONCURRENTLY jobs_active_state_idx ON jobs (state, id) WHERE finished_at IS NULL;

DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_state_idx;
CREATE INDEX CONCURRENTLY jobs_finished_state_idx ON jobs (state, id) WHERE finished_at IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_queue_state_idx;
CREATE INDEX CONCURRENTLY jobs_finished_queue_state_idx ON jobs (queue, state, id) WHERE finished_at IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_kind_state_idx;
CREATE INDEX CONCURRENTLY jobs_finished_kind_state_idx ON jobs (kind, state, id) WHERE finished_at IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_queue_kind_state_idx;
-- In the "C" collation, as jobs_queue_kind_state_idx was (see
-- JobListByQueueKind in queries/jobs.sql).
CREATE INDEX CONCURRENTLY jobs_finished_queue_kind_state_idx ON jobs (queue COLLATE "C", kind, state, id)
    WHERE finished_at IS NOT NULL;

DROP INDEX CONCURRENTLY IF EXISTS jobs_queue_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_kind_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_queue_kind_state_idx;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS jobs_queue_state_idx;
CREATE INDEX CONCURRENTLY jobs_queue_state_idx ON jobs (queue, state, id);
DROP INDEX CONCURRENTLY IF EXISTS jobs_state_idx;
CREATE INDEX CONCURRENTLY jobs_state_idx ON jobs (state, id);
DROP INDEX CONCURRENTLY IF EXISTS jobs_kind_state_idx;
CREATE INDEX CONCURRENTLY jobs_kind_state_idx ON jobs (kind, state, id);
DROP INDEX CONCURRENTLY IF EXISTS jobs_queue_kind_state_idx;
CREATE INDEX CONCURRENTLY jobs_queue_kind_state_idx ON jobs (queue COLLATE "C", kind, state, id);

DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_queue_kind_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_kind_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_queue_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_finished_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_active_state_idx;
