package client_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/dbtest"
)

// BenchmarkInsert_OneJobPerCommit stores one ready job per commit through
// a pool, from eight goroutines at once, as the request handlers of a
// busy service would, and reports the jobs stored per second. Each job's
// commit waits for its flush; how many share one is what the figure shows.
func BenchmarkInsert_OneJobPerCommit(b *testing.B) {
	ctx := b.Context()
	config, err := pgxpool.ParseConfig(dbtest.NewURL(b))
	if err != nil {
		b.Fatal(err)
	}
	const inserters = 8
	config.MaxConns = inserters
	config.MinConns = inserters
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	job, err := client.Validate(client.Request{Kind: "noop", Queue: ptr("bench")}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	// RunParallel runs parallelism × GOMAXPROCS goroutines.
	b.SetParallelism(max(1, inserters/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, _, err := client.Insert(ctx, pool, job); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}
