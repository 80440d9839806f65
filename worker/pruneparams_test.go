package worker

import (
	"context"
	"testing"
	"time"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
)

// TestPruneParams_KeepAJobUntilARetentionOfAFractionOfAMillisecondHasPassed
// prunes with a retention of 1.5 ms two succeeded jobs that finished
// 1.2 ms and 2.5 ms before the prune, by the database's clock (one
// transaction, whose now() is the same throughout): JobPrune counts whole
// milliseconds, and the first, whose retention has not passed, is kept,
// while the second is deleted.
func TestPruneParams_KeepAJobUntilARetentionOfAFractionOfAMillisecondHasPassed(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.New(t)
	params, some := pruneParams(Config{RetainSucceeded: 1500 * time.Microsecond, RetainDead: KeepForever, RetainCancelled: KeepForever})
	if !some {
		t.Fatal("pruneParams prunes nothing with a retention of 1.5ms")
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep
	ids := map[string]int64{}
	for _, ago := range []string{"1200 microseconds", "2500 microseconds"} {
		var id int64
		if err := tx.QueryRow(ctx, `
			INSERT INTO jobs (kind, state, attempt, fence, started_at, finished_at)
			VALUES ('done', 'succeeded', 1, 1, now() - $1::interval, now() - $1::interval)
			RETURNING id`, ago).Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[ago] = id
	}
	n, err := db.New(tx).JobPrune(ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	if n.Succeeded != 1 {
		t.Errorf("the prune deleted %d succeeded jobs, want 1", n.Succeeded)
	}
	var kept bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT FROM jobs WHERE id = $1)`, ids["1200 microseconds"]).Scan(&kept); err != nil {
		t.Fatal(err)
	}
	if !kept {
		t.Errorf("a job that finished 1.2ms ago was deleted with a retention of 1.5ms")
	}
}
