package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/migrations"
)

// readyTimeout bounds a readiness check, which a prober calls often.
const readyTimeout = 3 * time.Second

type statusBody struct {
	Status string `json:"status"`
}

// handleHealthz serves GET /healthz: 200 while the process can serve HTTP.
// It does not touch the database, so that a database outage does not get
// every instance restarted.
func handleHealthz() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, statusBody{Status: "ok"})
	})
}

// handleReadyz serves GET /readyz: 200 when the database answers and its
// schema is current, else 503, so that traffic goes elsewhere meanwhile.
func handleReadyz(logger *slog.Logger, pool *pgxpool.Pool) http.Handler {
	return handleErrors(logger, func(w http.ResponseWriter, r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
		defer cancel()
		if err := checkReady(ctx, pool); errors.Is(err, migrations.ErrNotMigrated) {
			return &apiError{status: http.StatusServiceUnavailable, msg: "database migrations are pending", cause: err}
		} else if err != nil {
			return &apiError{status: http.StatusServiceUnavailable, msg: errUnavailable.Error(), cause: err}
		}
		writeJSON(w, http.StatusOK, statusBody{Status: "ready"})
		return nil
	})
}

func checkReady(ctx context.Context, pool *pgxpool.Pool) error {
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("ping database: %w", err)
	}
	if err := migrations.CheckCurrent(ctx, pool); err != nil {
		return fmt.Errorf("ready check: %w", err)
	}
	return nil
}
