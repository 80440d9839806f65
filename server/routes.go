package server

import (
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
)

// addRoutes maps the whole API surface. Every /v1 route requires the bearer
// token when Config.APIToken is set; the health routes never do. Every /v1
// route but the listing refuses a query string (see refuseQuery). Unknown
// paths get a JSON 404 and known paths with the wrong method a JSON 405
// (see jsonMuxErrors).
func addRoutes(mux *http.ServeMux, logger *slog.Logger, pool *pgxpool.Pool, cfg Config, e *client.Enqueuer) {
	queries := db.New(pool)
	auth := requireBearer(cfg.APIToken)
	maxBody := cfg.maxBodyBytes()
	// Only the listing takes parameters; the routes with a body take the
	// job's fields in it.
	noQuery := refuseQuery("")
	noQueryForEnqueue := refuseQuery("the job's fields go in the JSON body")

	mux.Handle("GET /healthz", handleHealthz())
	mux.Handle("GET /readyz", handleReadyz(logger, pool))

	mux.Handle("POST /v1/jobs", auth(noQueryForEnqueue(handleEnqueue(logger, pool, e, maxBody))))
	mux.Handle("POST "+batchPath, auth(noQueryForEnqueue(handleEnqueueBatch(logger, pool, maxBody))))
	mux.Handle("GET /v1/jobs", auth(handleListJobs(logger, queries)))
	mux.Handle("GET /v1/jobs/{id}", auth(noQuery(handleGetJob(logger, queries))))
	mux.Handle("POST /v1/jobs/{id}/cancel", auth(noQuery(handleCancelJob(logger, pool))))
	mux.Handle("POST /v1/jobs/{id}/retry", auth(noQuery(handleRetryJob(logger, pool))))
	mux.Handle("GET /v1/queues", auth(noQuery(handleListQueues(logger, queries))))
}
