package builtin_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/builtin"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/worker"
)

func ptr[T any](v T) *T { return &v }

// chained returns the digest of n SHA-256 rounds over a zeroed 32-byte buffer.
func chained(n int) string {
	var b [32]byte
	for range n {
		b = sha256.Sum256(b[:])
	}
	return hex.EncodeToString(b[:])
}

func run(t *testing.T, ctx context.Context, kind, payload string, attempt int) (*builtin.Result, error) {
	t.Helper()
	h, ok := builtin.Handlers()[kind]
	if !ok {
		t.Fatalf("no handler for kind %q", kind)
	}
	job := &worker.Job{ID: 7, Queue: "default", Kind: kind, Attempt: attempt, MaxAttempts: 25,
		Fence: int64(attempt) + 1, WorkerID: "test-worker"}
	if payload != "" {
		job.Payload = json.RawMessage(payload)
	}
	res, err := h.Work(ctx, job)
	if err != nil {
		if res != nil {
			t.Errorf("handler returned a result beside its error: %v", res)
		}
		return nil, err
	}
	r, ok := res.(*builtin.Result)
	if !ok {
		t.Fatalf("result is %T, want *builtin.Result", res)
	}
	return r, nil
}

func TestHandlers_SucceedWithTheirOutputAndWhoRanThem(t *testing.T) {
	base := builtin.Result{Worker: "test-worker", PID: os.Getpid(), Attempt: 1, Fence: 2}
	with := func(f func(r *builtin.Result)) *builtin.Result {
		r := base
		f(&r)
		return &r
	}
	tests := []struct {
		name    string
		kind    string
		payload string
		attempt int
		want    *builtin.Result
	}{
		{"hash with defaults", builtin.KindHash, "", 1, with(func(r *builtin.Result) {
			r.Digest, r.Iterations, r.SleptMs = chained(1000), ptr(int64(1000)), ptr(int64(10))
		})},
		{"hash with an empty object", builtin.KindHash, `{}`, 1, with(func(r *builtin.Result) {
			r.Digest, r.Iterations, r.SleptMs = chained(1000), ptr(int64(1000)), ptr(int64(10))
		})},
		{"hash with null payload", builtin.KindHash, `null`, 1, with(func(r *builtin.Result) {
			r.Digest, r.Iterations, r.SleptMs = chained(1000), ptr(int64(1000)), ptr(int64(10))
		})},
		{"hash with zero sleep and iterations", builtin.KindHash, `{"sleep_ms":0,"iterations":0}`, 1, with(func(r *builtin.Result) {
			r.Digest, r.Iterations, r.SleptMs = chained(0), ptr(int64(0)), ptr(int64(0))
		})},
		{"hash with given iterations", builtin.KindHash, ` {"iterations": 3, "sleep_ms": 1} `, 1, with(func(r *builtin.Result) {
			r.Digest, r.Iterations, r.SleptMs = chained(3), ptr(int64(3)), ptr(int64(1))
		})},
		{"sleep", builtin.KindSleep, `{"ms":5}`, 1, with(func(r *builtin.Result) { r.SleptMs = ptr(int64(5)) })},
		{"sleep with defaults", builtin.KindSleep, `{}`, 1, with(func(r *builtin.Result) { r.SleptMs = ptr(int64(0)) })},
		{"fail succeeds after its failures", builtin.KindFail, `{"times":2}`, 3, with(func(r *builtin.Result) {
			r.Attempt, r.Fence, r.FailedAttempts = 3, 4, ptr(int64(2))
		})},
		{"fail with zero times succeeds at once", builtin.KindFail, `{"times":0}`, 1, with(func(r *builtin.Result) {
			r.FailedAttempts = ptr(int64(0))
		})},
		{"fail defaults to one failure", builtin.KindFail, ``, 2, with(func(r *builtin.Result) {
			r.Attempt, r.Fence, r.FailedAttempts = 2, 3, ptr(int64(1))
		})},
		{"noop", builtin.KindNoop, ``, 1, &base},
		{"noop with an empty object", builtin.KindNoop, `{}`, 1, &base},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := run(t, t.Context(), tt.kind, tt.payload, tt.attempt)
			if err != nil {
				t.Fatalf("handler failed: %v", err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResult_EncodesWhoRanItBesideTheKindsOutput(t *testing.T) {
	r := builtin.Result{Worker: "w1", PID: 42, Attempt: 2, Fence: 3, Digest: "ab", Iterations: ptr(int64(0)), SleptMs: ptr(int64(10))}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"worker":"w1","pid":42,"attempt":2,"fence":3,"digest":"ab","iterations":0,"slept_ms":10}`
	if diff := cmp.Diff(want, string(b)); diff != "" {
		t.Errorf("JSON (-want +got):\n%s", diff)
	}
}

func TestFail_FailsItsFirstAttemptsWithRetryableErrors(t *testing.T) {
	for attempt := 1; attempt <= 2; attempt++ {
		_, err := run(t, t.Context(), builtin.KindFail, `{"times":2}`, attempt)
		if err == nil {
			t.Fatalf("attempt %d succeeded, want failure", attempt)
		}
		if worker.IsPermanent(err) {
			t.Errorf("attempt %d: error %v is permanent, want retryable", attempt, err)
		}
	}
}

func TestHandlers_RejectMalformedPayloadsPermanently(t *testing.T) {
	tests := []struct {
		name, kind, payload, wantInErr string
	}{
		{"hash unknown field", builtin.KindHash, `{"iterations":1,"rounds":2}`, "unknown field"},
		{"hash negative iterations", builtin.KindHash, `{"iterations":-1}`, "iterations must be between 0 and 10000000"},
		{"hash absurd iterations", builtin.KindHash, `{"iterations":10000001}`, "iterations must be between"},
		{"hash negative sleep", builtin.KindHash, `{"sleep_ms":-5}`, "sleep_ms must be between"},
		{"hash sleep over an hour", builtin.KindHash, `{"sleep_ms":3600001}`, "sleep_ms must be between"},
		{"hash fractional iterations", builtin.KindHash, `{"iterations":1.5}`, "invalid payload"},
		{"hash string iterations", builtin.KindHash, `{"iterations":"10"}`, "invalid payload"},
		{"hash huge number", builtin.KindHash, `{"iterations":1e30}`, "invalid payload"},
		{"hash array payload", builtin.KindHash, `[1,2]`, "must be a JSON object"},
		{"hash string payload", builtin.KindHash, `"x"`, "must be a JSON object"},
		{"hash trailing data", builtin.KindHash, `{} {}`, "data after the JSON object"},
		{"hash not JSON", builtin.KindHash, `{iterations:1}`, "invalid payload"},
		{"sleep negative", builtin.KindSleep, `{"ms":-1}`, "ms must be between 0 and 3600000"},
		{"sleep over an hour", builtin.KindSleep, `{"ms":3600001}`, "ms must be between"},
		{"sleep unknown field", builtin.KindSleep, `{"seconds":1}`, "unknown field"},
		{"fail negative", builtin.KindFail, `{"times":-1}`, "times must be between"},
		{"fail absurd", builtin.KindFail, `{"times":1000001}`, "times must be between"},
		{"fail unknown field", builtin.KindFail, `{"count":1}`, "unknown field"},
		{"noop any field", builtin.KindNoop, `{"x":1}`, "unknown field"},
		{"noop number", builtin.KindNoop, `1`, "must be a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := run(t, t.Context(), tt.kind, tt.payload, 1)
			if err == nil {
				t.Fatal("handler accepted the payload")
			}
			if !worker.IsPermanent(err) {
				t.Errorf("error %v is not permanent", err)
			}
			if !strings.Contains(err.Error(), tt.wantInErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantInErr)
			}
			if !strings.Contains(err.Error(), tt.kind) {
				t.Errorf("error %q does not name the kind %q", err, tt.kind)
			}
		})
	}
}

func TestHandlers_ReturnTheCauseWhenTheirContextIsCancelled(t *testing.T) {
	tests := []struct{ name, kind, payload string }{
		{"sleep while waiting", builtin.KindSleep, `{"ms":60000}`},
		{"hash while waiting", builtin.KindHash, `{"sleep_ms":60000}`},
		{"hash while hashing", builtin.KindHash, `{"sleep_ms":0,"iterations":10000000}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(t.Context())
			time.AfterFunc(20*time.Millisecond, func() { cancel(worker.ErrJobCancelled) })
			start := time.Now()
			_, err := run(t, ctx, tt.kind, tt.payload, 1)
			if !errors.Is(err, worker.ErrJobCancelled) {
				t.Errorf("error = %v, want %v", err, worker.ErrJobCancelled)
			}
			if worker.IsPermanent(err) {
				t.Errorf("error %v is permanent", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("handler took %s to notice the cancellation", d)
			}
		})
	}
}

// TestRegister_RunsEveryKindOnARealWorker runs one job of each kind through a
// worker on a real database, and checks what the database recorded.
func TestRegister_RunsEveryKindOnARealWorker(t *testing.T) {
	pool := dbtest.New(t)
	q := db.New(pool)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	w, err := worker.New(pool, worker.Config{
		Slots:           4,
		ID:              "builtin-test",
		PollInterval:    50 * time.Millisecond,
		ReclaimInterval: 50 * time.Millisecond,
		Backoff:         func(int) time.Duration { return 10 * time.Millisecond },
		Logger:          slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	builtin.Register(w)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	}()

	type want struct {
		state   db.JobState
		attempt int
		result  map[string]any // fields checked in the result, beside worker and pid
		err     string         // substring of last_error
	}
	pid := float64(os.Getpid())
	tests := []struct {
		kind, payload string
		want          want
	}{
		{builtin.KindHash, `{"sleep_ms":1,"iterations":2}`, want{db.JobStateSucceeded, 1,
			map[string]any{"digest": chained(2), "iterations": 2.0, "slept_ms": 1.0, "attempt": 1.0, "fence": 1.0}, ""}},
		{builtin.KindSleep, `{"ms":1}`, want{db.JobStateSucceeded, 1, map[string]any{"slept_ms": 1.0, "attempt": 1.0}, ""}},
		{builtin.KindFail, `{"times":2}`, want{db.JobStateSucceeded, 3, map[string]any{"failed_attempts": 2.0, "attempt": 3.0, "fence": 3.0}, ""}},
		{builtin.KindNoop, `{}`, want{db.JobStateSucceeded, 1, map[string]any{"attempt": 1.0}, ""}},
		{builtin.KindHash, `{"iterations":-1}`, want{db.JobStateDead, 1, nil, "iterations must be between"}},
	}
	ids := make([]int64, len(tests))
	for i, tt := range tests {
		job, err := q.JobInsert(ctx, db.JobInsertParams{Queue: worker.DefaultQueue, Kind: tt.kind,
			Payload: json.RawMessage(tt.payload), MaxAttempts: 5})
		if err != nil {
			t.Fatalf("insert %s: %v", tt.kind, err)
		}
		ids[i] = job.ID
	}
	for i, tt := range tests {
		var job db.Job
		for {
			job, err = q.JobGet(ctx, ids[i])
			if err != nil {
				t.Fatalf("get job %d: %v", ids[i], err)
			}
			if job.State == db.JobStateSucceeded || job.State == db.JobStateDead {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatalf("%s %s: still %s after 30s", tt.kind, tt.payload, job.State)
			case <-time.After(20 * time.Millisecond):
			}
		}
		if job.State != tt.want.state || int(job.Attempt) != tt.want.attempt {
			t.Errorf("%s %s: state %s on attempt %d, want %s on attempt %d (last error %v)",
				tt.kind, tt.payload, job.State, job.Attempt, tt.want.state, tt.want.attempt, deref(job.LastError))
		}
		if tt.want.err != "" && !strings.Contains(deref(job.LastError), tt.want.err) {
			t.Errorf("%s %s: last error %q, want it to contain %q", tt.kind, tt.payload, deref(job.LastError), tt.want.err)
		}
		if tt.want.result == nil {
			continue
		}
		var got map[string]any
		if err := json.Unmarshal(job.Result, &got); err != nil {
			t.Fatalf("%s: result %s: %v", tt.kind, job.Result, err)
		}
		want := map[string]any{"worker": "builtin-test", "pid": pid}
		for k, v := range tt.want.result {
			want[k] = v
		}
		// Compare only the fields the test names, plus worker and pid.
		for k := range got {
			if _, ok := want[k]; !ok {
				delete(got, k)
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: result (-want +got):\n%s", tt.kind, diff)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
