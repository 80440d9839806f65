// Package client is how Go code enqueues Relay jobs, and the one home of
// the rules of enqueueing: the limits and defaults of a job, the validation
// of a request, and the insert with its idempotent replay. The HTTP API,
// `relay enqueue` and the lab all enqueue through it,
// so a job is accepted or refused the same way whichever door it comes in
// by. Insert and InsertMany take a db.DBTX, so a Go caller can enqueue in a
// transaction of its own: the job becomes visible to workers when, and
// only if, that transaction commits. An Enqueuer, shared by goroutines
// that each store one job, stores those that arrive together in one
// statement and spaces their notifications, as the HTTP API does.
//
// The connections given must run statements in one of pgx's modes that
// learn the arguments' types from the server: cache_statement (pgx's
// default), cache_describe or describe_exec. Under exec or simple_protocol
// (default_query_exec_mode) a payload goes as bytea, and PostgreSQL
// refuses every insert ("invalid input syntax for type json"); relay and
// worker.New refuse those modes.
package client

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/relayq/relay/internal/jsonb"
)

// Limits and defaults of a job, whichever way it is enqueued.
const (
	// DefaultQueue is the queue of a job enqueued without one.
	DefaultQueue = "default"
	// MaxNameBytes bounds the length of a queue or kind name, in bytes.
	MaxNameBytes = 128
	// MaxIdempotencyKeyBytes bounds the length of an idempotency key.
	MaxIdempotencyKeyBytes = 255
	// DefaultMaxAttempts is the max_attempts of a job enqueued without one.
	DefaultMaxAttempts = 25
	// MaxMaxAttempts is the largest max_attempts a job may have.
	MaxMaxAttempts = 1000
	// MaxDelay is how far ahead a job may be scheduled, by delay or run_at.
	MaxDelay = 365 * 24 * time.Hour
	// MaxBatchJobs is how many jobs one InsertMany may insert.
	MaxBatchJobs = 1000
	// MaxPayloadDepth bounds how deep the arrays and objects of a payload
	// may nest. encoding/json reads documents nested at most 10,000 deep
	// (jsonb.MaxDecodeDepth), and the deepest one that carries a payload,
	// a batch request to the API ({"jobs": [{"payload": ...}]}), holds it
	// three levels down.
	MaxPayloadDepth = jsonb.MaxDecodeDepth - 3
)

// earliestRunAt is the earliest run_at accepted: anything before is surely
// a mistake. A run_at in the past makes the job ready at once, and orders it
// by that run_at among the ready jobs of its priority.
var earliestRunAt = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)

// Request is one job to enqueue, as a client asks for it. A nil field was
// not given and takes its default.
type Request struct {
	// Kind (required) is the name handlers are registered under. It and
	// Queue are names of at most MaxNameBytes bytes of UTF-8, without NUL
	// or any other control character.
	Kind string
	// Queue defaults to DefaultQueue.
	Queue *string
	// Payload is any JSON value, null included, in which no object has a
	// key twice (jsonb would keep only the last) and arrays and objects
	// nest at most MaxPayloadDepth deep; it defaults to {}.
	Payload json.RawMessage
	// Priority is from -32768 to 32767, lower running first; default 0.
	Priority *int64
	// MaxAttempts is from 1 to MaxMaxAttempts; default DefaultMaxAttempts.
	MaxAttempts *int64
	// RunAt is when the job becomes ready, from 1970 to MaxDelay from now.
	RunAt *time.Time
	// Delay makes the job ready this long after the database's now(), from
	// 0 to MaxDelay, at millisecond precision. Not together with RunAt.
	// Without RunAt and Delay the job is ready at once.
	Delay *time.Duration
	// IdempotencyKey, if set, makes the enqueue happen at most once per
	// queue: see Insert.
	IdempotencyKey *string
}

// Job is a validated Request with every default applied: what Insert
// stores.
type Job struct {
	Queue       string
	Kind        string
	Payload     json.RawMessage
	Priority    int16
	MaxAttempts int32
	// RunAt is nil for DelayMs after now() in the database.
	RunAt          *time.Time
	DelayMs        int64
	IdempotencyKey *string
}

// Field names, as the HTTP API spells them. A FieldError names one of them.
const (
	FieldKind           = "kind"
	FieldQueue          = "queue"
	FieldPayload        = "payload"
	FieldPriority       = "priority"
	FieldMaxAttempts    = "max_attempts"
	FieldRunAt          = "run_at"
	FieldDelay          = "delay"
	FieldIdempotencyKey = "idempotency_key"
)

// FieldError is a request refused for one field. Message spells field
// names as its caller names them (JSON fields, HTTP headers, flags).
type FieldError struct {
	// Field is the field at fault, one of the Field constants.
	Field string
	// problem follows the field's name; %s in it stands for other.
	problem string
	other   string
}

func fieldError(field, problem string, args ...any) *FieldError {
	return &FieldError{Field: field, problem: fmt.Sprintf(problem, args...)}
}

// Error returns the message with the API's field names.
func (e *FieldError) Error() string { return e.Message(nil) }

// Message returns the message with field names spelled by spell, or as the
// API spells them if spell is nil.
func (e *FieldError) Message(spell func(field string) string) string {
	if spell == nil {
		spell = func(f string) string { return f }
	}
	problem := e.problem
	if e.other != "" {
		problem = fmt.Sprintf(problem, spell(e.other))
	}
	return spell(e.Field) + " " + problem
}

