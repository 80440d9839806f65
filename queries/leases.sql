-- name: JobCompleteAndClaim :many
-- Completes the finished jobs given (id, token, result) and claims ready
-- jobs of the queue for the worker, one for each lease token given, in one
-- statement and one commit, so that a worker with a free slot hands in one
-- job and picks up the next in a single round trip. Either list may be
-- empty.
--
-- The claim takes ready jobs in the order of jobs_claim_idx (priority, then
-- run_at, then id; see cursors below), skipping rows other claimers hold locked, so concurrent
-- workers never wait on each other nor claim the same job. Every claim
-- bumps attempt and fence and sets the lease expiry in database time. The
-- worker draws the lease tokens itself, fresh and random for every claim,
-- so that when the answer to this statement is lost it can still find the
-- jobs it claimed (JobGetClaimed). The claim is committed before any
-- handler runs.
--
-- A claim is made under the worker's session (session_key), which must
-- still hold its lock: a worker whose session ended claims nothing, since
-- any worker would take such jobs back at once, charging an attempt that
-- never ran. A worker without a session (session_key null) claims under
-- its leases alone. Before it looks at the session, the claim takes the
-- session's claim lock, shared, until it commits: the session's row is
-- forgotten only under that lock, taken exclusively
-- (WorkerStopClaimsOfEndedSessions), so a claim that found the session
-- alive has committed its jobs under it, for reclaims to find, before its
-- row can go; and a claim that cannot take the lock claims nothing.
--
-- The claim runs before the completions. The whole statement reads one
-- snapshot, taken as it begins, and a claim that scans for ready jobs only
-- after its completions (which may wait on a row another transaction
-- holds) finds there the jobs that other workers claimed and committed in
-- the meantime, still looking ready. FOR UPDATE then follows each to its
-- newest version, locks it, finds it taken and skips it, but keeps the
-- lock until this statement commits, and the worker running that job
-- waits on this one to complete it (docs/experiments.md, "The claim
-- before the completions").
--
-- A completion waits for a row another transaction holds for lock_wait_ms
-- at most (lock_timeout, for this statement alone): an operator's SELECT
-- ... FOR UPDATE of one job's row must not hold up the round's other
-- completions, which would otherwise wait with it and lose their leases.
-- The statement then fails (SQLSTATE 55P03) and commits nothing, and the
-- worker asks which rows are held (JobHeldElsewhere), sets their outcomes
-- aside and sends the others again.
--
-- The statement always returns at least one row. Each claimed job fills the
-- columns of one row, in the order of the claim (all null when nothing was
-- claimed). completed_ids lists the completions that passed the fence, on
-- the first row only: the others carry null, since a list repeated on
-- every row of a round of 200 completions and 200 claims sends 40,000 ids.
WITH completions AS (
    SELECT unnest(@complete_ids::bigint[]) AS id,
           unnest(@complete_tokens::uuid[]) AS token,
           unnest(@complete_results::jsonb[]) AS result
),
lock_wait AS MATERIALIZED (
    SELECT set_config('lock_timeout', CAST(@lock_wait_ms::integer AS text), true) AS setting
),
session AS (
    -- Taking a shared lock on the key succeeds only if no session holds
    -- it: then the session has ended (and this transaction holds the
    -- shared lock until it commits, which harms no one). CASE takes the
    -- claim lock (1380273244) first.
    SELECT sqlc.narg(session_key)::integer IS NULL
        OR CASE WHEN pg_try_advisory_xact_lock_shared(1380273244, sqlc.narg(session_key)::integer)
                THEN NOT pg_try_advisory_xact_lock_shared(1380273241, sqlc.narg(session_key)::integer)
                ELSE false
           END AS alive
),
-- The claim scans the claim index from where the worker says each priority's
-- ready jobs begin (cursor_priorities, with cursor_since the run_at to start
-- at, one per priority, ascending), and every priority between those from
-- its head. With no cursor, one scan covers every priority from the head.
-- A cursor lets a claim step over what it cannot take: while a long
-- transaction holds back vacuum, the index keeps an entry for every job
-- claimed since it began, at the head of its priority, and a claim from the
-- head visits each (see docs/experiments.md, "Why a pinned horizon hurts
-- Relay"). A cursor only narrows where a claim looks; a job behind one (a
-- job released or taken back keeps its run_at, and so its place) is found
-- by the next claim from the head, which each worker makes every so often.
-- The cursors are kept per priority so that a more urgent job is never
-- waiting behind a less urgent one's cursor.
cursors AS (
    SELECT DISTINCT ON (c.priority) c.priority, c.since
    FROM (SELECT unnest(@cursor_priorities::smallint[]) AS priority,
          unnest(@cursor_since::timestamptz[]) AS since) AS c
    ORDER BY c.priority, c.since
),
segments AS (
    SELECT c.priority::integer AS lo, c.priority::integer AS hi, c.since FROM cursors AS c
    UNION ALL
    SELECT g.lo, g.hi, '-infinity'::timestamptz
    FROM (
        SELECT COALESCE(lag(c.priority) OVER (ORDER BY c.priority) + 1, -32768) AS lo, c.priority - 1 AS hi
        FROM cursors AS c
        UNION ALL
        SELECT COALESCE(max(c.priority) + 1, -32768), 32767 FROM cursors AS c
    ) AS g
    WHERE g.lo <= g.hi
),
-- The segments are scanned one after another, in the order of their
-- priorities, and the claim stops once it has its jobs: each scan locks
-- only the rows it returns, and the scans of later segments never run, so
-- the claim locks no more ready jobs than it takes. The claim is ordered
-- by segment alone, which the segments' own order gives with no sort; a
-- sort of what every segment returns would make every scan run first,
-- each locking up to the whole claim's worth, and a concurrent claim would
-- skip the jobs locked beyond it, ready and untaken
-- (TestClaim_LocksNoMoreJobsThanItTakes).
ready AS (
    SELECT r.id, r.priority, r.run_at
    FROM (SELECT s.lo, s.hi, s.since FROM segments AS s ORDER BY s.lo) AS seg
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM jobs AS j
        -- Available: neither leased nor finished. Named by the columns of
        -- jobs_claim_idx's predicate, not by the state, so that no other
        -- index can serve the claim (see migrations/00010).
        WHERE j.lease_token IS NULL AND j.finished_at IS NULL
          AND j.queue = @queue
          AND (j.priority, j.run_at) >= (seg.lo, seg.since)
          AND j.priority <= seg.hi
          AND j.run_at <= now()
        ORDER BY j.priority, j.run_at, j.id
        LIMIT COALESCE(cardinality(@claim_tokens::uuid[]), 0)
        FOR UPDATE SKIP LOCKED
    ) AS r
    WHERE (SELECT s.alive FROM session AS s)
    ORDER BY seg.lo
    LIMIT COALESCE(cardinality(@claim_tokens::uuid[]), 0)
),
-- The jobs taken, in the order of the claim: each takes the lease token
-- at its place among them.
picked AS (
    SELECT ARRAY(SELECT ready.id FROM ready ORDER BY ready.priority, ready.run_at, ready.id) AS ids
),
claimed AS (
    UPDATE jobs AS j
    SET state            = 'running',
        attempt          = j.attempt + 1,
        fence            = j.fence + 1,
        lease_token      = (@claim_tokens::uuid[])[array_position((SELECT p.ids FROM picked AS p), j.id)],
        lease_expires_at = now() + interval '1 millisecond' * @lease_ms::bigint,
        leased_by        = @worker_id::text,
        lease_session    = sqlc.narg(session_key)::integer,
        started_at       = now()
    -- By primary key, one probe per job, whatever plan the connection
    -- keeps: a join with the jobs taken may be planned as a hash join
    -- that reads the whole table.
    WHERE j.id = ANY ((SELECT p.ids FROM picked AS p)::bigint[])
    RETURNING array_position((SELECT p.ids FROM picked AS p), j.id) AS n,
              j.id, j.queue, j.kind, j.payload, j.priority, j.attempt, j.max_attempts,
              j.fence, j.lease_token, j.lease_expires_at, j.created_at, j.run_at, j.started_at
),
completed AS (
    UPDATE jobs AS j
    SET state            = 'succeeded',
        result           = c.result,
        finished_at      = now(),
        lease_token      = NULL,
        lease_expires_at = NULL,
        lease_session    = NULL,
        cancel_requested_at = NULL
    FROM completions AS c
    WHERE j.id = c.id
      -- Always true: it makes the claim run first (see above).
      AND (SELECT count(*) FROM claimed) >= 0
      -- Always true: it sets the lock wait before any row is updated.
      AND (SELECT w.setting FROM lock_wait AS w) IS NOT NULL
      -- The fence: the same claim, still running, lease not yet expired.
      --
      -- Only a running job holds a lease (jobs_lease_iff_running), so the
      -- lease says it runs; and the token given is never null, so "not
      -- distinct from" it is "equal to" it. Neither the state nor an
      -- equality on the token is written, so that the job can only be
      -- looked up by id: either would let the planner read instead every
      -- entry of an index over running jobs (jobs_active_state_idx,
      -- jobs_lease_expires_at_idx), of which its statistics say there are
      -- few, and while a long transaction holds back vacuum those indexes
      -- keep an entry for every running version since (docs/experiments.md,
      -- "Why a pinned horizon hurts Relay"). The fences below are written
      -- the same way, for the same reason.
      AND j.lease_token IS NOT DISTINCT FROM c.token
      AND j.lease_expires_at > now()
    RETURNING j.id
)
SELECT (CASE WHEN claimed.n IS NULL OR claimed.n = 1 THEN done.completed_ids END)::bigint[] AS completed_ids,
       claimed.id, claimed.queue, claimed.kind, claimed.payload, claimed.priority,
       claimed.attempt, claimed.max_attempts, claimed.fence, claimed.lease_token,
       claimed.lease_expires_at, claimed.created_at, claimed.run_at, claimed.started_at
