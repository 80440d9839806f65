package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/dbtest"
)

func TestAuth_V1RoutesRequireTheBearerToken(t *testing.T) {
	t.Parallel()
	e := setup(t, Config{APIToken: "s3cret"})
	tests := []struct {
		name   string
		header []string
	}{
		{"no Authorization", nil},
		{"wrong token", []string{"Authorization", "Bearer nope"}},
		{"token prefix", []string{"Authorization", "Bearer s3cre"}},
		{"token with suffix", []string{"Authorization", "Bearer s3cretx"}},
		{"empty token", []string{"Authorization", "Bearer "}},
		{"scheme only", []string{"Authorization", "Bearer"}},
		{"token without scheme", []string{"Authorization", "s3cret"}},
		{"basic auth", []string{"Authorization", "Basic czNjcmV0Og=="}},
		// Two credentials are ambiguous: a proxy in front may have checked
		// the other one.
		{"token, then another Authorization", []string{"Authorization", "Bearer s3cret", "Authorization", "Bearer nope"}},
		{"token given twice", []string{"Authorization", "Bearer s3cret", "Authorization", "Bearer s3cret"}},
	}
	routes := []struct{ method, path, body string }{
		{"POST", "/v1/jobs", `{"kind":"a"}`},
		{"POST", "/v1/jobs/batch", `{"jobs":[{"kind":"a"}]}`},
		{"GET", "/v1/jobs", ""},
		{"GET", "/v1/jobs/1", ""},
		{"POST", "/v1/jobs/1/cancel", ""},
		{"POST", "/v1/jobs/1/retry", ""},
		{"GET", "/v1/queues", ""},
	}
	for _, tt := range tests {
		for _, r := range routes {
			t.Run(tt.name+"/"+r.method+" "+r.path, func(t *testing.T) {
				rec := e.do(t, r.method, r.path, r.body, tt.header...)
				wantError(t, rec, http.StatusUnauthorized, "")
				if got := rec.Header().Get("WWW-Authenticate"); got != "Bearer" {
					t.Errorf("WWW-Authenticate = %q", got)
				}
			})
		}
	}
	if n := dbtest.CountJobs(t, e.pool); n != 0 {
		t.Errorf("%d jobs written without the token", n)
	}

	for _, h := range []string{"Bearer s3cret", "bearer s3cret", "BEARER  s3cret"} {
		wantStatus(t, e.do(t, "POST", "/v1/jobs", `{"kind":"a"}`, "Authorization", h), http.StatusCreated)
	}
}

func TestAuth_HealthRoutesStayOpen(t *testing.T) {
	t.Parallel()
	e := setup(t, Config{APIToken: "s3cret"})
	wantStatus(t, e.do(t, "GET", "/healthz", ""), http.StatusOK)
	wantStatus(t, e.do(t, "GET", "/readyz", ""), http.StatusOK)
}

func TestAuth_NoTokenConfiguredLetsEveryoneIn(t *testing.T) {
	t.Parallel()
	e := setup(t)
	wantStatus(t, e.do(t, "GET", "/v1/queues", ""), http.StatusOK)
	wantStatus(t, e.do(t, "GET", "/v1/queues", "", "Authorization", "Bearer whatever"), http.StatusOK)
}

// TestNewServer_RefusesATokenNoRequestCanPresent: HTTP trims the white
// space around a header's value and refuses control characters but a tab
// in it, so a server given such a token would answer every /v1 request
// 401. NewServer panics rather than serve so, without naming the token.
func TestNewServer_RefusesATokenNoRequestCanPresent(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	for name, token := range map[string]string{
		"a trailing newline":  "s3cret\n",
		"a leading space":     " s3cret",
		"a trailing tab":      "s3cret\t",
		"white space alone":   " ",
		"a NUL":               "s3\x00cret",
		"a control character": "s3\x1bcret",
		"DEL":                 "s3cret\x7f",
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				r := recover()
				msg := fmt.Sprint(r)
				if r == nil || !strings.Contains(msg, "APIToken") || strings.Contains(msg, "s3") {
					t.Errorf("NewServer: recovered %q, want a panic that names APIToken and not the token", msg)
				}
			}()
			h := NewServer(nil, pool, Config{APIToken: token})
			h.Close(context.Background())
		})
	}
	// A tab inside the token can be presented.
	e := setup(t, Config{APIToken: "s3\tcret"})
	wantStatus(t, e.do(t, "GET", "/v1/queues", "", "Authorization", "Bearer s3\tcret"), http.StatusOK)
}

// TestNewServer_RefusesANilPool: NewServer says so itself, rather than
// leave it to what it builds on the pool.
func TestNewServer_RefusesANilPool(t *testing.T) {
	t.Parallel()
	defer func() {
		if r := recover(); r == nil || !strings.HasPrefix(fmt.Sprint(r), "server.NewServer: nil pool") {
			t.Errorf("NewServer: recovered %v, want server.NewServer's panic for a nil pool", r)
		}
	}()
	NewServer(nil, nil, Config{})
}

