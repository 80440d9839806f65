-- name: JobInsert :one
-- Inserts one job to run at run_at, or delay_ms after now() in the database.
-- With an idempotency key the queue already holds, it inserts nothing and
-- returns no row; the caller then reads the existing job with
-- JobGetByIdempotencyKey.
--
-- With announce_after_commit the insert does not notify the queue's
-- listeners itself (migrations/00016), and nor does any insert after it in
-- its transaction until one sets relay.announce again: the caller
-- announces the job once the transaction has committed, with JobAnnounce
-- for an insert that commits on its own, with JobAnnounceMany for a
-- transaction of the caller's (client.Tx). Without it the job is announced
-- when it commits.
WITH announce AS (
    SELECT set_config('relay.announce', CASE WHEN @announce_after_commit::boolean THEN 'after_commit' ELSE '' END, true)
)
INSERT INTO jobs (queue, kind, payload, priority, max_attempts, run_at, idempotency_key)
SELECT @queue::text, @kind::text, @payload::jsonb, @priority::smallint, @max_attempts::integer,
       COALESCE(sqlc.narg(run_at)::timestamptz, now() + interval '1 millisecond' * @delay_ms::bigint),
       sqlc.narg(idempotency_key)::text
FROM announce
ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING *;

-- name: JobInsertStrict :one
-- Inserts one job as JobInsert does, without ON CONFLICT: a key the queue
-- already holds fails it with a unique violation on
-- jobs_idempotency_key_idx, waiting first, as JobInsert does, for a
-- transaction still storing a job under the key. It follows a JobInsert
-- that returned no row where JobGetByIdempotencyKey then found no job
-- holding the key: the violation says that a job holds the key again,
-- while no row and no error says that a BEFORE INSERT trigger on the jobs
-- table returned NULL for the job, which JobInsert's DO NOTHING cannot
-- tell apart from a key taken.
WITH announce AS (
    SELECT set_config('relay.announce', CASE WHEN @announce_after_commit::boolean THEN 'after_commit' ELSE '' END, true)
)
INSERT INTO jobs (queue, kind, payload, priority, max_attempts, run_at, idempotency_key)
SELECT @queue::text, @kind::text, @payload::jsonb, @priority::smallint, @max_attempts::integer,
       COALESCE(sqlc.narg(run_at)::timestamptz, now() + interval '1 millisecond' * @delay_ms::bigint),
       sqlc.narg(idempotency_key)::text
FROM announce
RETURNING *;

-- name: JobAnnounce :exec
-- Tells the listeners of queue that a job became available there, as the
-- jobs_notify_available trigger does at an insert's commit, for a job
-- JobInsert stored with announce_after_commit: once the insert has
-- committed, and only if the job is ready by then (run_at). Its
-- transaction writes no row and its commit waits for no flush.
SELECT pg_notify(relay_queue_channel('available', @queue::text), @queue::text)
WHERE @run_at::timestamptz <= now();

-- name: JobAnnounceMany :exec
-- Tells the listeners of each queue given that a job became available
-- there, as JobAnnounce does for one: for the jobs stored with
-- announce_after_commit, once they have committed, by a transaction of
-- the caller's (client.Tx) or by a JobInsertMany that committed on its
-- own. A queue is announced if the earliest run_at given for it is due by
-- now.
SELECT pg_notify(relay_queue_channel('available', a.queue), a.queue)
FROM (
    SELECT unnest(@queues::text[])          AS queue,
           unnest(@run_ats::timestamptz[])  AS run_at
) AS a
WHERE a.run_at <= now();

