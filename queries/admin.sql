-- name: DatabaseExists :one
-- Whether a database of this name exists on the server; for the tools that
-- create databases (tests, experiments).
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_database AS d WHERE d.datname = @name::text)::boolean AS exists;