func TestRecoverPanics_PanicBecomes500JSON(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	h := recoverPanics(logger)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("kaboom")
	}))
	rec := serve(t, h, "GET", "/v1/jobs", "")
	got := wantError(t, rec, http.StatusInternalServerError, "")
	if got.Error != "internal server error" {
		t.Errorf("error = %q", got.Error)
	}
	if strings.Contains(rec.Body.String(), "kaboom") {
		t.Errorf("panic value reached the client: %s", rec.Body)
	}
	if !strings.Contains(logs.String(), "kaboom") || !strings.Contains(logs.String(), "stack") {
		t.Errorf("panic not logged with its stack:\n%s", logs.String())
	}
}

func TestRecoverPanics_ResponseAlreadyStartedIsLeftAlone(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	h := recoverPanics(logger)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusAccepted)
		panic("late")
	}))
	rec := serve(t, h, "GET", "/", "")
	if rec.Code != http.StatusAccepted || rec.Body.Len() != 0 {
		t.Errorf("status %d body %q; want the started response untouched", rec.Code, rec.Body)
	}
}

func TestRecoverPanics_AbortHandlerPropagates(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	h := recoverPanics(logger)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(http.ErrAbortHandler)
	}))
	defer func() {
		if v := recover(); v != http.ErrAbortHandler {
			t.Errorf("recovered %v, want http.ErrAbortHandler", v)
		}
	}()
	serve(t, h, "GET", "/", "")
}

func TestLogRequests_LogsMethodPathStatusAndDuration(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.do(t, "GET", "/v1/jobs/999?secret=x", "")
	var entry map[string]any
	for line := range strings.Lines(e.logs.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if m["msg"] == "http request" {
			entry = m
		}
	}
	if entry == nil {
		t.Fatalf("no request logged:\n%s", e.logs)
	}
	// The path is logged without its query string, which the route refuses.
	if entry["method"] != "GET" || entry["path"] != "/v1/jobs/999" || entry["status"] != float64(400) {
		t.Errorf("log entry = %v", entry)
	}
	if _, ok := entry["duration"]; !ok {
		t.Errorf("no duration in %v", entry)
	}
}

func TestLogRequests_RecordsStatusOfPanickingHandler(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	h := logRequests(logger)(recoverPanics(logger)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("x")
	})))
	serve(t, h, "POST", "/v1/jobs", "")
	if !strings.Contains(logs.String(), `"status":500`) {
		t.Errorf("500 not logged:\n%s", logs.String())
	}
}

func TestClassify_MapsDatabaseErrorsToStatuses(t *testing.T) {
	t.Parallel()
	pg := func(code string) error {
		return fmt.Errorf("insert job: %w", &pgconn.PgError{Code: code, Message: "secret detail"})
	}
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"unique violation", pg("23505"), http.StatusConflict},
		{"check violation", pg("23514"), http.StatusBadRequest},
		{"not null violation", pg("23502"), http.StatusBadRequest},
		{"invalid text representation", pg("22P02"), http.StatusBadRequest},
		{"untranslatable character", pg("22P05"), http.StatusBadRequest},
		{"numeric out of range", pg("22003"), http.StatusBadRequest},
		{"stack depth", pg("54001"), http.StatusBadRequest},
		{"connection failure", pg("08006"), http.StatusServiceUnavailable},
		{"too many connections", pg("53300"), http.StatusServiceUnavailable},
		{"admin shutdown", pg("57P01"), http.StatusServiceUnavailable},
		{"statement timeout", pg("57014"), http.StatusServiceUnavailable},
		{"deadlock", pg("40P01"), http.StatusServiceUnavailable},
		{"undefined table", pg("42P01"), http.StatusInternalServerError},
		{"deadline", fmt.Errorf("get job: %w", context.DeadlineExceeded), http.StatusServiceUnavailable},
		{"connect error", &pgconn.ConnectError{}, http.StatusServiceUnavailable},
		{"answer lost", fmt.Errorf("insert job: %w", client.ErrOutcomeUnknown), http.StatusGatewayTimeout},
		{"anything else", errors.New("scan: bad type"), http.StatusInternalServerError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := classify(tt.err)
			if got.status != tt.want {
				t.Errorf("status = %d, want %d", got.status, tt.want)
			}
			if strings.Contains(got.msg, "secret") || strings.Contains(got.msg, "SQLSTATE") {
				t.Errorf("message %q leaks the database error", got.msg)
			}
		})
	}
}

func TestRespondError_HidesInternalErrors(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, nil))
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/v1/jobs", nil)
	respondError(logger, rec, req, &pgconn.PgError{Code: "42601", Message: `syntax error at or near "SELECT"`})
	got := wantError(t, rec, http.StatusInternalServerError, "")
	if got.Error != "internal server error" {
		t.Errorf("error = %q", got.Error)
	}
	if !strings.Contains(logs.String(), "42601") {
		t.Errorf("real error not logged:\n%s", logs.String())
	}
}