FROM (SELECT COALESCE(array_agg(completed.id), '{}') AS completed_ids FROM completed) AS done
LEFT JOIN claimed ON true
ORDER BY claimed.n;

-- name: JobAnyReady :one
-- Whether the queue holds a job that a claim could take now: neither
-- leased nor finished, and due. An idle worker asks this before a poll's
-- claim (JobCompleteAndClaim), since nearly every poll of an idle worker
-- finds nothing, and the claim is a far larger statement: through a
-- transaction-mode pooler, where no statement stays prepared, planning it
-- costs several times what running it does. It looks for the first job in
-- the claim's order, rows other claimers hold locked included, so a true
-- may still claim nothing; a false is what the claim would have found, and
-- the worker looks again at its next poll or notification. The order, which
-- an EXISTS would drop, keeps the plan to jobs_claim_idx: statistics taken
-- while a backlog was ready would otherwise have the table read whole at
-- every poll once the backlog is gone.
SELECT ((
    SELECT j.id
    FROM jobs AS j
    WHERE j.lease_token IS NULL AND j.finished_at IS NULL
      AND j.queue = @queue::text
      AND j.run_at <= now()
    ORDER BY j.priority, j.run_at, j.id
    LIMIT 1
) IS NOT NULL)::boolean AS ready;

