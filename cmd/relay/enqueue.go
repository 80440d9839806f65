package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/internal/jsonb"
	"github.com/relayq/relay/internal/rfc3339"
	"github.com/relayq/relay/server"
)

// maxPayloadBytes bounds a payload read from standard input.
const maxPayloadBytes = 16 << 20

// jobJSON is a job as enqueue prints it: the API's view (never the lease
// token), with its idempotency key.
type jobJSON struct {
	server.JobView
	enqueued
}

// enqueued is what enqueue prints of a job beside its view.
type enqueued struct {
	IdempotencyKey *string `json:"idempotency_key,omitempty"`
	// Existing is set when the idempotency key was taken already, and the
	// job shown is the one that holds it.
	Existing bool `json:"existing,omitempty"`
}

func newJobJSON(j db.Job, existing bool) jobJSON {
	return jobJSON{JobView: server.NewJobView(j), enqueued: enqueued{IdempotencyKey: j.IdempotencyKey, Existing: existing}}
}

// encode returns j indented; or, for a job whose documents nest deeper
// than encoding/json writes (a result stored by an earlier build, of the
// job holding the idempotency key), on one line, as the API writes it.
func (j jobJSON) encode() ([]byte, error) {
	out, err := json.MarshalIndent(j, "", "  ")
	if err == nil {
		return out, nil
	}
	view, verr := j.JobView.AppendJSON(nil)
	if verr != nil {
		return nil, err
	}
	own, verr := json.Marshal(j.enqueued)
	if verr != nil {
		return nil, verr
	}
	if len(own) == len("{}") {
		return view, nil
	}
	return append(append(view[:len(view)-1], ','), own[1:]...), nil
}

// enqueueFlags are the flags of relay enqueue.
type enqueueFlags struct {
	logs           cli.LogFlags
	db             cli.DBFlags
	payload        string
	queue          string
	priority       int
	delay          time.Duration
	runAt          string
	maxAttempts    int
	idempotencyKey string
}

// newEnqueueFlagSet returns the flag set of relay enqueue, which parses
// into f.
func newEnqueueFlagSet(f *enqueueFlags) *cli.FlagSet {
	fs := cli.NewFlagSet("enqueue", "relay enqueue KIND [flags]",
		`Enqueues one job of the given kind directly in the database (no HTTP) and
prints it as JSON. With an idempotency key already used in the queue, nothing
is enqueued: if the job holding the key is the same job, it is printed, with
"existing": true; if it is a different job, enqueue fails, as the API answers
409. Jobs are compared by kind, queue, payload (as JSON values), priority and
max attempts: a replay's --run-at or --delay is not compared, nor applied.`)
	f.logs.Register(fs)
	f.db.Register(fs)
	fs.StringVar(&f.payload, "payload", "{}", "job payload, any JSON value; - reads it from standard input, 16 MiB at most")
	fs.StringVar(&f.queue, "queue", client.DefaultQueue, "queue")
	fs.IntVar(&f.priority, "priority", 0, "priority from -32768 to 32767; lower runs first")
	fs.DurationVar(&f.delay, "delay", 0, "run no earlier than this long from now, e.g. 5s")
	fs.StringVar(&f.runAt, "run-at", "", "run no earlier than this RFC 3339 time, such as 2027-01-02T15:04:05Z, and at most a year from now")
	fs.IntVar(&f.maxAttempts, "max-attempts", client.DefaultMaxAttempts, fmt.Sprintf("attempts before the job is dead, 1 to %d", client.MaxMaxAttempts))
	fs.StringVar(&f.idempotencyKey, "idempotency-key", "", "enqueue at most one job with this key in the queue")
	return fs
}

