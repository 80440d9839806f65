package client_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/dbtest"
)

// BenchmarkInsert_OneJobPerCommit stores one ready job per commit through
// a pool, from one goroutine and from eight at once, as the request
// handlers of a quiet and of a busy service would, and reports the jobs
// stored per second. Each job's commit waits for its flush; with eight,
// how many share one is what the figure shows.
func BenchmarkInsert_OneJobPerCommit(b *testing.B) {
	for _, inserters := range []int{1, 8} {
		b.Run(fmt.Sprintf("inserters=%d", inserters), func(b *testing.B) {
			benchmarkInsert(b, inserters)
		})
	}
}

func benchmarkInsert(b *testing.B, inserters int) {
	ctx := b.Context()
	config, err := pgxpool.ParseConfig(dbtest.NewURL(b))
	if err != nil {
		b.Fatal(err)
	}
	config.MaxConns = int32(inserters)
	config.MinConns = int32(inserters)
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	job, err := client.Validate(client.Request{Kind: "noop", Queue: ptr("bench")}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	// RunParallel runs parallelism × GOMAXPROCS goroutines; one inserter
	// runs in the benchmark's own.
	insert := func() bool {
		if _, _, err := client.Insert(ctx, pool, job); err != nil {
			b.Error(err)
			return false
		}
		return true
	}
	b.ResetTimer()
	if inserters == 1 {
		for range b.N {
			if !insert() {
				return
			}
		}
	} else {
		b.SetParallelism(max(1, inserters/runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() && insert() {
			}
		})
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "jobs/s")
}
