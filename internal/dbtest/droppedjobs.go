package dbtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DroppedKind is the kind of the jobs that DropJobsOfKind drops.
const DroppedKind = "dropped_by_trigger"

// DropJobsOfKind installs on the jobs table a user's BEFORE INSERT trigger
// that returns NULL for each row of kind DroppedKind, so that PostgreSQL
// stores nothing of that row and returns nothing of it, without an error:
// an insert of many jobs then gets back fewer rows than it sent.
func DropJobsOfKind(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	// A test fixture, as an application's own trigger would be.
	const sql = `
		CREATE FUNCTION test_drop_job() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RETURN NULL; END $$;
		CREATE TRIGGER test_drop_job BEFORE INSERT ON jobs
		FOR EACH ROW WHEN (NEW.kind = '` + DroppedKind + `') EXECUTE FUNCTION test_drop_job();`
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("dbtest: drop jobs of kind %s: %v", DroppedKind, err)
	}
}
