package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/migrations"
)

// testEnv is what most tests need: the API handler, the database behind it,
// and the log it writes.
type testEnv struct {
	h    http.Handler
	pool *pgxpool.Pool
	q    *db.Queries
	logs *syncBuffer
}

// setup returns the API on a fresh migrated database, with cfg if given.
func setup(t testing.TB, cfg ...Config) *testEnv {
	t.Helper()
	pool := dbtest.New(t)
	return setupWithPool(t, pool, cfg...)
}

func setupWithPool(t testing.TB, pool *pgxpool.Pool, cfg ...Config) *testEnv {
	t.Helper()
	var c Config
	if len(cfg) > 0 {
		c = cfg[0]
	}
	logs := &syncBuffer{}
	logger := slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("server log:\n%s", logs.String())
		}
	})
	return &testEnv{h: NewServer(logger, pool, c), pool: pool, q: db.New(pool), logs: logs}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// do sends a request to the handler. headers are name, value pairs.
func (e *testEnv) do(t testing.TB, method, path, body string, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	return serve(t, e.h, method, path, body, headers...)
}

func serve(t testing.TB, h http.Handler, method, path, body string, headers ...string) *httptest.ResponseRecorder {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// decode decodes the JSON body of rec into a T, failing the test if it is
// not JSON.
func decode[T any](t testing.TB, rec *httptest.ResponseRecorder) T {
	t.Helper()
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type = %q, want application/json; body: %s", ct, rec.Body)
	}
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("response body is not JSON: %v: %s", err, rec.Body)
	}
	return v
}

// wantStatus fails the test unless rec has the status.
func wantStatus(t testing.TB, rec *httptest.ResponseRecorder, status int) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body: %s", rec.Code, status, rec.Body)
	}
}

// wantError checks that rec is a JSON error with the status and field, and
// that it gives away nothing of the database.
func wantError(t testing.TB, rec *httptest.ResponseRecorder, status int, field string) errorBody {
	t.Helper()
	wantStatus(t, rec, status)
	got := decode[errorBody](t, rec)
	if got.Error == "" {
		t.Errorf("error message is empty: %s", rec.Body)
	}
	if got.Field != field {
		t.Errorf("field = %q, want %q (error %q)", got.Field, field, got.Error)
	}
	wantNoLeak(t, rec.Body.String())
	return got
}

// wantNoLeak fails if body looks like it carries database internals.
func wantNoLeak(t testing.TB, body string) {
	t.Helper()
	for _, s := range []string{"SQLSTATE", "ERROR:", "violates", "constraint", "relation", "pgx", "pgconn", "goroutine", "dial", "127.0.0.1", "lease_token"} {
		if strings.Contains(body, s) {
			t.Errorf("response body contains %q: %s", s, body)
		}
	}
}

// enqueue creates a job through the API and returns it.
func (e *testEnv) enqueue(t testing.TB, body string) JobView {
	t.Helper()
	rec := e.do(t, "POST", "/v1/jobs", body)
	wantStatus(t, rec, http.StatusCreated)
	return decode[JobView](t, rec)
}

// leaseTokens draws n fresh lease tokens, for a claim of n jobs.
func leaseTokens(n int) []pgtype.UUID {
	tokens := make([]pgtype.UUID, n)
	for i := range tokens {
		tokens[i] = newToken()
	}
	return tokens
}

// claim makes every ready job of queue running, as a worker would, and
// returns their lease tokens by id.
func (e *testEnv) claim(t testing.TB, queue string) map[int64]pgtype.UUID {
	t.Helper()
	return e.claimFor(t, queue, time.Minute)
}

// claimFor claims as claim does, under leases of the given length.
func (e *testEnv) claimFor(t testing.TB, queue string, lease time.Duration) map[int64]pgtype.UUID {
	t.Helper()
	return claimWith(t, e.q, queue, lease)
}

// claimWith claims through q as claimFor does.
func claimWith(t testing.TB, q *db.Queries, queue string, lease time.Duration) map[int64]pgtype.UUID {
	t.Helper()
	rows, err := q.JobCompleteAndClaim(context.Background(), db.JobCompleteAndClaimParams{
		CompleteIDs:     []int64{},
		CompleteTokens:  []pgtype.UUID{},
		CompleteResults: [][]byte{},
		Queue:           queue,
		ClaimTokens:     leaseTokens(1000),
		LeaseMs:         lease.Milliseconds(),
		WorkerID:        "test-worker",
	})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	out := map[int64]pgtype.UUID{}
	for _, r := range rows {
		if r.ID != nil {
			out[*r.ID] = r.LeaseToken
		}
	}
	return out
}

