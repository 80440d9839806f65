package client_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/faultproxy"
)

// BenchmarkInsert_OneJobPerCommit stores one ready job per commit through
// a pool, from one goroutine and from eight at once, as the request
// handlers of a quiet and of a busy service would, and reports the jobs
// stored per second. Each job's commit waits for its flush; with eight,
// how many share one is what the figure shows.
func BenchmarkInsert_OneJobPerCommit(b *testing.B) {
	for _, inserters := range []int{1, 8} {
		b.Run(fmt.Sprintf("inserters=%d", inserters), func(b *testing.B) {
			benchmarkInsert(b, inserters, 1, 0, func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
				_, _, err := client.Insert(ctx, pool, job)
				return err
			})
		})
	}
}

// BenchmarkEnqueuer_OneJobPerCall stores one ready job per call from
// eight goroutines at once, as the request handlers of a busy service
// would, with client.Insert and with one client.Enqueuer shared by all,
// its notifications spaced as by default and unspaced, beside no
// listening session and beside 50 that listen as idle workers of the
// jobs' queue do. It reports the jobs stored per second.
func BenchmarkEnqueuer_OneJobPerCall(b *testing.B) {
	const inserters = 8
	for _, listeners := range []int{0, 50} {
		for _, tc := range []struct {
			name      string
			newInsert func(*testing.B, *pgxpool.Pool) func(context.Context, client.Job) error
		}{
			{"Insert", func(_ *testing.B, pool *pgxpool.Pool) func(context.Context, client.Job) error {
				return func(ctx context.Context, job client.Job) error {
					_, _, err := client.Insert(ctx, pool, job)
					return err
				}
			}},
			{"Enqueuer unspaced", enqueue(-1)},
			{"Enqueuer", enqueue(0)},
		} {
			b.Run(fmt.Sprintf("listeners=%d/%s", listeners, tc.name), func(b *testing.B) {
				benchmarkInserts(b, insertBench{inserters: inserters, jobsPerCall: 1, listeners: listeners}, tc.newInsert)
			})
		}
	}
}

// enqueue returns what stores one job through a client.Enqueuer on a
// pool, with AnnounceEvery every, closed when its benchmark ends.
func enqueue(every time.Duration) func(*testing.B, *pgxpool.Pool) func(context.Context, client.Job) error {
	return func(b *testing.B, pool *pgxpool.Pool) func(context.Context, client.Job) error {
		enq := client.NewEnqueuer(pool, client.EnqueuerConfig{AnnounceEvery: every})
		b.Cleanup(func() { enq.Close(context.Background()) })
		return func(ctx context.Context, job client.Job) error {
			_, err := enq.Insert(ctx, job)
			return err
		}
	}
}

// BenchmarkInsertMany_TenJobsPerCommit stores ten ready jobs per commit
// through a pool with InsertMany, from one goroutine and from eight at
// once, as a producer of small batches would, and reports the jobs stored
// per second.
func BenchmarkInsertMany_TenJobsPerCommit(b *testing.B) {
	const batch = 10
	for _, inserters := range []int{1, 8} {
		b.Run(fmt.Sprintf("inserters=%d", inserters), func(b *testing.B) {
			benchmarkInsert(b, inserters, batch, 0, func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
				_, err := client.InsertMany(ctx, pool, slices.Repeat([]client.Job{job}, batch))
				return err
			})
		})
	}
}

// BenchmarkInsert_InATransaction stores one ready job in each transaction
// of the caller's, from one goroutine and from eight at once, and reports
// the jobs stored per second: in a transaction begun with pool.Begin, whose
// commit notifies the queue's listeners, and in one begun with
// client.Begin, which announces its jobs once it has committed.
func BenchmarkInsert_InATransaction(b *testing.B) {
	for _, tc := range []struct {
		name      string
		inserters int
		begin     func(context.Context, *pgxpool.Pool) (pgx.Tx, error)
	}{
		{"notified at commit/inserters=1", 1, beginPgx},
		{"announced after commit/inserters=1", 1, beginClient},
		{"notified at commit/inserters=8", 8, beginPgx},
		{"announced after commit/inserters=8", 8, beginClient},
	} {
		b.Run(tc.name, func(b *testing.B) {
			benchmarkInsert(b, tc.inserters, 1, 0, insertInATransaction(tc.begin))
		})
	}
}