-- name: JobInsertMany :many
-- Inserts many jobs in one statement, all or none, and returns their ids in
-- the order given: PostgreSQL unnests the arrays of the select list in
-- lockstep, inserts the rows in the order they come, and returns each as it
-- inserts it (client's
-- TestInsertManyAndAll_AFullBatchComesBackJobForJobInTheOrderGiven checks a
-- full batch). Rows ordered explicitly, by position and then by id, were
-- measured slower (docs/experiments.md, "The order of a batch's ids"). A
-- trigger on the jobs table that drops rows makes it return fewer
-- ids than it was given, which no longer line up with the jobs: the caller
-- compares the counts (client.JobsDroppedError). A run_at of year 1 (the
-- zero time.Time) means delay_ms
-- after now() in the database, since an array parameter cannot carry nulls
-- through sqlc. With announce_after_commit, as JobInsert, it leaves the
-- notification of its jobs, and of those inserted after it in its
-- transaction, to the caller, which announces them once they have
-- committed (JobAnnounceMany): at once for a statement that commits on
-- its own, and after its commit for a transaction of the caller's
-- (client.Tx).
WITH announce AS (
    SELECT set_config('relay.announce', CASE WHEN @announce_after_commit::boolean THEN 'after_commit' ELSE '' END, true)
)
INSERT INTO jobs (queue, kind, payload, priority, max_attempts, run_at)
SELECT b.queue, b.kind, b.payload, b.priority, b.max_attempts,
       COALESCE(NULLIF(b.run_at, '0001-01-01 00:00:00+00'), now() + interval '1 millisecond' * b.delay_ms)
FROM announce, (
    SELECT unnest(@queues::text[])           AS queue,
           unnest(@kinds::text[])            AS kind,
           unnest(@payloads::jsonb[])        AS payload,
           unnest(@priorities::smallint[])   AS priority,
           unnest(@max_attempts::integer[])  AS max_attempts,
           unnest(@run_ats::timestamptz[])   AS run_at,
           unnest(@delays_ms::bigint[])      AS delay_ms
) AS b
RETURNING id;

-- name: JobInsertAll :many
-- Inserts many jobs in one statement, all or none, as JobInsertMany does,
-- and returns them whole, in the order given: for the API, which stores
-- single-job requests that arrive together in one statement and answers
-- each with its job. As JobInsertMany's, its rows no longer line up with
-- the jobs given where a trigger drops some, and the caller
-- compares the counts.
WITH announce AS (
    SELECT set_config('relay.announce', CASE WHEN @announce_after_commit::boolean THEN 'after_commit' ELSE '' END, true)
)
INSERT INTO jobs (queue, kind, payload, priority, max_attempts, run_at)
SELECT b.queue, b.kind, b.payload, b.priority, b.max_attempts,
       COALESCE(NULLIF(b.run_at, '0001-01-01 00:00:00+00'), now() + interval '1 millisecond' * b.delay_ms)
FROM announce, (
    SELECT unnest(@queues::text[])           AS queue,
           unnest(@kinds::text[])            AS kind,
           unnest(@payloads::jsonb[])        AS payload,
           unnest(@priorities::smallint[])   AS priority,
           unnest(@max_attempts::integer[])  AS max_attempts,
           unnest(@run_ats::timestamptz[])   AS run_at,
           unnest(@delays_ms::bigint[])      AS delay_ms
) AS b
RETURNING *;

-- name: JobGet :one
SELECT * FROM jobs WHERE id = @id;

-- name: JobGetMany :many
-- The jobs with the ids given, whole, in id order; ids that name no job
-- are left out.
SELECT * FROM jobs WHERE id = ANY (@ids::bigint[]) ORDER BY id;

-- name: JobGetByIdempotencyKey :one
SELECT * FROM jobs WHERE queue = @queue AND idempotency_key = @idempotency_key;

