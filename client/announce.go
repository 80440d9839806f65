package client

import (
	"context"
	"fmt"
	"time"

	"github.com/relayq/relay/db"
)

// dueQueues holds, for each queue jobs were stored on, the earliest
// run_at of those jobs there: the zero time for one due at once. The zero
// value holds none. What stores jobs to be announced after their commit
// (Insert, InsertMany, a Tx, an Enqueuer) gathers their queues in one,
// and announces them once the jobs have committed.
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

// announce tells the workers of each queue of d whose earliest job is due
// by the database's clock that jobs became available there
// (JobAnnounceMany), in one statement, or does nothing if d holds no
// queue. Call it once the jobs have committed.
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
