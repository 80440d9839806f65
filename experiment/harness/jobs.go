package harness

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
)

// Job returns one job to insert on queue, of kind, with payload and
// maxAttempts, at priority 0, ready at once.
func Job(queue, kind string, payload json.RawMessage, maxAttempts int32) client.Job {
	return client.Job{Queue: queue, Kind: kind, Payload: payload, MaxAttempts: maxAttempts}
}

// InsertJobs inserts n copies of job through client.InsertMany, as many
// batches as its limit takes.
func InsertJobs(ctx context.Context, dbtx db.DBTX, job client.Job, n int) error {
	for done := 0; done < n; {
		batch := make([]client.Job, min(n-done, client.MaxBatchJobs))
		for i := range batch {
			batch[i] = job
		}
		if _, err := client.InsertMany(ctx, dbtx, batch); err != nil {
			return fmt.Errorf("insert %d jobs: %w", n, err)
		}
		done += len(batch)
	}
	return nil
}
