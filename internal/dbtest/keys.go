package dbtest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TakeKeyBeforeEachInsert installs on the jobs table a statement trigger
// that, before each statement that inserts into it, inserts a job of kind
// in the default queue, with the column defaults for the rest, under
// idempotency key, unless a job of that queue holds it already: an insert
// of another job under key then finds the key taken, by a job stored
// in the insert's own transaction, and rolled back with it if it fails.
func TakeKeyBeforeEachInsert(t testing.TB, pool *pgxpool.Pool, key, kind string) {
	t.Helper()
	// A test fixture, as an application's own trigger would be. Its own
	// insert fires the triggers again, one level deeper, where they do
	// nothing.
	sql := `
		CREATE FUNCTION test_take_key() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF pg_trigger_depth() = 1 THEN
				INSERT INTO jobs (kind, idempotency_key) VALUES (` + literal(kind) + `, ` + literal(key) + `)
				ON CONFLICT (queue, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING;
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_take_key BEFORE INSERT ON jobs
		FOR EACH STATEMENT EXECUTE FUNCTION test_take_key();`
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("dbtest: take key %q before each insert: %v", key, err)
	}
}

// FreeKeyAfterEachInsert installs on the jobs table a statement trigger
// that, after each statement that inserts into it, also one that stored
// nothing, deletes the job of kind that holds idempotency key in the
// default queue: the job an insert under key found holding it is gone
// by the time the insert's caller reads it, as a job deleted once its
// retention passed would be.
func FreeKeyAfterEachInsert(t testing.TB, pool *pgxpool.Pool, key, kind string) {
	t.Helper()
	sql := `
		CREATE FUNCTION test_free_key() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF pg_trigger_depth() = 1 THEN
				DELETE FROM jobs WHERE queue = 'default' AND idempotency_key = ` + literal(key) + ` AND kind = ` + literal(kind) + `;
			END IF;
			RETURN NULL;
		END $$;
		CREATE TRIGGER test_free_key AFTER INSERT ON jobs
		FOR EACH STATEMENT EXECUTE FUNCTION test_free_key();`
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("dbtest: free key %q after each insert: %v", key, err)
	}
}

// literal quotes s as an SQL string literal, for the DDL of a fixture,
// which takes no parameters.
func literal(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}
