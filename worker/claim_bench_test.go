package worker_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/worker"
)

// BenchmarkCompleteAndClaim_Round times the statement of a worker's round
// in its common case: it completes the jobs the previous round claimed and
// claims as many again, for rounds of 1, 50 and 200 jobs, from a queue
// filled with 100,000 jobs, and filled again whenever it runs dry (outside
// the timing). ns/job is the statement's time over the jobs it claims; a
// round of 200 that costs more per job than a round of 50 has a part that
// grows faster than the round. Each size runs on a connection that lets
// PostgreSQL choose between a custom and a generic plan at every call
// (plans=chosen, PostgreSQL's default) and on one that keeps a generic plan
// (plans=generic, as KeepGenericPlans sets relay work's connections).
//
//	go test -run '^$' -bench CompleteAndClaim_Round ./worker
func BenchmarkCompleteAndClaim_Round(b *testing.B) {
	for _, plans := range []string{"chosen", "generic"} {
		for _, size := range []int{1, 50, 200} {
			b.Run(fmt.Sprintf("plans=%s/jobs=%d", plans, size), func(b *testing.B) {
				benchmarkRound(b, plans == "generic", size)
			})
		}
	}
}

// benchmarkRound runs BenchmarkCompleteAndClaim_Round's rounds of size
// jobs, on a connection that keeps generic plans if generic.
func benchmarkRound(b *testing.B, generic bool, size int) {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(dbtest.NewURL(b))
	if err != nil {
		b.Fatal(err)
	}
	if generic {
		worker.KeepGenericPlans(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	q := db.New(pool)
	fill := func() {
		if _, err := pool.Exec(ctx, `
			INSERT INTO jobs (queue, kind) SELECT 'default', 'noop' FROM generate_series(1, 100000);
			ANALYZE jobs`); err != nil {
			b.Fatal(err)
		}
	}
	fill()
	var held []db.JobCompleteAndClaimRow
	claimed := 0
	for b.Loop() {
		rows, err := q.JobCompleteAndClaim(ctx, nextRound("bench", held, size))
		if err != nil {
			b.Fatal(err)
		}
		if got := len(rows[0].CompletedIDs); got != len(held) {
			b.Fatalf("completed %d of the %d jobs held", got, len(held))
		}
		held = held[:0]
		for _, r := range rows {
			if r.ID != nil {
				held = append(held, r)
			}
		}
		claimed += len(held)
		if len(held) < size {
			b.StopTimer()
			fill()
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(max(claimed, 1)), "ns/job")
}