-- name: JobCompleteMany :many
-- Completes the finished jobs given (id, token, result), as
-- JobCompleteAndClaim's completions do, with no claim beside them: the
-- round of a worker that claims nothing, since it has no slot free or no
-- reason to think the queue holds a job for it. PostgreSQL plans a
-- statement at every call, and this one costs it a sixth of the planning
-- of JobCompleteAndClaim (docs/experiments.md, "A claim with every
-- completion"). Its SET and fence repeat the completed
-- part of JobCompleteAndClaim, since a statement cannot share SQL with
-- another; TestComplete_EndsTheJobAlikeWithOrWithoutAClaimBesideIt and the
-- fence tests hold the two alike. It waits for a row another transaction
-- holds for lock_wait_ms at most, as JobCompleteAndClaim does. Returns the
-- completions that passed the fence.
WITH lock_wait AS MATERIALIZED (
    SELECT set_config('lock_timeout', CAST(@lock_wait_ms::integer AS text), true) AS setting
)
UPDATE jobs AS j
SET state            = 'succeeded',
    result           = c.result,
    finished_at      = now(),
    lease_token      = NULL,
    lease_expires_at = NULL,
    lease_session    = NULL,
    cancel_requested_at = NULL
FROM (SELECT unnest(@ids::bigint[]) AS id,
      unnest(@tokens::uuid[]) AS token,
      unnest(@results::jsonb[]) AS result) AS c
WHERE j.id = c.id
  AND (SELECT w.setting FROM lock_wait AS w) IS NOT NULL
  -- The fence, written as JobCompleteAndClaim's is.
  AND j.lease_token IS NOT DISTINCT FROM c.token
  AND j.lease_expires_at > now()
RETURNING j.id;

-- name: JobGetClaimed :many
-- Finds the jobs a claim took under the lease tokens given, that are still
-- running under them with their lease unexpired: a worker that sent a claim
-- and lost the answer (its connection cut after the commit, or its wait
-- timed out) adopts them instead of leaving them to wait out their lease.
SELECT j.id, j.queue, j.kind, j.payload, j.priority, j.attempt, j.max_attempts,
       j.fence, j.lease_token, j.lease_expires_at, j.created_at, j.run_at, j.started_at
FROM jobs AS j
WHERE j.state = 'running'
  AND j.lease_token = ANY (@tokens::uuid[])
  AND j.lease_expires_at > now()
ORDER BY j.id;

-- name: JobHeartbeatMany :many
-- Extends the leases of the (id, token) pairs given to lease_ms from the
-- database clock (now()), but only where the fence still holds: the same claim,
-- still running, lease not yet expired. A lease that has expired stays
-- expired even when no one has reclaimed the job yet.
--
-- A heartbeat never waits for a row lock. A job whose row another
-- transaction holds (a claim that stepped over it, a cancel, one of the
-- worker's own rounds completing it) is left for the next heartbeat rather
-- than waited for: a wait would hold back the renewal of every other lease
-- in the statement, and a heartbeat that locked rows while waiting for
-- another could close a circle of waits with a round. The lock taken
-- before each renewal costs a WAL record a job per heartbeat, every
-- lease/3 by default, and nothing on the claim's or the completion's path.
--
-- Returns a row for each job renewed, with its new expiry and whether
-- someone asked to cancel it, and a row for each job left for the next
-- heartbeat (renewed false, no expiry): its row was held, and in this
-- statement's snapshot the fence still held. A job with no row is no
-- longer the worker's.
WITH held AS (
    SELECT j.id
    FROM jobs AS j
    JOIN (SELECT unnest(@ids::bigint[]) AS id,
          unnest(@tokens::uuid[]) AS token) AS h ON h.id = j.id
    -- The fence, written as JobCompleteAndClaim's is.
    WHERE j.lease_token IS NOT DISTINCT FROM h.token
      AND j.lease_expires_at > now()
    FOR NO KEY UPDATE OF j SKIP LOCKED
),
renewed AS (
    UPDATE jobs AS j
    SET lease_expires_at = now() + interval '1 millisecond' * @lease_ms::bigint
    FROM held
    WHERE j.id = held.id
    RETURNING j.id, j.lease_expires_at, (j.cancel_requested_at IS NOT NULL)::boolean AS cancel_requested
)
SELECT r.id, r.lease_expires_at, r.cancel_requested, true AS renewed
FROM renewed AS r
UNION ALL
-- The jobs left for the next heartbeat: not renewed, although the fence
-- held in the snapshot. Only the jobs not renewed are looked up again.
SELECT j.id, NULL::timestamptz, false, false
FROM (SELECT unnest(@ids::bigint[]) AS id,
      unnest(@tokens::uuid[]) AS token) AS h
JOIN jobs AS j ON j.id = h.id
WHERE NOT EXISTS (SELECT FROM renewed AS r WHERE r.id = h.id)
  AND j.lease_token IS NOT DISTINCT FROM h.token
  AND j.lease_expires_at > now();

-- name: JobFailMany :many
-- Records the failure of each (id, token) given, where the fence holds, and
-- appends it to the error history of the job (which keeps its newest
-- entries: see job_errors_append) and its error_count. The job then ends cancelled if
-- someone asked to cancel it, dead if the error is permanent or it has used
-- its last attempt, and otherwise becomes available again retry_in_ms after
-- now() in the database. It waits for a row another transaction holds for
-- lock_wait_ms at most, as JobCompleteAndClaim does. Returns the jobs whose
-- failure was recorded, with the state each went to.
WITH lock_wait AS MATERIALIZED (
    SELECT set_config('lock_timeout', CAST(@lock_wait_ms::integer AS text), true) AS setting
)
UPDATE jobs AS j
SET state = CASE
        WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::job_state
        WHEN f.permanent OR j.attempt >= j.max_attempts THEN 'dead'::job_state
        ELSE 'available'::job_state
    END,
    run_at = CASE
        WHEN j.cancel_requested_at IS NULL AND NOT f.permanent AND j.attempt < j.max_attempts
            THEN now() + interval '1 millisecond' * f.retry_in_ms
        ELSE j.run_at
    END,
    finished_at = CASE
        WHEN j.cancel_requested_at IS NOT NULL OR f.permanent OR j.attempt >= j.max_attempts THEN now()
    END,
    lease_token         = NULL,
    lease_expires_at    = NULL,
    lease_session       = NULL,
    cancel_requested_at = NULL,
    last_error          = f.error,
    error_count         = j.error_count + 1,
    errors = job_errors_append(j.errors, jsonb_build_object(
        'attempt', j.attempt, 'worker', j.leased_by, 'error', f.error, 'at', now()))
FROM (SELECT unnest(@ids::bigint[]) AS id,
          unnest(@tokens::uuid[]) AS token,
          unnest(@errors::text[]) AS error,
          unnest(@permanent::boolean[]) AS permanent,
          unnest(@retry_in_ms::bigint[]) AS retry_in_ms) AS f
WHERE j.id = f.id
  AND (SELECT w.setting FROM lock_wait AS w) IS NOT NULL
  -- The fence, written as JobCompleteAndClaim's is.
  AND j.lease_token IS NOT DISTINCT FROM f.token
  AND j.lease_expires_at > now()
RETURNING j.id, j.state;

-- name: JobHeldElsewhere :many
-- Says, for each job given that still exists, whether another transaction
-- holds its row, as a completion or a failure would wait for: an operator's
-- SELECT ... FOR UPDATE, or a transaction that updated the row and has not
-- ended. A worker asks this of the outcomes of a round that waited too long
-- for a row (lock_wait_ms), to set aside those whose rows are held and send
-- the others, and again of those set aside before it sends them. It never
-- waits: it locks the rows no one holds, as the completion's update would,
-- and lets the locks go as it commits, which costs a WAL record a row.
WITH free AS (
    SELECT j.id
    FROM jobs AS j
    WHERE j.id = ANY (@ids::bigint[])
    FOR NO KEY UPDATE OF j SKIP LOCKED
)
SELECT j.id, NOT EXISTS (SELECT FROM free AS f WHERE f.id = j.id) AS held
FROM jobs AS j
WHERE j.id = ANY (@ids::bigint[])
ORDER BY j.id;

-- name: JobReleaseMany :many
-- Releases jobs from the worker that holds them, so that others can run
-- them at once instead of waiting for the leases to expire: a worker
-- shutting down releases the jobs it interrupted, with a note for their
-- error history ("released: worker shutting down"), which becomes their
-- last_error too, as every entry of the history does, so that last_error
-- says why the newest attempt ended rather than nothing or an older
-- attempt's error; a worker releases, with no note, and so with nothing
-- recorded, jobs it claimed ahead of a free slot and never started. The
-- attempt is given back either way (the fence still grew at the claim), and
-- a job someone asked to cancel ends cancelled. Fenced like an
-- acknowledgement; returns the jobs released. The job keeps its run_at,
-- and so its place in the queue ahead of jobs that became ready after it.
-- It waits for a row another transaction holds for lock_wait_ms at most,
-- as JobCompleteAndClaim does (zero: as long as it takes), so that a held
-- row of a job claimed ahead holds back no other acknowledgement of the
-- worker's round for longer.
WITH lock_wait AS MATERIALIZED (
    SELECT set_config('lock_timeout', CAST(@lock_wait_ms::integer AS text), true) AS setting
)
UPDATE jobs AS j
SET state       = CASE WHEN j.cancel_requested_at IS NULL THEN 'available'::job_state ELSE 'cancelled'::job_state END,
    finished_at = CASE WHEN j.cancel_requested_at IS NULL THEN NULL ELSE now() END,
    attempt     = j.attempt - 1,
    lease_token         = NULL,
    lease_expires_at    = NULL,
    lease_session       = NULL,
    cancel_requested_at = NULL,
    last_error  = COALESCE(sqlc.narg(note)::text, j.last_error),
    error_count = CASE WHEN sqlc.narg(note)::text IS NULL THEN j.error_count ELSE j.error_count + 1 END,
    errors = CASE
        WHEN sqlc.narg(note)::text IS NULL THEN j.errors
        ELSE job_errors_append(j.errors, jsonb_build_object(
            'attempt', j.attempt, 'worker', j.leased_by, 'error', sqlc.narg(note)::text, 'at', now()))
    END
FROM (SELECT unnest(@ids::bigint[]) AS id,
          unnest(@tokens::uuid[]) AS token) AS r
WHERE j.id = r.id
  AND (SELECT w.setting FROM lock_wait AS w) IS NOT NULL
  -- The fence, written as JobCompleteAndClaim's is.
  AND j.lease_token IS NOT DISTINCT FROM r.token
  AND j.lease_expires_at > now()
RETURNING j.id;

-- name: JobReclaim :many
-- Takes back up to max_jobs running jobs whose worker can no longer finish
-- them: the lease expired by the database clock, or the session the job was
-- claimed under ended (its advisory lock is gone from pg_locks; see
-- worker_sessions). Each goes back to available, or to dead if that was its
-- last attempt (or to cancelled if someone asked), with the reason and the
-- old worker in its error history. Clearing the lease token fences the old
-- worker out. The job keeps its run_at, and so its place in the queue: a
-- crash does not send it behind the backlog that built up since. Rows
-- another reclaimer holds are skipped, so any number of workers can run
-- this at once.
--
-- It answers one row per job taken back, or a single row with no job when
-- it took none, and every row lists the jobs it found to take back but
-- left (left_ids, up to max_jobs of them, in id order), when it took fewer
-- than max_jobs: those whose rows
-- another transaction held (an acknowledgement waiting for it, a cancel
-- in a transaction still open, an operator's SELECT ... FOR UPDATE), and
-- any claimed again or renewed since it began. A caller that reads only
-- the leases that expired lately (see expired_since) gives them back
-- as recheck_ids to its next reclaims, which look each up by id, however
-- long ago its lease expired, until it is taken or no longer abandoned.
-- Every row also says when the statement ran (reclaimed_at, the
-- database's now()), and how many worker sessions were live then (live),
-- and how many of those work on queue (live_in_queue), read from the
-- locks of the sessions as the ended ones are: a worker spaces its
-- reclaims, its looks at the planner's statistics and its polls by that
-- count (fleetInterval), and learns it at every reclaim without a
-- statement of its own.
--
-- Whether a session ended is read from one scan of pg_locks per statement,
-- which the count reads too. A session counts as ended only if it was
-- registered when this statement took its snapshot (so its lock was taken
-- before the scan) and its lock is gone: then it has ended for good. A job
-- is judged by its own session alone, so nothing another session of the
-- same worker id does, before or during this statement, can make a live
-- claim look abandoned.
WITH live_sessions AS MATERIALIZED (
    SELECT l.session_key FROM worker_sessions_live AS l
),
ended_sessions AS MATERIALIZED (
    SELECT s.session_key
    FROM worker_sessions AS s
    WHERE NOT EXISTS (SELECT 1 FROM live_sessions AS l WHERE l.session_key = s.session_key)
),
fleet AS (
    SELECT count(*)::integer AS live,
           count(*) FILTER (WHERE s.queue = @queue::text)::integer AS live_in_queue
    FROM live_sessions AS l
    LEFT JOIN worker_sessions AS s ON s.session_key = l.session_key
),
-- The jobs to look at, found by index: those whose lease expired, and
-- those of the ended sessions (one lookup of jobs_lease_session_key_idx
-- for all of them, with its limit), so that the statement never scans
-- every running job. The sessions are looked up together rather than one
-- by one: the planner's estimate for a lookup per session, times the
-- sessions it expects of a table it may not have analyzed, once made the
-- plan cost enough for PostgreSQL to compile it (JIT) at every reclaim,
-- half a second each. The expired leases are read from the
-- lease times after expired_since only, a time by the database's clock,
-- when that is given: a worker that reclaims every fraction of a second
-- has taken back the older ones already, and gives the time its last
-- reclaim that took every one it found ran, as that reclaim returned it
-- in reclaimed_at, less a margin. Read on the database, unlike a time the
-- caller measures, it does not depend on how long either statement took
-- to get there. While a long transaction holds back
-- vacuum the index also holds an entry for the running version of every
-- job finished since it began, which a full pass has to step over (see
-- docs/experiments.md, "Why a pinned horizon hurts Relay"). Null reads
-- them all: the pass a worker makes at start, and every so often.
--
-- A running job is recognised here by its lease or its session, never by
-- its state, so that each lookup can only read the index over those
-- columns (see migrations/00009).
candidates AS (
    SELECT e.id FROM jobs AS e
    WHERE e.lease_token IS NOT NULL
      AND e.lease_expires_at <= now()
      AND e.lease_expires_at > COALESCE(sqlc.narg(expired_since)::timestamptz, '-infinity')
    UNION
    (SELECT r.id FROM jobs AS r
     WHERE r.lease_session = ANY (ARRAY(SELECT es.session_key FROM ended_sessions AS es))
       -- With no session ended the lookup does not run (see abandoned).
       AND EXISTS (SELECT FROM ended_sessions)
     LIMIT @max_jobs)
    UNION
    -- The jobs a previous reclaim left, looked up by id. Running, which
    -- either condition implies (see abandoned), is not named, lest the
    -- planner read every expired entry of the index over leases instead.
    SELECT h.id FROM jobs AS h
    WHERE h.id = ANY (@recheck_ids::bigint[])
      AND (h.lease_expires_at <= now() OR h.lease_session = ANY (ARRAY(SELECT es.session_key FROM ended_sessions AS es)))
),
abandoned AS (
    SELECT a.id
    FROM jobs AS a
    WHERE a.id = ANY (ARRAY(SELECT c.id FROM candidates AS c))
      -- Evaluated once, before the lookup: with nothing to take back, as
      -- at nearly every reclaim, the lookup does not run at all, whatever
      -- plan PostgreSQL keeps for it. The plan a worker's connection
      -- caches for this statement is made once; made while the table was
      -- nearly empty, it reads the whole table instead of looking jobs up
      -- by id, and keeps doing so as the table grows, until statistics are
      -- gathered again, which on a server without autovacuum is never.
      AND EXISTS (SELECT FROM candidates)
      -- Checked again on the newest version of the row once locked, so a
      -- lease renewed, or a job claimed anew, after this statement began
      -- is not taken. Either condition says the job still runs, since
      -- only a running job has a lease expiry or a session
      -- (jobs_lease_iff_running, jobs_lease_session_only_running); naming
      -- it would let the planner read every entry of an index over running
      -- jobs instead of looking these up by id (see JobCompleteAndClaim).
      AND (a.lease_expires_at <= now() OR a.lease_session IN (SELECT es.session_key FROM ended_sessions AS es))
    LIMIT @max_jobs
    FOR UPDATE SKIP LOCKED
),
taken AS (
    UPDATE jobs AS j
    SET state = CASE
            WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'::job_state
            WHEN j.attempt >= j.max_attempts THEN 'dead'::job_state
            ELSE 'available'::job_state
        END,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL OR j.attempt >= j.max_attempts THEN now() END,
        lease_token         = NULL,
        lease_expires_at    = NULL,
        lease_session       = NULL,
        cancel_requested_at = NULL,
        last_error  = CASE WHEN j.lease_expires_at <= now() THEN 'lease expired' ELSE 'worker session ended' END,
        error_count = j.error_count + 1,
        errors = job_errors_append(j.errors, jsonb_build_object(
            'attempt', j.attempt, 'worker', j.leased_by,
            'error', CASE WHEN j.lease_expires_at <= now() THEN 'lease expired' ELSE 'worker session ended' END,
            'at', now()))
    FROM abandoned
    WHERE j.id = abandoned.id
    RETURNING j.id, j.state, j.attempt, j.leased_by, j.last_error
)
SELECT t.id, t.state, t.attempt, t.leased_by, t.last_error, l.left_ids,
       now()::timestamptz AS reclaimed_at, f.live, f.live_in_queue
FROM fleet AS f, (
    SELECT COALESCE(array_agg(x.id), '{}')::bigint[] AS left_ids
    FROM (
        SELECT c.id FROM candidates AS c
        WHERE NOT EXISTS (SELECT FROM taken AS t WHERE t.id = c.id)
          -- A full batch leaves the rest for the caller's next reclaim.
          AND (SELECT count(*) FROM taken) < @max_jobs
        ORDER BY c.id
        LIMIT @max_jobs
    ) AS x
) AS l
LEFT JOIN taken AS t ON true;
