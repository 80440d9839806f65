package soak

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
)

// holdIdleTransaction opens a transaction, gives it a transaction id and
// leaves it idle until ctx ends, then rolls it back: the session of an
// application that began a transaction and went on with something else.
// ready receives the transaction id once it is held.
func holdIdleTransaction(ctx context.Context, pool *pgxpool.Pool, ready chan<- int64) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{})
	if err != nil {
		return fmt.Errorf("idle in transaction: begin: %w", err)
	}
	defer rollback(ctx, tx)
	xid, err := labdb.New(tx).SoakTakeXID(ctx)
	if err != nil {
		return fmt.Errorf("idle in transaction: take a transaction id: %w", err)
	}
	ready <- xid
	<-ctx.Done()
	return nil
}

// ReaderStats is what the REPEATABLE READ readers of a phase did.
type ReaderStats struct {
	// Readers is how many ran, each in one transaction for the whole phase.
	Readers int `json:"readers"`
	// Counts is how many count(*) they ran in all, and Count how long each
	// took.
	Counts int                 `json:"counts"`
	Count  harness.Percentiles `json:"count"`
	// Rows is the last count a reader saw: its snapshot's, which stays the
	// same for the whole transaction.
	Rows int64 `json:"rows"`
}

// runReaders runs n readers until ctx ends, each in a REPEATABLE READ,
// read-only transaction of its own, counting the system's job table
// (System.CountJobs) every interval (at once again when a count took
// longer). ready is closed once every reader holds its snapshot.
func runReaders(ctx context.Context, pool *pgxpool.Pool, sys System, n int, interval time.Duration, ready chan<- struct{}) (ReaderStats, error) {
	var (
		mu    sync.Mutex
		times []float64
		rows  int64
		wg    sync.WaitGroup
		errs  = make([]error, n)
	)
	var started sync.WaitGroup
	started.Add(n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			once := sync.OnceFunc(started.Done)
			defer once()
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
			if err != nil {
				errs[i] = fmt.Errorf("reader %d: begin: %w", i+1, err)
				return
			}
			defer rollback(ctx, tx)
			q := labdb.New(tx)
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				t0 := time.Now()
				c, err := sys.CountJobs(ctx, q)
				if err != nil {
					if ctx.Err() == nil {
						errs[i] = fmt.Errorf("reader %d: count the jobs: %w", i+1, err)
					}
					return
				}
				once()
				mu.Lock()
				times = append(times, harness.Millis(time.Since(t0)))
				rows = c
				mu.Unlock()
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	go func() {
		started.Wait()
		close(ready)
	}()
	wg.Wait()
	return ReaderStats{Readers: n, Counts: len(times), Count: harness.PercentilesOf(times), Rows: rows}, errors.Join(errs...)
}

// rollback ends a transaction the soak held open.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = tx.Rollback(rctx)
}
