package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// httpTimeout bounds one request; the server answers within its own
// 10 s database timeout.
const httpTimeout = 20 * time.Second

// httpStats is the HTTP client of a run and its record of the
// enqueues' answers.
type httpStats struct {
	once   sync.Once
	client *http.Client

	mu     sync.Mutex
	events []httpEvent
}

// httpEvent is the answer to one enqueue request.
type httpEvent struct {
	at     time.Time
	status int // 0 for a network error
	leak   string
}

func (s *httpStats) record(ev httpEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, ev)
}

// do sends one request to the run's API and returns the status and body.
// With auth, it carries the run's API token (if any).
func (s *httpStats) do(ctx context.Context, r *scenarioRun, method, path string, header http.Header, body []byte, auth bool) (int, []byte, error) {
	s.once.Do(func() {
		s.client = &http.Client{
			Timeout:   httpTimeout,
			Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second},
		}
	})
	req, err := http.NewRequestWithContext(ctx, method, r.apiBase+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, fmt.Errorf("build request: %w", err)
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	if auth && r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, b, fmt.Errorf("read the answer: %w", err)
	}
	return resp.StatusCode, b, nil
}

// leakMarkers are fragments that must never appear in an error a
// client sees: driver and server internals, addresses, SQL, Go traces.
var leakMarkers = []string{
	"pgx", "pgconn", "sqlstate", "postgres", "dial tcp", "connection refused",
	"127.0.0.1", "[::1]", ".go:", "goroutine", "panic", "fatal:", "syntax error",
	"select ", "insert ", "update ", "relation ", "jobs_", "context deadline", "eof",
}

