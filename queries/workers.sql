-- name: WorkerRegister :one
-- Registers a worker under a fresh session key and takes the advisory lock
-- on that key in the calling session, in one statement, so that no reclaim
-- can see the row of the worker without its lock. The lock lasts as long as the
-- session: the caller keeps this connection open for the life of the worker.
-- A worker that registers again under its id (after losing its session)
-- takes over its row. Returns no row if the lock on the key could not be taken.
WITH fresh AS (
    SELECT nextval('worker_session_key_seq')::integer AS session_key
),
locked AS (
    SELECT f.session_key
    FROM fresh AS f
    WHERE pg_try_advisory_lock(1380273241, f.session_key)
)
INSERT INTO workers (id, session_key, queue, pid, host)
SELECT @id, l.session_key, @queue, @pid, @host
FROM locked AS l
ON CONFLICT (id) DO UPDATE
SET session_key = EXCLUDED.session_key,
    queue       = EXCLUDED.queue,
    pid         = EXCLUDED.pid,
    host        = EXCLUDED.host,
    started_at  = now()
RETURNING session_key;

-- name: WorkerUnregister :execrows
-- Removes a worker that is shutting down, if the row is still its own.
DELETE FROM workers WHERE id = @id AND session_key = @session_key;

-- name: WorkerDeleteGone :execrows
-- Forgets workers whose session ended and that hold no running job.
DELETE FROM workers AS w
WHERE NOT worker_session_alive(w.session_key)
  AND NOT EXISTS (SELECT 1 FROM jobs AS j WHERE j.state = 'running' AND j.leased_by = w.id);

-- name: WorkerList :many
-- Lists registered workers and whether each one session is alive.
SELECT w.*,
    worker_session_alive(w.session_key) AS session_alive
FROM workers AS w
ORDER BY w.id;

-- name: WorkerListen :exec
-- Subscribes the calling session to the notifications that the
-- jobs_notify_available trigger sends, with the queue name as payload.
LISTEN relay_jobs_available;
