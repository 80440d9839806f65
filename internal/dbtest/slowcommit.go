package dbtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// SlowCommitPayload is the payload of a job whose commit SlowCommits
// makes wait.
const SlowCommitPayload = `{"slow_commit": true}`

// SlowCommits makes the commit of each transaction that inserts a job
// whose payload has the key slow_commit wait d, as a commit waits for a
// slow disk or a synchronous standby: a deferred trigger sleeps d at the
// commit, in the server, before the transaction commits.
func SlowCommits(t testing.TB, pool *pgxpool.Pool, d time.Duration) {
	t.Helper()
	slowCommits(t, pool, d, "")
}

// SlowCommitsPastCancels makes commits wait as SlowCommits does, and
// commit all the same if their statement is cancelled meanwhile, as pgx
// cancels one whose answer it gives up waiting for: as a commit does
// that waits for its WAL flush, or for a synchronous standby once it has
// committed locally.
func SlowCommitsPastCancels(t testing.TB, pool *pgxpool.Pool, d time.Duration) {
	t.Helper()
	slowCommits(t, pool, d, "EXCEPTION WHEN query_canceled THEN RETURN NULL;")
}

// slowCommits installs the trigger of SlowCommits, whose function ends
// with handler, an exception clause or nothing.
func slowCommits(t testing.TB, pool *pgxpool.Pool, d time.Duration, handler string) {
	t.Helper()
	// A test fixture: the sleep is a literal, as a DDL statement takes no
	// parameters.
	sql := fmt.Sprintf(`
		CREATE FUNCTION test_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_sleep(%f); RETURN NULL; %s END $$;
		CREATE CONSTRAINT TRIGGER test_slow_commit AFTER INSERT ON jobs
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
		WHEN (NEW.payload ? 'slow_commit') EXECUTE FUNCTION test_slow_commit();`, d.Seconds(), handler)
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("dbtest: make commits slow: %v", err)
	}
}
