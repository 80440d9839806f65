-- name: DatabaseExists :one
-- Whether a database of this name exists on the server; for the test helper
-- that creates a database per test.
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_database AS d WHERE d.datname = @name::text)::boolean AS exists;