-- name: JobList :many
-- Lists the summaries of jobs (job_summaries) in id order, a page at a
-- time: pass the last id of one page as after_id to get the next. This one
-- lists every job, through the primary key; the other JobList statements
-- filter by queue, kind and state, one statement for each combination,
-- which the caller picks (server.listJobs).
--
-- Those read the jobs of each state apart, in one branch per state (every
-- value of job_state: a new state needs a branch in each), or in two
-- branches when the state is given, one for it among the jobs not
-- finished and one among the finished, since each reads another index
-- (migrations/00011):
--   - A finished state reads an index over the finished jobs, led by the
--     filter's columns, then state, then id (jobs_finished_state_idx,
--     jobs_finished_queue_state_idx, jobs_finished_kind_state_idx,
--     jobs_finished_queue_kind_state_idx), from after_id on, in index
--     order, and stops after max_jobs rows: a page costs the same however
--     long the history, and a filter that matches nothing costs a few
--     index pages.
--   - A state of the backlog (available, running) reads
--     jobs_active_state_idx, over the jobs not finished, by state and id,
--     and checks each job's queue and kind: a filter that matches little
--     costs at most the backlog of that state, never the history.
-- Each branch stops after max_jobs rows; the page is the first max_jobs
-- of those, in id order, sorted from at most max_jobs rows per branch.
--
-- How they are written leaves the planner those indexes as the only good
-- plan, whatever the values and the statistics (server's
-- TestListJobs_EveryFilterReadsItsIndexWithoutScanningTheHistory checks it
-- for custom and generic plans):
--   - A branch's leading column is matched with = ANY of a one-element
--     array rather than =, and its rows ordered by that column before id
--     (which is id order, the column holding one value). After a plain
--     equality the planner takes the column for a constant, and the
--     primary key yields id order too: a plan that does not know the value
--     may walk the primary key and filter its way through the history.
--   - Every value, the page size included, is read through a scalar
--     subquery, (SELECT @value), which the planner does not look into, so
--     that the plan is the same for any values: pgx's prepared statements
--     are planned for their values at first and may keep a generic plan
--     after a few executions, and a plan made for the values trusts the
--     statistics, which may say that so few jobs match that reading them
--     all through another index and sorting them is cheaper.
--   - A queue filtered with a kind among the finished jobs is compared in
--     the "C" collation, which only jobs_finished_queue_kind_state_idx
--     uses (see JobListByQueueKind).
SELECT * FROM job_summaries AS j
WHERE j.id > (SELECT @after_id::bigint)
ORDER BY j.id
LIMIT (SELECT @max_jobs::integer);

-- name: JobListByState :many
-- Lists the jobs in one state, as JobList says: not finished through
-- jobs_active_state_idx, finished through jobs_finished_state_idx.
SELECT * FROM (
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY[(SELECT @state::job_state)]) AND j.finished_at IS NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY[(SELECT @state::job_state)])
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
) AS u
ORDER BY u.id
LIMIT (SELECT @max_jobs::integer);

-- name: JobListByQueue :many
-- Lists the jobs of one queue, as JobList says: those not finished
-- through jobs_active_state_idx, the finished through
-- jobs_finished_queue_state_idx.
SELECT * FROM (
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY['available'::job_state]) AND j.finished_at IS NULL
       AND j.queue = (SELECT @queue::text)
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY['running'::job_state]) AND j.finished_at IS NULL
       AND j.queue = (SELECT @queue::text)
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.queue = ANY (ARRAY[(SELECT @queue::text)])
       AND j.state = 'succeeded'
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.queue, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.queue = ANY (ARRAY[(SELECT @queue::text)])
       AND j.state = 'dead'
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.queue, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.queue = ANY (ARRAY[(SELECT @queue::text)])
       AND j.state = 'cancelled'
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.queue, j.id LIMIT (SELECT @max_jobs::integer))
) AS u
ORDER BY u.id
LIMIT (SELECT @max_jobs::integer);

-- name: JobListByQueueState :many
-- Lists the jobs of one queue in one state, as JobList says, through
-- jobs_active_state_idx or jobs_finished_queue_state_idx.
SELECT * FROM (
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY[(SELECT @state::job_state)]) AND j.finished_at IS NULL
       AND j.queue = (SELECT @queue::text)
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.queue = ANY (ARRAY[(SELECT @queue::text)])
       AND j.state = (SELECT @state::job_state)
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.queue, j.id LIMIT (SELECT @max_jobs::integer))
) AS u
ORDER BY u.id
LIMIT (SELECT @max_jobs::integer);

