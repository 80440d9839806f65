-- The record of `relay experiment chaos`: what the harness enqueued, every
-- handler execution its workers ran, every fault it injected, and, through
-- triggers, every change of a job's state or lease and every worker
-- session registered. The checker (experiment/chaos_check.go) judges a run
-- from these tables alone.
--
-- The harness applies this file, after Relay's migrations, to a database it
-- created for the run; it is never part of Relay's own schema. Every
-- statement can run twice.

-- Whether jobs of a kind are poison: chaos_panic, chaos_fail and chaos_exit
-- (experiment/chaos_worker.go) never succeed, and must end dead after
-- exactly max_attempts claims. The one list of them the queries use.
CREATE OR REPLACE FUNCTION chaos_poison_kind(kind text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT kind IN ('chaos_panic', 'chaos_fail', 'chaos_exit')
$$;

-- Every job whose enqueue was acknowledged: by the Go call that inserted it
-- (via 'go') or by a 2xx from the HTTP API (via 'http').
CREATE TABLE IF NOT EXISTS chaos_enqueues (
    job_id   bigint      PRIMARY KEY,
    via      text        NOT NULL,
    acked_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Every Idempotency-Key the harness sent an enqueue with, acknowledged or
-- not: a job holding one of these keys was enqueued by the harness even if
-- the answer never arrived (a request cut by a database restart).
CREATE TABLE IF NOT EXISTS chaos_enqueue_keys (
    key text        PRIMARY KEY,
    at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per handler execution, written by the chaos worker: inserted
-- before the handler does anything, completed when it returns, and marked
-- with what became of its acknowledgement (worker.Config.OnAck).
CREATE TABLE IF NOT EXISTS chaos_executions (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     bigint      NOT NULL,
    kind       text        NOT NULL,
    attempt    integer     NOT NULL,
    -- The claim's fence: one execution per (job, fence).
    fence      bigint      NOT NULL,
    worker     text        NOT NULL,
    pid        integer     NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    ended_at   timestamptz,
    -- How the handler returned: ok, error, panic.
    outcome    text,
    -- context.Cause of the handler's context when it was cancelled
    -- (lease lost, job cancelled, worker shutting down).
    cause      text,
    -- worker.Ack.Outcome: completed, failed, lease_lost or released.
    ack        text,
    -- worker.Ack.Accepted: whether the worker was told the database took
    -- the acknowledgement. NULL when the worker died before it knew.
    accepted   boolean,
    acked_at   timestamptz,
    UNIQUE (job_id, fence)
);

-- Every fault: injected by the harness (kill, pause, partition_cut,
-- blackhole, commit_cut, backend_kill, db_restart, bad_input) or by a job
-- (self_exit, written by the worker just before it exits), recorded before
-- it takes effect. target is a worker id, or '*' for all of them.
CREATE TABLE IF NOT EXISTS chaos_faults (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    kind     text        NOT NULL,
    target   text        NOT NULL,
    pid      integer     NOT NULL DEFAULT 0,
    detail   text        NOT NULL DEFAULT '',
    -- When a fault that lasts (pause, partition, restart) was healed.
    ended_at timestamptz
);

-- Every registration of a worker session (a new session key for a worker
-- id), so that a reclaim for an ended session can be matched with the fault
-- that ended that very session.
CREATE TABLE IF NOT EXISTS chaos_sessions (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker      text        NOT NULL,
    session_key integer     NOT NULL,
    at          timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Every update of a job, with the state, lease and fence before and after,
-- classified by what made it:
--   claim      available -> running
--   heartbeat  running -> running, same lease token, lease extended
--   complete   running -> succeeded
--   fail       running -> available | dead | cancelled, with a handler error
--   reclaim    running -> available | dead | cancelled, 'lease expired' or
--              'worker session ended'
--   release    running -> available | cancelled, at a worker's shutdown
--   unclaim    running -> another state, the attempt undone and nothing
--              added to the error history: a job claimed ahead and handed
--              back unstarted
--   other      anything else (cancel marks, retries, and whatever should
--              never happen, such as leaving succeeded)
CREATE TABLE IF NOT EXISTS chaos_transitions (
    id                   bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id               bigint      NOT NULL,
    kind                 text        NOT NULL,
    action               text        NOT NULL,
    old_state            job_state   NOT NULL,
    new_state            job_state   NOT NULL,
    old_token            uuid,
    new_token            uuid,
    old_fence            bigint      NOT NULL,
    new_fence            bigint      NOT NULL,
    old_attempt          integer     NOT NULL,
    new_attempt          integer     NOT NULL,
    old_lease_expires_at timestamptz,
    new_lease_expires_at timestamptz,
    old_leased_by        text,
    new_leased_by        text,
    -- The session the claim this update ends was made under, if any.
    old_lease_session    integer,
    new_run_at           timestamptz NOT NULL,
    -- The entry this update appended to the job's error history, if any.
    error                jsonb,
    -- The fence recorded in the result this update stored, if any.
    result_fence         bigint,
    -- now(): the time of the statement, which every fence and reclaim
    -- compares lease_expires_at with.
    tx_at                timestamptz NOT NULL,
    -- clock_timestamp(): when the row was changed.
    at                   timestamptz NOT NULL
);

CREATE INDEX IF NOT EXISTS chaos_transitions_job_idx ON chaos_transitions (job_id, id);
CREATE INDEX IF NOT EXISTS chaos_transitions_action_idx ON chaos_transitions (action, at);

CREATE OR REPLACE FUNCTION chaos_record_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    entry  jsonb;
    act    text;
    rfence bigint;
BEGIN
    -- Counted, not measured: a history at its cap drops its oldest entry
    -- as it gains a new one.
    IF NEW.error_count > OLD.error_count THEN
        entry := NEW.errors -> -1;
    END IF;
    IF NEW.result IS NOT NULL AND NEW.result IS DISTINCT FROM OLD.result
       AND jsonb_typeof(NEW.result) = 'object' AND jsonb_typeof(NEW.result -> 'fence') = 'number' THEN
        rfence := (NEW.result ->> 'fence')::bigint;
    END IF;
    act := CASE
        WHEN OLD.state = 'available' AND NEW.state = 'running' THEN 'claim'
        WHEN OLD.state = 'running' AND NEW.state = 'running'
             AND OLD.lease_token IS NOT DISTINCT FROM NEW.lease_token
             AND OLD.lease_expires_at IS DISTINCT FROM NEW.lease_expires_at THEN 'heartbeat'
        WHEN OLD.state = 'running' AND NEW.state = 'succeeded' THEN 'complete'
        WHEN OLD.state = 'running' AND NEW.state <> 'running'
             AND entry ->> 'error' IN ('lease expired', 'worker session ended') THEN 'reclaim'
        WHEN OLD.state = 'running' AND NEW.state <> 'running'
             AND entry ->> 'error' LIKE 'released:%' THEN 'release'
        WHEN OLD.state = 'running' AND NEW.state <> 'running' AND entry IS NOT NULL THEN 'fail'
        -- A job claimed ahead and released unstarted: the attempt undone,
        -- nothing added to its history.
        WHEN OLD.state = 'running' AND NEW.state <> 'running' AND entry IS NULL
             AND NEW.attempt = OLD.attempt - 1 THEN 'unclaim'
        ELSE 'other'
    END;
    INSERT INTO chaos_transitions (
        job_id, kind, action, old_state, new_state, old_token, new_token,
        old_fence, new_fence, old_attempt, new_attempt,
        old_lease_expires_at, new_lease_expires_at, old_leased_by, new_leased_by,
        old_lease_session, new_run_at, error, result_fence, tx_at, at)
    VALUES (
        NEW.id, NEW.kind, act, OLD.state, NEW.state, OLD.lease_token, NEW.lease_token,
        OLD.fence, NEW.fence, OLD.attempt, NEW.attempt,
        OLD.lease_expires_at, NEW.lease_expires_at, OLD.leased_by, NEW.leased_by,
        OLD.lease_session, NEW.run_at, entry, rfence, now(), clock_timestamp());
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS chaos_record_transition ON jobs;
CREATE TRIGGER chaos_record_transition
    AFTER UPDATE ON jobs
    FOR EACH ROW
    EXECUTE FUNCTION chaos_record_transition();

CREATE OR REPLACE FUNCTION chaos_record_session() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.session_key IS DISTINCT FROM OLD.session_key THEN
        INSERT INTO chaos_sessions (worker, session_key, at) VALUES (NEW.id, NEW.session_key, clock_timestamp());
    END IF;
    RETURN NULL;
END;
$$;

DROP TRIGGER IF EXISTS chaos_record_session ON workers;
CREATE TRIGGER chaos_record_session
    AFTER INSERT OR UPDATE ON workers
    FOR EACH ROW
    EXECUTE FUNCTION chaos_record_session();
