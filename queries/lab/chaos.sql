-- Statements of `relay experiment chaos` (package chaos): its chaos
-- workers' record of every execution, the harness's record of enqueues and
-- faults, the faults it injects through the database, and the checker's
-- reading of the history. They use the tables of experiment/schema/chaos.sql,
-- which only the harness's own databases have, so `sqlc vet` (which prepares
-- every query against a database migrated with Relay's schema alone) skips
-- them.

-- name: ChaosExecutionStart :exec
-- Records that a handler starts running one claim of a job. A second
-- record of the same claim changes nothing.
-- @sqlc-vet-disable sqlc/db-prepare
INSERT INTO chaos_executions (job_id, kind, attempt, fence, worker, pid)
VALUES (@job_id, @kind, @attempt, @fence, @worker, @pid)
ON CONFLICT (job_id, fence) DO NOTHING;

-- name: ChaosExecutionsEnd :exec
-- Records how handlers returned: for each (job, fence), when, how (ok,
-- error, panic) and, if its context was cancelled, why.
-- @sqlc-vet-disable sqlc/db-prepare
UPDATE chaos_executions AS e
SET ended_at = f.ended_at,
    outcome  = f.outcome,
    cause    = NULLIF(f.cause, '')
FROM (SELECT unnest(@job_ids::bigint[])         AS job_id,
             unnest(@fences::bigint[])          AS fence,
             unnest(@ended_ats::timestamptz[])  AS ended_at,
             unnest(@outcomes::text[])          AS outcome,
             unnest(@causes::text[])            AS cause) AS f
WHERE e.job_id = f.job_id AND e.fence = f.fence;

-- name: ChaosExecutionsAck :exec
-- Records what became of the acknowledgement of each (job, fence): the
-- outcome the worker reported and whether the database accepted it.
-- @sqlc-vet-disable sqlc/db-prepare
UPDATE chaos_executions AS e
SET ack      = a.ack,
    accepted = a.accepted,
    acked_at = a.acked_at
FROM (SELECT unnest(@job_ids::bigint[])        AS job_id,
             unnest(@fences::bigint[])         AS fence,
             unnest(@acks::text[])             AS ack,
             unnest(@accepted::boolean[])      AS accepted,
             unnest(@acked_ats::timestamptz[]) AS acked_at) AS a
WHERE e.job_id = a.job_id AND e.fence = a.fence;

-- name: ChaosFaultRecord :one
-- Records a fault just before it is injected, at the database's clock.
-- @sqlc-vet-disable sqlc/db-prepare
INSERT INTO chaos_faults (kind, target, pid, detail)
VALUES (@kind, @target, @pid, @detail)
RETURNING id;

-- name: ChaosFaultEnd :exec
-- Records when a lasting fault was healed.
-- @sqlc-vet-disable sqlc/db-prepare
UPDATE chaos_faults SET ended_at = clock_timestamp() WHERE id = @id;

-- name: ChaosEnqueued :exec
-- Records jobs whose enqueue was acknowledged, and how.
-- @sqlc-vet-disable sqlc/db-prepare
INSERT INTO chaos_enqueues (job_id, via)
SELECT unnest(@job_ids::bigint[]), @via::text
ON CONFLICT (job_id) DO NOTHING;

-- name: ChaosEnqueueKeys :exec
-- Records Idempotency-Keys the harness sent enqueues with.
-- @sqlc-vet-disable sqlc/db-prepare
INSERT INTO chaos_enqueue_keys (key)
SELECT unnest(@keys::text[])
ON CONFLICT (key) DO NOTHING;

-- name: ChaosWorkerBackends :many
-- The server processes of the chaos workers' own connections (session and
-- pool; application_name relay-worker-<id>), for the backend-kill scenario.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT a.pid::integer AS pid,
       a.application_name::text AS application_name,
       COALESCE(a.state, '')::text AS state,
       COALESCE(left(a.query, 80), '')::text AS query,
       -- The session connection holds the worker's advisory lock.
       EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l
               WHERE l.pid = a.pid AND l.locktype = 'advisory'
                 AND l.classid = 1380273241::oid AND l.granted)::boolean AS holds_session
FROM pg_catalog.pg_stat_activity AS a
WHERE a.datname = current_database()
  AND a.application_name LIKE 'relay-worker-%'
  AND a.pid <> pg_backend_pid()
ORDER BY a.pid;

-- name: ChaosTerminateBackend :one
-- Ends one server process, as a crashed backend or an administrator would.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT pg_terminate_backend(@pid::integer)::boolean AS terminated;

