package worker_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/modelcheck"
)

// BenchmarkReclaim_RegisteredWorkers times one reclaim statement, the one
// every worker runs four times a second, with 10, 200 and 1,000 live
// worker sessions registered, each holding its lock and 4 running jobs, and
// nothing to take back: the cost of finding out that no worker is gone.
//
//	go test -run '^$' -bench Reclaim_RegisteredWorkers ./worker
func BenchmarkReclaim_RegisteredWorkers(b *testing.B) {
	const jobsPerWorker = 4
	for _, workers := range []int{10, 200, 1000} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			ctx := context.Background()
			pool := dbtest.New(b)
			// One connection holds every session's lock, as that many
			// worker processes would, each its own.
			locks, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
			if err != nil {
				b.Fatal(err)
			}
			defer locks.Close(ctx)
			if _, err := locks.Exec(ctx, `SELECT pg_advisory_lock(1380273241, k) FROM generate_series(1, $1::int) AS k`, workers); err != nil {
				b.Fatal(err)
			}
			if _, err := pool.Exec(ctx, fmt.Sprintf(`
				INSERT INTO worker_sessions (session_key, worker_id, queue, pid, host)
				SELECT k, 'w' || k, 'default', k, 'bench' FROM generate_series(1, %[1]d) AS k;
				INSERT INTO workers (id, session_key, queue, pid, host)
				SELECT 'w' || k, k, 'default', k, 'bench' FROM generate_series(1, %[1]d) AS k;
				INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, lease_session, started_at)
				SELECT 'noop', 'running', 1, 1, gen_random_uuid(), now() + interval '1 hour', 'w' || k, k, now()
				FROM generate_series(1, %[1]d) AS k, generate_series(1, %[2]d);
				ANALYZE worker_sessions; ANALYZE workers; ANALYZE jobs;`, workers, jobsPerWorker)); err != nil {
				b.Fatal(err)
			}
			q := db.New(pool)
			b.ResetTimer()
			for b.Loop() {
				rows, err := q.JobReclaim(ctx, db.JobReclaimParams{MaxJobs: 1000})
				if err != nil {
					b.Fatal(err)
				}
				if taken, _ := modelcheck.ReclaimedOf(rows); len(taken) != 0 {
					b.Fatalf("reclaimed %d jobs of live workers", len(taken))
				}
			}
		})
	}
}