// BenchmarkInsert_ToAServerFarAway stores ready jobs from one goroutine
// through a proxy that holds each of the client's writes for a
// millisecond, as a server across a network answers a round trip later:
// one job per call with Insert, ten with InsertMany, and one in a Tx
// begun and committed by hand, as a request handler's would be. It
// reports the jobs stored per second, and in ns/op the time of each call,
// which every round trip it waits for makes a millisecond or more longer.
func BenchmarkInsert_ToAServerFarAway(b *testing.B) {
	const lag = time.Millisecond
	for _, tc := range []struct {
		name   string
		jobs   int
		insert func(context.Context, *pgxpool.Pool, client.Job) error
	}{
		{"Insert", 1, func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
			_, _, err := client.Insert(ctx, pool, job)
			return err
		}},
		{"InsertMany of 10", 10, func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
			_, err := client.InsertMany(ctx, pool, slices.Repeat([]client.Job{job}, 10))
			return err
		}},
		{"Insert in a Tx", 1, insertInATransaction(beginClient)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			benchmarkInsert(b, 1, tc.jobs, lag, tc.insert)
		})
	}
}

// insertInATransaction returns a call that stores one job with Insert in
// a transaction begun with begin, and commits it.
func insertInATransaction(begin func(context.Context, *pgxpool.Pool) (pgx.Tx, error)) func(context.Context, *pgxpool.Pool, client.Job) error {
	return func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
		tx, err := begin(ctx, pool)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, _, err := client.Insert(ctx, tx, job); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

func beginPgx(ctx context.Context, pool *pgxpool.Pool) (pgx.Tx, error) { return pool.Begin(ctx) }

func beginClient(ctx context.Context, pool *pgxpool.Pool) (pgx.Tx, error) {
	return client.Begin(ctx, pool)
}

// benchmarkInsert runs insert, which stores jobsPerCall jobs, b.N times
// from as many goroutines as inserters, each with a connection of a pool
// of its own; with a lag, through a proxy that holds each write of the
// pool's for that long (faultproxy.Proxy.Slow).
func benchmarkInsert(b *testing.B, inserters, jobsPerCall int, lag time.Duration, insert func(context.Context, *pgxpool.Pool, client.Job) error) {
	benchmarkInserts(b, insertBench{inserters: inserters, jobsPerCall: jobsPerCall, lag: lag}, func(_ *testing.B, pool *pgxpool.Pool) func(context.Context, client.Job) error {
		return func(ctx context.Context, job client.Job) error { return insert(ctx, pool, job) }
	})
}

// insertBench is how benchmarkInserts runs.
type insertBench struct {
	inserters   int           // goroutines calling the insert
	jobsPerCall int           // jobs each call stores
	lag         time.Duration // how long a proxy holds each write of the pool's
	listeners   int           // sessions listening as idle workers of the jobs' queue do
}

// benchmarkInserts runs the insert that newInsert returns for the
// benchmark's pool b.N times (what newInsert has b clean up is cleaned up
// before the pool closes), from as many goroutines as bench.inserters,
// with a pool of that many connections, beside bench.listeners sessions
// that listen as idle workers of the jobs' queue do and read every
// notification, and reports the jobs stored per second.
func benchmarkInserts(b *testing.B, bench insertBench, newInsert func(*testing.B, *pgxpool.Pool) func(context.Context, client.Job) error) {
	ctx := b.Context()
	url := dbtest.NewURL(b)
	if bench.lag > 0 {
		proxy, through, err := faultproxy.StartFor(url)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { proxy.Close() })
		proxy.Slow(bench.lag)
		url = through
	}
	config, err := pgxpool.ParseConfig(url)
	if err != nil {
		b.Fatal(err)
	}
	config.MaxConns = int32(bench.inserters)
	config.MinConns = int32(bench.inserters)
	pool, err := pgxpool.NewWithConfig(ctx, config)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	job, err := client.Validate(client.Request{Kind: "noop", Queue: ptr("bench")}, time.Now())
	if err != nil {
		b.Fatal(err)
	}
	listen(b, pool, "bench", bench.listeners)
	insert := newInsert(b, pool)
	// RunParallel runs parallelism × GOMAXPROCS goroutines; one inserter
	// runs in the benchmark's own.
	once := func() bool {
		if err := insert(ctx, job); err != nil {
			b.Error(err)
			return false
		}
		return true
	}
	b.ResetTimer()
	if bench.inserters == 1 {
		for range b.N {
			if !once() {
				return
			}
		}
	} else {
		b.SetParallelism(max(1, bench.inserters/runtime.GOMAXPROCS(0)))
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() && once() {
			}
		})
	}
	b.ReportMetric(float64(b.N*bench.jobsPerCall)/b.Elapsed().Seconds(), "jobs/s")
}

// listen connects n sessions to pool's database that listen as idle
// workers of queue do, each reading every notification it hears until
// the benchmark ends, as a worker's session does.
func listen(b *testing.B, pool *pgxpool.Pool, queue string, n int) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		conn, _ := dbtest.Listen(b, pool, queue)
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := conn.WaitForNotification(ctx); err != nil && ctx.Err() == nil {
					b.Errorf("listener: %v", err)
					return
				}
			}
		})
	}
	// Registered after the listeners' own cleanups, so run before them:
	// each stops reading before its connection closes.
	b.Cleanup(func() {
		cancel()
		wg.Wait()
	})
}