// leakIn returns what an error answer reveals that it should not, or "".
func leakIn(status int, body []byte) string {
	if status < 400 {
		return ""
	}
	var e struct {
		Error string `json:"error"`
		Field string `json:"field"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&e); err != nil || e.Error == "" {
		return fmt.Sprintf("not a JSON error body: %.80q", body)
	}
	if status < 500 {
		return "" // a 4xx may quote the client's own input back
	}
	lower := strings.ToLower(e.Error)
	for _, m := range leakMarkers {
		if strings.Contains(lower, m) {
			return fmt.Sprintf("%q reveals %q", e.Error, m)
		}
	}
	return ""
}

// enqueueHTTP enqueues jobs one at a time through POST /v1/jobs, at an even
// pace over the duration, from a few concurrent clients. Each job has an
// Idempotency-Key and is retried under it, on a 5xx or a network error,
// until it is acknowledged: an enqueue cut by a restart is never doubled.
func (r *scenarioRun) enqueueHTTP(ctx context.Context, jobs []plannedJob) error {
	type item struct {
		i   int
		job plannedJob
	}
	ch := make(chan item)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for it := range ch {
				r.enqueueOneHTTP(ctx, fmt.Sprintf("chaos-%d", it.i), it.job)
			}
		}()
	}
	interval := r.cfg.Duration / time.Duration(len(jobs))
	start := time.Now()
	for i, j := range jobs {
		if !sleepUntil(ctx, start.Add(time.Duration(i)*interval)) {
			break
		}
		select {
		case ch <- item{i, j}:
		case <-ctx.Done():
		}
	}
	close(ch)
	wg.Wait()
	if ctx.Err() != nil {
		return fmt.Errorf("chaos: enqueue: %w", ctx.Err())
	}
	return nil
}

// enqueueGiveUp bounds the retries of one enqueue.
const enqueueGiveUp = 2 * time.Minute

func (r *scenarioRun) enqueueOneHTTP(ctx context.Context, key string, job plannedJob) {
	body, err := json.Marshal(map[string]any{"kind": job.Kind, "payload": job.Payload, "max_attempts": job.MaxAttempts})
	if err != nil {
		panic(err)
	}
	header := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}}
	r.ledger.sent(key)
	deadline := time.Now().Add(enqueueGiveUp)
	for ctx.Err() == nil {
		status, resp, err := r.http.do(ctx, r, http.MethodPost, "/v1/jobs", header, body, true)
		ev := httpEvent{at: time.Now(), status: status}
		if err != nil {
			ev.status = 0
		} else {
			ev.leak = leakIn(status, resp)
		}
		r.http.record(ev)
		if err == nil && (status == http.StatusCreated || status == http.StatusOK) {
			var j struct {
				ID int64 `json:"id"`
			}
			if json.Unmarshal(resp, &j) == nil && j.ID > 0 {
				r.ledger.ack([]int64{j.ID}, "http")
			}
			return
		}
		if err == nil && status < 500 {
			r.log.Error("enqueue refused", "status", status, "body", string(resp))
			return
		}
		if time.Now().After(deadline) {
			r.log.Error("enqueue given up", "key", key, "status", status, "err", err)
			return
		}
		sleepUntil(ctx, time.Now().Add(100*time.Millisecond))
	}
}

// BadInputResult is what the bad-input burst found.
type BadInputResult struct {
	// Requests is how many hostile requests were sent.
	Requests int `json:"requests"`
	// ByStatus counts their answers by HTTP status ("0" for no answer).
	ByStatus map[string]int `json:"by_status"`
	// Cases lists each kind of request and the answers it got.
	Cases []BadInputCase `json:"cases"`
	// Not4xx lists the requests answered otherwise than with a 4xx.
	Not4xx []string `json:"not_4xx,omitempty"`
	// Leaks lists answers whose body was not a plain JSON error.
	Leaks []string `json:"leaks,omitempty"`
	// ReplayStatus is the answer to an exact replay of an enqueue under its
	// Idempotency-Key (want 200), and ReplaySameJob whether it named the
	// original job.
	ReplayStatus  int  `json:"replay_status"`
	ReplaySameJob bool `json:"replay_same_job"`
}

// BadInputCase is one kind of hostile request.
type BadInputCase struct {
	// Name describes the request.
	Name string `json:"name"`
	// Statuses counts its answers by HTTP status.
	Statuses map[string]int `json:"statuses"`
}

// badRequest is a request that the API must refuse with a 4xx.
type badRequest struct {
	name   string
	method string
	path   string
	header http.Header
	body   []byte
	// auth: "" sends the right token, "none" none, "wrong" a wrong one.
	auth string
}

// badRequests returns the hostile requests; keyTaken is an Idempotency-Key
// already used for another job.
func badRequests(keyTaken string) []badRequest {
	js := http.Header{"Content-Type": {"application/json"}}
	withKey := func(keys ...string) http.Header {
		return http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": keys}
	}
	post := func(name, body string) badRequest {
		return badRequest{name: name, method: "POST", path: "/v1/jobs", header: js, body: []byte(body)}
	}
	batch := func(name, body string) badRequest {
		return badRequest{name: name, method: "POST", path: "/v1/jobs/batch", header: js, body: []byte(body)}
	}
	get := func(name, path string) badRequest {
		return badRequest{name: name, method: "GET", path: path}
	}
	long := strings.Repeat("k", 129)
	manyJobs := `{"jobs":[` + strings.TrimSuffix(strings.Repeat(`{"kind":"noop"},`, 1001), ",") + `]}`
	reqs := []badRequest{
		post("malformed JSON", `{"kind": "noop",`),
		post("array body", `[{"kind":"noop"}]`),
		post("string body", `"noop"`),
		post("null body", `null`),
		post("empty body", ``),
		post("blank body", "  \n "),
		post("missing kind", `{}`),
		post("kind not a string", `{"kind": 42}`),
		post("empty kind", `{"kind": ""}`),
		post("kind too long", `{"kind":"`+long+`"}`),
		post("NUL in kind", `{"kind":"no\u0000op"}`),
		post("NUL in payload", `{"kind":"noop","payload":{"k":"a\u0000b"}}`),
		post("NUL in payload key", `{"kind":"noop","payload":{"\u0000":1}}`),
		post("lone surrogate in payload", `{"kind":"noop","payload":"\ud800"}`),
		post("number too large for PostgreSQL", `{"kind":"noop","payload":1`+strings.Repeat("0", 140000)+`}`),
		post("payload nested too deep", `{"kind":"noop","payload":`+strings.Repeat("[", 20000)+strings.Repeat("]", 20000)+`}`),
		post("unknown field", `{"kind":"noop","evil":true}`),
		post("duplicate key", `{"kind":"noop","kind":"sleep"}`),
		post("key in another case", `{"Kind":"noop"}`),
		post("payload key given twice", `{"kind":"noop","payload":{"amount":100,"amount":1}}`),
		{name: "job field in the query string", method: "POST", path: "/v1/jobs?queue=elsewhere", header: js, body: []byte(`{"kind":"noop"}`)},
		{name: "body marked compressed", method: "POST", path: "/v1/jobs", header: http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"br"}}, body: []byte(`{"kind":"noop"}`)},
		post("data after the object", `{"kind":"noop"} {"kind":"noop"}`),
		post("priority out of range", `{"kind":"noop","priority":40000}`),
		post("priority not an integer", `{"kind":"noop","priority":1.5}`),
		post("max_attempts zero", `{"kind":"noop","max_attempts":0}`),
		post("max_attempts too large", `{"kind":"noop","max_attempts":1001}`),
		post("max_attempts a string", `{"kind":"noop","max_attempts":"3"}`),
		post("run_at not a time", `{"kind":"noop","run_at":"tomorrow"}`),
		post("run_at too far", `{"kind":"noop","run_at":"2999-01-01T00:00:00Z"}`),
		post("negative delay", `{"kind":"noop","delay":"-5s"}`),
		post("delay and run_at", `{"kind":"noop","delay":"5s","run_at":"2030-01-01T00:00:00Z"}`),
		post("queue too long", `{"kind":"noop","queue":"`+long+`"}`),
		post("empty queue", `{"kind":"noop","queue":""}`),
		{name: "invalid UTF-8", method: "POST", path: "/v1/jobs", header: js, body: []byte("{\"kind\":\"no\xffop\"}")},
		{name: "wrong content type", method: "POST", path: "/v1/jobs", header: http.Header{"Content-Type": {"text/plain"}}, body: []byte(`{"kind":"noop"}`)},
		post("body over the size limit", `{"kind":"noop","payload":"`+strings.Repeat("x", 3<<19)+`"}`),
		{name: "header over the size limit", method: "POST", path: "/v1/jobs", header: http.Header{"Content-Type": {"application/json"}, "X-Junk": {strings.Repeat("j", 80<<10)}}, body: []byte(`{"kind":"noop"}`)},
		{name: "empty Idempotency-Key", method: "POST", path: "/v1/jobs", header: withKey(""), body: []byte(`{"kind":"noop"}`)},
		{name: "Idempotency-Key too long", method: "POST", path: "/v1/jobs", header: withKey(strings.Repeat("i", 256)), body: []byte(`{"kind":"noop"}`)},
		{name: "Idempotency-Key twice", method: "POST", path: "/v1/jobs", header: withKey("dup-a", "dup-b"), body: []byte(`{"kind":"noop"}`)},
		{name: "Idempotency-Key reused for another job", method: "POST", path: "/v1/jobs", header: withKey(keyTaken), body: []byte(`{"kind":"noop","payload":{"other":true}}`)},
		batch("batch without jobs", `{"jobs":[]}`),
		batch("batch of 1001 jobs", manyJobs),
		batch("batch with one bad job among good ones", `{"jobs":[{"kind":"noop"},{"kind":"noop"},{"kind":""},{"kind":"noop"}]}`),
		batch("batch job not an object", `{"jobs":[1]}`),
		batch("batch jobs not an array", `{"jobs":{"kind":"noop"}}`),
		{name: "batch with an Idempotency-Key", method: "POST", path: "/v1/jobs/batch", header: withKey("batch-key"), body: []byte(`{"jobs":[{"kind":"noop"}]}`)},
		{name: "no token", method: "POST", path: "/v1/jobs", header: js, body: []byte(`{"kind":"noop"}`), auth: "none"},
		{name: "wrong token", method: "POST", path: "/v1/jobs", header: js, body: []byte(`{"kind":"noop"}`), auth: "wrong"},
		{name: "wrong token on a batch", method: "POST", path: "/v1/jobs/batch", header: js, body: []byte(`{"jobs":[{"kind":"noop"}]}`), auth: "wrong"},
		get("id not a number", "/v1/jobs/abc"),
		get("id zero", "/v1/jobs/0"),
		get("id overflowing int64", "/v1/jobs/99999999999999999999"),
		get("SQL in the id", "/v1/jobs/1;DROP%20TABLE%20jobs"),
		get("path traversal in the id", "/v1/jobs/..%2F..%2Fetc%2Fpasswd"),
		get("missing job", "/v1/jobs/9223372036854775807"),
		get("SQL in a filter", "/v1/jobs?state=%27%20OR%201%3D1--"),
		get("limit too large", "/v1/jobs?limit=100000"),
		get("negative cursor", "/v1/jobs?after=-1"),
		get("limit with a sign", "/v1/jobs?limit=%2B2"),
		get("parameter on a job", "/v1/jobs/1?fields=all"),
		{name: "cancel a missing job", method: "POST", path: "/v1/jobs/9223372036854775807/cancel"},
		{name: "retry a missing job", method: "POST", path: "/v1/jobs/9223372036854775807/retry"},
		{name: "wrong method", method: "DELETE", path: "/v1/jobs"},
		get("unknown path", "/v1/nope"),
	}
	return reqs
}

// sendBadInput sends the hostile requests (BadInputRounds times each, 8 at
// a time) while the workload runs, after setting up an enqueue under an
// Idempotency-Key for the key-reuse case, and replays that enqueue exactly
// at the end (which must return the original job).
func (r *scenarioRun) sendBadInput(ctx context.Context) error {
	const key = "chaos-bad-input-original"
	original := []byte(`{"kind":"noop"}`)
	header := http.Header{"Content-Type": {"application/json"}, "Idempotency-Key": {key}}
	r.ledger.sent(key)
	status, body, err := r.http.do(ctx, r, "POST", "/v1/jobs", header, original, true)
	if err != nil {
		return fmt.Errorf("chaos: set up the bad-input burst: enqueue under a key: %w", err)
	}
	if status != http.StatusCreated {
		return fmt.Errorf("chaos: set up the bad-input burst: enqueue under a key: status %d: %s", status, body)
	}
	var job struct {
		ID int64 `json:"id"`
	}
	if err := json.Unmarshal(body, &job); err != nil {
		return fmt.Errorf("chaos: set up the bad-input burst: read the job: %w", err)
	}
	if job.ID == 0 {
		return fmt.Errorf("chaos: set up the bad-input burst: no job id in the answer: %s", body)
	}
	r.ledger.ack([]int64{job.ID}, "http")

	reqs := badRequests(key)
	res := &BadInputResult{ByStatus: map[string]int{}}
	cases := make([]BadInputCase, len(reqs))
	for i, q := range reqs {
		cases[i] = BadInputCase{Name: q.name, Statuses: map[string]int{}}
	}
	r.recordFault(ctx, "bad_input", "api", 0, fmt.Sprintf("%d kinds of hostile request, %d times each", len(reqs), r.cfg.BadInputRounds))

	type task struct{ i int }
	tasks := make(chan task)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range tasks {
				q := reqs[t.i]
				h := q.header.Clone()
				if h == nil {
					h = http.Header{}
				}
				switch q.auth {
				case "none":
				case "wrong":
					h.Set("Authorization", "Bearer not-the-token")
				default:
					if r.token != "" {
						h.Set("Authorization", "Bearer "+r.token)
					}
				}
				status, body, err := r.http.do(ctx, r, q.method, q.path, h, q.body, false)
				if err != nil {
					status = 0
				}
				leak := leakIn(status, body)
				mu.Lock()
				res.Requests++
				res.ByStatus[strconv.Itoa(status)]++
				cases[t.i].Statuses[strconv.Itoa(status)]++
				if status < 400 || status > 499 {
					res.Not4xx = append(res.Not4xx, fmt.Sprintf("%s: %d %v %.120s", q.name, status, err, body))
				}
				if leak != "" && status != http.StatusRequestHeaderFieldsTooLarge {
					// Go's server answers 431 in plain text before any
					// handler runs; it reveals nothing.
					res.Leaks = append(res.Leaks, q.name+": "+leak)
				}
				mu.Unlock()
			}
		}()
	}
	for range r.cfg.BadInputRounds {
		for _, i := range r.permutation(len(reqs)) {
			select {
			case tasks <- task{i}:
			case <-ctx.Done():
			}
		}
	}
	close(tasks)
	wg.Wait()
	res.Cases = cases
	slices.Sort(res.Not4xx)
	res.Not4xx = slices.Compact(res.Not4xx)
	slices.Sort(res.Leaks)
	res.Leaks = slices.Compact(res.Leaks)

	status, body, err = r.http.do(ctx, r, "POST", "/v1/jobs", header, original, true)
	if err != nil {
		return fmt.Errorf("chaos: replay the keyed enqueue: %w", err)
	}
	var replay struct {
		ID int64 `json:"id"`
	}
	res.ReplayStatus = status
	res.ReplaySameJob = json.Unmarshal(body, &replay) == nil && replay.ID == job.ID
	r.mu.Lock()
	r.details.badInput = res
	r.mu.Unlock()
	if ctx.Err() != nil {
		return fmt.Errorf("chaos: bad-input burst interrupted: %w", ctx.Err())
	}
	return nil
}

// permutation returns a random order of 0..n-1.
func (r *scenarioRun) permutation(n int) []int {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.Perm(n)
}
