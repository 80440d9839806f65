// Package builtin holds the job handlers that ship with the relay command:
// small, deterministic workloads for trying Relay out, for benchmarks and
// for failure testing. Register adds them all to a worker.
//
// Every payload is a JSON object. A missing or null payload counts as {}
// and a missing field takes its default; an unknown field, a negative or
// absurdly large number, or anything that is not an object fails the job
// permanently (worker.Permanent), since retrying cannot fix it.
//
// The kinds and their payloads:
//
//   - hash, {"sleep_ms": 10, "iterations": 1000}: waits sleep_ms
//     milliseconds, then runs iterations rounds of SHA-256 chained over a
//     32-byte buffer that starts zeroed, and returns the final digest in hex
//     as "digest". The benchmark workload: a little latency, a little CPU.
//     Limits: sleep_ms ≤ 3,600,000 (1 hour), iterations ≤ 10,000,000.
//   - sleep, {"ms": 0}: waits ms milliseconds (≤ 1 hour) and returns
//     "slept_ms".
//   - fail, {"times": 1}: fails its first times attempts with an ordinary,
//     retryable error, then succeeds and returns "failed_attempts". A job
//     whose max_attempts is not above times ends dead. Limit: 1,000,000.
//   - noop, {}: does nothing and succeeds.
//
// Waiting respects the job's context: a handler whose job is cancelled, whose
// lease is lost or whose worker shuts down returns the context's cause (for
// example worker.ErrJobCancelled) at once, and hash also checks it between
// rounds.
//
// Each result records which execution produced it, beside the kind's own
// fields:
//
//	{"worker": "host-1234-ab12", "pid": 1234, "attempt": 2, "fence": 2, "digest": "…"}
//
// so that at-least-once delivery (a job that ran twice, on which worker) can
// be observed from the outside.
package builtin

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/relayq/relay/worker"
)

// The kinds this package handles.
const (
	// KindHash sleeps, then hashes: the benchmark workload.
	KindHash = "hash"
	// KindSleep waits for a while.
	KindSleep = "sleep"
	// KindFail fails a given number of attempts, then succeeds.
	KindFail = "fail"
	// KindNoop does nothing.
	KindNoop = "noop"
)

// Defaults and limits of the payloads.
const (
	// DefaultHashSleepMs is hash's default sleep_ms.
	DefaultHashSleepMs = 10
	// DefaultHashIterations is hash's default iterations.
	DefaultHashIterations = 1000
	// DefaultFailTimes is fail's default times.
	DefaultFailTimes = 1
	// MaxSleepMs bounds every wait a payload asks for: one hour.
	MaxSleepMs = int64(time.Hour / time.Millisecond)
	// MaxHashIterations bounds hash's iterations.
	MaxHashIterations = 10_000_000
	// MaxFailTimes bounds fail's times.
	MaxFailTimes = 1_000_000
)

// hashCheckEvery is how many hash rounds run between checks of the context.
const hashCheckEvery = 1 << 14

// Result is what every built-in handler returns, stored as JSON with the
// completed job. The first four fields say which execution produced it; the
// others belong to one kind each and are left out by the rest.
type Result struct {
	// Worker is the id of the worker that ran the job.
	Worker string `json:"worker"`
	// PID is the process id of that worker.
	PID int `json:"pid"`
	// Attempt is the attempt that succeeded (1 for the first).
	Attempt int `json:"attempt"`
	// Fence is the claim's fence.
	Fence int64 `json:"fence"`

	// Digest is hash's final digest, in hex.
	Digest string `json:"digest,omitempty"`
	// Iterations is how many rounds hash ran.
	Iterations *int64 `json:"iterations,omitempty"`
	// SleptMs is how long sleep (or hash, before hashing) waited.
	SleptMs *int64 `json:"slept_ms,omitempty"`
	// FailedAttempts is how many attempts fail failed before this one.
	FailedAttempts *int64 `json:"failed_attempts,omitempty"`
}

// Handlers returns a new handler for each built-in kind, by kind.
func Handlers() map[string]worker.Handler {
	return map[string]worker.Handler{
		KindHash:  worker.HandlerFunc(hashJob),
		KindSleep: worker.HandlerFunc(sleepJob),
		KindFail:  worker.HandlerFunc(failJob),
		KindNoop:  worker.HandlerFunc(noopJob),
	}
}

// Register registers every built-in handler with w.
func Register(w *worker.Worker) {
	for kind, h := range Handlers() {
		w.Handle(kind, h)
	}
}