-- name: ChaosProgress :one
-- How many acknowledged jobs there are, and how many of them are finished.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT count(*)::bigint AS enqueued,
       count(*) FILTER (WHERE j.state IN ('succeeded', 'dead', 'cancelled'))::bigint AS finished
FROM chaos_enqueues AS e
LEFT JOIN jobs AS j ON j.id = e.job_id;

-- name: ChaosRunningByWorker :many
-- How many jobs each worker holds now, and how many of them are long
-- (sleep jobs of at least long_ms) and started less than young_ms ago, so
-- surely still running for a while: the pause scenario's best victim first.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT j.leased_by::text AS worker,
       count(*)::bigint AS running,
       count(*) FILTER (WHERE j.kind = 'sleep' AND (j.payload ->> 'ms')::bigint >= @long_ms::bigint
                          AND j.started_at > now() - interval '1 millisecond' * @young_ms::bigint)::bigint AS long_running
FROM jobs AS j
WHERE j.state = 'running' AND j.finished_at IS NULL
GROUP BY j.leased_by
ORDER BY long_running DESC, running DESC;

-- name: ChaosLost :many
-- Acknowledged jobs that did not end succeeded or dead, or are missing.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT e.job_id, e.via, COALESCE(j.state::text, 'missing')::text AS state
FROM chaos_enqueues AS e
LEFT JOIN jobs AS j ON j.id = e.job_id
WHERE j.id IS NULL OR j.state NOT IN ('succeeded', 'dead')
ORDER BY e.job_id;

-- name: ChaosWrongOutcome :many
-- Acknowledged jobs that finished, but not in the state their kind must:
-- the poison kinds dead, every other kind succeeded. (How a poison job
-- came to die is judged from ChaosPoisonJobs.)
-- @sqlc-vet-disable sqlc/db-prepare
SELECT j.id, j.kind, j.state, j.attempt, j.max_attempts
FROM chaos_enqueues AS e
JOIN jobs AS j ON j.id = e.job_id
WHERE j.state IN ('succeeded', 'dead')
  AND j.state <> CASE WHEN chaos_poison_kind(j.kind) THEN 'dead' ELSE 'succeeded' END::job_state
ORDER BY j.id;

-- name: ChaosUnexpected :many
-- Executions of jobs the harness never enqueued: neither acknowledged nor
-- sent with one of the harness's Idempotency-Keys.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT x.job_id, x.fence, x.worker
FROM chaos_executions AS x
LEFT JOIN jobs AS j ON j.id = x.job_id
WHERE NOT EXISTS (SELECT 1 FROM chaos_enqueues AS e WHERE e.job_id = x.job_id)
  AND (j.idempotency_key IS NULL
       OR NOT EXISTS (SELECT 1 FROM chaos_enqueue_keys AS k WHERE k.key = j.idempotency_key))
ORDER BY x.job_id, x.fence;

-- name: ChaosUnacknowledgedJobs :many
-- Jobs in the table that no acknowledged enqueue accounts for, and whether
-- the harness at least sent them (under one of its Idempotency-Keys): a
-- write nobody sent is a phantom; one the harness sent but never heard back
-- about is an enqueue whose answer was lost.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT j.id, j.kind,
       (j.idempotency_key IS NOT NULL
        AND EXISTS (SELECT 1 FROM chaos_enqueue_keys AS k WHERE k.key = j.idempotency_key))::boolean AS sent_by_harness
FROM jobs AS j
WHERE NOT EXISTS (SELECT 1 FROM chaos_enqueues AS e WHERE e.job_id = j.id)
ORDER BY j.id;

