package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/internal/jsonb"
	"github.com/relayq/relay/server"
)

// maxPayloadBytes bounds a payload read from standard input.
const maxPayloadBytes = 16 << 20

// jobJSON is a job as enqueue prints it: the API's view (never the lease
// token), with its idempotency key.
type jobJSON struct {
	server.JobView
	IdempotencyKey *string `json:"idempotency_key,omitempty"`
	// Existing is set when the idempotency key was taken already, and the
	// job shown is the one that holds it.
	Existing bool `json:"existing,omitempty"`
}

func newJobJSON(j db.Job, existing bool) jobJSON {
	return jobJSON{JobView: server.NewJobView(j), IdempotencyKey: j.IdempotencyKey, Existing: existing}
}

func runEnqueue(ctx context.Context, env *environment, args []string) error {
	var (
		logs           cli.LogFlags
		dbf            cli.DBFlags
		payload        string
		queue          string
		priority       int
		delay          time.Duration
		runAt          string
		maxAttempts    int
		idempotencyKey string
	)
	fs := cli.NewFlagSet("enqueue", "relay enqueue KIND [flags]",
		`Enqueues one job of the given kind directly in the database (no HTTP) and
prints it as JSON. With an idempotency key already used in the queue, nothing
is enqueued and the job holding the key is printed, with "existing": true.`)
	logs.Register(fs)
	dbf.Register(fs)
	fs.StringVar(&payload, "payload", "{}", "job payload, any JSON value; - reads it from standard input")
	fs.StringVar(&queue, "queue", server.DefaultQueue, "queue")
	fs.IntVar(&priority, "priority", 0, "priority from -32768 to 32767; lower runs first")
	fs.DurationVar(&delay, "delay", 0, "run no earlier than this long from now, e.g. 5s")
	fs.StringVar(&runAt, "run-at", "", "run no earlier than this RFC 3339 time, e.g. 2030-01-02T15:04:05Z")
	fs.IntVar(&maxAttempts, "max-attempts", server.DefaultMaxAttempts, fmt.Sprintf("attempts before the job is dead, 1 to %d", server.MaxMaxAttempts))
	fs.StringVar(&idempotencyKey, "idempotency-key", "", "enqueue at most one job with this key in the queue")
	pos, err := fs.Parse(args, env.stderr)
	if err != nil {
		return cli.Helped(err)
	}
	if len(pos) != 1 {
		return cli.Usagef("enqueue: want exactly one KIND, got %d arguments (run \"relay enqueue -h\" for usage)", len(pos))
	}
	kind := pos[0]
	logger, err := logs.Logger(env.stderr)
	if err != nil {
		return err
	}

	params := db.JobInsertParams{Queue: queue, Kind: kind, Priority: int16(priority), MaxAttempts: int32(maxAttempts)}
	if err := checkName("kind", kind, server.MaxNameBytes); err != nil {
		return err
	}
	if err := checkName("--queue", queue, server.MaxNameBytes); err != nil {
		return err
	}
	if priority < math.MinInt16 || priority > math.MaxInt16 {
		return cli.Usagef("--priority must be from %d to %d, got %d", math.MinInt16, math.MaxInt16, priority)
	}
	if maxAttempts < 1 || maxAttempts > server.MaxMaxAttempts {
		return cli.Usagef("--max-attempts must be from 1 to %d, got %d", server.MaxMaxAttempts, maxAttempts)
	}
	if runAt != "" && delay != 0 {
		return cli.Usagef("give --delay or --run-at, not both")
	}
	if delay < 0 || delay > server.MaxDelay {
		return cli.Usagef("--delay must be from 0 to %s, got %s", server.MaxDelay, delay)
	}
	params.DelayMs = delay.Milliseconds()
	if runAt != "" {
		t, err := time.Parse(time.RFC3339, runAt)
		if err != nil {
			return cli.Usagef("--run-at must be an RFC 3339 time such as 2030-01-02T15:04:05Z, got %q", runAt)
		}
		params.RunAt = &t
	}
	if idempotencyKey != "" {
		if err := checkName("--idempotency-key", idempotencyKey, server.MaxIdempotencyKeyBytes); err != nil {
			return err
		}
		params.IdempotencyKey = &idempotencyKey
	}
	raw := []byte(payload)
	if payload == "-" {
		if raw, err = io.ReadAll(io.LimitReader(env.stdin, maxPayloadBytes+1)); err != nil {
			return fmt.Errorf("read the payload from standard input: %w", err)
		}
		if len(raw) > maxPayloadBytes {
			return fmt.Errorf("payload from standard input is larger than %d bytes", maxPayloadBytes)
		}
	}
	if params.Payload, err = checkPayload(raw); err != nil {
		return err
	}

	dsn, err := dbf.Resolve(env.getenv)
	if err != nil {
		return err
	}
	pool, err := connect(ctx, logger, dsn, "relay enqueue", 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireMigrated(ctx, pool); err != nil {
		return err
	}
	q := db.New(pool)
	job, err := q.JobInsert(ctx, params)
	existing := false
	if errors.Is(err, pgx.ErrNoRows) && params.IdempotencyKey != nil {
		existing = true
		job, err = q.JobGetByIdempotencyKey(ctx, db.JobGetByIdempotencyKeyParams{Queue: queue, IdempotencyKey: params.IdempotencyKey})
		if err != nil {
			return fmt.Errorf("get the job holding idempotency key %q: %w", idempotencyKey, err)
		}
	} else if err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	out, err := json.MarshalIndent(newJobJSON(job, existing), "", "  ")
	if err != nil {
		return fmt.Errorf("encode the job: %w", err)
	}
	_, err = fmt.Fprintf(env.stdout, "%s\n", out)
	return err
}

// checkPayload returns the payload compacted, or a clear error if it is not
// one valid JSON value that PostgreSQL can store as jsonb.
func checkPayload(raw []byte) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, cli.Usagef("--payload is empty: give a JSON value such as {}")
	}
	if !utf8.Valid(raw) {
		return nil, cli.Usagef("--payload is not valid UTF-8")
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, cli.Usagef("--payload is not valid JSON: %v", err)
	}
	if err := jsonb.Check(buf.Bytes()); err != nil {
		return nil, cli.Usagef("--payload %v", err)
	}
	return buf.Bytes(), nil
}

// checkName checks a name stored as PostgreSQL text.
func checkName(what, s string, maxBytes int) error {
	switch {
	case s == "":
		return cli.Usagef("%s must not be empty", what)
	case len(s) > maxBytes:
		return cli.Usagef("%s must be at most %d bytes", what, maxBytes)
	case !utf8.ValidString(s) || bytes.IndexByte([]byte(s), 0) >= 0:
		return cli.Usagef("%s must be valid UTF-8 without NUL characters", what)
	}
	return nil
}