// HashPayload is the payload of a hash job.
type HashPayload struct {
	SleepMs    int64 `json:"sleep_ms"`
	Iterations int64 `json:"iterations"`
}

// SleepPayload is the payload of a sleep job.
type SleepPayload struct {
	Ms int64 `json:"ms"`
}

// FailPayload is the payload of a fail job.
type FailPayload struct {
	Times int64 `json:"times"`
}

func hashJob(ctx context.Context, job *worker.Job) (any, error) {
	p := HashPayload{SleepMs: DefaultHashSleepMs, Iterations: DefaultHashIterations}
	if err := DecodePayload(job, &p); err != nil {
		return nil, err
	}
	if err := inRange(job.Kind, "sleep_ms", p.SleepMs, MaxSleepMs); err != nil {
		return nil, err
	}
	if err := inRange(job.Kind, "iterations", p.Iterations, MaxHashIterations); err != nil {
		return nil, err
	}
	if err := Sleep(ctx, time.Duration(p.SleepMs)*time.Millisecond); err != nil {
		return nil, err
	}
	var buf [sha256.Size]byte
	for i := int64(0); i < p.Iterations; i++ {
		if i%hashCheckEvery == 0 && ctx.Err() != nil {
			return nil, fmt.Errorf("hash interrupted after %d iterations: %w", i, context.Cause(ctx))
		}
		buf = sha256.Sum256(buf[:])
	}
	r := NewResult(job)
	r.Digest = hex.EncodeToString(buf[:])
	r.Iterations = &p.Iterations
	r.SleptMs = &p.SleepMs
	return r, nil
}

func sleepJob(ctx context.Context, job *worker.Job) (any, error) {
	var p SleepPayload
	if err := DecodePayload(job, &p); err != nil {
		return nil, err
	}
	if err := inRange(job.Kind, "ms", p.Ms, MaxSleepMs); err != nil {
		return nil, err
	}
	if err := Sleep(ctx, time.Duration(p.Ms)*time.Millisecond); err != nil {
		return nil, err
	}
	r := NewResult(job)
	r.SleptMs = &p.Ms
	return r, nil
}

func failJob(_ context.Context, job *worker.Job) (any, error) {
	p := FailPayload{Times: DefaultFailTimes}
	if err := DecodePayload(job, &p); err != nil {
		return nil, err
	}
	if err := inRange(job.Kind, "times", p.Times, MaxFailTimes); err != nil {
		return nil, err
	}
	if int64(job.Attempt) <= p.Times {
		return nil, fmt.Errorf("fail: attempt %d fails as asked (times %d)", job.Attempt, p.Times)
	}
	r := NewResult(job)
	r.FailedAttempts = &p.Times
	return r, nil
}

func noopJob(_ context.Context, job *worker.Job) (any, error) {
	if err := DecodePayload(job, &struct{}{}); err != nil {
		return nil, err
	}
	return NewResult(job), nil
}

// NewResult starts a Result for job, run by this process.
func NewResult(job *worker.Job) *Result {
	return &Result{Worker: job.WorkerID, PID: os.Getpid(), Attempt: job.Attempt, Fence: job.Fence}
}

// DecodePayload reads job's payload, a JSON object, strictly into v, which
// holds the defaults: a field the payload leaves out keeps its default, and
// a missing or null payload leaves v as it is. Any malformed payload is a
// permanent error.
func DecodePayload(job *worker.Job, v any) error {
	payload := bytes.TrimSpace(job.Payload)
	if len(payload) == 0 || bytes.Equal(payload, []byte("null")) {
		return nil
	}
	if payload[0] != '{' {
		return worker.Permanent(fmt.Errorf("%s: payload must be a JSON object", job.Kind))
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return worker.Permanent(fmt.Errorf("%s: invalid payload: %w", job.Kind, err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return worker.Permanent(fmt.Errorf("%s: invalid payload: data after the JSON object", job.Kind))
	}
	return nil
}

// inRange checks that a payload number is within [0, max].
func inRange(kind, field string, n, max int64) error {
	if n < 0 || n > max {
		return worker.Permanent(fmt.Errorf("%s: %s must be between 0 and %d, got %d", kind, field, max, n))
	}
	return nil
}

// Sleep waits for d, or returns the cause of ctx's cancellation if that
// comes first. On Linux it is precise to the kernel's timer, not to Go's
// millisecond timer granularity (see sleep).
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	return sleep(ctx, d)
}

// timerSleep is sleep on a Go timer.
func timerSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