-- name: JobListByKind :many
-- Lists the jobs of one kind, as JobList says: those not finished through
-- jobs_active_state_idx, the finished through
-- jobs_finished_kind_state_idx.
SELECT * FROM (
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY['available'::job_state]) AND j.finished_at IS NULL
       AND j.kind = (SELECT @kind::text)
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY['running'::job_state]) AND j.finished_at IS NULL
       AND j.kind = (SELECT @kind::text)
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.kind = ANY (ARRAY[(SELECT @kind::text)])
       AND j.state = 'succeeded'
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.kind, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.kind = ANY (ARRAY[(SELECT @kind::text)])
       AND j.state = 'dead'
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.kind, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.kind = ANY (ARRAY[(SELECT @kind::text)])
       AND j.state = 'cancelled'
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.kind, j.id LIMIT (SELECT @max_jobs::integer))
) AS u
ORDER BY u.id
LIMIT (SELECT @max_jobs::integer);

-- name: JobListByKindState :many
-- Lists the jobs of one kind in one state, as JobList says, through
-- jobs_active_state_idx or jobs_finished_kind_state_idx.
SELECT * FROM (
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY[(SELECT @state::job_state)]) AND j.finished_at IS NULL
       AND j.kind = (SELECT @kind::text)
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.kind = ANY (ARRAY[(SELECT @kind::text)])
       AND j.state = (SELECT @state::job_state)
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.kind, j.id LIMIT (SELECT @max_jobs::integer))
) AS u
ORDER BY u.id
LIMIT (SELECT @max_jobs::integer);

-- name: JobListByQueueKind :many
-- Lists the jobs of one kind in one queue, as JobList says: those not
-- finished through jobs_active_state_idx, the finished through
-- jobs_finished_queue_kind_state_idx, whose queue is in the "C" collation
-- (the same as the default one for equality). Compared in it, the queue
-- matches no other index. jobs_finished_queue_state_idx also yields a
-- queue's finished jobs in id order, and where the statistics say that
-- the kind leaves every job (a history of one kind), the planner would
-- read it instead, and filter its way through the queue's whole history
-- for a kind that has none.
SELECT * FROM (
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY['available'::job_state]) AND j.finished_at IS NULL
       AND j.queue = (SELECT @queue::text)
       AND j.kind = (SELECT @kind::text)
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY['running'::job_state]) AND j.finished_at IS NULL
       AND j.queue = (SELECT @queue::text)
       AND j.kind = (SELECT @kind::text)
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.queue COLLATE "C" = ANY (ARRAY[(SELECT @queue::text)])
       AND j.kind = (SELECT @kind::text)
       AND j.state = 'succeeded'
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.queue COLLATE "C", j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.queue COLLATE "C" = ANY (ARRAY[(SELECT @queue::text)])
       AND j.kind = (SELECT @kind::text)
       AND j.state = 'dead'
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.queue COLLATE "C", j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.queue COLLATE "C" = ANY (ARRAY[(SELECT @queue::text)])
       AND j.kind = (SELECT @kind::text)
       AND j.state = 'cancelled'
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.queue COLLATE "C", j.id LIMIT (SELECT @max_jobs::integer))
) AS u
ORDER BY u.id
LIMIT (SELECT @max_jobs::integer);