-- name: ChaosStaleTransitions :many
-- Acknowledgements the database applied although they were stale: a
-- complete, fail, heartbeat, or release (of a running job, or of one claimed ahead) applied when
-- the lease had already expired by the statement's own clock (now(), the
-- time every fence compares with); a completion whose result was produced by another claim
-- than the current one (the result's fence); a failure whose error names
-- another claim's fence (the chaos kinds put fence=N in their errors).
-- @sqlc-vet-disable sqlc/db-prepare
SELECT t.id, t.job_id, t.kind, t.action, t.old_fence,
       COALESCE(t.result_fence, 0)::bigint AS result_fence,
       t.old_lease_expires_at, t.tx_at,
       CASE
           WHEN t.old_lease_expires_at IS NULL OR t.old_lease_expires_at <= t.tx_at THEN 'lease expired before the statement'
           WHEN t.action = 'complete' THEN 'result produced by another claim'
           ELSE 'error produced by another claim'
       END::text AS reason
FROM chaos_transitions AS t
WHERE t.action IN ('complete', 'fail', 'heartbeat', 'release', 'unclaim')
  AND (t.old_lease_expires_at IS NULL
       OR t.old_lease_expires_at <= t.tx_at
       OR (t.action = 'complete' AND t.result_fence IS NOT NULL AND t.result_fence <> t.old_fence)
       OR (t.action = 'fail' AND substring(t.error ->> 'error' FROM 'fence=([0-9]+)') IS NOT NULL
           AND substring(t.error ->> 'error' FROM 'fence=([0-9]+)')::bigint <> t.old_fence))
ORDER BY t.id;

-- name: ChaosStaleAcceptedExecutions :many
-- Executions whose worker was told its completion or failure was accepted,
-- although the database holds no such transition from that very claim
-- (same job, same fence).
-- @sqlc-vet-disable sqlc/db-prepare
SELECT x.job_id, x.fence, x.worker, x.ack
FROM chaos_executions AS x
WHERE x.accepted
  AND x.ack IN ('completed', 'failed', 'released')
  AND NOT EXISTS (
      SELECT 1 FROM chaos_transitions AS t
      WHERE t.job_id = x.job_id
        AND t.old_fence = x.fence
        AND t.action = CASE x.ack WHEN 'completed' THEN 'complete' WHEN 'failed' THEN 'fail' ELSE 'release' END)
ORDER BY x.job_id, x.fence;

-- name: ChaosAmbiguousCompletions :many
-- Completions that landed although their worker was told they did not:
-- the answer was lost (a connection cut as the commit happened) and the
-- retry found the job already succeeded. Harmless by design; counted to
-- show that the cut-at-commit fault really hit a commit.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT x.job_id, x.fence, x.worker
FROM chaos_executions AS x
JOIN chaos_transitions AS t
  ON t.job_id = x.job_id AND t.old_fence = x.fence AND t.action = 'complete'
WHERE x.ack = 'completed' AND x.accepted = false
ORDER BY x.job_id;

-- name: ChaosTerminalChanges :many
-- Updates of a job that had already succeeded or died (the harness never
-- retries, so there must be none): a terminal state left or finalised twice.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT t.id, t.job_id, t.old_state, t.new_state, t.action, t.at
FROM chaos_transitions AS t
WHERE t.old_state IN ('succeeded', 'dead')
ORDER BY t.id;

-- name: ChaosReclaims :many
-- Every reclaim, with what the checker needs to judge it and to time it:
-- the reason, the worker and lease taken away, when the reclaimed claim was
-- made, when the session that claim was made under registered (for a claim
-- without a session, the worker's session current at the claim), and when
-- the job was claimed next. A claim is judged by its own session: one sent
-- under a session before a partition may run only once it heals, after the
-- worker registered its next session.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT r.id, r.job_id, r.kind,
       (r.error ->> 'error')::text AS reason,
       COALESCE(r.old_leased_by, '')::text AS worker,
       r.old_fence, r.old_lease_expires_at, r.tx_at, r.at,
       r.new_state, r.old_lease_session,
       c.at AS claimed_at,
       -- Year 1 (the zero time.Time) when there is none.
       COALESCE(sess.at, '0001-01-01 00:00:00+00')::timestamptz AS session_at,
       COALESCE(nxt.at, '0001-01-01 00:00:00+00')::timestamptz AS next_claim_at
FROM chaos_transitions AS r
LEFT JOIN chaos_transitions AS c
  ON c.job_id = r.job_id AND c.action = 'claim' AND c.new_fence = r.old_fence
LEFT JOIN LATERAL (
    SELECT s.at FROM chaos_sessions AS s
    WHERE s.worker = r.old_leased_by
      AND CASE WHEN r.old_lease_session IS NOT NULL THEN s.session_key = r.old_lease_session
               ELSE s.at <= c.at END
    ORDER BY s.at DESC LIMIT 1
) AS sess ON true
LEFT JOIN LATERAL (
    SELECT n.at FROM chaos_transitions AS n
    WHERE n.job_id = r.job_id AND n.action = 'claim' AND n.id > r.id
    ORDER BY n.id LIMIT 1
) AS nxt ON true
WHERE r.action = 'reclaim'
ORDER BY r.id;

-- name: ChaosFaults :many
-- @sqlc-vet-disable sqlc/db-prepare
SELECT id, at, kind, target, pid, detail, ended_at
FROM chaos_faults
ORDER BY at, id;

-- name: ChaosDuplicates :one
-- How often jobs ran more than once. A job's own failures (accepted) call
-- for its retries, and the poison kinds run max_attempts times by design:
-- a duplicate is a job of a healthy kind that ran more than once beyond
-- that. Returns how many jobs were duplicated, how many extra executions
-- that made, the most executions of one job, and executions in all.
-- @sqlc-vet-disable sqlc/db-prepare
WITH per_job AS (
    SELECT x.job_id, x.kind,
           count(*) AS runs,
           count(*) - count(*) FILTER (WHERE x.ack = 'failed' AND x.accepted) AS deliveries
    FROM chaos_executions AS x
    GROUP BY x.job_id, x.kind
)
SELECT count(*) FILTER (WHERE p.deliveries > 1 AND NOT chaos_poison_kind(p.kind))::bigint AS duplicated_jobs,
       COALESCE(sum(p.deliveries - 1) FILTER (WHERE p.deliveries > 1 AND NOT chaos_poison_kind(p.kind)), 0)::bigint AS extra_executions,
       COALESCE(max(p.runs), 0)::bigint AS max_runs,
       COALESCE(sum(p.runs), 0)::bigint AS executions
FROM per_job AS p;

-- name: ChaosPoisonJobs :many
-- Every job of a poison kind: how it ended, how many times it was claimed
-- (a claim released unstarted, which undoes its attempt, does not count),
-- how many of its claims were retries after a failure (a claim after a
-- reclaim has no backoff to honour), how many of those came before the
-- retry time the failure set (a backoff not honoured), and by how little
-- the earliest one came after it (0 when there was no retry).
-- @sqlc-vet-disable sqlc/db-prepare
WITH t AS (
    SELECT c.job_id, c.action,
           -- A claim right after a failure: a retry, with a backoff to honour.
           c.action = 'claim' AND lag(c.action) OVER w = 'fail' AS retry,
           -- For a retry: how long after the retry time the failure set.
           c.tx_at - lag(c.new_run_at) OVER w AS slack
    FROM chaos_transitions AS c
    WHERE chaos_poison_kind(c.kind)
    WINDOW w AS (PARTITION BY c.job_id ORDER BY c.id)
)
SELECT j.id, j.kind, j.state, j.attempt, j.max_attempts,
       (count(t.job_id) FILTER (WHERE t.action = 'claim')
        - count(t.job_id) FILTER (WHERE t.action = 'unclaim'))::bigint AS claims,
       count(t.job_id) FILTER (WHERE t.retry)::bigint AS retries_after_failure,
       count(t.job_id) FILTER (WHERE t.retry AND t.slack < interval '0')::bigint AS early_claims,
       COALESCE(1000 * EXTRACT(EPOCH FROM min(t.slack) FILTER (WHERE t.retry)), 0)::float8 AS min_backoff_slack_ms
FROM jobs AS j
LEFT JOIN t ON t.job_id = j.id
WHERE chaos_poison_kind(j.kind)
GROUP BY j.id
ORDER BY j.id;

-- name: ChaosExecutions :many
-- Every execution, for the checks that follow one worker through a fault.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT id, job_id, kind, attempt, fence, worker, pid, started_at, ended_at,
       outcome, cause, ack, accepted, acked_at
FROM chaos_executions
ORDER BY id;

-- name: ChaosAppliedOutcomes :many
-- When the database applied each completion, failure or release, by its
-- clock, keyed by the claim it ended (job and fence). A worker learns of
-- an acknowledgement only when the answer reaches it, which for a worker
-- frozen with a statement in flight is after it wakes, however long
-- before the database applied it.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT t.job_id, t.old_fence AS fence, t.action, t.at
FROM chaos_transitions AS t
WHERE t.action IN ('complete', 'fail', 'release')
ORDER BY t.id;

-- name: ChaosActionCounts :many
-- How many transitions of each action happened between two instants.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT t.action, count(*)::bigint AS n
FROM chaos_transitions AS t
WHERE t.at >= @since::timestamptz AND t.at < @until::timestamptz
GROUP BY t.action
ORDER BY t.action;

-- name: ChaosSessions :many
-- @sqlc-vet-disable sqlc/db-prepare
SELECT id, worker, session_key, at
FROM chaos_sessions
ORDER BY id;

-- name: ChaosFirstClaims :many
-- For each worker, its first claim at or after a given instant.
-- @sqlc-vet-disable sqlc/db-prepare
SELECT t.new_leased_by::text AS worker, min(t.at)::timestamptz AS at
FROM chaos_transitions AS t
WHERE t.action = 'claim' AND t.at >= @since::timestamptz
GROUP BY t.new_leased_by;
