package worker

import (
	"context"
	"time"

	"github.com/relayq/relay/db"
)

// pruner deletes the finished jobs whose retention has passed: the
// workers' share of keeping the jobs table the size of the work at hand
// and a few days of history, not of every job ever run.
type pruner struct {
	w *Worker
}

// maxPruneBatches is how many prune statements a worker runs in a row,
// each of DefaultPruneBatch jobs per state, in one round: a worker
// catching up on a long history deletes at most this many batches at a
// time, each a transaction of its own, and leaves the rest to its next
// round and to the other workers.
const maxPruneBatches = 10

// run prunes every PruneInterval, after saying once whether the server
// runs autovacuum, on which the space of the pruned jobs depends. A
// worker that keeps every state forever prunes nothing. A round whose
// last batch came back full leaves more to delete: the next follows after
// a pause as long as that round took, not after PruneInterval, so that a
// worker whose jobs finish faster than maxPruneBatches batches per
// interval still keeps up, while spending at most about half its time
// pruning.
func (p pruner) run(ctx context.Context) {
	w := p.w
	p.warnWithoutAutovacuum(ctx)
	params, some := pruneParams(w.cfg)
	if !some {
		return
	}
	wait := w.cfg.PruneInterval
	window := newPruneWindow()
	for round := 0; ; round++ {
		select {
		case <-ctx.Done():
			return
		case <-time.After(jitter(wait)):
		}
		if round%fullPruneEvery == 0 {
			window.forget()
		}
		began := time.Now()
		total, more := p.round(ctx, params, window)
		if total != (db.JobPruneRow{}) {
			w.log.Info("pruned finished jobs", "succeeded", total.Succeeded,
				"dead", total.Dead, "cancelled", total.Cancelled)
		}
		wait = w.cfg.PruneInterval
		if more {
			wait = min(wait, max(time.Since(began), minRetryDelay))
		}
	}
}

// round runs up to maxPruneBatches prune statements while each comes back
// full, each over the finished jobs window gives, and returns how many
// jobs of each state they deleted, and whether the last came back full,
// leaving more to delete.
func (p pruner) round(ctx context.Context, params db.JobPruneParams, window *sinceLastComplete) (total db.JobPruneRow, more bool) {
	for range maxPruneBatches {
		params.ExpiredSince = window.since()
		n, err := p.prune(ctx, params)
		window.record(n.PrunedAt, err == nil && max(n.Succeeded, n.Dead, n.Cancelled) < DefaultPruneBatch)
		if err != nil {
			return total, false
		}
		total.Succeeded += n.Succeeded
		total.Dead += n.Dead
		total.Cancelled += n.Cancelled
		if max(n.Succeeded, n.Dead, n.Cancelled) < DefaultPruneBatch {
			return total, false
		}
	}
	return total, true
}

// fullPruneEvery is how many prune rounds pass between two whose first
// statement reads every finished job past its retention, from the oldest,
// rather than a window of them (see newPruneWindow).
const fullPruneEvery = 30

// pruneWindowMargin is how far a prune's window of finished jobs reaches
// back beyond the last prune that found every older job gone: a job that
// a transaction finished before that prune ran, committing only after it
// began, was not there to be found.
const pruneWindowMargin = time.Second

// newPruneWindow returns the window of finished jobs, by when their
// retention passed, in which a prune looks for jobs to delete. Once a
// prune came back with less than a full batch of every state, every job
// whose retention had passed when it ran was deleted, or held by another
// transaction, another pruner's as a rule, which deletes it; the next
// needs only those whose retention passed since. Otherwise (at start,
// after a failure, after a full batch, and every fullPruneEvery rounds,
// which also finds a job skipped that the transaction holding it did not
// delete after all) it reads them all, from the oldest. Each worker keeps
// its own.
func newPruneWindow() *sinceLastComplete {
	return &sinceLastComplete{margin: pruneWindowMargin}
}

// prune runs one JobPrune, for a Lease at most. A failure is logged,
// one that ran out of that time too, unless the worker is stopping.
func (p pruner) prune(ctx context.Context, params db.JobPruneParams) (db.JobPruneRow, error) {
	w := p.w
	pctx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	n, err := w.q.JobPrune(pctx, params)
	if err != nil && ctx.Err() == nil {
		w.log.Warn("prune finished jobs failed", "err", err)
	}
	return n, err
}

// warnWithoutAutovacuum logs a warning when autovacuum will not vacuum
// the jobs table, and why: pruning deletes rows, and only a vacuum makes
// their space, and that of the row versions every transition leaves,
// usable again.
func (p pruner) warnWithoutAutovacuum(ctx context.Context) {
	w := p.w
	actx, cancel := context.WithTimeout(ctx, w.cfg.Lease)
	defer cancel()
	why, err := w.q.JobsAutovacuumOff(actx)
	switch {
	case err != nil:
		if ctx.Err() == nil {
			w.log.Warn("read whether autovacuum vacuums the jobs table failed", "err", err)
		}
	case why != "":
		w.log.Warn(why + ": the space of finished jobs the workers prune, " +
			"and of the row versions every transition leaves, is not reused until VACUUM runs; " +
			"turn autovacuum on, or run VACUUM jobs regularly")
	}
}

// pruneParams turns the retentions of cfg into JobPrune's, a null
// retention keeping a state forever, and reports whether any state is
// pruned at all. JobPrune counts whole milliseconds: a retention that is
// not one is rounded up, so that no job is deleted before it has passed.
func pruneParams(cfg Config) (db.JobPruneParams, bool) {
	ms := func(d time.Duration) *int64 {
		if d < 0 {
			return nil
		}
		v := d.Milliseconds()
		if d%time.Millisecond != 0 {
			v++
		}
		return &v
	}
	params := db.JobPruneParams{
		RetainSucceededMs: ms(cfg.RetainSucceeded),
		RetainDeadMs:      ms(cfg.RetainDead),
		RetainCancelledMs: ms(cfg.RetainCancelled),
		MaxJobs:           DefaultPruneBatch,
	}
	some := params.RetainSucceededMs != nil || params.RetainDeadMs != nil || params.RetainCancelledMs != nil
	return params, some
}

// retention says how long a retention keeps jobs, for the logs.
func retention(d time.Duration) string {
	if d < 0 {
		return "forever"
	}
	return d.String()
}
