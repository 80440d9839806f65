package client

import (
	"context"
	"fmt"
	"time"

	"github.com/relayq/relay/db"
)

// Announce tells the workers of each queue of due, which maps a queue to
// the earliest run_at of jobs stored there without a notification
// (InsertAllUnannounced), that jobs became available there: those of the
// queues whose earliest job is due by the database's clock, in one
// statement (JobAnnounceMany). A zero run_at is due now. Call it once the
// jobs have committed.
func Announce(ctx context.Context, dbtx db.DBTX, due map[string]time.Time) error {
	return dueQueues(due).announce(ctx, dbtx)
}

// dueQueues holds, for each queue jobs were stored on, the earliest
// run_at of those jobs there: the zero time for one due at once. The zero
// value holds none.
type dueQueues map[string]time.Time

// add records a job due at runAt stored on queue.
func (d *dueQueues) add(queue string, runAt time.Time) {
	if *d == nil {
		*d = dueQueues{}
	}
	if earliest, ok := (*d)[queue]; !ok || runAt.Before(earliest) {
		(*d)[queue] = runAt
	}
}

// announce tells the listeners of each queue of d whose earliest job is
// due by now that jobs became available there (JobAnnounceMany), in one
// statement, or does nothing if d holds no queue.
func (d dueQueues) announce(ctx context.Context, dbtx db.DBTX) error {
	if len(d) == 0 {
		return nil
	}
	params := db.JobAnnounceManyParams{
		Queues: make([]string, 0, len(d)),
		RunAts: make([]time.Time, 0, len(d)),
	}
	for queue, runAt := range d {
		params.Queues = append(params.Queues, queue)
		params.RunAts = append(params.RunAts, runAt)
	}
	if err := db.New(dbtx).JobAnnounceMany(ctx, params); err != nil {
		return fmt.Errorf("announce jobs on %d queues: %w", len(d), err)
	}
	return nil
}
