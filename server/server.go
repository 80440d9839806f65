// Package server is Relay's HTTP API: enqueueing jobs one at a time or in
// batches, reading, listing, cancelling and retrying them, per-queue
// statistics, and health probes for a load balancer or orchestrator.
//
//	POST /v1/jobs              enqueue one job: 201 (200 for an idempotent replay)
//	POST /v1/jobs/batch        enqueue up to 1000 jobs, all or none: 201 {"ids": [...]}
//	GET  /v1/jobs              list job summaries: ?queue=&state=&kind=&limit=&after=
//	GET  /v1/jobs/{id}         one job, with payload, result and error history (never its lease token)
//	POST /v1/jobs/{id}/cancel  cancel an available job, or ask a running one to stop
//	POST /v1/jobs/{id}/retry   make a dead or cancelled job available again
//	GET  /v1/queues            per queue: jobs available and running, age of the oldest ready job
//	GET  /healthz              200 while the process serves
//	GET  /readyz               200 when the database answers and is migrated, else 503
//
// A job to enqueue is a JSON object with "kind" (required), "queue",
// "payload", "priority", "max_attempts", and either "run_at" (RFC 3339) or
// "delay" (a Go duration string such as "5s" or "1h30m"); see jobRequest.
// POST /v1/jobs takes an optional Idempotency-Key header. Listing pages are
// DefaultListLimit jobs unless limit says otherwise; a limit above
// MaxListLimit is a 400. A listing shows each job's JobSummary, which
// leaves out the payload, the result and the error history. When Config.APIToken is set, every /v1 route needs
// "Authorization: Bearer <token>", in one Authorization header.
//
// Every response body the server writes is JSON, with
// X-Content-Type-Options: nosniff and Cache-Control: no-store (net/http
// itself answers a request it cannot parse, such as one with a malformed
// header or headers over its limit, in plain text, before any handler). A
// listing refuses a parameter it does not know, and every other /v1 route
// any query string at all. Errors have the shape
//
//	{"error": "a message for people", "field": "the offending input, when there is one"}
//
// and never carry SQL, SQLSTATE codes or stack traces: the real cause is
// logged. Rejected requests (4xx) write nothing to the database.
package server

import (
	"context"
	"log/slog"
	"net/http"
	"reflect"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
)

// DefaultMaxBodyBytes is the request body limit when Config.MaxBodyBytes is
// not set.
const DefaultMaxBodyBytes = 1 << 20

// Limits of the API beyond those of enqueueing, which package client holds.
const (
	// DefaultListLimit is the page size of a job listing without a limit.
	DefaultListLimit = 100
	// MaxListLimit is the largest page size of a job listing; a larger
	// limit is rejected with 400 rather than silently reduced.
	MaxListLimit = 1000
)

// dbTimeout bounds the database work of one request, so that a database
// that hangs turns into a 503 well before the server's WriteTimeout.
const dbTimeout = 10 * time.Second

// Config configures the API. The zero value is usable: no authentication
// and a body limit of DefaultMaxBodyBytes.
type Config struct {
	// APIToken, when not empty, is the bearer token every /v1 request must
	// present in its Authorization header. The health routes stay open.
	// It must be one a request can present (PresentableToken): NewServer
	// panics otherwise.
	APIToken string
	// MaxBodyBytes limits the size of a request body; larger bodies get
	// 413. Zero or less means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// AnnounceEvery spaces the notifications that tell workers of jobs
	// posted one per request, whatever their queues: a job whose
	// statement begins sooner than AnnounceEvery after the latest
	// notifying statement began is announced, with the others stored
	// meanwhile, AnnounceEvery after that (client.EnqueuerConfig). Zero
	// means client.DefaultAnnounceEvery; less than zero announces each
	// statement's jobs at its commit.
	AnnounceEvery time.Duration
}

func (c Config) maxBodyBytes() int64 {
	if c.MaxBodyBytes <= 0 {
		return DefaultMaxBodyBytes
	}
	return c.MaxBodyBytes
}

// Handler is the HTTP handler of the whole API. Close it once the
// http.Server that serves it has shut down, before closing its pool.
type Handler struct {
	http.Handler
	enqueuer *client.Enqueuer
}

// PresentableToken reports whether a request can present token as its
// bearer token: HTTP trims the white space around a header's value, as the
// API trims the token it is given, and refuses the control characters but
// a tab in it. A token that fails, as one read from a file ending in a
// newline, would have every request refused with a 401.
func PresentableToken(token string) bool {
	if strings.TrimSpace(token) != token {
		return false
	}
	for _, c := range []byte(token) {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// NewServer returns the HTTP handler of the whole API, on its own mux, with
// request logging and panic recovery around it. A nil logger discards logs.
// Close the handler once the http.Server serving it has shut down. It
// panics if pool is nil, or if cfg.APIToken is not a token a request can
// present (PresentableToken), with which it would answer every /v1
// request 401.
func NewServer(logger *slog.Logger, pool *pgxpool.Pool, cfg Config) *Handler {
	if pool == nil {
		panic("server.NewServer: nil pool")
	}
	if !PresentableToken(cfg.APIToken) {
		// Named without the token, which is a secret.
		panic("server.NewServer: Config.APIToken begins or ends with white space, or holds a control character: " +
			"no request can present it in its Authorization header")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	e := client.NewEnqueuer(pool, client.EnqueuerConfig{
		AnnounceEvery: cfg.AnnounceEvery,
		StoreTimeout:  dbTimeout,
		Logger:        logger,
	})
	mux := http.NewServeMux()
	addRoutes(mux, logger, pool, cfg, e)
	var h http.Handler = jsonMuxErrors(mux)
	h = recoverPanics(logger)(h)
	h = logRequests(logger)(h)
	return &Handler{Handler: h, enqueuer: e}
}

// Close sends at once the notifications still owed for jobs the API
// stored (see Config.AnnounceEvery), so that their workers need not wait
// for their next poll, announces each group stored after it at its
// commit, and waits for the jobs of requests still being stored, as after
// a Shutdown that ran out of time, to be stored and announced
// (client.Enqueuer.Close). It returns then, or once ctx has ended, or 10
// s have passed. The jobs of a statement still running then are announced
// once it commits, if the pool is still open; otherwise their workers
// find them at their next poll.
func (h *Handler) Close(ctx context.Context) {
	h.enqueuer.Close(ctx)
}

// readTimeout bounds reading a whole request, its body included.
const readTimeout = 30 * time.Second

// NewHTTPServer returns an http.Server for h on addr with timeouts and a
// header size limit set, so that slow or oversized clients cannot hold
// connections or memory indefinitely. Its WriteTimeout, which counts from
// the end of a request's headers, leaves room for a body read up to its
// ReadTimeout, the per-request database timeout after it, and the answer:
// a job stored after a slow upload is not left without its 201. It panics
// if h is nil, or a nil pointer or function, with which the server would
// serve http.DefaultServeMux or panic at each request.
func NewHTTPServer(addr string, h http.Handler) *http.Server {
	if isNil(h) {
		panic("server.NewHTTPServer: nil handler")
	}
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       readTimeout,
		WriteTimeout:      readTimeout + dbTimeout + 20*time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
}

// isNil reports whether h is nil, or holds a nil pointer, function or map.
func isNil(h http.Handler) bool {
	if h == nil {
		return true
	}
	switch v := reflect.ValueOf(h); v.Kind() {
	case reflect.Pointer, reflect.Func, reflect.Map:
		return v.IsNil()
	}
	return false
}
