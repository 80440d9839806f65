package harness

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/enqueue"
)

// Job returns one job to insert on queue, of kind, with payload and
// maxAttempts, at priority 0, ready at once.
func Job(queue, kind string, payload json.RawMessage, maxAttempts int32) enqueue.Job {
	return enqueue.Job{Queue: queue, Kind: kind, Payload: payload, MaxAttempts: maxAttempts}
}

// InsertJobs inserts n copies of job through enqueue.InsertMany, as many
// batches as its limit takes.
func InsertJobs(ctx context.Context, dbtx db.DBTX, job enqueue.Job, n int) error {
	for done := 0; done < n; {
		batch := make([]enqueue.Job, min(n-done, enqueue.MaxBatchJobs))
		for i := range batch {
			batch[i] = job
		}
		if _, err := enqueue.InsertMany(ctx, dbtx, batch); err != nil {
			return fmt.Errorf("insert %d jobs: %w", n, err)
		}
		done += len(batch)
	}
	return nil
}
