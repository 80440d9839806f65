-- +goose NO TRANSACTION

-- +goose Up

-- The claim index covers the jobs with neither a lease nor a finish: the
-- available ones (jobs_lease_iff_running: only a running job holds a
-- lease; jobs_finished_iff_terminal: only a finished job has finished_at).
-- It was partial over state = 'available', and the claim named that state.
--
-- A claim that names state = 'available' also lets the planner read the
-- queue's available entries of jobs_queue_state_idx, or every available
-- entry of jobs_state_idx, and sort them, when its statistics say few
-- jobs are available. While a long transaction holds back vacuum, those
-- entries include one for every version of every job claimed since, and
-- the claim's cursor (a bound of jobs_claim_idx alone) cannot step over
-- them. An analyze by autovacuum during the pin made that plan, the next
-- one a minute later undid it, and in between every claim read thousands
-- of pages (docs/experiments.md, "The claim's index, lost to an analyze").
-- Now the claim names the columns of this predicate instead of the state,
-- and no other index applies to it (JobCompleteAndClaim).
--
-- Built concurrently, as the indexes of 00006, 00007 and 00009 are, and
-- before the index it replaces is dropped, so that claims always have
-- one; it then takes the old one's name.
DROP INDEX CONCURRENTLY IF EXISTS jobs_ready_idx;
CREATE INDEX CONCURRENTLY jobs_ready_idx ON jobs (queue, priority, run_at, id)
    WHERE lease_token IS NULL AND finished_at IS NULL;
DROP INDEX CONCURRENTLY IF EXISTS jobs_claim_idx;
ALTER INDEX jobs_ready_idx RENAME TO jobs_claim_idx;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS jobs_available_idx;
CREATE INDEX CONCURRENTLY jobs_available_idx ON jobs (queue, priority, run_at, id) WHERE state = 'available';
DROP INDEX CONCURRENTLY IF EXISTS jobs_claim_idx;
ALTER INDEX jobs_available_idx RENAME TO jobs_claim_idx;