-- name: JobListByQueueKindState :many
-- Lists the jobs of one kind in one queue in one state, as JobList says,
-- through jobs_active_state_idx or jobs_finished_queue_kind_state_idx
-- (see JobListByQueueKind).
SELECT * FROM (
    (SELECT * FROM job_summaries AS j
     WHERE j.state = ANY (ARRAY[(SELECT @state::job_state)]) AND j.finished_at IS NULL
       AND j.queue = (SELECT @queue::text)
       AND j.kind = (SELECT @kind::text)
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.state, j.id LIMIT (SELECT @max_jobs::integer))
    UNION ALL
    (SELECT * FROM job_summaries AS j
     WHERE j.queue COLLATE "C" = ANY (ARRAY[(SELECT @queue::text)])
       AND j.kind = (SELECT @kind::text)
       AND j.state = (SELECT @state::job_state)
       AND j.finished_at IS NOT NULL
       AND j.id > (SELECT @after_id::bigint)
     ORDER BY j.queue COLLATE "C", j.id LIMIT (SELECT @max_jobs::integer))
) AS u
ORDER BY u.id
LIMIT (SELECT @max_jobs::integer);

-- name: JobQueueStats :many
-- For every queue that holds jobs, how many are available (ready or
-- scheduled) and running, and the age of the oldest job that is ready to
-- run and waiting for a worker, by the database clock.
--
-- It costs the same however long the history of finished jobs. The queues
-- are found by skip scans, one descent per queue (the recursive parts:
-- each step finds the next queue after the last): of
-- jobs_finished_queue_state_idx for the queues that hold finished jobs,
-- and of jobs_claim_idx for those that hold available ones; and among the
-- running entries of jobs_active_state_idx, read once, for those whose
-- jobs all run. Each queue's available jobs are counted, and its oldest
-- ready one found, in jobs_claim_idx, which holds the available jobs
-- alone (they neither hold a lease nor have finished); its running jobs
-- are counted among the running entries read. Finished jobs are not
-- counted, since counting them would read the whole history kept; the
-- listing (JobList) pages through them by state. A queue stays listed,
-- with no jobs waiting or running, until its finished jobs are pruned.
WITH RECURSIVE finished_queues AS (
    (SELECT j.queue FROM jobs AS j WHERE j.finished_at IS NOT NULL ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM jobs AS j
            WHERE j.finished_at IS NOT NULL AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM finished_queues AS q
    WHERE q.queue IS NOT NULL
),
available_queues AS (
    (SELECT j.queue FROM jobs AS j WHERE j.lease_token IS NULL AND j.finished_at IS NULL ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM jobs AS j
            WHERE j.lease_token IS NULL AND j.finished_at IS NULL AND j.queue > q.queue
            ORDER BY j.queue LIMIT 1)
    FROM available_queues AS q
    WHERE q.queue IS NOT NULL
),
running AS (
    SELECT r.queue FROM jobs AS r WHERE r.state = 'running' AND r.finished_at IS NULL
),
queues AS (
    SELECT f.queue FROM finished_queues AS f WHERE f.queue IS NOT NULL
    UNION
    SELECT a.queue FROM available_queues AS a WHERE a.queue IS NOT NULL
    UNION
    SELECT r.queue FROM running AS r
)
SELECT q.queue::text AS queue,
    (SELECT count(*) FROM jobs AS a
     WHERE a.queue = q.queue AND a.lease_token IS NULL AND a.finished_at IS NULL)::bigint AS available,
    (SELECT count(*) FROM running AS r WHERE r.queue = q.queue)::bigint AS running,
    COALESCE(EXTRACT(EPOCH FROM now() - (
        SELECT min(a.run_at) FROM jobs AS a
        WHERE a.queue = q.queue AND a.lease_token IS NULL AND a.finished_at IS NULL AND a.run_at <= now())), 0)::float8
        AS oldest_ready_age_seconds
FROM queues AS q
ORDER BY q.queue;

-- name: JobCancel :one
-- Cancels an available job at once. A running job is only marked: its
-- worker learns of it at its next heartbeat, cancels the context of the handler,
-- and its failure then ends the job as cancelled. Returns the job as the
-- statement leaves it, with applied false when it had already finished
-- (and is left as it was), or no row for a job that is missing.
--
-- The job is locked first (found), and whether the cancel applies is
-- decided on the row found holds: FOR UPDATE waits for a change in
-- progress and reads the row that change leaves, where the UPDATE's own
-- scan reads the older version in the statement's snapshot, and a
-- condition on j.state would refuse, on that version, a change the locked
-- row allows. So a cancel refused is refused for the state it returns,
-- never for one that a concurrent change has since left. The new values,
-- though, are computed from j alone: PostgreSQL builds the row from that
-- older version, and checks its constraints, before it finds the version
-- found locked and computes the row again from it, so values taken from
-- found would meet the older version's lease (a claim, a failure or a
-- reclaim in between) and break jobs_lease_iff_running.
WITH found AS (
    SELECT * FROM jobs AS f WHERE f.id = @id FOR UPDATE
),
cancelled AS (
    UPDATE jobs AS j
    SET state               = CASE WHEN j.state = 'available' THEN 'cancelled'::job_state ELSE j.state END,
        finished_at         = CASE WHEN j.state = 'available' THEN now() ELSE j.finished_at END,
        cancel_requested_at = CASE WHEN j.state = 'running' THEN COALESCE(j.cancel_requested_at, now()) END
    FROM found
    WHERE j.id = found.id
      AND found.state IN ('available', 'running')
    RETURNING j.*
)
SELECT true AS applied, cancelled.* FROM cancelled
UNION ALL
SELECT false AS applied, found.* FROM found WHERE NOT EXISTS (SELECT FROM cancelled);

