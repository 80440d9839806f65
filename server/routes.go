package server

import (
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
)

// addRoutes maps the whole API surface. Every /v1 route requires the bearer
// token when Config.APIToken is set; the health routes never do. Unknown
// paths get a JSON 404 and known paths with the wrong method a JSON 405
// (see jsonMuxErrors).
func addRoutes(mux *http.ServeMux, logger *slog.Logger, pool *pgxpool.Pool, cfg Config, e *client.Enqueuer) {
	queries := db.New(pool)
	auth := requireBearer(cfg.APIToken)
	maxBody := cfg.maxBodyBytes()

	mux.Handle("GET /healthz", handleHealthz())
	mux.Handle("GET /readyz", handleReadyz(logger, pool))

	mux.Handle("POST /v1/jobs", auth(handleEnqueue(logger, pool, e, maxBody)))
	mux.Handle("POST "+batchPath, auth(handleEnqueueBatch(logger, pool, maxBody)))
	mux.Handle("GET /v1/jobs", auth(handleListJobs(logger, queries)))
	mux.Handle("GET /v1/jobs/{id}", auth(handleGetJob(logger, queries)))
	mux.Handle("POST /v1/jobs/{id}/cancel", auth(handleCancelJob(logger, queries)))
	mux.Handle("POST /v1/jobs/{id}/retry", auth(handleRetryJob(logger, queries)))
	mux.Handle("GET /v1/queues", auth(handleListQueues(logger, queries)))
}