// Validate checks r and returns the job it asks for, with every default
// applied. now is the time RunAt is checked against. Its errors are
// *FieldError.
func Validate(r Request, now time.Time) (Job, error) {
	job := Job{
		Queue:       DefaultQueue,
		Kind:        r.Kind,
		Payload:     json.RawMessage(`{}`),
		MaxAttempts: DefaultMaxAttempts,
	}
	if r.Kind == "" {
		return job, fieldError(FieldKind, "is required")
	}
	if err := checkNewName(FieldKind, r.Kind); err != nil {
		return job, err
	}
	if r.Queue != nil {
		if err := checkNewName(FieldQueue, *r.Queue); err != nil {
			return job, err
		}
		job.Queue = *r.Queue
	}
	if len(r.Payload) > 0 {
		// Before json.Valid, which refuses a document nested deeper than
		// encoding/json reads as it refuses one that is not JSON.
		if jsonb.Depth(r.Payload) > MaxPayloadDepth {
			return job, fieldError(FieldPayload, "must not nest arrays and objects more than %d deep", MaxPayloadDepth)
		}
		if !json.Valid(r.Payload) {
			return job, fieldError(FieldPayload, "is not valid JSON")
		}
		if err := jsonb.Check(r.Payload); err != nil {
			return job, fieldError(FieldPayload, "%v", err)
		}
		// jsonb would keep the last value of a key given twice and drop
		// the others: data the caller sent, lost without a word.
		if err := jsonb.CheckDuplicateKeys(r.Payload); err != nil {
			return job, fieldError(FieldPayload, "%v", err)
		}
		job.Payload = r.Payload
	}
	if r.Priority != nil {
		if *r.Priority < math.MinInt16 || *r.Priority > math.MaxInt16 {
			return job, fieldError(FieldPriority, "must be an integer from %d to %d", math.MinInt16, math.MaxInt16)
		}
		job.Priority = int16(*r.Priority)
	}
	if r.MaxAttempts != nil {
		if *r.MaxAttempts < 1 || *r.MaxAttempts > MaxMaxAttempts {
			return job, fieldError(FieldMaxAttempts, "must be an integer from 1 to %d", MaxMaxAttempts)
		}
		job.MaxAttempts = int32(*r.MaxAttempts)
	}
	if r.RunAt != nil && r.Delay != nil {
		return job, &FieldError{Field: FieldDelay, problem: "must not be given together with %s", other: FieldRunAt}
	}
	if r.RunAt != nil {
		switch t := *r.RunAt; {
		case t.Before(earliestRunAt):
			return job, fieldError(FieldRunAt, "must not be before 1970")
		case t.After(now.Add(MaxDelay)):
			return job, fieldError(FieldRunAt, "must be at most %s from now", MaxDelay)
		}
		job.RunAt = r.RunAt
	}
	if r.Delay != nil {
		switch d := *r.Delay; {
		case d < 0:
			return job, fieldError(FieldDelay, "must not be negative")
		case d > MaxDelay:
			return job, fieldError(FieldDelay, "must be at most %s", MaxDelay)
		}
		job.DelayMs = r.Delay.Milliseconds()
	}
	if r.IdempotencyKey != nil {
		if err := checkName(FieldIdempotencyKey, *r.IdempotencyKey, MaxIdempotencyKeyBytes); err != nil {
			return job, err
		}
		job.IdempotencyKey = r.IdempotencyKey
	}
	return job, nil
}

// CheckName checks a queue or kind name that jobs may already have, as
// the filters of a listing take it: not empty, at most MaxNameBytes
// characters, valid UTF-8 and free of NUL, which PostgreSQL text cannot
// hold. Unlike Validate, it accepts control characters, which jobs stored
// before Validate refused them may have in their names, and names of more
// than MaxNameBytes bytes, which the database holds up to MaxNameBytes
// characters (jobs_queue_valid, jobs_kind_valid) for a Job that did not
// come from Validate, so that such jobs can still be found. Its error is
// a *FieldError for field.
func CheckName(field, s string) error {
	// At most MaxNameBytes characters take at most UTFMax bytes each.
	if utf8.RuneCountInString(s) > MaxNameBytes {
		return fieldError(field, "must be at most %d characters", MaxNameBytes)
	}
	if err := checkName(field, s, utf8.UTFMax*MaxNameBytes); err != nil {
		return err
	}
	return nil // not checkName's nil *FieldError, which is a non-nil error
}

// checkNewName checks the queue or kind name of a job to enqueue: as
// CheckName does, and free of control characters (C0, DEL and C1), which
// would break a log line or a terminal that shows the name. The first one
// is named, with its byte offset.
func checkNewName(field, s string) *FieldError {
	if err := checkName(field, s, MaxNameBytes); err != nil {
		return err
	}
	for i, r := range s {
		if unicode.IsControl(r) {
			return fieldError(field, "must not contain control characters (%U at byte %d)", r, i)
		}
	}
	return nil
}

func checkName(field, s string, maxBytes int) *FieldError {
	switch {
	case s == "":
		return fieldError(field, "must not be empty")
	case len(s) > maxBytes:
		return fieldError(field, "must be at most %d bytes", maxBytes)
	case !utf8.ValidString(s):
		return fieldError(field, "must be valid UTF-8")
	case strings.IndexByte(s, 0) >= 0:
		return fieldError(field, `must not contain NUL characters (\u0000)`)
	}
	return nil
}