-- name: JobRetry :one
-- Makes a dead or cancelled job available again now, with a fresh set of
-- attempts. Its fence keeps growing, so its new claims still outrank every
-- old one. Returns the job as the statement leaves it, with applied false
-- when it was in any other state (and is left as it was), or no row for a
-- job that is missing. The job is locked first, and the retry decided on
-- the row found holds, its new values computed from j, as in JobCancel:
-- a row still running in the statement's snapshot is left as it is until
-- the version found locked, dead or cancelled, is retried.
WITH found AS (
    SELECT * FROM jobs AS f WHERE f.id = @id FOR UPDATE
),
retried AS (
    UPDATE jobs AS j
    SET state       = CASE WHEN j.state IN ('dead', 'cancelled') THEN 'available'::job_state ELSE j.state END,
        attempt     = CASE WHEN j.state IN ('dead', 'cancelled') THEN 0 ELSE j.attempt END,
        run_at      = CASE WHEN j.state IN ('dead', 'cancelled') THEN now() ELSE j.run_at END,
        finished_at = CASE WHEN j.state IN ('dead', 'cancelled') THEN NULL ELSE j.finished_at END,
        result      = CASE WHEN j.state IN ('dead', 'cancelled') THEN NULL ELSE j.result END
    FROM found
    WHERE j.id = found.id
      AND found.state IN ('dead', 'cancelled')
    RETURNING j.*
)
SELECT true AS applied, retried.* FROM retried
UNION ALL
SELECT false AS applied, found.* FROM found WHERE NOT EXISTS (SELECT FROM retried);

