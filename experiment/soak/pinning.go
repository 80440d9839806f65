package soak

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
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
	// Nice is the nice value each reader's backend ran at, read back from
	// the system once set (Config.ReadersNice); absent when none was set.
	Nice []int `json:"nice,omitempty"`
	// Apart is the table apart the readers counted (Config.ReadersApart);
	// absent, they counted the system's job table.
	Apart *ApartStats `json:"apart,omitempty"`
}

// runReaders runs n readers until ctx ends, each in a REPEATABLE READ,
// read-only transaction of its own on pool, counting a job table with
// count (the system's: System.CountJobs) every interval (at once again
// when a count took longer). With nice above zero, each first gives its
// backend's process that nice value (lowerPriority), and gives back the
// one it had at its end. ready is closed once every reader holds its
// snapshot.
func runReaders(ctx context.Context, pool *pgxpool.Pool, count func(context.Context, *labdb.Queries) (int64, error), n int, interval time.Duration, nice int, ready chan<- struct{}) (ReaderStats, error) {
	var (
		mu    sync.Mutex
		times []float64
		rows  int64
		nices []int
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
			if nice > 0 {
				pid, err := q.ExperimentBackendPID(ctx)
				if err != nil {
					errs[i] = fmt.Errorf("reader %d: find its backend: %w", i+1, err)
					return
				}
				got, restore, err := lowerPriority(int(pid), nice)
				if err != nil {
					errs[i] = fmt.Errorf("reader %d: %w", i+1, err)
					return
				}
				defer restore()
				mu.Lock()
				nices = append(nices, got)
				mu.Unlock()
			}
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for {
				t0 := time.Now()
				c, err := count(ctx, q)
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
	return ReaderStats{Readers: n, Counts: len(times), Count: harness.PercentilesOf(times), Rows: rows, Nice: nices}, errors.Join(errs...)
}

// lowerPriority gives the process pid, a backend of a server on this host,
// the nice value nice. It returns the value the process then has, read
// back, and a function that gives it back the value it had before, as
// far as this process may: raising a priority again takes privileges
// (root's, or CAP_SYS_NICE), and without them the backend keeps the lower
// one until it exits. Linux only, as the soak's CPU figures are.
func lowerPriority(pid, nice int) (got int, restore func(), err error) {
	if !harness.IsPostgres(pid) {
		return 0, nil, fmt.Errorf("backend %d is no PostgreSQL process of this host, whose priority the soak could lower", pid)
	}
	before, err := niceOf(pid)
	if err != nil {
		return 0, nil, err
	}
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, pid, nice); err != nil {
		return 0, nil, fmt.Errorf("give backend %d nice %d: %w", pid, nice, err)
	}
	restore = func() { _ = syscall.Setpriority(syscall.PRIO_PROCESS, pid, before) }
	if got, err = niceOf(pid); err != nil {
		restore()
		return 0, nil, err
	}
	return got, restore, nil
}

// niceOf returns the nice value of the process pid.
func niceOf(pid int) (int, error) {
	// Linux's system call answers 20 - nice, which Go does not convert.
	prio, err := syscall.Getpriority(syscall.PRIO_PROCESS, pid)
	if err != nil {
		return 0, fmt.Errorf("read backend %d's nice value: %w", pid, err)
	}
	return 20 - prio, nil
}

// rollback ends a transaction the soak held open.
func rollback(ctx context.Context, tx pgx.Tx) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = tx.Rollback(rctx)
}
