-- name: WorkerDrawSessionKey :one
-- Draws a session key never drawn before, for a worker to register under
-- (WorkerRegister's session_key). Drawn in a statement of its own, so that
-- a worker that loses the answer of its registration, which may have
-- committed, knows the key of that session and can name it as its own
-- when it registers again (lost_session_keys).
SELECT nextval('worker_session_key_seq')::integer AS session_key;

-- name: WorkerSessionEndWhenSilent :exec
-- Has the server end the calling session once its connection has been
-- silent for about a lease, as the worker does on its side: TCP keepalive
-- probes after idle_seconds without a word from the worker, then every
-- interval_seconds, up to count of them, and tcp_user_timeout, how many
-- milliseconds a probe or a notification may go unacknowledged. Without
-- them the server keeps the session of a worker whose host vanished
-- without a word (power lost, a network cut that sends no reset) until
-- its own TCP keepalive gives up, two hours and more by default, and with
-- the session its lock, its listener seat and its worker id: a worker
-- started again under that id is refused for as long. A null leaves that
-- setting as the session's connection string set it. Over a Unix-domain
-- socket the settings do nothing, and none is needed: the kernel tells the
-- server when the other end is gone.
SELECT set_config('tcp_keepalives_idle', COALESCE(sqlc.narg(idle_seconds)::integer::text, current_setting('tcp_keepalives_idle')), false) AS idle,
    set_config('tcp_keepalives_interval', COALESCE(sqlc.narg(interval_seconds)::integer::text, current_setting('tcp_keepalives_interval')), false) AS interval,
    set_config('tcp_keepalives_count', COALESCE(sqlc.narg(count)::integer::text, current_setting('tcp_keepalives_count')), false) AS count,
    set_config('tcp_user_timeout', COALESCE(sqlc.narg(user_timeout_ms)::integer::text, current_setting('tcp_user_timeout')), false) AS user_timeout;

-- name: WorkerRegister :one
-- Registers a new session of a worker under session_key (one
-- WorkerDrawSessionKey drew; null draws one here), takes the advisory
-- lock on it in the calling session, records the session in
-- worker_sessions and makes it the holder of the worker id in workers, all
-- in one statement, so that no reclaim can see the session without its
-- lock. The lock lasts as long as the session: the caller keeps this
-- connection open for the life of the worker.
--
-- A worker id belongs to one live session at a time. It passes to the new
-- session only when the session holding it has ended, or is one of the
-- caller's own: its previous session (previous_session_key: a worker
-- registering again after losing its connection, which the server may not
-- have noticed yet), or a session it registered without learning so
-- (lost_session_keys: registrations whose answers were lost, whose
-- connections the server may not have seen end either). A key is drawn
-- once, so a key the caller drew names no other process's session.
-- Two registrations of one id at once are ordered by the id's row, and
-- the second sees the first's session alive. Returns no row when the id is
-- held by another live session (see WorkerHolder) or the lock could not be
-- taken; it then leaves the caller holding the lock of an unused key,
-- which the caller releases by closing the connection. backend_pid is the
-- server process of the calling session.
WITH fresh AS (
    SELECT COALESCE(sqlc.narg(session_key)::integer, nextval('worker_session_key_seq')::integer) AS session_key
),
locked AS (
    SELECT f.session_key
    FROM fresh AS f
    WHERE pg_try_advisory_lock(1380273241, f.session_key)
),
holder AS (
    INSERT INTO workers (id, session_key, queue, pid, host)
    SELECT @id, l.session_key, @queue, @pid, @host
    FROM locked AS l
    ON CONFLICT (id) DO UPDATE
    SET session_key = EXCLUDED.session_key,
        queue       = EXCLUDED.queue,
        pid         = EXCLUDED.pid,
        host        = EXCLUDED.host,
        started_at  = now()
    WHERE workers.session_key = sqlc.narg(previous_session_key)::integer
       OR workers.session_key = ANY (sqlc.narg(lost_session_keys)::integer[])
       OR NOT worker_session_alive(workers.session_key)
    RETURNING workers.session_key
),
session AS (
    INSERT INTO worker_sessions (session_key, worker_id, queue, pid, host)
    SELECT h.session_key, @id, @queue, @pid, @host
    FROM holder AS h
    RETURNING worker_sessions.session_key
)
SELECT s.session_key, pg_backend_pid() AS backend_pid
FROM session AS s;

-- name: WorkerHolder :one
-- The session that holds a worker id, and whether it is alive: what a
-- registration refused for that id reports.
SELECT w.id, w.session_key, w.pid, w.host, w.started_at,
    worker_session_alive(w.session_key) AS session_alive
FROM workers AS w
WHERE w.id = @id;

-- name: WorkerUnregister :one
-- Frees the id of a worker that is shutting down, if this session still
-- holds it. The session's own row stays until the session has ended and
-- WorkerForgetEnded forgets it: until its connection closes the session
-- could still claim, and a row removed under a claim in flight would hide
-- that claim's jobs from the reclaims that take back an ended session's
-- jobs at once. Returns whether the id was freed.
WITH holder AS (
    DELETE FROM workers AS w
    WHERE w.id = @id AND w.session_key = @session_key
    RETURNING w.id
)
SELECT EXISTS (SELECT 1 FROM holder) AS id_released;

