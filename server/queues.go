package server

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/relayq/relay/db"
)

type queueCounts struct {
	Available int64 `json:"available"`
	Running   int64 `json:"running"`
	Succeeded int64 `json:"succeeded"`
	Dead      int64 `json:"dead"`
	Cancelled int64 `json:"cancelled"`
}

type queueStats struct {
	Queue  string      `json:"queue"`
	Counts queueCounts `json:"counts"`
	// OldestReadyAgeSeconds is how long the oldest job that is ready to run
	// has waited for a worker, by the database clock; 0 when none waits.
	OldestReadyAgeSeconds float64 `json:"oldest_ready_age_seconds"`
}

type queuesResponse struct {
	Queues []queueStats `json:"queues"`
}

// handleListQueues serves GET /v1/queues: for every queue that holds jobs,
// its job counts by state and the age of its oldest ready job.
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
					Succeeded: row.Succeeded,
					Dead:      row.Dead,
					Cancelled: row.Cancelled,
				},
				OldestReadyAgeSeconds: row.OldestReadyAgeSeconds,
			})
		}
		writeJSON(w, http.StatusOK, resp)
		return nil
	})
}
