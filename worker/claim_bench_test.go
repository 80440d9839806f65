package worker_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
)

// BenchmarkCompleteAndClaim_Round times the statement of a worker's round
// in its common case: it completes the jobs the previous round claimed and
// claims as many again, for rounds of 1, 50 and 200 jobs, from a queue
// filled with 100,000 jobs, and filled again whenever it runs dry (outside
// the timing). ns/job is the statement's time over the jobs it claims; a
// round of 200 that costs more per job than a round of 50 has a part that
// grows faster than the round.
//
//	go test -run '^$' -bench CompleteAndClaim_Round ./worker
func BenchmarkCompleteAndClaim_Round(b *testing.B) {
	for _, size := range []int{1, 50, 200} {
		b.Run(fmt.Sprintf("jobs=%d", size), func(b *testing.B) {
			ctx := context.Background()
			pool := dbtest.New(b)
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
		})
	}
}