-- name: WorkerStopClaimsOfEndedSessions :many
-- The first of the two statements that forget the sessions that ended, in
-- one READ COMMITTED transaction: it takes, for the rest of the
-- transaction, the claim lock of each session that ended and that no
-- claim holds, and returns their keys for WorkerForgetEnded. A claim holds
-- its session's claim lock, shared, from before it checks that the
-- session is alive until it commits (JobCompleteAndClaim), so once this
-- has the lock every claim that found the session alive has committed,
-- and the next statement's snapshot, taken after this one's, sees its
-- jobs; a claim that comes after finds the session ended, or the lock
-- taken, and claims nothing. In one statement the check for running jobs
-- would read a snapshot taken before the locks, blind to a claim that
-- committed in between. The lock table is read once, for live; the claim
-- locks are tried on the ended sessions alone, 200 at most, so that a
-- fleet that ended at once does not fill the server's lock table (each
-- lock held takes a slot of it until the transaction ends): the next
-- forget takes the rest.
WITH live AS MATERIALIZED (
    SELECT l.session_key FROM worker_sessions_live AS l
),
ended AS MATERIALIZED (
    SELECT s.session_key
    FROM worker_sessions AS s
    WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.session_key = s.session_key)
    -- Those whose jobs still run last: until the reclaims take their jobs
    -- back they cannot be forgotten, and they would otherwise fill every
    -- forget's 200. The forget looks again, after the locks (OFFSET 0:
    -- see WorkerForgetEnded).
    ORDER BY EXISTS (
                 SELECT 1 FROM jobs AS j WHERE j.state = 'running' AND j.lease_session = s.session_key
                 OFFSET 0),
             s.session_key
    LIMIT 200
)
SELECT e.session_key
FROM ended AS e
WHERE pg_try_advisory_xact_lock(1380273244, e.session_key)
ORDER BY e.session_key;

-- name: WorkerForgetEnded :execrows
-- Forgets the sessions given, which ended and which no claim can still
-- take jobs under (WorkerStopClaimsOfEndedSessions, earlier in the same
-- transaction), unless jobs run under them, and frees the ids they held.
-- Returns how many sessions it forgot. An id is freed only while the
-- newest version of its row still names a session given, so an id taken
-- over by a new session while this runs is kept: an ended session never
-- holds its lock again. Checking each id's session against pg_locks
-- instead read the lock table once per worker, every worker's id, not
-- only the ended ones': 30 to 46 ms a statement beside 152 live workers.
WITH freed AS (
    DELETE FROM workers AS w
    WHERE w.session_key = ANY (@session_keys::integer[])
    RETURNING w.id
)
DELETE FROM worker_sessions AS s
WHERE s.session_key = ANY (@session_keys::integer[])
  -- One probe of jobs_lease_session_idx per session, whatever the
  -- statistics say: OFFSET 0 keeps the lookup a subplan run for each
  -- session, which PostgreSQL would otherwise be free to turn into a join
  -- that hashes every running job, reading the whole table to find them
  -- while the table has never been analyzed.
  AND NOT EXISTS (
      SELECT 1 FROM jobs AS j WHERE j.state = 'running' AND j.lease_session = s.session_key
      OFFSET 0);

-- name: WorkerSessionAlive :one
-- Whether the session registered under a key still holds its lock.
SELECT worker_session_alive(@session_key::integer)::boolean AS alive;

-- name: WorkerSessionKeys :many
-- The keys of every session recorded in worker_sessions, ended ones
-- included until WorkerForgetEnded removes them.
SELECT s.session_key FROM worker_sessions AS s ORDER BY s.session_key;

-- name: WorkerList :many
-- Lists the worker ids registered, each with the session that holds it and
-- whether that session is alive.
SELECT w.*, (l.session_key IS NOT NULL)::boolean AS session_alive
FROM workers AS w
LEFT JOIN worker_sessions_live AS l ON l.session_key = w.session_key
ORDER BY w.id;

-- name: WorkerListen :one
-- Subscribes the calling session to its queue's notifications, which the
-- jobs_notify_available and jobs_notify_returned triggers send with the
-- queue name as payload: that a job became available there, and that a
-- job went back to available there (taken back, released or retried).
-- Returns the two channels' names, which the notifications carry.
SELECT relay_queue_channel('available', @queue::text)::text AS available_channel,
       relay_queue_channel('returned', @queue::text)::text AS returned_channel
FROM worker_listen(@queue::text);

-- name: WorkerTakeListenerSeat :one
-- Takes one of the queue's listener seats for the calling session, if one
-- is free, and returns its number; no row when all are taken. A seat is an
-- advisory lock of the session, held until the session ends, so that the
-- seat of a worker that dies is free again at once. Only a seated worker
-- listens for its queue's notifications (WorkerListen): PostgreSQL wakes
-- every listening session of the database at each commit that notifies,
-- whatever the channel, so the listeners are kept few and the other
-- workers of the queue poll. The seats are tried in order and the first
-- free one is taken. Two queues whose seats hash alike share that seat.
--
-- The seats are drawn one at a time, as each is tried, so that a look
-- costs the seats it tries (at most one more than the workers seated),
-- however many the queue has: generate_series in FROM would list every
-- seat before the first is tried, and a queue of 2^31 - 1 seats
-- (MaxQueueListeners) would keep the statement listing them for minutes,
-- spilling them to temporary files, at every registration. The subquery
-- is not flattened, nor the condition pushed into it, since it returns a
-- set from its select list.
SELECT s.seat::integer AS seat
FROM (SELECT generate_series(0, sqlc.arg(seats)::integer - 1) AS seat) AS s
WHERE pg_try_advisory_lock(1380273243, hashtext(sqlc.arg(queue)::text || '/' || s.seat::text))
LIMIT 1;
