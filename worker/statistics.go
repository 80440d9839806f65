package worker

import (
	"context"
	"fmt"
	"time"
)

// statistician gathers the planner's statistics of the jobs table when
// autovacuum does not: on a server, or for a table, where autovacuum is
// off. A worker's connections keep the plans PostgreSQL chose for their
// statements until the statistics of the tables those read change, and a
// plan made over a nearly empty table reads the whole table where it
// should look a job up by id (JobStatisticsDue in queries/admin.sql).
// Where autovacuum runs, it gathers them itself and this does nothing.
type statistician struct {
	w *Worker
}

// run looks every PruneInterval whether the statistics are due, and
// gathers them when they are and no other worker is gathering them.
func (s statistician) run(ctx context.Context) {
	w := s.w
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(w.cfg.PruneInterval)):
		}
		analyzed, err := s.analyze(ctx)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				w.log.Warn("analyze jobs failed", "err", err)
			}
		case analyzed:
			w.log.Info("analyzed jobs", "reason", "autovacuum is off")
		}
	}
}

// analyze runs ANALYZE jobs if JobStatisticsDue says so, in the
// transaction that holds the lock it takes, and reports whether it did.
// The transaction lasts as long as the ANALYZE, which reads a sample of
// the table; it is cancelled after Lease.
func (s statistician) analyze(ctx context.Context) (bool, error) {
	w := s.w
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	q := w.q.WithTx(tx)
	due, err := q.JobStatisticsDue(ctx)
	if err != nil {
		return false, fmt.Errorf("ask whether the statistics are due: %w", err)
	}
	if !due {
		return false, nil
	}
	if err := q.JobAnalyze(ctx); err != nil {
		return false, fmt.Errorf("analyze: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit: %w", err)
	}
	return true, nil
}
