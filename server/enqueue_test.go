package server

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
)

// jsonValues compares JSON documents by value rather than by spelling.
var jsonValues = cmp.Transformer("jsonValue", func(m json.RawMessage) any {
	var v any
	if len(m) == 0 {
		return nil
	}
	if err := json.Unmarshal(m, &v); err != nil {
		return fmt.Sprintf("invalid JSON %q: %v", m, err)
	}
	return v
})

// ignoreTimes leaves out of a comparison the fields the database fills with
// its clock.
var ignoreTimes = cmpopts.IgnoreFields(JobView{}, "ID", "RunAt", "CreatedAt")

func TestEnqueue_CreatesJobWithDefaults(t *testing.T) {
	t.Parallel()
	e := setup(t)
	before := time.Now()
	rec := e.do(t, "POST", "/v1/jobs", `{"kind":"email.send"}`)
	wantStatus(t, rec, http.StatusCreated)
	got := decode[JobView](t, rec)

	want := JobView{
		JobSummary: JobSummary{Queue: "default", Kind: "email.send", State: db.JobStateAvailable, MaxAttempts: 25},
		Payload:    json.RawMessage(`{}`),
		Errors:     json.RawMessage(`[]`),
	}
	if diff := cmp.Diff(want, got, ignoreTimes, jsonValues); diff != "" {
		t.Errorf("job (-want +got):\n%s", diff)
	}
	if got.ID <= 0 {
		t.Errorf("id = %d", got.ID)
	}
	if d := got.RunAt.Sub(before); d < -time.Minute || d > time.Minute {
		t.Errorf("run_at = %v, want about now (%v)", got.RunAt, before)
	}
	if loc := rec.Header().Get("Location"); loc != fmt.Sprintf("/v1/jobs/%d", got.ID) {
		t.Errorf("Location = %q", loc)
	}
	stored, err := e.q.JobGet(context.Background(), got.ID)
	if err != nil {
		t.Fatalf("job not stored: %v", err)
	}
	if diff := cmp.Diff(got, NewJobView(stored), jsonValues); diff != "" {
		t.Errorf("response differs from the stored job (-response +stored):\n%s", diff)
	}
}

func TestEnqueue_StoresEveryField(t *testing.T) {
	t.Parallel()
	e := setup(t)
	runAt := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	body := fmt.Sprintf(`{
		"kind": "report.build",
		"queue": "reports",
		"payload": {"user": 42, "tags": ["a", "b"], "nested": {"deep": [null, true, 1.5]}},
		"priority": -7,
		"max_attempts": 3,
		"run_at": %q
	}`, runAt.Format(time.RFC3339Nano))
	got := e.enqueue(t, body)

	want := JobView{
		JobSummary: JobSummary{
			ID:          got.ID,
			Queue:       "reports",
			Kind:        "report.build",
			Priority:    -7,
			State:       db.JobStateAvailable,
			MaxAttempts: 3,
			RunAt:       runAt,
		},
		Payload: json.RawMessage(`{"user": 42, "tags": ["a", "b"], "nested": {"deep": [null, true, 1.5]}}`),
		Errors:  json.RawMessage(`[]`),
	}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(JobView{}, "CreatedAt"), jsonValues, cmpopts.EquateApproxTime(0)); diff != "" {
		t.Errorf("job (-want +got):\n%s", diff)
	}
}

