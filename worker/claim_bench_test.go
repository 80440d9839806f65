package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/uuid"

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
			rounds := 0
			for b.Loop() {
				params := db.JobCompleteAndClaimParams{
					Queue: "default", ClaimTokens: make([]uuid.UUID, size), LeaseMs: 60_000, WorkerID: "bench",
				}
				for i := range params.ClaimTokens {
					params.ClaimTokens[i] = uuid.New()
				}
				for _, r := range held {
					params.CompleteIDs = append(params.CompleteIDs, *r.ID)
					params.CompleteTokens = append(params.CompleteTokens, *r.LeaseToken)
					params.CompleteResults = append(params.CompleteResults, json.RawMessage(`{}`))
				}
				rows, err := q.JobCompleteAndClaim(ctx, params)
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
				rounds++
				if len(held) < size {
					b.StopTimer()
					fill()
					b.StartTimer()
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(rounds*size), "ns/job")
		})
	}
}
