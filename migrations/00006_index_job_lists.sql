-- +goose NO TRANSACTION

-- +goose Up

-- The job listing (queries/jobs.sql) filters by queue, kind and state, in
-- any combination, in id order. Each combination reads an index led by its
-- filter's columns, then state, then id, which yields a filter's jobs in id
-- order (without a state, one range per state, merged), so that a page, or
-- a filter that matches nothing, costs the same however long the history:
-- jobs_queue_state_idx (00001) serves the queue alone, these the others.
--
-- Every index on jobs costs a write at every transition of every job,
-- since each changes the state and no update of a state can be HOT. These
-- three are the fewest that cover every combination; none is partial,
-- since a branch of the listing has to find its state's jobs in id order
-- whatever the state.
--
-- Built concurrently, so that claims, heartbeats and acknowledgements go on
-- while they are built over a long history. A build cut short leaves an
-- invalid index behind, so each is dropped first, and a second run of the
-- migration builds it again.
DROP INDEX CONCURRENTLY IF EXISTS jobs_state_idx;
CREATE INDEX CONCURRENTLY jobs_state_idx ON jobs (state, id);

DROP INDEX CONCURRENTLY IF EXISTS jobs_kind_state_idx;
CREATE INDEX CONCURRENTLY jobs_kind_state_idx ON jobs (kind, state, id);

DROP INDEX CONCURRENTLY IF EXISTS jobs_queue_kind_state_idx;
-- Its queue is in the "C" collation, which equals the default one for
-- equality, so that the listing can compare the queue in a way that no other
-- index answers (see JobListByQueueKind in queries/jobs.sql).
CREATE INDEX CONCURRENTLY jobs_queue_kind_state_idx ON jobs (queue COLLATE "C", kind, state, id);

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS jobs_queue_kind_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_kind_state_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_state_idx;
