-- name: DatabaseExists :one
-- Whether a database of this name exists on the server; for the test helper
-- that creates a database per test.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_database AS d WHERE d.datname = @name::text)::boolean AS exists;

-- name: BackendPID :one
-- The server process the calling session talks to. A connection whose
-- server process differs from the one it announced when it connected goes
-- through a connection pooler, which may hand each transaction to another
-- server session.
SELECT pg_backend_pid()::integer AS backend_pid;

-- name: DatabaseNow :one
-- The database clock: the start of the calling transaction, the instant
-- every fence in a statement of that transaction compares with.
SELECT now()::timestamptz AS now;

-- name: ServerAutovacuum :one
-- Whether the server runs autovacuum, which reuses the space of the jobs
-- that pruning deletes and of the versions every transition leaves behind.
SELECT current_setting('autovacuum')::boolean AS autovacuum;