func runEnqueue(ctx context.Context, env *environment, args []string) error {
	var f enqueueFlags
	fs := newEnqueueFlagSet(&f)
	pos, err := fs.Parse(args, env.stderr)
	if err != nil {
		return cli.Helped(err)
	}
	if len(pos) != 1 {
		return cli.Usagef("enqueue: want exactly one KIND, got %d arguments (run \"relay enqueue -h\" for usage)", len(pos))
	}
	kind := pos[0]
	logger, err := f.logs.Logger(env.stderr)
	if err != nil {
		return err
	}

	// A flag given empty, as by a shell variable left unset, is refused
	// as the API refuses the field, never taken for a flag not given: an
	// empty --idempotency-key would otherwise store the job again at each
	// retry, and an empty --run-at run it at once.
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })

	req := client.Request{Kind: kind, Queue: &f.queue, Priority: ptr(int64(f.priority)), MaxAttempts: ptr(int64(f.maxAttempts))}
	if given["run-at"] {
		t, err := rfc3339.Parse(f.runAt)
		if errors.Is(err, rfc3339.ErrSyntax) {
			return cli.Usagef("--run-at must be an RFC 3339 time such as 2030-01-02T15:04:05Z, got %q", f.runAt)
		} else if err != nil {
			return cli.Usagef("--run-at %q: %v", f.runAt, err)
		}
		req.RunAt = &t
	}
	if given["delay"] {
		req.Delay = &f.delay
	}
	if given["idempotency-key"] {
		req.IdempotencyKey = &f.idempotencyKey
	}
	raw := []byte(f.payload)
	if f.payload == "-" {
		if raw, err = readAll(ctx, io.LimitReader(env.stdin, maxPayloadBytes+1)); err != nil {
			return fmt.Errorf("read the payload from standard input: %w", err)
		}
		if len(raw) > maxPayloadBytes {
			return cli.Usagef("--payload from standard input is larger than %d bytes", maxPayloadBytes)
		}
	}
	if req.Payload, err = compactPayload(raw); err != nil {
		return err
	}
	job, err := client.Validate(req, time.Now())
	var fe *client.FieldError
	if errors.As(err, &fe) {
		return cli.Usagef("%s", fe.Message(flagOf))
	}
	if err != nil {
		return err
	}

	dsn, err := f.db.Resolve(env.getenv)
	if err != nil {
		return err
	}
	pool, err := connect(ctx, logger, dsn, "relay enqueue", 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireMigrated(ctx, logger, pool); err != nil {
		return err
	}
	stored, existing, err := client.Insert(ctx, pool, job)
	if errors.Is(err, client.ErrIdempotencyConflict) {
		return fmt.Errorf("enqueue: --idempotency-key %q was already used in queue %q for a different job (job %d); nothing was enqueued",
			f.idempotencyKey, f.queue, stored.ID)
	}
	if err != nil {
		return fmt.Errorf("enqueue: %w", err)
	}
	// The job is stored: an error from here on says so, lest it be
	// enqueued again for the error.
	out, err := newJobJSON(stored, existing).encode()
	if err != nil {
		return fmt.Errorf("job %d was enqueued, but encoding it to print failed: %w", stored.ID, err)
	}
	if _, err := fmt.Fprintf(env.stdout, "%s\n", out); err != nil {
		return fmt.Errorf("job %d was enqueued, but printing it failed: %w", stored.ID, err)
	}
	return nil
}

// readAll reads r to its end, or returns ctx's cause once ctx ends first,
// as when a signal stops the program while standard input stays open: a
// read cannot be interrupted, so it is left to the program's exit.
func readAll(ctx context.Context, r io.Reader) ([]byte, error) {
	type read struct {
		b   []byte
		err error
	}
	done := make(chan read, 1)
	go func() {
		b, err := io.ReadAll(r)
		done <- read{b, err}
	}()
	select {
	case got := <-done:
		return got.b, got.err
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// compactPayload returns the f.payload compacted, or a clear error if it is
// not one valid JSON value; client.Validate checks that PostgreSQL can
// store it as jsonb, and refuses one nested too deep, which is returned
// as it is.
func compactPayload(raw []byte) (json.RawMessage, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil, cli.Usagef("--payload is empty: give a JSON value such as {}")
	}
	if !utf8.Valid(raw) {
		return nil, cli.Usagef("--payload is not valid UTF-8")
	}
	if jsonb.Depth(raw) > client.MaxPayloadDepth {
		// Left to client.Validate, which says it is too deep, where
		// json.Compact, which reads no deeper than 10,000 levels, would
		// call it invalid JSON.
		return raw, nil
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return nil, cli.Usagef("--payload is not valid JSON: %v", err)
	}
	return buf.Bytes(), nil
}

// flagOf spells a field of package client as relay enqueue's flag for it.
func flagOf(field string) string {
	if field == client.FieldKind {
		return "kind"
	}
	return "--" + strings.ReplaceAll(field, "_", "-")
}

func ptr[T any](v T) *T { return &v }