func TestEnqueue_AcceptsAnyJSONPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, payload := range []string{`null`, `"text"`, `12.50`, `[1,"two",{"3":[]}]`, `true`, `{"a":{"x":1},"b":{"x":2},"c":[{"x":3},{"x":4}]}`, `{"a":1,"A":2,"é":3,"e\u0301":4}`, `{"emoji":"\ud83d\ude00 é","esc":"a\\u0000b"}`} {
		t.Run(payload, func(t *testing.T) {
			got := e.enqueue(t, `{"kind":"k","payload":`+payload+`}`)
			if diff := cmp.Diff(json.RawMessage(payload), got.Payload, jsonValues); diff != "" {
				t.Errorf("payload (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEnqueue_DelaySchedulesRelativeToDatabaseClock(t *testing.T) {
	t.Parallel()
	e := setup(t)
	got := e.enqueue(t, `{"kind":"k","delay":"1h30m"}`)
	if d := got.RunAt.Sub(got.CreatedAt); d < 90*time.Minute || d > 90*time.Minute+time.Second {
		t.Errorf("run_at - created_at = %v, want 1h30m", d)
	}
	got = e.enqueue(t, `{"kind":"k","delay":"0s"}`)
	if d := got.RunAt.Sub(got.CreatedAt); d < 0 || d > time.Second {
		t.Errorf("run_at - created_at = %v, want 0", d)
	}
}

func TestEnqueue_AcceptsJSONContentTypeWithCharset(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := e.do(t, "POST", "/v1/jobs", `{"kind":"k"}`, "Content-Type", "application/json; charset=UTF-8")
	wantStatus(t, rec, http.StatusCreated)
}

func TestEnqueue_AcceptsJSONSentAsCurlsDefaultFormContentType(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := e.do(t, "POST", "/v1/jobs", `{"kind":"k"}`, "Content-Type", "application/x-www-form-urlencoded")
	wantStatus(t, rec, http.StatusCreated)
}

func TestEnqueue_RejectsInvalidRequestsWithoutWriting(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 129)
	tests := []struct {
		name   string
		body   string
		header []string
		status int
		field  string
	}{
		{name: "empty body", body: "", status: 400},
		{name: "whitespace body", body: " \n ", status: 400},
		{name: "malformed JSON", body: `{"kind":`, status: 400},
		{name: "not JSON", body: `kind=a`, status: 400},
		{name: "array instead of object", body: `[{"kind":"a"}]`, status: 400},
		{name: "string instead of object", body: `"a"`, status: 400},
		{name: "null instead of object", body: `null`, status: 400},
		{name: "trailing object", body: `{"kind":"a"} {"kind":"b"}`, status: 400},
		{name: "trailing garbage", body: `{"kind":"a"}x`, status: 400},
		{name: "trailing brace", body: `{"kind":"a"}}`, status: 400},
		{name: "unknown field", body: `{"kind":"a","bogus":1}`, status: 400, field: "bogus"},
		{name: "field in wrong case", body: `{"Kind":"a"}`, status: 400, field: "Kind"},
		{name: "field given twice", body: `{"kind":"a","kind":"b"}`, status: 400, field: "kind"},
		{name: "raw NUL byte", body: "{\"kind\":\"a\x00\"}", status: 400},
		{name: "invalid UTF-8", body: "{\"kind\":\"a\xff\"}", status: 400},
		{name: "invalid UTF-8 in payload", body: "{\"kind\":\"a\",\"payload\":\"\xc3\x28\"}", status: 400},
		{name: "missing kind", body: `{"queue":"q"}`, status: 400, field: "kind"},
		{name: "null kind", body: `{"kind":null}`, status: 400, field: "kind"},
		{name: "empty kind", body: `{"kind":""}`, status: 400, field: "kind"},
		{name: "kind too long", body: `{"kind":"` + long + `"}`, status: 400, field: "kind"},
		{name: "kind too long in bytes", body: `{"kind":"` + strings.Repeat("é", 65) + `"}`, status: 400, field: "kind"},
		{name: "kind not a string", body: `{"kind":5}`, status: 400, field: "kind"},
		{name: "NUL in kind", body: `{"kind":"a\u0000b"}`, status: 400, field: "kind"},
		{name: "newline in kind", body: `{"kind":"a\nb"}`, status: 400, field: "kind"},
		{name: "C1 control in kind", body: `{"kind":"a\u0085"}`, status: 400, field: "kind"},
		{name: "empty queue", body: `{"kind":"a","queue":""}`, status: 400, field: "queue"},
		{name: "queue too long", body: `{"kind":"a","queue":"` + long + `"}`, status: 400, field: "queue"},
		{name: "NUL in queue", body: `{"kind":"a","queue":"\u0000"}`, status: 400, field: "queue"},
		{name: "escape in queue", body: `{"kind":"a","queue":"\u001b[2J"}`, status: 400, field: "queue"},
		{name: "DEL in queue", body: `{"kind":"a","queue":"q\u007f"}`, status: 400, field: "queue"},
		{name: "queue not a string", body: `{"kind":"a","queue":["q"]}`, status: 400, field: "queue"},
		{name: "NUL in payload string", body: `{"kind":"a","payload":"\u0000"}`, status: 400, field: "payload"},
		{name: "NUL in nested payload string", body: `{"kind":"a","payload":{"a":[1,{"b":"x\u0000y"}]}}`, status: 400, field: "payload"},
		{name: "NUL in payload key", body: `{"kind":"a","payload":{"a\u0000":1}}`, status: 400, field: "payload"},
		{name: "NUL in nested payload key", body: `{"kind":"a","payload":[{"ok":{"\u0000":1}}]}`, status: 400, field: "payload"},
		{name: "payload key given twice", body: `{"kind":"a","payload":{"amount":100,"amount":1}}`, status: 400, field: "payload"},
		{name: "payload key given twice, once escaped", body: `{"kind":"a","payload":{"a":1,"\u0061":2}}`, status: 400, field: "payload"},
		{name: "nested payload key given twice", body: `{"kind":"a","payload":[{"x":{"y":1,"z":2,"y":3}}]}`, status: 400, field: "payload"},
		{name: "lone high surrogate in payload", body: `{"kind":"a","payload":"\ud800"}`, status: 400, field: "payload"},
		{name: "lone low surrogate in payload", body: `{"kind":"a","payload":{"\udc00":1}}`, status: 400, field: "payload"},
		{name: "reversed surrogates in payload", body: `{"kind":"a","payload":"\ude00\ud83d"}`, status: 400, field: "payload"},
		{name: "lone high surrogate in kind", body: `{"kind":"a\ud800b"}`, status: 400, field: "kind"},
		{name: "lone low surrogate in queue", body: `{"kind":"a","queue":"q\udc00"}`, status: 400, field: "queue"},
		{name: "reversed surrogates in kind", body: `{"kind":"\ude00\ud83d"}`, status: 400, field: "kind"},
		{name: "lone surrogate in delay", body: `{"kind":"a","delay":"5s\ud800"}`, status: 400, field: "delay"},
		{name: "payload number too large for numeric", body: `{"kind":"a","payload":1e131072}`, status: 400, field: "payload"},
		{name: "payload number too precise for numeric", body: `{"kind":"a","payload":[1e-16384]}`, status: 400, field: "payload"},
		{name: "payload number with huge exponent", body: `{"kind":"a","payload":{"n":1e99999999999999999999}}`, status: 400, field: "payload"},
		{name: "payload too deeply nested", body: `{"kind":"a","payload":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, status: 400},
		{name: "priority above int16", body: `{"kind":"a","priority":32768}`, status: 400, field: "priority"},
		{name: "priority below int16", body: `{"kind":"a","priority":-32769}`, status: 400, field: "priority"},
		{name: "priority fractional", body: `{"kind":"a","priority":1.5}`, status: 400, field: "priority"},
		{name: "priority as string", body: `{"kind":"a","priority":"1"}`, status: 400, field: "priority"},
		{name: "priority huge", body: `{"kind":"a","priority":1e999}`, status: 400, field: "priority"},
		{name: "priority beyond int64", body: `{"kind":"a","priority":99999999999999999999}`, status: 400, field: "priority"},
		{name: "priority fractional by its exponent", body: `{"kind":"a","priority":15e-1}`, status: 400, field: "priority"},
		{name: "priority a hair above whole", body: `{"kind":"a","priority":1.0000000000000000001}`, status: 400, field: "priority"},
		{name: "priority whole but above int16", body: `{"kind":"a","priority":3.2768e4}`, status: 400, field: "priority"},
		{name: "priority with a huge exponent", body: `{"kind":"a","priority":1e99999999999999999999}`, status: 400, field: "priority"},
		{name: "priority as boolean", body: `{"kind":"a","priority":true}`, status: 400, field: "priority"},
		{name: "max_attempts fractional", body: `{"kind":"a","max_attempts":2.5}`, status: 400, field: "max_attempts"},
		{name: "max_attempts zero", body: `{"kind":"a","max_attempts":0}`, status: 400, field: "max_attempts"},
		{name: "max_attempts negative", body: `{"kind":"a","max_attempts":-1}`, status: 400, field: "max_attempts"},
		{name: "max_attempts above 1000", body: `{"kind":"a","max_attempts":1001}`, status: 400, field: "max_attempts"},
		{name: "run_at not RFC 3339", body: `{"kind":"a","run_at":"tomorrow"}`, status: 400, field: "run_at"},
		{name: "run_at without zone", body: `{"kind":"a","run_at":"2030-01-01T00:00:00"}`, status: 400, field: "run_at"},
		{name: "run_at as number", body: `{"kind":"a","run_at":1700000000}`, status: 400, field: "run_at"},
		{name: "run_at before 1970", body: `{"kind":"a","run_at":"1969-12-31T23:59:59Z"}`, status: 400, field: "run_at"},
		{name: "run_at over a year ahead", body: fmt.Sprintf(`{"kind":"a","run_at":%q}`, time.Now().AddDate(1, 1, 0).Format(time.RFC3339)), status: 400, field: "run_at"},
		{name: "run_at offset of 24 hours", body: `{"kind":"a","run_at":"2030-01-01T12:00:00+24:00"}`, status: 400, field: "run_at"},
		{name: "run_at offset of 60 minutes", body: `{"kind":"a","run_at":"2030-01-01T12:00:00+23:60"}`, status: 400, field: "run_at"},
		{name: "run_at comma before the fraction", body: `{"kind":"a","run_at":"2030-01-01T12:00:00,5Z"}`, status: 400, field: "run_at"},
		{name: "run_at leap second", body: `{"kind":"a","run_at":"2030-12-31T23:59:60Z"}`, status: 400, field: "run_at"},
		{name: "run_at and delay", body: `{"kind":"a","run_at":"2030-01-01T00:00:00Z","delay":"5s"}`, status: 400, field: "delay"},
		{name: "delay negative", body: `{"kind":"a","delay":"-1s"}`, status: 400, field: "delay"},
		{name: "delay without unit", body: `{"kind":"a","delay":"5"}`, status: 400, field: "delay"},
		{name: "delay as number", body: `{"kind":"a","delay":5000}`, status: 400, field: "delay"},
		{name: "delay over a year", body: `{"kind":"a","delay":"8761h"}`, status: 400, field: "delay"},
		{name: "delay overflowing", body: `{"kind":"a","delay":"9999999999h"}`, status: 400, field: "delay"},
		{name: "empty Idempotency-Key", body: `{"kind":"a"}`, header: []string{"Idempotency-Key", ""}, status: 400, field: "Idempotency-Key"},
		{name: "Idempotency-Key too long", body: `{"kind":"a"}`, header: []string{"Idempotency-Key", strings.Repeat("k", 256)}, status: 400, field: "Idempotency-Key"},
		{name: "NUL in Idempotency-Key", body: `{"kind":"a"}`, header: []string{"Idempotency-Key", "a\x00b"}, status: 400, field: "Idempotency-Key"},
		{name: "invalid UTF-8 in Idempotency-Key", body: `{"kind":"a"}`, header: []string{"Idempotency-Key", "a\xffb"}, status: 400, field: "Idempotency-Key"},
		{name: "Idempotency-Key twice", body: `{"kind":"a"}`, header: []string{"Idempotency-Key", "a", "Idempotency-Key", "b"}, status: 400, field: "Idempotency-Key"},
		{name: "text/plain Content-Type", body: `{"kind":"a"}`, header: []string{"Content-Type", "text/plain"}, status: 415, field: "Content-Type"},
		{name: "JSON in another charset", body: `{"kind":"a"}`, header: []string{"Content-Type", "application/json; charset=latin1"}, status: 415, field: "Content-Type"},
		{name: "second Content-Type in another charset", body: `{"kind":"a"}`, header: []string{"Content-Type", "application/json", "Content-Type", "application/json; charset=latin1"}, status: 415, field: "Content-Type"},
		{name: "second Content-Type not JSON", body: `{"kind":"a"}`, header: []string{"Content-Type", "application/json", "Content-Type", "text/plain"}, status: 415, field: "Content-Type"},
		{name: "gzip Content-Encoding", body: gzipped(t, `{"kind":"a"}`), header: []string{"Content-Encoding", "gzip"}, status: 415, field: "Content-Encoding"},
		{name: "br Content-Encoding on a plain body", body: `{"kind":"a"}`, header: []string{"Content-Encoding", "br"}, status: 415, field: "Content-Encoding"},
		{name: "Content-Encoding in capitals", body: `{"kind":"a"}`, header: []string{"Content-Encoding", "GZIP"}, status: 415, field: "Content-Encoding"},
		{name: "identity then gzip", body: `{"kind":"a"}`, header: []string{"Content-Encoding", "identity, gzip"}, status: 415, field: "Content-Encoding"},
		{name: "second Content-Encoding header", body: `{"kind":"a"}`, header: []string{"Content-Encoding", "identity", "Content-Encoding", "deflate"}, status: 415, field: "Content-Encoding"},
		{name: "Content-Encoding before a bad body", body: `{"kind":`, header: []string{"Content-Encoding", "zstd"}, status: 415, field: "Content-Encoding"},
	}
	e := setup(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := e.do(t, "POST", "/v1/jobs", tt.body, tt.header...)
			wantError(t, rec, tt.status, tt.field)
			if n := dbtest.CountJobs(t, e.pool); n != 0 {
				t.Errorf("%d jobs written", n)
			}
		})
	}
}

// TestEnqueue_RejectsQueryParametersWithoutWriting: the enqueue routes take
// the job's fields in the body, and a parameter in the query string would
// otherwise be dropped without a word (?queue=emails storing the job in
// the default queue).
func TestEnqueue_RejectsQueryParametersWithoutWriting(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, query, field string
	}{
		{"queue", "queue=emails", "queue"},
		{"kind", "kind=other", "kind"},
		{"unknown", "bogus=1", "bogus"},
		{"the first of several", "priority=1&queue=q", "priority"},
		{"without a value", "queue", "queue"},
		{"escaped name", "qu%65ue=q", "queue"},
		{"empty name", "=x", ""},
		{"malformed escape", "queue=%zz", ""},
		{"semicolon", "queue=a;b", ""},
	}
	routes := []struct{ path, body string }{
		{"/v1/jobs", `{"kind":"a"}`},
		{"/v1/jobs/batch", `{"jobs":[{"kind":"a"}]}`},
	}
	e := setup(t)
	for _, route := range routes {
		for _, tt := range tests {
			t.Run(route.path+"?"+tt.name, func(t *testing.T) {
				got := wantError(t, e.do(t, "POST", route.path+"?"+tt.query, route.body), http.StatusBadRequest, tt.field)
				if !strings.Contains(got.Error, "malformed") &&
					(!strings.Contains(got.Error, "takes no query parameters") || !strings.Contains(got.Error, "JSON body")) {
					t.Errorf("error %q does not say the job's fields go in the body", got.Error)
				}
				if n := dbtest.CountJobs(t, e.pool); n != 0 {
					t.Errorf("%d jobs written", n)
				}
			})
		}
	}
	// A bare "?", or one with separators alone, names no parameter.
	for _, query := range []string{"", "&", "&&"} {
		wantStatus(t, e.do(t, "POST", "/v1/jobs?"+query, `{"kind":"a"}`), http.StatusCreated)
	}
}

func TestEnqueue_AcceptsIdentityContentEncoding(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, coding := range []string{"identity", "Identity", " IDENTITY ", ""} {
		wantStatus(t, e.do(t, "POST", "/v1/jobs", `{"kind":"a"}`, "Content-Encoding", coding), http.StatusCreated)
	}
	wantStatus(t, e.do(t, "POST", "/v1/jobs/batch", `{"jobs":[{"kind":"a"}]}`, "Content-Encoding", "identity"), http.StatusCreated)
}

// gzipped returns s compressed with gzip.
func gzipped(t testing.TB, s string) string {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.String()
}

// TestEnqueue_RefusesControlCharactersInNamesSayingWhichAndWhere: the
// 400 names the field, the character and its byte offset, and nothing is
// stored.
func TestEnqueue_RefusesControlCharactersInNamesSayingWhichAndWhere(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for body, want := range map[string]string{
		`{"kind":"send\nemail"}`:           "kind must not contain control characters (U+000A at byte 4)",
		`{"kind":"a","queue":"é\u009b2J"}`: "queue must not contain control characters (U+009B at byte 2)",
	} {
		field, _, _ := strings.Cut(want, " ")
		if got := wantError(t, e.do(t, "POST", "/v1/jobs", body), http.StatusBadRequest, field); got.Error != want {
			t.Errorf("%s: error %q, want %q", body, got.Error, want)
		}
	}
	if n := dbtest.CountJobs(t, e.pool); n != 0 {
		t.Errorf("%d jobs stored, want none", n)
	}
}

func TestEnqueue_RejectsNULInPayload(t *testing.T) {
	t.Parallel()
	e := setup(t)
	got := wantError(t, e.do(t, "POST", "/v1/jobs", `{"kind":"a","payload":{"deep":["\u0000"]}}`), http.StatusBadRequest, "payload")
	if !strings.Contains(got.Error, "NUL") {
		t.Errorf("error %q does not say what is wrong", got.Error)
	}
	if n := dbtest.CountJobs(t, e.pool); n != 0 {
		t.Errorf("%d jobs written", n)
	}
}

// TestEnqueue_RejectsPayloadKeyGivenTwiceNamingIt: jsonb keeps the last
// value of a key given twice, so {"amount":100,"amount":1} would be stored
// as {"amount":1}.
func TestEnqueue_RejectsPayloadKeyGivenTwiceNamingIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	got := wantError(t, e.do(t, "POST", "/v1/jobs", `{"kind":"dup","payload":{"amount":100,"amount":1}}`), http.StatusBadRequest, "payload")
	if want := `payload contains the key "amount" twice in one object, at byte 14`; !strings.HasPrefix(got.Error, want) {
		t.Errorf("error %q, want it to start %q", got.Error, want)
	}
	if n := dbtest.CountJobs(t, e.pool); n != 0 {
		t.Errorf("%d jobs written", n)
	}
}

func TestEnqueue_AcceptsEscapedBackslashBeforeU0000(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// The text \u0000 after an escaped backslash is not a NUL.
	got := e.enqueue(t, `{"kind":"a","payload":"\\u0000"}`)
	if diff := cmp.Diff(json.RawMessage(`"\\u0000"`), got.Payload, jsonValues); diff != "" {
		t.Errorf("payload (-want +got):\n%s", diff)
	}
}

// TestEnqueue_TakesAPayloadNestedAsDeepAsTheClientDoes: a payload nested
// client.MaxPayloadDepth deep is stored through both doors of the API,
// and the job it makes reads back, as a view a Go client decodes; one a
// level deeper is refused on its field, and one deeper than encoding/json
// reads gets an error that says so, not that the body is not JSON.
func TestEnqueue_TakesAPayloadNestedAsDeepAsTheClientDoes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	nested := func(depth int) string { return strings.Repeat("[", depth) + strings.Repeat("]", depth) }
	deepest := nested(client.MaxPayloadDepth)
	for name, rec := range map[string]func() (int64, error){
		"alone": func() (int64, error) {
			rec := e.do(t, "POST", "/v1/jobs", `{"kind":"a","payload":`+deepest+`}`)
			wantStatus(t, rec, http.StatusCreated)
			var job struct{ ID int64 }
			return job.ID, json.Unmarshal(rec.Body.Bytes(), &job)
		},
		"in a batch": func() (int64, error) {
			rec := e.do(t, "POST", "/v1/jobs/batch", `{"jobs":[{"kind":"a","payload":`+deepest+`}]}`)
			wantStatus(t, rec, http.StatusCreated)
			var batch batchResponse
			err := json.Unmarshal(rec.Body.Bytes(), &batch)
			if len(batch.IDs) != 1 {
				return 0, fmt.Errorf("ids %v: %v", batch.IDs, err)
			}
			return batch.IDs[0], err
		},
	} {
		t.Run(name, func(t *testing.T) {
			id, err := rec()
			if err != nil {
				t.Fatalf("decode the answer: %v", err)
			}
			var view struct{ Payload json.RawMessage }
			got := e.do(t, "GET", fmt.Sprintf("/v1/jobs/%d", id), "")
			wantStatus(t, got, http.StatusOK)
			if err := json.Unmarshal(got.Body.Bytes(), &view); err != nil {
				t.Fatalf("decode the job's view: %v", err)
			}
			if string(view.Payload) != deepest {
				t.Errorf("read back a payload of %d bytes, want the %d sent", len(view.Payload), len(deepest))
			}
		})
	}
	stored := dbtest.CountJobs(t, e.pool)
	tooDeep := fmt.Sprintf("payload must not nest arrays and objects more than %d deep", client.MaxPayloadDepth)
	beyondJSON := fmt.Sprintf("request body nests arrays and objects more than 10000 deep, deeper than encoding/json reads: a payload may nest at most %d deep", client.MaxPayloadDepth)
	for _, tt := range []struct {
		name, path, body, field, msg string
	}{
		{"a level too deep", "/v1/jobs", `{"kind":"a","payload":` + nested(client.MaxPayloadDepth+1) + `}`, "payload", tooDeep},
		{"a level too deep in a batch", "/v1/jobs/batch", `{"jobs":[{"kind":"a","payload":` + nested(client.MaxPayloadDepth+1) + `}]}`, "", beyondJSON},
		{"deeper than encoding/json reads", "/v1/jobs", `{"kind":"a","payload":` + nested(10000) + `}`, "", beyondJSON},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := wantError(t, e.do(t, "POST", tt.path, tt.body), http.StatusBadRequest, tt.field)
			if got.Error != tt.msg {
				t.Errorf("error %q, want %q", got.Error, tt.msg)
			}
		})
	}
	if n := dbtest.CountJobs(t, e.pool); n != stored {
		t.Errorf("%d jobs stored by the requests refused", n-stored)
	}
}

func TestEnqueue_AcceptsBoundaryValues(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tests := []string{
		`{"kind":"` + strings.Repeat("k", 128) + `","queue":"` + strings.Repeat("q", 128) + `"}`,
		`{"kind":"a","priority":-32768,"max_attempts":1}`,
		`{"kind":"a","priority":32767,"max_attempts":1000}`,
		`{"kind":"a","delay":"8760h"}`,
		`{"kind":"a","run_at":"1970-01-01T00:00:00Z"}`,
		`{"kind":"a","run_at":"2027-06-01t12:00:00z"}`,
		`{"kind":"a","payload":[1e131071, 1e-16383, -0, 0e999999]}`,
		`{"kind":"a","queue":null,"run_at":null,"delay":null,"priority":null,"max_attempts":null}`,
	}
	for _, body := range tests {
		t.Run(body[:min(len(body), 60)], func(t *testing.T) {
			e.enqueue(t, body)
		})
	}
	rec := e.do(t, "POST", "/v1/jobs", `{"kind":"a"}`, "Idempotency-Key", strings.Repeat("k", 255))
	wantStatus(t, rec, http.StatusCreated)
}

// TestEnqueue_ADelayBeyondWhatADurationHoldsIsTooLongNotMalformed: a
// delay written as a duration is refused for its length, or its sign, even
// when it is beyond what time.Duration holds (about 2,562,047 hours),
// rather than as if it were not a duration at all.
func TestEnqueue_ADelayBeyondWhatADurationHoldsIsTooLongNotMalformed(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tooLong := fmt.Sprintf("delay must be at most %s", client.MaxDelay)
	malformed := `delay must be a duration such as "5s" or "1h30m"`
	tests := []struct{ delay, want string }{
		{"8761h", tooLong},
		{"2562048h", tooLong},
		{"9999999999h", tooLong},
		{"+9999999999h", tooLong},
		{"99999999999999999999ns", tooLong},
		{"1h9999999999m", tooLong},
		{"1.5e3h", malformed},
		{"-1s", "delay must not be negative"},
		{"-9999999999h", "delay must not be negative"},
		{"9999999999", malformed},
		{"9999999999x", malformed},
		{"9999999999 h", malformed},
		{"", malformed},
	}
	for _, tt := range tests {
		t.Run(tt.delay, func(t *testing.T) {
			got := wantError(t, e.do(t, "POST", "/v1/jobs", fmt.Sprintf(`{"kind":"a","delay":%q}`, tt.delay)), http.StatusBadRequest, "delay")
			if got.Error != tt.want {
				t.Errorf("error %q, want %q", got.Error, tt.want)
			}
			got = wantError(t, e.do(t, "POST", "/v1/jobs/batch", fmt.Sprintf(`{"jobs":[{"kind":"a","delay":%q}]}`, tt.delay)), http.StatusBadRequest, "jobs[0].delay")
			if got.Error != "jobs[0]: "+tt.want {
				t.Errorf("error %q, want %q", got.Error, "jobs[0]: "+tt.want)
			}
		})
	}
	if n := dbtest.CountJobs(t, e.pool); n != 0 {
		t.Errorf("%d jobs written", n)
	}
}

// TestParseDelay_ReadsWhatParseDurationReads: parseDelay takes every
// duration time.ParseDuration takes, with its value, and what it does not
// take only when it is a duration beyond time.Duration's range.
func TestParseDelay_ReadsWhatParseDurationReads(t *testing.T) {
	for _, s := range []string{
		"0", "-0", "+0", "0s", "5s", "+5s", "-5s", "1.5h", "1.s", ".5s", "1h30m", "2h45m10.5s",
		"300ms", "7us", "7\u00b5s", "7\u03bcs", "9ns", "2562047h", "-2562047h", "1h2h", "00001m",
		"", "5", "s", ".s", "1..5s", "5x", "5 s", " 5s", "5s ", "1e3s", "--5s", "+-5s", "5S", "5sm",
		"9999999999h", "-9999999999h", "1h9999999999m", "99999999999999999999ns",
	} {
		want, err := time.ParseDuration(s)
		got, ok := parseDelay(s)
		switch {
		case err == nil && (!ok || got != want):
			t.Errorf("parseDelay(%q) = %v, %t; want %v, as time.ParseDuration reads it", s, got, ok, want)
		case err != nil && ok && got != math.MaxInt64 && got != math.MinInt64:
			t.Errorf("parseDelay(%q) = %v, true; want it refused, or beyond range, as time.ParseDuration refuses it: %v", s, got, err)
		}
	}
	for _, s := range []string{"", "5", "5x", "1e3s", "5 s", ".s", "--5s"} {
		if _, ok := parseDelay(s); ok {
			t.Errorf("parseDelay(%q) took it, want it refused as not a duration", s)
		}
	}
}

func TestEnqueue_BodyOverLimitIs413(t *testing.T) {
	t.Parallel()
	e := setup(t, Config{MaxBodyBytes: 64})
	small := `{"kind":"a"}`
	wantStatus(t, e.do(t, "POST", "/v1/jobs", small), http.StatusCreated)
	big := `{"kind":"a","payload":"` + strings.Repeat("x", 64) + `"}`
	wantError(t, e.do(t, "POST", "/v1/jobs", big), http.StatusRequestEntityTooLarge, "")
	wantError(t, e.do(t, "POST", "/v1/jobs/batch", `{"jobs":[`+big+`]}`), http.StatusRequestEntityTooLarge, "")
	if n := dbtest.CountJobs(t, e.pool); n != 1 {
		t.Errorf("%d jobs stored, want 1", n)
	}
}

func TestEnqueue_DefaultBodyLimitIsOneMiB(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pad := func(total int) string {
		head, tail := `{"kind":"a","payload":"`, `"}`
		return head + strings.Repeat("x", total-len(head)-len(tail)) + tail
	}
	wantStatus(t, e.do(t, "POST", "/v1/jobs", pad(DefaultMaxBodyBytes)), http.StatusCreated)
	wantError(t, e.do(t, "POST", "/v1/jobs", pad(DefaultMaxBodyBytes+1)), http.StatusRequestEntityTooLarge, "")
	if n := dbtest.CountJobs(t, e.pool); n != 1 {
		t.Errorf("%d jobs stored, want 1", n)
	}
}

func TestEnqueue_ReplayWithSameKeyReturnsOriginal(t *testing.T) {
	t.Parallel()
	e := setup(t)
	first := e.do(t, "POST", "/v1/jobs", `{"kind":"a","queue":"q","payload":{"x":1,"y":[1,2]},"priority":2,"max_attempts":5}`, "Idempotency-Key", "order-17")
	wantStatus(t, first, http.StatusCreated)
	original := decode[JobView](t, first)

	// The same request spelled differently: key order, whitespace, number
	// spelling, and a delay, which is not compared.
	replays := []string{
		`{"kind":"a","queue":"q","payload":{"x":1,"y":[1,2]},"priority":2,"max_attempts":5}`,
		`{"max_attempts":5, "priority":2, "payload":{ "y":[1.0, 2e0], "x":10e-1 }, "queue":"q", "kind":"a"}`,
		`{"kind":"a","queue":"q","payload":{"x":1,"y":[1,2]},"priority":2.0,"max_attempts":0.5e1,"delay":"1h"}`,
	}
	for _, body := range replays {
		rec := e.do(t, "POST", "/v1/jobs", body, "Idempotency-Key", "order-17")
		wantStatus(t, rec, http.StatusOK)
		if diff := cmp.Diff(original, decode[JobView](t, rec), jsonValues); diff != "" {
			t.Errorf("replay of %s (-original +replay):\n%s", body, diff)
		}
	}
	if n := dbtest.CountJobs(t, e.pool); n != 1 {
		t.Errorf("%d jobs stored, want 1", n)
	}
}

func TestEnqueue_ReplayWithDefaultsMatchesExplicitValues(t *testing.T) {
	t.Parallel()
	e := setup(t)
	wantStatus(t, e.do(t, "POST", "/v1/jobs", `{"kind":"a"}`, "Idempotency-Key", "k"), http.StatusCreated)
	rec := e.do(t, "POST", "/v1/jobs", `{"kind":"a","queue":"default","payload":{},"priority":0,"max_attempts":25}`, "Idempotency-Key", "k")
	wantStatus(t, rec, http.StatusOK)
}

func TestEnqueue_SameKeyWithDifferentBodyIs409(t *testing.T) {
	t.Parallel()
	e := setup(t)
	original := `{"kind":"a","payload":{"x":1},"priority":2,"max_attempts":5}`
	wantStatus(t, e.do(t, "POST", "/v1/jobs", original, "Idempotency-Key", "k"), http.StatusCreated)
	tests := map[string]string{
		"kind":            `{"kind":"b","payload":{"x":1},"priority":2,"max_attempts":5}`,
		"payload value":   `{"kind":"a","payload":{"x":2},"priority":2,"max_attempts":5}`,
		"payload type":    `{"kind":"a","payload":{"x":"1"},"priority":2,"max_attempts":5}`,
		"payload extra":   `{"kind":"a","payload":{"x":1,"y":null},"priority":2,"max_attempts":5}`,
		"payload missing": `{"kind":"a","priority":2,"max_attempts":5}`,
		"priority":        `{"kind":"a","payload":{"x":1},"priority":3,"max_attempts":5}`,
		"max_attempts":    `{"kind":"a","payload":{"x":1},"priority":2}`,
	}
	for name, body := range tests {
		t.Run(name, func(t *testing.T) {
			wantError(t, e.do(t, "POST", "/v1/jobs", body, "Idempotency-Key", "k"), http.StatusConflict, "Idempotency-Key")
		})
	}
	if n := dbtest.CountJobs(t, e.pool); n != 1 {
		t.Errorf("%d jobs stored, want 1", n)
	}
}

func TestEnqueue_SameKeyInAnotherQueueIsAnotherJob(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a := e.do(t, "POST", "/v1/jobs", `{"kind":"a","queue":"one"}`, "Idempotency-Key", "k")
	b := e.do(t, "POST", "/v1/jobs", `{"kind":"a","queue":"two"}`, "Idempotency-Key", "k")
	wantStatus(t, a, http.StatusCreated)
	wantStatus(t, b, http.StatusCreated)
	if decode[JobView](t, a).ID == decode[JobView](t, b).ID {
		t.Error("both queues got the same job")
	}
}

func TestEnqueue_ConcurrentRequestsWithSameKeyCreateOneJob(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const n = 16
	codes := make([]int, n)
	ids := make([]int64, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			rec := e.do(t, "POST", "/v1/jobs", `{"kind":"a","payload":{"i":1}}`, "Idempotency-Key", "same")
			codes[i] = rec.Code
			var j JobView
			_ = json.Unmarshal(rec.Body.Bytes(), &j)
			ids[i] = j.ID
		})
	}
	wg.Wait()
	created := 0
	for i, c := range codes {
		switch c {
		case http.StatusCreated:
			created++
		case http.StatusOK:
		default:
			t.Errorf("request %d: status %d", i, c)
		}
		if ids[i] != ids[0] {
			t.Errorf("request %d got job %d, request 0 got %d", i, ids[i], ids[0])
		}
	}
	if created != 1 {
		t.Errorf("%d requests created a job, want 1", created)
	}
	if got := dbtest.CountJobs(t, e.pool); got != 1 {
		t.Errorf("%d jobs stored, want 1", got)
	}
}

// TestEnqueue_ARequestWaitsForTheJobBeingStoredUnderItsKey holds an
// Idempotency-Key in a transaction still open that stored a job under it,
// as another enqueue does while it stores its job: a request with the same
// key and job waits until that transaction commits, and then answers
// with its job, 200.
func TestEnqueue_ARequestWaitsForTheJobBeingStoredUnderItsKey(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := t.Context()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	key := "held"
	job, err := client.Validate(client.Request{Kind: "a", IdempotencyKey: &key}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	held, _, err := client.Insert(ctx, tx, job)
	if err != nil {
		t.Fatal(err)
	}
	answered := make(chan *httptest.ResponseRecorder, 1)
	go func() { answered <- e.do(t, "POST", "/v1/jobs", `{"kind":"a"}`, "Idempotency-Key", "held") }()
	dbtest.WaitBlocks(t, e.pool, tx, "the request")
	select {
	case rec := <-answered:
		t.Fatalf("answered %d before the job holding its key was committed: %s", rec.Code, rec.Body)
	default:
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rec := <-answered
	wantStatus(t, rec, http.StatusOK)
	if got := decode[JobView](t, rec); got.ID != held.ID {
		t.Errorf("answered with job %d, want the one committed, %d", got.ID, held.ID)
	}
}

// TestEnqueue_AKeyWhoseJobIsDeletedAsItIsReadIsTakenAnew covers the race
// in which the insert finds the key taken but the job holding it is gone
// when read: the request stores its job, 201.
func TestEnqueue_AKeyWhoseJobIsDeletedAsItIsReadIsTakenAnew(t *testing.T) {
	t.Parallel()
	e := setup(t)
	wantStatus(t, e.do(t, "POST", "/v1/jobs", `{"kind":"holder"}`, "Idempotency-Key", "ghost"), http.StatusCreated)
	dbtest.FreeKeyAfterEachInsert(t, e.pool, "ghost", "holder")
	rec := e.do(t, "POST", "/v1/jobs", `{"kind":"a"}`, "Idempotency-Key", "ghost")
	wantStatus(t, rec, http.StatusCreated)
	if got := decode[JobView](t, rec); got.Kind != "a" {
		t.Errorf("answered with a job of kind %q, want the request's, a", got.Kind)
	}
	if n := dbtest.CountJobs(t, e.pool); n != 1 {
		t.Errorf("%d jobs stored, want 1", n)
	}
}

// TestEnqueue_AKeyThatChangesHandsAtEveryInsertIs503: where another job
// takes the key at every insert and is gone by every read, the request is
// a 503 that says to try again, and stores nothing.
func TestEnqueue_AKeyThatChangesHandsAtEveryInsertIs503(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dbtest.TakeKeyBeforeEachInsert(t, e.pool, "ghost", "holder")
	dbtest.FreeKeyAfterEachInsert(t, e.pool, "ghost", "holder")
	got := wantError(t, e.do(t, "POST", "/v1/jobs", `{"kind":"a"}`, "Idempotency-Key", "ghost"), http.StatusServiceUnavailable, "")
	if want := "the job holding this Idempotency-Key changed while the request ran; try again"; got.Error != want {
		t.Errorf("error %q, want %q", got.Error, want)
	}
	if n := dbtest.CountJobs(t, e.pool); n != 0 {
		t.Errorf("%d jobs stored, want none", n)
	}
}

func TestEnqueue_ConstraintViolationFromDatabaseIs400(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// A rule the API does not know about, standing in for any constraint
	// that validation misses.
	if _, err := e.pool.Exec(context.Background(), `ALTER TABLE jobs ADD CONSTRAINT no_forbidden CHECK (kind <> 'forbidden')`); err != nil {
		t.Fatal(err)
	}
	wantError(t, e.do(t, "POST", "/v1/jobs", `{"kind":"forbidden"}`), http.StatusBadRequest, "")
	wantError(t, e.do(t, "POST", "/v1/jobs/batch", `{"jobs":[{"kind":"ok"},{"kind":"forbidden"}]}`), http.StatusBadRequest, "")
	if n := dbtest.CountJobs(t, e.pool); n != 0 {
		t.Errorf("%d jobs written", n)
	}
	if !strings.Contains(e.logs.String(), "no_forbidden") {
		t.Errorf("the database error was not logged:\n%s", e.logs)
	}
}

// TestEnqueue_AJobATriggerDropsIsNotAnsweredAsStored installs a BEFORE
// INSERT trigger of the user's that drops the jobs of one kind: a one-job
// request of that kind is a 500 that says that its job was not stored,
// with an Idempotency-Key too, every time it is sent, not a 503 that says
// to try again; and a batch that holds one a 500, with no ids, that says
// how many of its jobs were stored; none gives away the database's text.
func TestEnqueue_AJobATriggerDropsIsNotAnsweredAsStored(t *testing.T) {
	t.Parallel()
	e := setup(t)
	dbtest.DropJobsOfKind(t, e.pool)
	for _, header := range [][]string{nil, {"Idempotency-Key", "dropped"}, {"Idempotency-Key", "dropped"}} {
		got := wantError(t, e.do(t, "POST", "/v1/jobs", `{"kind":"`+dbtest.DroppedKind+`"}`, header...), http.StatusInternalServerError, "")
		if want := "the job was not stored: a trigger on the jobs table dropped it"; got.Error != want {
			t.Errorf("one job, headers %q: error %q, want %q", header, got.Error, want)
		}
	}
	rec := e.do(t, "POST", "/v1/jobs/batch", `{"jobs":[{"kind":"first"},{"kind":"`+dbtest.DroppedKind+`"},{"kind":"third"}]}`)
	got := wantError(t, rec, http.StatusInternalServerError, "")
	if want := "the database stored 2 of the 3 jobs, and a trigger on the jobs table dropped the others"; !strings.HasPrefix(got.Error, want) {
		t.Errorf("batch: error %q, want it to begin %q", got.Error, want)
	}
	if strings.Contains(rec.Body.String(), `"ids"`) {
		t.Errorf("batch answered with ids: %s", rec.Body)
	}
	if n := dbtest.CountJobs(t, e.pool); n != 2 {
		t.Errorf("%d jobs stored, want the batch's 2", n)
	}
}

func TestEnqueueBatch_InsertsAllInRequestOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := `{"jobs":[
		{"kind":"first","payload":{"n":1}},
		{"kind":"second","queue":"other","priority":-1,"max_attempts":2,"delay":"1h"},
		{"kind":"third","run_at":"2020-01-01T00:00:00Z","payload":[1,"\ud83d\ude00"]}
	]}`
	rec := e.do(t, "POST", "/v1/jobs/batch", body)
	wantStatus(t, rec, http.StatusCreated)
	got := decode[batchResponse](t, rec)
	if len(got.IDs) != 3 {
		t.Fatalf("ids = %v, want 3", got.IDs)
	}
	want := []JobView{
		{JobSummary: JobSummary{Queue: "default", Kind: "first", MaxAttempts: 25}, Payload: json.RawMessage(`{"n":1}`)},
		{JobSummary: JobSummary{Queue: "other", Kind: "second", Priority: -1, MaxAttempts: 2}, Payload: json.RawMessage(`{}`)},
		{JobSummary: JobSummary{Queue: "default", Kind: "third", MaxAttempts: 25}, Payload: json.RawMessage(`[1,"😀"]`)},
	}
	for i, id := range got.IDs {
		job, err := e.q.JobGet(context.Background(), id)
		if err != nil {
			t.Fatalf("job %d not stored: %v", id, err)
		}
		want[i].State, want[i].Errors = db.JobStateAvailable, json.RawMessage(`[]`)
		if diff := cmp.Diff(want[i], NewJobView(job), ignoreTimes, jsonValues); diff != "" {
			t.Errorf("jobs[%d] (-want +got):\n%s", i, diff)
		}
		switch i {
		case 1:
			if d := job.RunAt.Sub(job.CreatedAt); d < time.Hour || d > time.Hour+time.Second {
				t.Errorf("delayed job runs %v after creation, want 1h", d)
			}
		case 2:
			if !job.RunAt.Equal(time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)) {
				t.Errorf("run_at = %v", job.RunAt)
			}
		}
	}
	if !(got.IDs[0] < got.IDs[1] && got.IDs[1] < got.IDs[2]) {
		t.Errorf("ids not in request order: %v", got.IDs)
	}
}

func TestEnqueueBatch_AcceptsUpTo1000Jobs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	jobs := func(n int) string {
		return `{"jobs":[` + strings.TrimSuffix(strings.Repeat(`{"kind":"k"},`, n), ",") + `]}`
	}
	rec := e.do(t, "POST", "/v1/jobs/batch", jobs(client.MaxBatchJobs))
	wantStatus(t, rec, http.StatusCreated)
	if got := decode[batchResponse](t, rec); len(got.IDs) != client.MaxBatchJobs {
		t.Errorf("%d ids", len(got.IDs))
	}
	wantError(t, e.do(t, "POST", "/v1/jobs/batch", jobs(client.MaxBatchJobs+1)), http.StatusBadRequest, "jobs")
	if n := dbtest.CountJobs(t, e.pool); n != client.MaxBatchJobs {
		t.Errorf("%d jobs stored, want %d", n, client.MaxBatchJobs)
	}
}

func TestEnqueueBatch_RejectsWholeBatchNamingFirstBadJob(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		body   string
		header []string
		status int
		field  string
	}{
		{name: "missing kind", body: `{"jobs":[{"kind":"a"},{"kind":"b"},{"kind":"c"},{"queue":"q"},{"kind":""}]}`, status: 400, field: "jobs[3].kind"},
		{name: "NUL in payload", body: `{"jobs":[{"kind":"a"},{"kind":"b","payload":{"k":"\u0000"}}]}`, status: 400, field: "jobs[1].payload"},
		{name: "control character in queue", body: `{"jobs":[{"kind":"a"},{"kind":"b","queue":"q\r"}]}`, status: 400, field: "jobs[1].queue"},
		{name: "payload key given twice", body: `{"jobs":[{"kind":"a"},{"kind":"b","payload":{"k":1,"k":2}}]}`, status: 400, field: "jobs[1].payload"},
		{name: "unknown field", body: `{"jobs":[{"kind":"a","extra":true}]}`, status: 400, field: "jobs[0].extra"},
		{name: "field in wrong case", body: `{"jobs":[{"kind":"a"},{"KIND":"a"}]}`, status: 400, field: "jobs[1].KIND"},
		{name: "wrong type", body: `{"jobs":[{"kind":"a"},{"kind":"a","priority":"high"}]}`, status: 400, field: "jobs[1].priority"},
		{name: "job not an object", body: `{"jobs":[{"kind":"a"},{"kind":"b"},"c"]}`, status: 400, field: "jobs[2]"},
		{name: "job null", body: `{"jobs":[null]}`, status: 400, field: "jobs[0]"},
		{name: "bad delay", body: `{"jobs":[{"kind":"a","delay":"soon"}]}`, status: 400, field: "jobs[0].delay"},
		{name: "priority out of range", body: `{"jobs":[{"kind":"a","priority":40000}]}`, status: 400, field: "jobs[0].priority"},
		{name: "empty batch", body: `{"jobs":[]}`, status: 400, field: "jobs"},
		{name: "null jobs", body: `{"jobs":null}`, status: 400, field: "jobs"},
		{name: "no jobs field", body: `{}`, status: 400, field: "jobs"},
		{name: "jobs not an array", body: `{"jobs":{"kind":"a"}}`, status: 400, field: "jobs"},
		{name: "unknown top-level field", body: `{"jobs":[{"kind":"a"}],"queue":"q"}`, status: 400, field: "queue"},
		{name: "trailing data", body: `{"jobs":[{"kind":"a"}]}]`, status: 400},
		{name: "malformed", body: `{"jobs":[{"kind":"a"}`, status: 400},
		{name: "invalid UTF-8", body: "{\"jobs\":[{\"kind\":\"\xfe\"}]}", status: 400},
		{name: "Idempotency-Key", body: `{"jobs":[{"kind":"a"}]}`, header: []string{"Idempotency-Key", "k"}, status: 400, field: "Idempotency-Key"},
		{name: "wrong Content-Type", body: `{"jobs":[{"kind":"a"}]}`, header: []string{"Content-Type", "text/json"}, status: 415, field: "Content-Type"},
		{name: "gzip Content-Encoding", body: gzipped(t, `{"jobs":[{"kind":"a"}]}`), header: []string{"Content-Encoding", "gzip"}, status: 415, field: "Content-Encoding"},
		{name: "br Content-Encoding on a plain body", body: `{"jobs":[{"kind":"a"}]}`, header: []string{"Content-Encoding", "br"}, status: 415, field: "Content-Encoding"},
	}
	e := setup(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, e.do(t, "POST", "/v1/jobs/batch", tt.body, tt.header...), tt.status, tt.field)
			if n := dbtest.CountJobs(t, e.pool); n != 0 {
				t.Errorf("%d jobs written", n)
			}
		})
	}
}

func TestEnqueueBatch_ErrorMessageNamesTheJob(t *testing.T) {
	t.Parallel()
	e := setup(t)
	got := wantError(t, e.do(t, "POST", "/v1/jobs/batch", `{"jobs":[{"kind":"a"},{"kind":"a"},{"kind":"a"},{}]}`), http.StatusBadRequest, "jobs[3].kind")
	if !strings.HasPrefix(got.Error, "jobs[3]: ") {
		t.Errorf("error = %q, want it to name jobs[3]", got.Error)
	}
}

func TestEnqueue_TakesPriorityAndMaxAttemptsAsAnyNumberWhoseValueIsWhole(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tests := []struct {
		body                  string
		priority, maxAttempts int64
	}{
		{`{"kind":"a","priority":-3.2768e4,"max_attempts":1.0}`, -32768, 1},
		{`{"kind":"a","priority":32767.000,"max_attempts":10e2}`, 32767, 1000},
		{`{"kind":"a","priority":-0.0,"max_attempts":25E+0}`, 0, 25},
		{`{"kind":"a","priority":70e-1,"max_attempts":0.3e1}`, 7, 3},
	}
	for _, tt := range tests {
		t.Run(tt.body, func(t *testing.T) {
			got := e.enqueue(t, tt.body)
			if int64(got.Priority) != tt.priority || int64(got.MaxAttempts) != tt.maxAttempts {
				t.Errorf("priority %d, max_attempts %d; want %d, %d", got.Priority, got.MaxAttempts, tt.priority, tt.maxAttempts)
			}
		})
	}
	rec := e.do(t, "POST", "/v1/jobs/batch", `{"jobs":[{"kind":"a","priority":2.0},{"kind":"a","priority":2e0,"max_attempts":5.0}]}`)
	wantStatus(t, rec, http.StatusCreated)
}

// The decoder leaves the integer fields to validation, which names them
// itself: encoding/json adds a field's name to its own type errors, but
// not, when built with GOEXPERIMENT=jsonv2, to those of a type's
// UnmarshalJSON.
func TestDecodeJob_LeavesTheIntegersToValidationWhichNamesThem(t *testing.T) {
	tests := []struct{ body, field string }{
		{`{"kind":"a","priority":"1"}`, "priority"},
		{`{"kind":"a","priority":1.5}`, "priority"},
		{`{"kind":"a","priority":"\ud800"}`, "priority"},
		{`{"kind":"a","max_attempts":[1]}`, "max_attempts"},
		{`{"kind":"a","max_attempts":1e400}`, "max_attempts"},
	}
	for _, tt := range tests {
		req, err := decodeJob([]byte(tt.body))
		if err != nil {
			t.Errorf("decodeJob(%s) = %v, want the %s left to validation", tt.body, err, tt.field)
			continue
		}
		_, err = validateJob(req, nil, time.Now())
		var ae *apiError
		want := tt.field + " must be " + fieldTypes[tt.field]
		if !errors.As(err, &ae) || ae.field != tt.field || ae.msg != want {
			t.Errorf("validateJob of %s = %v, want a 400 on field %s: %q", tt.body, err, tt.field, want)
		}
	}
}

func TestParseWhole_TakesEveryJSONNumberWhoseValueIsWholeAndFitsInt64(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"-0", 0, true}, {"0.0", 0, true}, {"-0.0e5", 0, true}, {"0e-999999999999999999999", 0, true},
		{"7", 7, true}, {"7.0", 7, true}, {"7.000", 7, true}, {"7e0", 7, true}, {"70e-1", 7, true}, {"0.7e1", 7, true}, {"7E+0", 7, true},
		{"-12.50e1", -125, true}, {"1e18", 1_000_000_000_000_000_000, true},
		{"9223372036854775807", math.MaxInt64, true}, {"9223372036854775807.0", math.MaxInt64, true},
		{"-9223372036854775808", math.MinInt64, true}, {"-9.223372036854775808e18", math.MinInt64, true},
		{"7.5", 0, false}, {"75e-1", 0, false}, {"0.1", 0, false}, {"1.0000000000000000001", 0, false},
		{"9223372036854775808", 0, false}, {"9223372036854775808.0", 0, false}, {"1e19", 0, false},
		{"-9223372036854775809", 0, false}, {"1e99999999999999999999", 0, false},
		{"1e9223372036854775807", 0, false}, {"1.5e-9223372036854775808", 0, false}, {"10e-9223372036854775808", 0, false},
		{`"7"`, 0, false}, {"true", 0, false}, {"[7]", 0, false}, {"{}", 0, false},
	}
	for _, tt := range tests {
		got, ok := parseWhole(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("parseWhole(%s) = %d, %t; want %d, %t", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}