// claimOne claims the job with id, which must be the only ready job of its
// queue, under a lease of the given length, and returns its lease token.
func (e *testEnv) claimOne(t testing.TB, id int64, lease time.Duration) pgtype.UUID {
	t.Helper()
	job, err := e.q.JobGet(context.Background(), id)
	if err != nil {
		t.Fatalf("get job %d: %v", id, err)
	}
	tokens := e.claimFor(t, job.Queue, lease)
	token, ok := tokens[id]
	if !ok || len(tokens) != 1 {
		t.Fatalf("job %d was not claimed alone (claimed %v)", id, tokens)
	}
	return token
}

// kill claims the job with id (which must be the only ready job of its
// queue) and fails it permanently, leaving it dead.
func (e *testEnv) kill(t testing.TB, queue string, id int64) {
	t.Helper()
	tokens := e.claim(t, queue)
	token, ok := tokens[id]
	if !ok {
		t.Fatalf("job %d was not claimed (claimed %v)", id, tokens)
	}
	failLeased(t, e.q, id, token, true)
}

// failLeased fails the running job id through q, under the lease token,
// as its worker would: for good, or with attempts left, to run again at
// once. It ends dead, or available.
func failLeased(t testing.TB, q *db.Queries, id int64, token pgtype.UUID, permanent bool) {
	t.Helper()
	want := db.JobStateAvailable
	if permanent {
		want = db.JobStateDead
	}
	rows, err := q.JobFailMany(context.Background(), db.JobFailManyParams{
		IDs: []int64{id}, Tokens: []pgtype.UUID{token}, Errors: []string{"boom"},
		Permanent: []bool{permanent}, RetryInMs: []int64{0},
	})
	if err != nil || len(rows) != 1 || rows[0].State != want {
		t.Fatalf("fail job %d: %v %+v, want it %s", id, err, rows, want)
	}
}

func TestNewHTTPServer_SetsTimeoutsAndHeaderLimit(t *testing.T) {
	t.Parallel()
	h := http.NotFoundHandler()
	srv := NewHTTPServer(":8080", h)
	if srv.Addr != ":8080" || srv.Handler == nil {
		t.Errorf("Addr/Handler not set: %q %v", srv.Addr, srv.Handler)
	}
	for name, d := range map[string]time.Duration{
		"ReadHeaderTimeout": srv.ReadHeaderTimeout,
		"ReadTimeout":       srv.ReadTimeout,
		"WriteTimeout":      srv.WriteTimeout,
		"IdleTimeout":       srv.IdleTimeout,
	} {
		if d <= 0 {
			t.Errorf("%s is not set", name)
		}
	}
	// WriteTimeout counts from the end of a request's headers: an answer
	// must still go out after a body read for up to ReadTimeout and the
	// database work that follows it, or a job is stored and its 201 lost.
	if srv.WriteTimeout <= srv.ReadTimeout+dbTimeout {
		t.Errorf("WriteTimeout %v leaves no room for a body read up to ReadTimeout %v and the database timeout %v after it",
			srv.WriteTimeout, srv.ReadTimeout, dbTimeout)
	}
	if srv.MaxHeaderBytes <= 0 {
		t.Error("MaxHeaderBytes is not set")
	}
}

// A nil handler, or a nil *Handler, would have the http.Server serve
// http.DefaultServeMux, whatever the program registered there, or panic
// at each request: NewHTTPServer refuses it at once.
func TestNewHTTPServer_RefusesANilHandler(t *testing.T) {
	t.Parallel()
	for name, h := range map[string]http.Handler{
		"nil":             nil,
		"nil *Handler":    (*Handler)(nil),
		"nil HandlerFunc": http.HandlerFunc(nil),
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "nil handler") {
					t.Errorf("NewHTTPServer: recovered %v, want a panic for a nil handler", r)
				}
			}()
			srv := NewHTTPServer(":8080", h)
			t.Errorf("NewHTTPServer returned a server whose Handler is %#v", srv.Handler)
		})
	}
}

