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
	// The sequence counts the commits that began to wait, and keeps its
	// count when the transaction rolls back.
	sql := fmt.Sprintf(`
		CREATE SEQUENCE test_slow_commits_begun;
		CREATE FUNCTION test_slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM nextval('test_slow_commits_begun'); PERFORM pg_sleep(%f); RETURN NULL; %s END $$;
		CREATE CONSTRAINT TRIGGER test_slow_commit AFTER INSERT ON jobs
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
		WHEN (NEW.payload ? 'slow_commit') EXECUTE FUNCTION test_slow_commit();`, d.Seconds(), handler)
	if _, err := pool.Exec(context.Background(), sql); err != nil {
		t.Fatalf("dbtest: make commits slow: %v", err)
	}
}

// slowCommitTries is how many times LoseASlowCommitsAnswer stores a job
// before it gives up on a commit that lands after its answer was lost.
const slowCommitTries = 5

// LoseASlowCommitsAnswer runs store, which stores one job whose commit
// SlowCommitsPastCancels makes wait and gives up on its answer after a
// timeout, until a run's commit lands all the same, and returns that
// run's error once it has. A run whose commit did not land says nothing
// about a lost answer, and is run again, up to slowCommitTries times: on
// a loaded machine the timeout can fall before the statement reaches its
// commit, which cancels it, and a commit that had begun to wait has been
// seen rolled back all the same, as by a cancel that arrived late.
func LoseASlowCommitsAnswer(t testing.TB, pool *pgxpool.Pool, store func() error) error {
	t.Helper()
	for try := 1; ; try++ {
		begun, stored := slowCommitsBegun(t, pool), CountJobs(t, pool)
		err := store()
		waitUntilIdle(t, pool)
		if CountJobs(t, pool) > stored {
			return err
		}
		waited := slowCommitsBegun(t, pool) > begun
		if try == slowCommitTries {
			t.Fatalf("dbtest: in %d tries, no commit landed after its answer was lost (the last began to wait: %t): %v", try, waited, err)
		}
		t.Logf("dbtest: try %d: the commit did not land (it began to wait: %t): %v; again", try, waited, err)
	}
}

// slowCommitsBegun returns how many commits that SlowCommits made slow
// have begun to wait in pool's database.
func slowCommitsBegun(t testing.TB, pool *pgxpool.Pool) int64 {
	t.Helper()
	var n int64
	err := pool.QueryRow(context.Background(),
		`SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM test_slow_commits_begun`).Scan(&n)
	if err != nil {
		t.Fatalf("dbtest: count the slow commits begun: %v", err)
	}
	return n
}

// waitUntilIdle waits until no other session of pool's database is
// running a statement, as one whose client gave up on its answer may go
// on running.
func waitUntilIdle(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		var running int
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid()
			AND backend_type = 'client backend' AND state <> 'idle'`).Scan(&running)
		if err != nil {
			t.Fatalf("dbtest: look for running statements: %v", err)
		}
		if running == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("dbtest: %d sessions still running a statement after 30s", running)
		}
	}
}