-- name: JobPrune :one
-- Deletes finished jobs whose retention has passed: succeeded jobs that
-- finished more than retain_succeeded_ms ago, dead ones past
-- retain_dead_ms, cancelled ones past retain_cancelled_ms (a null
-- retention keeps that state's jobs forever), oldest first, at most
-- max_jobs of each state, and returns how many of each it deleted, and
-- when it ran (pruned_at).
--
-- Each state's jobs are found through jobs_finished_idx in the order they
-- finished, so a prune costs its batch, however long the history kept, and
-- one that finds nothing reads a leaf page per state. Rows another pruner
-- holds are skipped, so any number of workers can prune at once; a job
-- retried (JobRetry) while this runs is checked again once locked and
-- kept. Each call is one short statement: a caller with more to delete
-- calls again.
--
-- Given expired_since, a time by the database's clock, it reads only the
-- jobs whose retention passed since then: a caller whose last prune found
-- every older job gone (deleted, or skipped as another transaction,
-- another pruner's as a rule, held it) gives the time that prune ran, as
-- it returned it in pruned_at (the database's now()), less a margin. Read
-- on the database, unlike a time the caller measures, it does not depend
-- on how long either statement took to get there. While a long
-- transaction holds back vacuum, the index still holds an entry for every
-- job deleted since it began, which a prune from the oldest steps over,
-- each time (see docs/experiments.md, "Why a pinned horizon hurts
-- Relay"). Null reads from the oldest: the prune a worker makes at start,
-- after a full batch or a failure, and every so often, which also finds
-- the jobs skipped that the transaction holding them did not delete after
-- all.
WITH succeeded AS (
    SELECT s.id FROM jobs AS s
    WHERE s.state = 'succeeded'
      AND s.finished_at < now() - interval '1 millisecond' * sqlc.narg(retain_succeeded_ms)::bigint
      AND s.finished_at >= COALESCE(sqlc.narg(expired_since)::timestamptz
                                  - interval '1 millisecond' * sqlc.narg(retain_succeeded_ms)::bigint,
                                  '-infinity')
    ORDER BY s.state, s.finished_at
    LIMIT @max_jobs::integer
    FOR UPDATE SKIP LOCKED
),
dead AS (
    SELECT d.id FROM jobs AS d
    WHERE d.state = 'dead'
      AND d.finished_at < now() - interval '1 millisecond' * sqlc.narg(retain_dead_ms)::bigint
      AND d.finished_at >= COALESCE(sqlc.narg(expired_since)::timestamptz
                                  - interval '1 millisecond' * sqlc.narg(retain_dead_ms)::bigint,
                                  '-infinity')
    ORDER BY d.state, d.finished_at
    LIMIT @max_jobs::integer
    FOR UPDATE SKIP LOCKED
),
cancelled AS (
    SELECT c.id FROM jobs AS c
    WHERE c.state = 'cancelled'
      AND c.finished_at < now() - interval '1 millisecond' * sqlc.narg(retain_cancelled_ms)::bigint
      AND c.finished_at >= COALESCE(sqlc.narg(expired_since)::timestamptz
                                  - interval '1 millisecond' * sqlc.narg(retain_cancelled_ms)::bigint,
                                  '-infinity')
    ORDER BY c.state, c.finished_at
    LIMIT @max_jobs::integer
    FOR UPDATE SKIP LOCKED
),
pruned AS (
    DELETE FROM jobs AS j
    -- By primary key, one probe per job (an IN over the union may hash
    -- join with a scan of the whole table).
    WHERE j.id = ANY (ARRAY(SELECT succeeded.id FROM succeeded
                            UNION ALL SELECT dead.id FROM dead
                            UNION ALL SELECT cancelled.id FROM cancelled))
    RETURNING j.state
)
SELECT count(*) FILTER (WHERE pruned.state = 'succeeded')::bigint AS succeeded,
       count(*) FILTER (WHERE pruned.state = 'dead')::bigint      AS dead,
       count(*) FILTER (WHERE pruned.state = 'cancelled')::bigint AS cancelled,
       now()::timestamptz AS pruned_at
FROM pruned;

-- name: JobIDIssued :one
-- Whether a job id has been handed out by the jobs' identity sequence: a
-- job that is not found although its id was issued has been deleted after
-- its retention (or its enqueue was rolled back, or has not committed
-- yet). known is false for a role that may not read the sequence, for
-- which pg_sequence_last_value raises an error or, in some PostgreSQL
-- releases, returns null, as it does for a sequence never used: issued is
-- then false and means nothing.
SELECT p.known::boolean AS known,
       COALESCE(CASE WHEN p.known THEN @id::bigint <= pg_sequence_last_value('jobs_id_seq'::regclass) END,
                false)::boolean AS issued
FROM (SELECT has_sequence_privilege('jobs_id_seq'::regclass, 'SELECT, USAGE') AS known) AS p;
