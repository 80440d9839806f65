package worker

import (
	"context"
	"fmt"
	"time"
)

// statisticsInterval is how often, at most, a worker looks whether the
// planner's statistics of the jobs table are due: one statement over the
// server's table statistics.
const statisticsInterval = time.Second

// statistician gathers the planner's statistics of the jobs table when
// they are due and autovacuum has not gathered them: on a server, or for
// a table, where autovacuum is off, or once the table outgrew them. A
// worker's connections keep the plans PostgreSQL chose for their
// statements until the statistics of the tables those read change, and a
// plan made over a nearly empty table reads the whole table where it
// should look a job up by id (JobStatisticsDue in queries/admin.sql).
type statistician struct {
	w *Worker
}

// run looks every statisticsInterval, or every PruneInterval if that is
// shorter, whether the statistics are due, and gathers them when they are
// and no other worker, nor autovacuum, is gathering them. In a large
// fleet each worker looks less often, the fleet as a whole as often as
// fleetShare workers (fleetInterval).
func (s statistician) run(ctx context.Context) {
	w := s.w
	every := min(w.cfg.PruneInterval, statisticsInterval)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(fleetInterval(every, w.fleetSize()))):
		}
		reason, err := s.analyze(ctx)
		switch {
		case err != nil:
			if ctx.Err() == nil {
				w.log.Warn("analyze jobs failed", "err", err)
			}
		case reason != "":
			w.log.Info("analyzed jobs", "reason", reason)
		}
	}
}

// analyze runs ANALYZE jobs if JobStatisticsDue says so, in the
// transaction that holds the locks it takes, and reports why it did, or
// "" if it did not. While autovacuum works on the table it does not
// wait: it leaves the statistics to autovacuum, or to its next look. The
// transaction lasts as long as the ANALYZE, which reads a sample of the
// table; it is cancelled after Lease.
func (s statistician) analyze(ctx context.Context) (string, error) {
	w := s.w
	ctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	// Asked first in a statement of its own, which holds a connection of
	// the pool for one round trip: they are seldom due. The lock it takes
	// when they are is released as the statement ends.
	if due, err := w.q.JobStatisticsDue(ctx); err != nil {
		return "", fmt.Errorf("ask whether the statistics are due: %w", err)
	} else if due.Reason == "" {
		return "", nil
	}
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	q := w.q.WithTx(tx)
	due, err := q.JobStatisticsDue(ctx)
	if err != nil {
		return "", fmt.Errorf("ask whether the statistics are due: %w", err)
	}
	if !due.Due {
		return "", nil
	}
	if err := q.JobLockForAnalyze(ctx); err != nil {
		if lockNotAvailable(err) {
			w.log.Debug("analyze jobs deferred", "reason", due.Reason, "holder", "another session, such as autovacuum")
			return "", nil
		}
		return "", fmt.Errorf("lock jobs for ANALYZE: %w", err)
	}
	if err := q.JobAnalyze(ctx); err != nil {
		return "", fmt.Errorf("analyze: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("commit: %w", err)
	}
	return due.Reason, nil
}
