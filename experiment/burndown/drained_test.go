package burndown

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/dbtest"
)

// TestSystems_DrainedWhenNoJobOfTheQueueIsLeftUnfinished checks each
// system's drained lookup against jobs of every state: a queue is drained
// when none of its jobs waits, is scheduled or runs, whatever other queues
// hold. Each case inserts its jobs in a transaction that is rolled back.
func TestSystems_DrainedWhenNoJobOfTheQueueIsLeftUnfinished(t *testing.T) {
	url := dbtest.NewURL(t)
	// River's tables beside Relay's, in the same database: neither
	// system's names collide with the other's.
	procs := harness.NewProcs(riverBin(t), t.TempDir(), "DATABASE_URL="+url)
	defer procs.KillAll()
	if err := procs.Run(t.Context(), "river-migrate", "migrate", "--log-format", "json"); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()

	const (
		relayJob = `INSERT INTO jobs (queue, kind, payload, state, run_at, attempt, fence, lease_token, lease_expires_at, leased_by, started_at, finished_at)
			SELECT $1, 'noop', '{}', s.state::job_state, now() + $3::interval,
			       CASE WHEN s.state = 'available' THEN 0 ELSE 1 END, CASE WHEN s.state = 'available' THEN 0 ELSE 1 END,
			       CASE WHEN s.state = 'running' THEN gen_random_uuid() END,
			       CASE WHEN s.state = 'running' THEN now() + interval '1 minute' END,
			       CASE WHEN s.state = 'running' THEN 'w' END,
			       CASE WHEN s.state <> 'available' THEN now() END,
			       CASE WHEN s.state IN ('succeeded', 'dead', 'cancelled') THEN now() END
			FROM (SELECT $2::text AS state) AS s`
		riverJob = `INSERT INTO river_job (queue, kind, args, state, scheduled_at, attempt, attempted_at, finalized_at)
			SELECT $1, 'noop', '{}', s.state::river_job_state, now() + $3::interval,
			       CASE WHEN s.state IN ('available', 'pending', 'scheduled') THEN 0 ELSE 1 END,
			       CASE WHEN s.state NOT IN ('available', 'pending', 'scheduled') THEN now() END,
			       CASE WHEN s.state IN ('completed', 'discarded', 'cancelled') THEN now() END
			FROM (SELECT $2::text AS state) AS s`
	)
	// job is one job inserted before the lookup: its queue, its state in
	// the system's own words, and how far ahead it is due.
	type job struct{ queue, state, due string }
	for _, tc := range []struct {
		system string
		insert string
		jobs   []job
		want   bool
	}{
		{SystemRelay, relayJob, nil, true},
		{SystemRelay, relayJob, []job{{queue, "available", "0s"}}, false},
		{SystemRelay, relayJob, []job{{queue, "available", "1 hour"}}, false},
		{SystemRelay, relayJob, []job{{queue, "running", "0s"}}, false},
		{SystemRelay, relayJob, []job{{queue, "succeeded", "0s"}, {queue, "dead", "0s"}, {queue, "cancelled", "0s"}}, true},
		{SystemRelay, relayJob, []job{{queue, "succeeded", "0s"}, {queue, "running", "0s"}}, false},
		{SystemRelay, relayJob, []job{{"other", "available", "0s"}, {"other", "running", "0s"}}, true},
		{SystemRiver, riverJob, nil, true},
		{SystemRiver, riverJob, []job{{queue, "available", "0s"}}, false},
		{SystemRiver, riverJob, []job{{queue, "scheduled", "1 hour"}}, false},
		{SystemRiver, riverJob, []job{{queue, "pending", "0s"}}, false},
		{SystemRiver, riverJob, []job{{queue, "retryable", "1 minute"}}, false},
		{SystemRiver, riverJob, []job{{queue, "running", "0s"}}, false},
		{SystemRiver, riverJob, []job{{queue, "completed", "0s"}, {queue, "discarded", "0s"}, {queue, "cancelled", "0s"}}, true},
		{SystemRiver, riverJob, []job{{"other", "available", "0s"}, {"other", "running", "0s"}}, true},
	} {
		t.Run(fmt.Sprintf("%s %v", tc.system, tc.jobs), func(t *testing.T) {
			sys := relaySystem("")
			if tc.system == SystemRiver {
				sys = riverSystem("", nil)
			}
			tx, err := pool.Begin(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(t.Context())
			for _, j := range tc.jobs {
				if _, err := tx.Exec(t.Context(), tc.insert, j.queue, j.state, j.due); err != nil {
					t.Fatalf("insert a %s job on %s: %v", j.state, j.queue, err)
				}
			}
			got, err := sys.drained(t.Context(), labdb.New(tx))
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("drained with jobs %v: %v, want %v", tc.jobs, got, tc.want)
			}
		})
	}
}
