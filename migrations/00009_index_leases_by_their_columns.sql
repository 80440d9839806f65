-- +goose NO TRANSACTION

-- +goose Up

-- The reclaim finds expired leases, and the jobs of ended sessions, by
-- these two indexes. They were partial over running jobs (WHERE state =
-- 'running'); they now cover the jobs that hold a lease, and those that
-- name a session, which are the running jobs (jobs_lease_iff_running,
-- jobs_lease_session_only_running), so that the reclaim reaches them
-- without naming the state.
--
-- A statement that names state = 'running' also lets the planner read the
-- entries of jobs_state_idx for running jobs, of which its statistics say
-- there are few. While a long transaction holds back vacuum, that index
-- keeps an entry for every running version of every job since, and the
-- reclaim read them all at each pass (see docs/experiments.md, "Why a
-- pinned horizon hurts Relay"). So the statements of queries/leases.sql
-- recognise a running job by its lease, or its session, never by its
-- state, and the fences compare the lease token in a way from which the
-- planner cannot infer that the job holds one (see JobCompleteAndClaim).
--
-- Built concurrently, as the indexes of 00006 and 00007 are; each is
-- built before the one it replaces is dropped, so that the reclaim always
-- has one.
DROP INDEX CONCURRENTLY IF EXISTS jobs_lease_expires_at_idx;
CREATE INDEX CONCURRENTLY jobs_lease_expires_at_idx ON jobs (lease_expires_at) WHERE lease_token IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS jobs_lease_expiry_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_lease_session_key_idx;
CREATE INDEX CONCURRENTLY jobs_lease_session_key_idx ON jobs (lease_session) WHERE lease_session IS NOT NULL;
DROP INDEX CONCURRENTLY IF EXISTS jobs_lease_session_idx;

-- +goose Down
DROP INDEX CONCURRENTLY IF EXISTS jobs_lease_session_idx;
CREATE INDEX CONCURRENTLY jobs_lease_session_idx ON jobs (lease_session) WHERE state = 'running';
DROP INDEX CONCURRENTLY IF EXISTS jobs_lease_session_key_idx;
DROP INDEX CONCURRENTLY IF EXISTS jobs_lease_expiry_idx;
CREATE INDEX CONCURRENTLY jobs_lease_expiry_idx ON jobs (lease_expires_at) WHERE state = 'running';
DROP INDEX CONCURRENTLY IF EXISTS jobs_lease_expires_at_idx;
