package server

import (
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strings"
	"time"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/rfc3339"
)

// jobRequest is one job to enqueue, as sent by a client: the body of
// POST /v1/jobs, and each element of "jobs" in POST /v1/jobs/batch.
//
//   - kind (required): the name handlers are registered under, 1 to 128 bytes.
//   - queue: 1 to 128 bytes; default "default".
//   - payload: any JSON value, null included; default {}.
//   - priority: an integer from -32768 to 32767; lower runs first; default 0.
//     Here and in max_attempts, any number whose value is whole: 2, 2.0
//     and 2e0 alike (see wholeField).
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
	Priority    json.RawMessage `json:"priority"`
	RunAt       *string         `json:"run_at"`
	Delay       *string         `json:"delay"`
	MaxAttempts json.RawMessage `json:"max_attempts"`
}

// jobRequestFields lists the JSON names of jobRequest.
var jobRequestFields = []string{"kind", "queue", "payload", "priority", "run_at", "delay", "max_attempts"}

// decodeJob decodes one job object strictly (see decodeStrict).
func decodeJob(data []byte) (jobRequest, error) {
	var req jobRequest
	err := decodeStrict(data, &req, jobRequestFields)
	return req, err
}

// validateJob checks one enqueue request with the rules of package
// enqueue. key is the Idempotency-Key header, or nil. now is the time run_at
// is checked against. Errors are 400s naming the field at fault, as the API
// spells it.
func validateJob(req jobRequest, key *string, now time.Time) (client.Job, error) {
	priority, err := wholeField("priority", req.Priority)
	if err != nil {
		return client.Job{}, err
	}
	maxAttempts, err := wholeField("max_attempts", req.MaxAttempts)
	if err != nil {
		return client.Job{}, err
	}
	r := client.Request{
		Queue:          req.Queue,
		Payload:        req.Payload,
		Priority:       priority,
		MaxAttempts:    maxAttempts,
		IdempotencyKey: key,
	}
	if req.Kind != nil {
		r.Kind = *req.Kind
	}
	if req.RunAt != nil {
		t, err := rfc3339.Parse(*req.RunAt)
		if errors.Is(err, rfc3339.ErrSyntax) {
			return client.Job{}, badRequest("run_at", "run_at must be an RFC 3339 timestamp such as 2030-01-02T15:04:05Z")
		} else if err != nil {
			return client.Job{}, badRequest("run_at", "run_at must be an RFC 3339 timestamp: %v", err)
		}
		r.RunAt = &t
	}
	if req.Delay != nil {
		d, ok := parseDelay(*req.Delay)
		if !ok {
			return client.Job{}, badRequest("delay", `delay must be a duration such as "5s" or "1h30m"`)
		}
		r.Delay = &d
	}
	job, err := client.Validate(r, now)
	var fe *client.FieldError
	if errors.As(err, &fe) {
		return job, badRequest(apiField(fe.Field), "%s", fe.Message(apiField))
	}
	return job, err
}

// durationText is the text time.ParseDuration reads: a sign, then
// numbers, each with its unit.
var durationText = regexp.MustCompile(`^[-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|\x{00b5}s|\x{03bc}s|ms|s|m|h))+$`)

// parseDelay parses s as time.ParseDuration does, and reports whether it
// is a duration. One beyond what time.Duration holds (about 2,562,047
// hours either way), which ParseDuration refuses as it refuses text that
// is not a duration, is read as the nearest one it holds, for validation
// to refuse as too long, or negative.
func parseDelay(s string) (time.Duration, bool) {
	if d, err := time.ParseDuration(s); err == nil {
		return d, true
	}
	if !durationText.MatchString(s) {
		return 0, false
	}
	if strings.HasPrefix(s, "-") {
		return math.MinInt64, true
	}
	return math.MaxInt64, true
}

// apiField spells a field of package client as the API names it: the
// idempotency key is a header.
func apiField(field string) string {
	if field == client.FieldIdempotencyKey {
		return "Idempotency-Key"
	}
	return field
}

// checkName checks a queue or kind name of a listing as enqueueing does,
// but for control characters, which enqueueing refuses and a listing
// accepts, to find the jobs stored before they were refused, and for its
// length, counted in characters as the database counts it rather than in
// bytes (client.CheckName).
func checkName(field, s string) error {
	var fe *client.FieldError
	if err := client.CheckName(field, s); errors.As(err, &fe) {
		return badRequest(field, "%s", fe.Message(nil))
	}
	return nil
}
