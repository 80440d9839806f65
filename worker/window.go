package worker

import "time"

// sinceLastComplete is the window of a maintenance statement, a reclaim or
// a prune, that need read only what came due since its last complete run:
// it keeps when that run ran, by the database's clock, as the statement
// returned it, so that neither the worker's clock nor the time either
// statement took to reach the database moves the window. Until a run is
// complete, and whenever a full pass is due, it reads everything.
type sinceLastComplete struct {
	// margin is how far the window reaches back beyond the last complete
	// run: what a transaction changed before that run, committing only
	// after it began, was not there to be found.
	margin time.Duration
	// ran is when the last complete run ran; zero: none since the last
	// full pass was due.
	ran time.Time
}

// since returns the time, by the database's clock, from which the next
// run reads, or nil for a full pass.
func (w *sinceLastComplete) since() *time.Time {
	if w.ran.IsZero() {
		return nil
	}
	since := w.ran.Add(-w.margin)
	return &since
}

// record notes a run that ran at ran, by the database's clock: complete
// if it succeeded and found everything due taken care of.
func (w *sinceLastComplete) record(ran time.Time, complete bool) {
	if !complete {
		w.forget()
		return
	}
	w.ran = ran
}

// forget makes the next run a full pass.
func (w *sinceLastComplete) forget() { w.ran = time.Time{} }