// A few requests are answered by net/http before any of the API's code
// runs, not in JSON: what the README lists, each on a connection of its
// own to the server NewHTTPServer makes, which the server then closes.
func TestNewHTTPServer_AnswersWhatNetHTTPRefusesBeforeTheAPI(t *testing.T) {
	t.Parallel()
	e := setup(t)
	srv := NewHTTPServer("127.0.0.1:0", e.h)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })

	headers := func(n int) string { return "X-Big: " + strings.Repeat("a", n) + "\r\n" }
	tests := []struct {
		name, request string
		status        int
		body          string // the start of the body
	}{
		{"not HTTP", "hello\r\n\r\n", http.StatusBadRequest, "400 Bad Request"},
		{"a control character in a header", "GET /healthz HTTP/1.1\r\nHost: x\r\nX: a\x01b\r\n\r\n", http.StatusBadRequest, "400 Bad Request"},
		{"no Host", "GET /healthz HTTP/1.1\r\n\r\n", http.StatusBadRequest, "400 Bad Request: missing required Host header"},
		{"headers beyond 68 KiB", "GET /healthz HTTP/1.1\r\nHost: x\r\n" + headers(70<<10) + "\r\n",
			http.StatusRequestHeaderFieldsTooLarge, "431 Request Header Fields Too Large"},
		{"an Expect other than 100-continue", "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nExpect: later\r\nContent-Length: 2\r\n\r\n{}",
			http.StatusExpectationFailed, ""},
		{"a Transfer-Encoding other than chunked", "POST /v1/jobs HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
			http.StatusNotImplemented, "Unsupported transfer encoding"},
		{"HTTP/2 in cleartext", "GET /healthz HTTP/2.0\r\nHost: x\r\n\r\n", http.StatusHTTPVersionNotSupported, "505 HTTP Version Not Supported"},
		{"HTTP/1.0, which is served", "GET /healthz HTTP/1.0\r\n\r\n", http.StatusOK, `{"status":"ok"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(conn, tt.request); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("read the answer: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || !strings.HasPrefix(string(body), tt.body) {
				t.Errorf("answer %d %q, want %d %q...", resp.StatusCode, body, tt.status, tt.body)
			}
			if tt.status != http.StatusOK && bytes.HasPrefix(body, []byte("{")) {
				t.Errorf("answer %d %q is JSON: it came from the API, not from net/http", resp.StatusCode, body)
			}
		})
	}
}

func TestRoutes_UnknownRouteIs404JSON(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, path := range []string{"/", "/nope", "/v1", "/v1/", "/v1/jobs/", "/v1/jobs/1/nope", "/v2/jobs"} {
		t.Run(path, func(t *testing.T) {
			wantError(t, e.do(t, "GET", path, ""), http.StatusNotFound, "")
		})
	}
}

func TestRoutes_WrongMethodIs405JSONWithAllow(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tests := []struct {
		method, path, allow string
	}{
		{"DELETE", "/v1/jobs/1", "GET, HEAD"},
		{"PUT", "/v1/jobs", "GET, HEAD, POST"},
		{"GET", "/v1/jobs/1/cancel", "POST"},
		{"GET", "/v1/jobs/1/retry", "POST"},
		{"POST", "/v1/queues", "GET, HEAD"},
		{"POST", "/healthz", "GET, HEAD"},
		{"DELETE", "/readyz", "GET, HEAD"},
		{"GET", "/v1/jobs/batch", "POST"},
		{"HEAD", "/v1/jobs/batch", "POST"},
		{"DELETE", "/v1/jobs/batch", "POST"},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			rec := e.do(t, tt.method, tt.path, "")
			wantError(t, rec, http.StatusMethodNotAllowed, "")
			if got := rec.Header().Get("Allow"); got != tt.allow {
				t.Errorf("Allow = %q, want %q", got, tt.allow)
			}
		})
	}
}

func TestRoutes_PathNotInCanonicalFormIsRedirectedWithJSON(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := e.do(t, "GET", "/v1//jobs/1", "")
	if rec.Code < 300 || rec.Code > 399 || rec.Header().Get("Location") != "/v1/jobs/1" {
		t.Fatalf("status %d Location %q, want a redirect to /v1/jobs/1", rec.Code, rec.Header().Get("Location"))
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json: %s", ct, rec.Body)
	}
	if got := decode[errorBody](t, rec); got.Error == "" {
		t.Errorf("body %s, want a JSON message", rec.Body)
	}
}

func TestHealthz_IsOKWithoutDatabase(t *testing.T) {
	t.Parallel()
	e := setupWithPool(t, unreachablePool(t))
	rec := e.do(t, "GET", "/healthz", "")
	wantStatus(t, rec, http.StatusOK)
	if diff := cmp.Diff(statusBody{Status: "ok"}, decode[statusBody](t, rec)); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
}

func TestReadyz_IsOKWhenDatabaseIsMigrated(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := e.do(t, "GET", "/readyz", "")
	wantStatus(t, rec, http.StatusOK)
	if diff := cmp.Diff(statusBody{Status: "ready"}, decode[statusBody](t, rec)); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
}

func TestReadyz_Is503WhenMigrationsArePending(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rollBackOneMigration(t, e.pool)
	got := wantError(t, e.do(t, "GET", "/readyz", ""), http.StatusServiceUnavailable, "")
	if got.Error != "database migrations are pending" {
		t.Errorf("error = %q", got.Error)
	}
}

func TestReadyz_Is503WhenDatabaseIsUnreachable(t *testing.T) {
	t.Parallel()
	e := setupWithPool(t, unreachablePool(t))
	got := wantError(t, e.do(t, "GET", "/readyz", ""), http.StatusServiceUnavailable, "")
	if got.Error != "database unavailable" {
		t.Errorf("error = %q", got.Error)
	}
}

func TestRoutes_DatabaseUnreachableIs503WithGenericMessage(t *testing.T) {
	t.Parallel()
	e := setupWithPool(t, unreachablePool(t))
	tests := []struct{ method, path, body string }{
		{"POST", "/v1/jobs", `{"kind":"k"}`},
		{"POST", "/v1/jobs/batch", `{"jobs":[{"kind":"k"}]}`},
		{"GET", "/v1/jobs/1", ""},
		{"GET", "/v1/jobs", ""},
		{"POST", "/v1/jobs/1/cancel", ""},
		{"POST", "/v1/jobs/1/retry", ""},
		{"GET", "/v1/queues", ""},
	}
	for _, tt := range tests {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			rec := e.do(t, tt.method, tt.path, tt.body)
			got := wantError(t, rec, http.StatusServiceUnavailable, "")
			if got.Error != "database unavailable" {
				t.Errorf("error = %q, want the generic message", got.Error)
			}
			if rec.Header().Get("Retry-After") == "" {
				t.Error("no Retry-After header")
			}
		})
	}
	if !strings.Contains(e.logs.String(), "request failed") {
		t.Errorf("the real error was not logged:\n%s", e.logs)
	}
}

// unreachablePool returns a pool whose every connection attempt fails fast.
func unreachablePool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), "postgres://postgres@127.0.0.1:1/relay?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// rollBackOneMigration undoes the latest migration, leaving one pending.
func rollBackOneMigration(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		t.Fatalf("migrator: %v", err)
	}
	defer m.Close()
	if _, err := m.Down(context.Background()); err != nil {
		t.Fatalf("migrate down: %v", err)
	}
}

// newToken draws a fresh random lease token.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }

// Every answer, a job or an error, tells a browser not to guess another
// type than JSON for it, and any cache not to store it: a job's state
// changes from one read to the next, and its payload may be confidential.
func TestResponses_AreNeitherSniffedNorStored(t *testing.T) {
	t.Parallel()
	e := setup(t, Config{APIToken: "s3cret", MaxBodyBytes: 100})
	auth := []string{"Authorization", "Bearer s3cret"}
	job := e.do(t, "POST", "/v1/jobs", `{"kind":"a","payload":{"card":"4111"}}`, auth...)
	wantStatus(t, job, http.StatusCreated)
	id := strconv.FormatInt(decode[JobView](t, job).ID, 10)
	panicking := recoverPanics(slog.New(slog.DiscardHandler))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("kaboom")
	}))
	tests := []struct {
		name string
		rec  *httptest.ResponseRecorder
	}{
		{"enqueue", job},
		{"a job", e.do(t, "GET", "/v1/jobs/"+id, "", auth...)},
		{"a listing", e.do(t, "GET", "/v1/jobs", "", auth...)},
		{"the queues", e.do(t, "GET", "/v1/queues", "", auth...)},
		{"a cancel", e.do(t, "POST", "/v1/jobs/"+id+"/cancel", "", auth...)},
		{"no token", e.do(t, "GET", "/v1/jobs/"+id, "")},
		{"no such job", e.do(t, "GET", "/v1/jobs/999999", "", auth...)},
		{"a bad id", e.do(t, "GET", "/v1/jobs/x", "", auth...)},
		{"a body too large", e.do(t, "POST", "/v1/jobs", `{"kind":"`+strings.Repeat("a", 200)+`"}`, auth...)},
		{"no such route", e.do(t, "GET", "/nope", "")},
		{"a wrong method", e.do(t, "DELETE", "/v1/jobs/1", "", auth...)},
		{"a redirect", e.do(t, "GET", "/v1//jobs/1", "")},
		{"healthz", e.do(t, "GET", "/healthz", "")},
		{"readyz", e.do(t, "GET", "/readyz", "")},
		{"a panic", serve(t, panicking, "GET", "/v1/jobs", "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := tt.rec.Header()
			if got := h.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("%d: X-Content-Type-Options = %q, want nosniff", tt.rec.Code, got)
			}
			if got := h.Get("Cache-Control"); got != "no-store" {
				t.Errorf("%d: Cache-Control = %q, want no-store", tt.rec.Code, got)
			}
		})
	}
}
