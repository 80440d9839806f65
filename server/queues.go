package server

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/relayq/relay/db"
)

// queueCounts are the jobs of a queue that are waiting or running.
// Finished jobs are not counted: that would cost as much as the history
// kept (see JobQueueStats); GET /v1/jobs?queue=&state= pages through them.
type queueCounts struct {
	Available int64 `json:"available"`
	Running   int64 `json:"running"`
}

type queueStats struct {
	Queue  string      `json:"queue"`
	Counts queueCounts `json:"counts"`
	// OldestReadyAgeSeconds is how long the oldest job that is ready to run
	// has waited for a worker, by the database clock, counted from its
	// run_at: from its enqueue, unless it was given a run_at or a delay, or
	// was retried; 0 when none waits.
	OldestReadyAgeSeconds float64 `json:"oldest_ready_age_seconds"`
}

type queuesResponse struct {
	Queues []queueStats `json:"queues"`
}

// handleListQueues serves GET /v1/queues: for every queue that holds jobs,
// how many are available and running, and the age of its oldest ready
// job, at a cost that does not grow with the history of finished jobs.
func handleListQueues(logger *slog.Logger, queries *db.Queries) http.Handler {
	return handleErrors(logger, func(w http.ResponseWriter, r *http.Request) error {
		ctx, cancel := dbContext(r)
		defer cancel()
		rows, err := queries.JobQueueStats(ctx)
		if err != nil {
			return fmt.Errorf("queue stats: %w", err)
		}
		resp := queuesResponse{Queues: make([]queueStats, 0, len(rows))}
		for _, row := range rows {
			resp.Queues = append(resp.Queues, queueStats{
				Queue: row.Queue,
				Counts: queueCounts{
					Available: row.Available,
					Running:   row.Running,
				},
				OldestReadyAgeSeconds: row.OldestReadyAgeSeconds,
			})
		}
		writeJSON(w, http.StatusOK, resp)
		return nil
	})
}
