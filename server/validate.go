package server

import (
	"encoding/json"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/relayq/relay/internal/jsonb"
)

// jobRequest is one job to enqueue, as sent by a client: the body of
// POST /v1/jobs, and each element of "jobs" in POST /v1/jobs/batch.
//
//   - kind (required): the name handlers are registered under, 1 to 128 bytes.
//   - queue: 1 to 128 bytes; default "default".
//   - payload: any JSON value, null included; default {}.
//   - priority: an integer from -32768 to 32767; lower runs first; default 0.
//   - run_at: an RFC 3339 timestamp, from 1970 to one year from now.
//   - delay: a Go duration string such as "500ms", "5s" or "1h30m", from 0 to
//     one year (8760h). Not together with run_at. Precision is a
//     millisecond; anything finer is dropped. Without run_at and delay the
//     job is ready at once.
//   - max_attempts: an integer from 1 to 1000; default 25.
type jobRequest struct {
	Kind        *string         `json:"kind"`
	Queue       *string         `json:"queue"`
	Payload     json.RawMessage `json:"payload"`
	Priority    *int64          `json:"priority"`
	RunAt       *string         `json:"run_at"`
	Delay       *string         `json:"delay"`
	MaxAttempts *int64          `json:"max_attempts"`
}

// jobRequestFields lists the JSON names of jobRequest.
var jobRequestFields = []string{"kind", "queue", "payload", "priority", "run_at", "delay", "max_attempts"}

// jobSpec is a validated jobRequest with every default applied.
type jobSpec struct {
	Queue          string
	Kind           string
	Payload        json.RawMessage
	Priority       int16
	MaxAttempts    int32
	RunAt          *time.Time // nil: DelayMs after now() in the database
	DelayMs        int64
	IdempotencyKey *string
}

// decodeJob decodes one job object strictly (see decodeStrict).
func decodeJob(data []byte) (jobRequest, error) {
	var req jobRequest
	err := decodeStrict(data, &req, jobRequestFields)
	return req, err
}

// validateJob is the one place an enqueue request is validated, for single
// and batch enqueueing alike. key is the Idempotency-Key header, or nil.
// now is the time run_at is checked against. Errors are 400s naming the
// field at fault.
func validateJob(req jobRequest, key *string, now time.Time) (jobSpec, error) {
	spec := jobSpec{
		Queue:       DefaultQueue,
		Payload:     json.RawMessage(`{}`),
		MaxAttempts: DefaultMaxAttempts,
	}

	if req.Kind == nil || *req.Kind == "" {
		return spec, badRequest("kind", "kind is required")
	}
	if err := checkName("kind", *req.Kind, MaxNameBytes); err != nil {
		return spec, err
	}
	spec.Kind = *req.Kind

	if req.Queue != nil {
		if err := checkName("queue", *req.Queue, MaxNameBytes); err != nil {
			return spec, err
		}
		spec.Queue = *req.Queue
	}

	if len(req.Payload) > 0 {
		if err := jsonb.Check(req.Payload); err != nil {
			return spec, badRequest("payload", "payload %v", err)
		}
		spec.Payload = req.Payload
	}

	if req.Priority != nil {
		if *req.Priority < math.MinInt16 || *req.Priority > math.MaxInt16 {
			return spec, badRequest("priority", "priority must be an integer from %d to %d", math.MinInt16, math.MaxInt16)
		}
		spec.Priority = int16(*req.Priority)
	}

	if req.MaxAttempts != nil {
		if *req.MaxAttempts < 1 || *req.MaxAttempts > MaxMaxAttempts {
			return spec, badRequest("max_attempts", "max_attempts must be an integer from 1 to %d", MaxMaxAttempts)
		}
		spec.MaxAttempts = int32(*req.MaxAttempts)
	}

	if req.RunAt != nil && req.Delay != nil {
		return spec, badRequest("delay", "give run_at or delay, not both")
	}
	if req.RunAt != nil {
		t, err := parseRunAt(*req.RunAt, now)
		if err != nil {
			return spec, err
		}
		spec.RunAt = &t
	}
	if req.Delay != nil {
		d, err := parseDelay(*req.Delay)
		if err != nil {
			return spec, err
		}
		spec.DelayMs = d.Milliseconds()
	}

	if key != nil {
		if *key == "" {
			return spec, badRequest("Idempotency-Key", "Idempotency-Key must not be empty")
		}
		if err := checkName("Idempotency-Key", *key, MaxIdempotencyKeyBytes); err != nil {
			return spec, err
		}
		spec.IdempotencyKey = key
	}
	return spec, nil
}

// checkName checks a name stored as PostgreSQL text: not empty, at most
// maxBytes bytes, valid UTF-8, and free of NUL, which text cannot hold.
func checkName(field, s string, maxBytes int) error {
	switch {
	case s == "":
		return badRequest(field, "%s must not be empty", field)
	case len(s) > maxBytes:
		return badRequest(field, "%s must be at most %d bytes", field, maxBytes)
	case !utf8.ValidString(s):
		return badRequest(field, "%s must be valid UTF-8", field)
	case strings.IndexByte(s, 0) >= 0:
		return badRequest(field, `%s must not contain NUL characters (\u0000)`, field)
	}
	return nil
}

// earliestRunAt is the earliest run_at accepted: anything before is surely
// a mistake, and a run_at in the past only means "now" anyway.
var earliestRunAt = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)

func parseRunAt(s string, now time.Time) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, badRequest("run_at", "run_at must be an RFC 3339 timestamp such as 2030-01-02T15:04:05Z")
	}
	if t.Before(earliestRunAt) {
		return time.Time{}, badRequest("run_at", "run_at must not be before 1970")
	}
	if t.After(now.Add(MaxDelay)) {
		return time.Time{}, badRequest("run_at", "run_at must be at most %s from now", MaxDelay)
	}
	return t, nil
}

func parseDelay(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, badRequest("delay", `delay must be a duration such as "5s" or "1h30m"`)
	}
	if d < 0 {
		return 0, badRequest("delay", "delay must not be negative")
	}
	if d > MaxDelay {
		return 0, badRequest("delay", "delay must be at most %s", MaxDelay)
	}
	return d, nil
}
