-- +goose Up

-- The life of a job. Only statements in queries/ move a job between states:
--   available -> running                (claim)
--   running   -> succeeded              (complete, fenced by lease token)
--   running   -> available | dead | cancelled   (fail, fenced by lease token)
--   running   -> available | dead       (reclaim, after the lease expired or the worker's session ended)
--   running   -> available              (release, by a worker shutting down)
--   available -> cancelled              (cancel)
--   dead | cancelled -> available       (retry)
CREATE TYPE job_state AS ENUM ('available', 'running', 'succeeded', 'dead', 'cancelled');

CREATE TABLE jobs (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue            text        NOT NULL DEFAULT 'default',
    kind             text        NOT NULL,
    payload          jsonb       NOT NULL DEFAULT '{}',
    -- Lower runs first.
    priority         smallint    NOT NULL DEFAULT 0,
    state            job_state   NOT NULL DEFAULT 'available',
    -- Incremented by every claim, so a job that crashes its worker every
    -- time still runs out of attempts. Reset by a manual retry.
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL DEFAULT 25,
    -- Incremented by every claim and never reset: a number that only grows
    -- over the life of the job, which handlers pass to other systems so
    -- that they can refuse writes from an older claim.
    fence            bigint      NOT NULL DEFAULT 0,
    run_at           timestamptz NOT NULL DEFAULT now(),
    -- Fresh for every claim. Every acknowledgement must present it.
    lease_token      uuid,
    lease_expires_at timestamptz,
    -- The worker that holds (or last held) the job.
    leased_by        text,
    -- Set by cancelling a running job; its worker learns at the next heartbeat.
    cancel_requested_at timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    finished_at      timestamptz,
    last_error       text,
    -- One entry per failed attempt: {"attempt", "worker", "error", "at"}.
    errors           jsonb       NOT NULL DEFAULT '[]',
    result           jsonb,
    idempotency_key  text,

    CONSTRAINT jobs_queue_valid CHECK (queue <> '' AND length(queue) <= 128),
    CONSTRAINT jobs_kind_valid CHECK (kind <> '' AND length(kind) <= 128),
    CONSTRAINT jobs_idempotency_key_valid CHECK (idempotency_key IS NULL OR (idempotency_key <> '' AND length(idempotency_key) <= 255)),
    CONSTRAINT jobs_attempts_valid CHECK (max_attempts >= 1 AND attempt >= 0 AND fence >= attempt),
    CONSTRAINT jobs_errors_array CHECK (jsonb_typeof(errors) = 'array'),
    -- A running job holds exactly one lease; no other state holds one.
    CONSTRAINT jobs_lease_iff_running CHECK (
        (state = 'running') = (lease_token IS NOT NULL)
        AND (state = 'running') = (lease_expires_at IS NOT NULL)
        AND (state <> 'running' OR leased_by IS NOT NULL)
    ),
    CONSTRAINT jobs_running_has_attempt CHECK (state <> 'running' OR (attempt >= 1 AND started_at IS NOT NULL)),
    -- Finished exactly when in a terminal state.
    CONSTRAINT jobs_finished_iff_terminal CHECK (
        (state IN ('succeeded', 'dead', 'cancelled')) = (finished_at IS NOT NULL)
    ),
    CONSTRAINT jobs_result_only_succeeded CHECK (result IS NULL OR state = 'succeeded'),
    CONSTRAINT jobs_cancel_only_running CHECK (cancel_requested_at IS NULL OR state = 'running')
)
-- A queue table is rewritten constantly: every claim, heartbeat and
-- acknowledgement leaves a dead row version behind. Leaving a fifth of each
-- page free lets the new version usually land on the same page as the old
-- one, and vacuuming after 1% of the table has changed (instead of the
-- default 20%), with almost no cost-based throttling, keeps those dead
-- versions from bloating the table and its indexes, which would otherwise
-- slow every claim that has to step over them.
WITH (
    fillfactor = 80,
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- Serves the claim: equality on queue, then exactly the claim's ORDER BY,
-- over available jobs only, so the index stays as small as the backlog.
CREATE INDEX jobs_claim_idx ON jobs (queue, priority, run_at, id) WHERE state = 'available';

-- Serves the reclaim of expired leases.
CREATE INDEX jobs_lease_expiry_idx ON jobs (lease_expires_at) WHERE state = 'running';

-- Serves the reclaim of jobs whose worker's session ended.
CREATE INDEX jobs_leased_by_idx ON jobs (leased_by) WHERE state = 'running';

-- Serves listing by state and the per-queue counts.
CREATE INDEX jobs_queue_state_idx ON jobs (queue, state, id);

CREATE UNIQUE INDEX jobs_idempotency_key_idx ON jobs (queue, idempotency_key) WHERE idempotency_key IS NOT NULL;

-- +goose Down
DROP TABLE jobs;
DROP TYPE job_state;
