package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/migrations"
)

// syncBuffer is a bytes.Buffer safe to write from one goroutine while
// another reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type result struct {
	stdout, stderr string
	err            error
}

// runRelay runs the program in-process, as `relay args...`, with env as its
// whole environment.
func runRelay(ctx context.Context, env map[string]string, stdin string, args ...string) result {
	var stdout, stderr syncBuffer
	err := run(ctx, append([]string{"relay"}, args...), func(k string) string { return env[k] },
		strings.NewReader(stdin), &stdout, &stderr)
	return result{stdout.String(), stderr.String(), err}
}

func testContext(t *testing.T, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// emptyDatabaseURL returns the URL of a new, empty database (no schema at
// all) on the test server, dropped when the test ends.
func emptyDatabaseURL(t *testing.T) string {
	t.Helper()
	ctx := testContext(t, 30*time.Second)
	base := dbtest.NewURL(t) // on a server where we may create databases
	var b [6]byte
	rand.Read(b[:])
	name := "relay_empty_" + hex.EncodeToString(b[:])
	exec := func(ctx context.Context, sql string) error {
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return err
		}
		defer conn.Close(context.WithoutCancel(ctx))
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func TestRun_RejectsBadUsageWithOneLineAndNoOutput(t *testing.T) {
	db := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x"}
	tests := []struct {
		name      string
		env       map[string]string
		args      []string
		wantInErr string
	}{
		{"unknown command", nil, []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag of serve", db, []string{"serve", "--bogus"}, "serve: flag provided but not defined: -bogus"},
		{"unknown flag of work", db, []string{"work", "--bogus"}, "work: flag provided but not defined: -bogus"},
		{"unknown flag of migrate", db, []string{"migrate", "up", "--bogus"}, "migrate: flag provided but not defined: -bogus"},
		{"unknown flag of dev", db, []string{"dev", "--bogus"}, "dev: flag provided but not defined: -bogus"},
		{"bad flag value", db, []string{"work", "--slots", "many"}, `invalid value "many" for flag -slots`},
		{"bad duration", db, []string{"work", "--lease", "10"}, `invalid value "10" for flag -lease`},
		{"zero worker slots", db, []string{"work", "--slots", "0"}, "--slots must be at least 1"},
		{"negative serve slots", db, []string{"serve", "--slots", "-1"}, "--slots must not be negative"},
		{"non-positive backoff", db, []string{"work", "--backoff-base", "0s"}, "--backoff-base must be positive"},
		{"no queue listeners", db, []string{"work", "--queue-listeners", "0"}, "--queue-listeners must be positive, or -1 for every worker, got 0"},
		{"queue listeners below -1", db, []string{"work", "--queue-listeners", "-2"}, "--queue-listeners must be positive, or -1 for every worker, got -2"},
		{"queue listeners beyond an int32", db, []string{"work", "--queue-listeners", "2147483648"}, "queue listeners must be at most 2147483647 (MaxQueueListeners), got 2147483648"},
		{"slots beyond the most a worker runs", db, []string{"work", "--slots", "10001"}, "slots must be from 1 to 10000 (MaxSlots), got 10001"},
		{"prefetch that would overflow", db, []string{"work", "--prefetch", "9223372036854775807"}, "prefetch must be at most 10000 (MaxPrefetch), got 9223372036854775807"},
		{"session database URL that does not parse", db, []string{"work", "--session-database-url", "postgres://h:notaport/db"}, "invalid session database URL"},
		{"lease too short", db, []string{"work", "--lease", "50ms"}, "lease must be at least 100ms, got 50ms"},
		{"zero lease", db, []string{"work", "--lease", "0s"}, "--lease must be positive, got 0s"},
		{"heartbeat beyond the lease", db, []string{"work", "--heartbeat", "40s"}, "heartbeat interval 40s must be positive and shorter than the lease 30s"},
		{"negative heartbeat", db, []string{"work", "--heartbeat", "-1s"}, "--heartbeat must be positive, or 0 for a third of --lease, got -1s"},
		{"prefetch wait beyond the lease", db, []string{"work", "--prefetch-wait", "40s"}, "prefetch wait 40s must be positive and shorter than the lease 30s"},
		{"zero poll", db, []string{"work", "--poll", "0s"}, "--poll must be positive, got 0s"},
		{"negative reclaim interval", db, []string{"work", "--reclaim-interval", "-1s"}, "--reclaim-interval must be positive, got -1s"},
		{"empty queue to work", db, []string{"work", "--queue", ""}, "--queue must not be empty"},
		{"long worker id", db, []string{"work", "--id", strings.Repeat("w", 129)}, "id longer than 128 bytes"},
		{"worker queue not UTF-8", db, []string{"work", "--queue", "q\xff"}, `queue name "q\xff" must be valid UTF-8 without NUL`},
		{"serve's worker id not UTF-8", db, []string{"serve", "--slots", "1", "--id", "w\xff"}, `id "w\xff" must be valid UTF-8 without NUL`},
		{"worker flag of serve without slots", db, []string{"serve", "--lease", "-5s"}, "--lease must be positive, got -5s"},
		{"a query exec mode that cannot run relay's statements", map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x?default_query_exec_mode=exec"}, []string{"work"},
			"database URL: default_query_exec_mode=exec cannot run Relay's statements"},
		{"the simple protocol", map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x?default_query_exec_mode=simple_protocol"}, []string{"enqueue", "noop"},
			"database URL: default_query_exec_mode=simple_protocol cannot run Relay's statements"},
		{"retention given to serve without slots", db, []string{"serve", "--retain-succeeded", "1h"},
			"--retain-succeeded: worker flags, which do nothing without worker slots: give --slots N to run slots here, or give the flags to relay work"},
		{"worker flags given to serve with no slots", db, []string{"serve", "--slots", "0", "--queue", "emails", "--lease", "1m"},
			"--lease, --queue: worker flags, which do nothing without worker slots"},
		{"queue listeners of serve without slots", db, []string{"serve", "--queue-listeners", "-7"}, "--queue-listeners must be positive, or -1 for every worker, got -7"},
		{"bad log level", db, []string{"work", "--log-level", "loud"}, `invalid --log-level "loud"`},
		{"bad log format", db, []string{"serve", "--log-format", "xml"}, `invalid --log-format "xml"`},
		{"unknown migrate action", db, []string{"migrate", "sideways"}, `unknown action "sideways"`},
		{"two migrate actions", db, []string{"migrate", "up", "down"}, "want one of up, down or status"},
		{"stray argument to serve", db, []string{"serve", "now"}, `serve: unexpected argument "now"`},
		{"address without a port", db, []string{"serve", "--addr", "8080"}, `serve: invalid address "8080" (--addr or RELAY_ADDR)`},
		{"address with a port out of range", db, []string{"serve", "--addr", "127.0.0.1:99999"}, `serve: invalid address "127.0.0.1:99999" (--addr or RELAY_ADDR): address 99999: invalid port`},
		{"address with a port out of range, given a token", db, []string{"serve", "--api-token", "t", "--addr", "0.0.0.0:-1"}, `serve: invalid address "0.0.0.0:-1"`},
		{"address after a space in RELAY_ADDR", map[string]string{"DATABASE_URL": db["DATABASE_URL"], "RELAY_ADDR": " 127.0.0.1:8080"},
			[]string{"serve"}, `serve: invalid address " 127.0.0.1:8080" (--addr or RELAY_ADDR): begins or ends with white space`},
		{"address after a space in RELAY_ADDR, given a token", map[string]string{"DATABASE_URL": db["DATABASE_URL"], "RELAY_ADDR": " 127.0.0.1:8080", "RELAY_API_TOKEN": "t"},
			[]string{"dev"}, `dev: invalid address " 127.0.0.1:8080" (--addr or RELAY_ADDR): begins or ends with white space`},
		{"address before a newline in --addr", db, []string{"serve", "--addr", "127.0.0.1:8080\n"}, `serve: invalid address "127.0.0.1:8080\n" (--addr or RELAY_ADDR): begins or ends with white space`},
		{"address with a port out of range in RELAY_ADDR", map[string]string{"DATABASE_URL": db["DATABASE_URL"], "RELAY_ADDR": "localhost:65536"},
			[]string{"dev"}, `dev: invalid address "localhost:65536" (--addr or RELAY_ADDR): address 65536: invalid port`},
		{"address without a port in RELAY_ADDR", map[string]string{"DATABASE_URL": db["DATABASE_URL"], "RELAY_ADDR": "localhost"},
			[]string{"dev"}, `dev: invalid address "localhost" (--addr or RELAY_ADDR)`},
		{"session database beside dev's throwaway database", map[string]string{"RELAY_SESSION_DATABASE_URL": "postgres://127.0.0.1:1/x"},
			[]string{"dev", "--addr", "127.0.0.1:0"}, "dev: --session-database-url (or RELAY_SESSION_DATABASE_URL) names a database, but without DATABASE_URL relay dev starts one of its own"},
		{"session database flag beside dev's throwaway database", nil,
			[]string{"dev", "--addr", "127.0.0.1:0", "--session-database-url", "postgres://127.0.0.1:1/x"}, "dev: --session-database-url (or RELAY_SESSION_DATABASE_URL) names a database"},
		{"enqueue without kind", db, []string{"enqueue"}, "want exactly one KIND"},
		{"enqueue with two kinds", db, []string{"enqueue", "a", "b"}, "want exactly one KIND"},
		{"enqueue invalid JSON", db, []string{"enqueue", "hash", "--payload", "{iterations: 1}"}, "--payload is not valid JSON"},
		{"enqueue two JSON values", db, []string{"enqueue", "hash", "--payload", "{} {}"}, "--payload is not valid JSON"},
		{"enqueue empty payload", db, []string{"enqueue", "hash", "--payload", " "}, "--payload is empty"},
		{"enqueue payload nested too deep", db, []string{"enqueue", "hash", "--payload", strings.Repeat("[", client.MaxPayloadDepth+1) + strings.Repeat("]", client.MaxPayloadDepth+1)},
			fmt.Sprintf("--payload must not nest arrays and objects more than %d deep", client.MaxPayloadDepth)},
		{"enqueue payload nested deeper than encoding/json reads", db, []string{"enqueue", "hash", "--payload", strings.Repeat("[", 10001) + strings.Repeat("]", 10001)},
			fmt.Sprintf("--payload must not nest arrays and objects more than %d deep", client.MaxPayloadDepth)},
		{"enqueue run-at beyond a year", db, []string{"enqueue", "hash", "--run-at", "2999-01-02T15:04:05Z"}, "--run-at must be at most 8760h0m0s from now"},
		{"enqueue delay and run-at", db, []string{"enqueue", "hash", "--delay", "1s", "--run-at", "2030-01-02T15:04:05Z"}, "--delay must not be given together with --run-at"},
		{"enqueue a zero delay and run-at", db, []string{"enqueue", "hash", "--delay", "0s", "--run-at", "2026-01-02T15:04:05Z"}, "--delay must not be given together with --run-at"},
		{"enqueue bad run-at", db, []string{"enqueue", "hash", "--run-at", "tomorrow"}, "--run-at must be an RFC 3339 time"},
		{"enqueue negative delay", db, []string{"enqueue", "hash", "--delay", "-1s"}, "--delay must not be negative"},
		{"enqueue priority out of range", db, []string{"enqueue", "hash", "--priority", "40000"}, "--priority must be an integer from -32768 to 32767"},
		{"enqueue zero max attempts", db, []string{"enqueue", "hash", "--max-attempts", "0"}, "--max-attempts must be an integer from 1 to 1000"},
		{"enqueue long kind", db, []string{"enqueue", strings.Repeat("k", 129)}, "kind must be at most 128 bytes"},
		{"enqueue empty idempotency key", db, []string{"enqueue", "hash", "--idempotency-key", ""}, "--idempotency-key must not be empty"},
		{"enqueue empty run-at", db, []string{"enqueue", "hash", "--run-at", ""}, "--run-at must be an RFC 3339 time"},
		{"enqueue kind with a control character", db, []string{"enqueue", "send\nemail"}, "kind must not contain control characters (U+000A at byte 4)"},
		{"enqueue queue with a control character", db, []string{"enqueue", "hash", "--queue", "q\x1b"}, "--queue must not contain control characters (U+001B at byte 1)"},
		{"no database configured", nil, []string{"work"}, "no database: give --database-url or set DATABASE_URL"},
		{"database URL that does not parse, to work", map[string]string{"DATABASE_URL": "postgres://h:notaport/db"},
			[]string{"work"}, "invalid database URL: cannot parse `postgres://h:notaport/db`: invalid port"},
		{"database URL that does not parse, to serve", nil,
			[]string{"serve", "--database-url", "postgres://h:notaport/db"}, "invalid database URL"},
		{"database URL that does not parse, to dev", nil,
			[]string{"dev", "--database-url", "postgres://h:notaport/db"}, "invalid database URL"},
		{"database URL that does not parse, to migrate", nil,
			[]string{"migrate", "status", "--database-url", "postgres://h:notaport/db"}, "invalid database URL"},
		{"database URL that does not parse, to enqueue", nil,
			[]string{"enqueue", "hash", "--database-url", "postgres://u:s3cret@h:notaport/db"}, "cannot parse `postgres://u:xxxxx@h:notaport/db`"},
		{"version with argument", nil, []string{"version", "x"}, `unexpected argument "x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runRelay(testContext(t, 10*time.Second), tt.env, "", tt.args...)
			var u *cli.UsageError
			if !errors.As(r.err, &u) {
				t.Fatalf("error = %v (%T), want a usage error", r.err, r.err)
			}
			if !strings.Contains(r.err.Error(), tt.wantInErr) {
				t.Errorf("error %q does not contain %q", r.err, tt.wantInErr)
			}
			if strings.Contains(r.err.Error(), "\n") {
				t.Errorf("error is not one line: %q", r.err)
			}
			if r.stdout != "" || r.stderr != "" {
				t.Errorf("printed stdout %q, stderr %q; want nothing (main prints the error)", r.stdout, r.stderr)
			}
		})
	}
}

// TestRun_EnqueueRefusesABadPayloadFromStandardInputAsAUsageError: a
// payload that --payload - reads is refused as the same payload given on
// the command line is, with a usage error (exit status 2) and before the
// database is reached, whatever is wrong with it, its size included.
func TestRun_EnqueueRefusesABadPayloadFromStandardInputAsAUsageError(t *testing.T) {
	db := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x"}
	for _, tt := range []struct {
		name, stdin, wantInErr string
	}{
		{"nothing", "", "--payload is empty"},
		{"not JSON", "{iterations: 1}\n", "--payload is not valid JSON"},
		{"a key twice", `{"a":1,"a":2}`, `--payload contains the key "a" twice`},
		{"beyond the limit", "[" + strings.Repeat(" ", maxPayloadBytes) + "]", fmt.Sprintf("larger than %d bytes", maxPayloadBytes)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := runRelay(testContext(t, 10*time.Second), db, tt.stdin, "enqueue", "hash", "--payload", "-")
			var u *cli.UsageError
			if !errors.As(r.err, &u) {
				t.Fatalf("error = %v (%T), want a usage error", r.err, r.err)
			}
			if !strings.Contains(r.err.Error(), tt.wantInErr) {
				t.Errorf("error %q does not contain %q", r.err, tt.wantInErr)
			}
		})
	}
}

func TestRun_WithoutCommandPrintsUsageAndFails(t *testing.T) {
	r := runRelay(t.Context(), nil, "")
	var u *cli.UsageError
	if !errors.As(r.err, &u) {
		t.Fatalf("error = %v, want a usage error", r.err)
	}
	if !strings.Contains(r.stderr, "Commands:") {
		t.Errorf("stderr does not list the commands:\n%s", r.stderr)
	}
}

func TestRun_HelpListsCommandsAndFlagsAndSucceeds(t *testing.T) {
	tests := []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"dev", "migrate", "serve", "work", "enqueue", "version", "DATABASE_URL", "RELAY_ADDR", "RELAY_API_TOKEN", "RELAY_SESSION_DATABASE_URL", "GOGC"}},
		{[]string{"-h"}, []string{"Commands:"}},
		{[]string{"help"}, []string{"Commands:"}},
		{[]string{"help", "work"}, []string{"Usage: relay work", "-backoff-base", "-slots", "(default 10)", "-reclaim-interval", "-queue-listeners"}},
		{[]string{"serve", "-h"}, []string{"Usage: relay serve", "-addr", "-api-token", "-insecure-no-auth", "-max-body-bytes", "-announce-every", "-slots", "-queue"}},
		{[]string{"dev", "--help"}, []string{"Usage: relay dev", "(default 4)", "-insecure-no-auth"}},
		{[]string{"migrate", "-h"}, []string{"Usage: relay migrate [up|down|status]"}},
		{[]string{"enqueue", "-h"}, []string{"Usage: relay enqueue KIND", "-payload", "-idempotency-key", "-run-at", "-delay", "-max-attempts", "-priority"}},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			r := runRelay(t.Context(), nil, "", tt.args...)
			if r.err != nil {
				t.Fatalf("error: %v", r.err)
			}
			for _, w := range tt.want {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("help does not mention %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}

// TestCommands_FlagsAreTheSetRunParses checks the flag set each command
// gives for checking a command line against the help it prints when run.
func TestCommands_FlagsAreTheSetRunParses(t *testing.T) {
	for _, c := range commands() {
		if c.flags == nil {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			fs := c.flags()
			if fs.Name() != c.name {
				t.Errorf("flag set of %s is named %q", c.name, fs.Name())
			}
			r := runRelay(t.Context(), nil, "", c.name, "-h")
			if r.err != nil {
				t.Fatalf("relay %s -h: %v", c.name, r.err)
			}
			fs.VisitAll(func(f *flag.Flag) {
				if !strings.Contains(r.stderr, "  -"+f.Name+" ") && !strings.Contains(r.stderr, "  -"+f.Name+"\n") {
					t.Errorf("relay %s -h does not list -%s:\n%s", c.name, f.Name, r.stderr)
				}
			})
		})
	}
}

func TestRun_VersionPrintsTheVersion(t *testing.T) {
	for _, arg := range []string{"version", "--version"} {
		r := runRelay(t.Context(), nil, "", arg)
		if r.err != nil || !strings.HasPrefix(r.stdout, "relay ") || strings.Count(r.stdout, "\n") != 1 {
			t.Errorf("relay %s: stdout %q, err %v; want one line starting with \"relay \"", arg, r.stdout, r.err)
		}
	}
}

func TestRun_FailsClearlyWhenTheDatabaseIsUnreachable(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--addr", "127.0.0.1:0"},
		{"work"},
		{"migrate", "status"},
		{"enqueue", "noop"},
		{"dev", "--addr", "127.0.0.1:0"},
	} {
		t.Run(args[0], func(t *testing.T) {
			args := append(args, "--database-url", "postgres://127.0.0.1:1/x")
			r := runRelay(testContext(t, 20*time.Second), nil, "", args...)
			if r.err == nil {
				t.Fatal("succeeded without a database")
			}
			const want = "cannot reach the database postgres://127.0.0.1:1/x: "
			if !strings.HasPrefix(r.err.Error(), want) || strings.Contains(r.err.Error(), "\n") {
				t.Errorf("error = %q, want one line starting with %q", r.err, want)
			}
		})
	}
}

// TestRun_RefusesADatabaseURLWithWhiteSpaceAroundIt: a URL read from a
// file or pasted with a space before or after it is a usage error that
// shows no part of it. pgx takes a URL after a space for the keyword/value
// form, and the server's refusal of the "parameter" named by all of it up
// to its first '=' would show the password.
func TestRun_RefusesADatabaseURLWithWhiteSpaceAroundIt(t *testing.T) {
	const url = "postgres://u:s3cret@127.0.0.1:5432/x?sslmode=disable"
	for _, tt := range []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"DATABASE_URL after a space", map[string]string{"DATABASE_URL": " " + url}, []string{"migrate", "status"}},
		{"DATABASE_URL before a newline", map[string]string{"DATABASE_URL": url + "\n"}, []string{"enqueue", "noop"}},
		{"--database-url after a tab", nil, []string{"work", "--database-url", "\t" + url}},
		{"RELAY_SESSION_DATABASE_URL after a space", map[string]string{"DATABASE_URL": dbtest.NewURL(t), "RELAY_SESSION_DATABASE_URL": " " + url},
			[]string{"work"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := runRelay(testContext(t, 20*time.Second), tt.env, "", tt.args...)
			if code := cli.ExitCode(r.err); code != 2 {
				t.Fatalf("exit status %d (error %v), want 2", code, r.err)
			}
			if !strings.Contains(r.err.Error(), "begins or ends with white space") || strings.Contains(r.err.Error(), "s3cret") {
				t.Errorf("error = %q, want one saying the URL begins or ends with white space, without the password", r.err)
			}
		})
	}
}

// TestRun_FailsClearlyWhenTheSessionDatabaseIsUnreachable gives a worker a
// session database that cannot be reached, as with a mistake in
// --session-database-url: a worker claims nothing without its session, so
// it fails at start, as without its database, rather than run waiting for
// a session it never had.
func TestRun_FailsClearlyWhenTheSessionDatabaseIsUnreachable(t *testing.T) {
	dsn := dbtest.NewURL(t)
	for _, args := range [][]string{
		{"work"},
		{"serve", "--addr", "127.0.0.1:0", "--slots", "2"},
		{"dev", "--addr", "127.0.0.1:0"},
	} {
		t.Run(args[0], func(t *testing.T) {
			env := map[string]string{"DATABASE_URL": dsn, "RELAY_SESSION_DATABASE_URL": "postgres://u:s3cret@127.0.0.1:1/x"}
			r := runRelay(testContext(t, 20*time.Second), env, "", args...)
			if r.err == nil {
				t.Fatal("succeeded without a session database")
			}
			const want = "cannot reach the session database postgres://u:xxxxx@127.0.0.1:1/x: "
			if !strings.HasPrefix(r.err.Error(), want) || strings.Contains(r.err.Error(), "\n") {
				t.Errorf("error = %q, want one line starting with %q", r.err, want)
			}
		})
	}
}

func TestRun_RefusesAnUnmigratedDatabase(t *testing.T) {
	dsn := emptyDatabaseURL(t)
	for _, args := range [][]string{
		{"serve", "--addr", "127.0.0.1:0", "--slots", "2"},
		{"work"},
		{"enqueue", "noop"},
	} {
		t.Run(args[0], func(t *testing.T) {
			r := runRelay(testContext(t, 20*time.Second), map[string]string{"DATABASE_URL": dsn}, "", args...)
			if !errors.Is(r.err, errNotMigrated) {
				t.Fatalf("error = %v, want %v", r.err, errNotMigrated)
			}
			if got, want := r.err.Error(), `database not migrated: run "relay migrate up"`; got != want {
				t.Errorf("error = %q, want %q", got, want)
			}
		})
	}
}

func TestMigrate_UpStatusDownOnAFreshDatabase(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	dsn := emptyDatabaseURL(t)
	type step struct {
		args []string
		want string
	}
	down := func(from, to int) []step {
		var steps []step
		for v := from; v >= to; v-- {
			steps = append(steps, step{[]string{"migrate", "down"}, fmt.Sprintf("rolled back migration %d %s", v, migrationNames[v-1])})
		}
		return steps
	}
	all := len(migrationNames)
	steps := []step{
		{[]string{"migrate", "status"}, migrateStatus(0)},
		{[]string{"migrate"}, migrateUpFromNone()},
		{[]string{"migrate", "up"}, "no migrations to apply: the database is up to date"},
		{[]string{"migrate", "status"}, migrateStatus(all)},
	}
	steps = append(steps, down(all, 7)...)
	steps = append(steps, step{[]string{"migrate", "status"}, migrateStatus(6)})
	steps = append(steps, down(6, 1)...)
	steps = append(steps,
		step{[]string{"migrate", "down"}, "no migration to roll back"},
		step{[]string{"migrate", "up"}, migrateUpFromNone()})
	for _, s := range steps {
		r := runRelay(ctx, nil, "", append(s.args, "--database-url", dsn)...)
		if r.err != nil {
			t.Fatalf("relay %s: %v", strings.Join(s.args, " "), r.err)
		}
		if diff := cmp.Diff(s.want+"\n", r.stdout); diff != "" {
			t.Errorf("relay %s: stdout (-want +got):\n%s", strings.Join(s.args, " "), diff)
		}
	}
}

// TestRun_FailsWhenItCannotPrintItsOutput: a command whose output cannot
// be written, as to a full disk, fails with exit status 1, saying what it
// did, rather than succeed with nothing printed; a script that reads the
// output would otherwise read nothing from a success.
func TestRun_FailsWhenItCannotPrintItsOutput(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	dsn := emptyDatabaseURL(t)
	last := len(migrationNames)
	for _, tt := range []struct {
		args      []string
		wantInErr string
	}{
		{[]string{"version"}, "print the version: no space left on device"},
		{[]string{"migrate", "down"}, "print the outcome: no space left on device"},
		{[]string{"migrate", "up"}, fmt.Sprintf("applied migrations 1 to %d, but printing it failed: no space left on device", last)},
		{[]string{"migrate", "up"}, "print the outcome: no space left on device"},
		{[]string{"migrate", "down"}, fmt.Sprintf("rolled back migration %d, but printing it failed: no space left on device", last)},
	} {
		err := run(ctx, append([]string{"relay"}, tt.args...), func(k string) string { return map[string]string{"DATABASE_URL": dsn}[k] },
			strings.NewReader(""), failingWriter{}, io.Discard)
		if code := cli.ExitCode(err); code != 1 || !strings.Contains(err.Error(), tt.wantInErr) {
			t.Errorf("relay %s: exit status %d, error %v; want 1, with an error containing %q", strings.Join(tt.args, " "), code, err, tt.wantInErr)
		}
	}
}

// TestMigrate_StatusAndTheSchemaCheckCreateNothing looks at a database
// that was never migrated with relay migrate status and with a command
// that needs the schema: both only read, so the database still holds no
// table afterwards.
func TestMigrate_StatusAndTheSchemaCheckCreateNothing(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	dsn := emptyDatabaseURL(t)
	r := runRelay(ctx, nil, "", "migrate", "status", "--database-url", dsn)
	if r.err != nil {
		t.Fatalf("relay migrate status: %v", r.err)
	}
	if diff := cmp.Diff(migrateStatus(0)+"\n", r.stdout); diff != "" {
		t.Errorf("relay migrate status: stdout (-want +got):\n%s", diff)
	}
	if r := runRelay(ctx, nil, "", "enqueue", "noop", "--database-url", dsn); !errors.Is(r.err, errNotMigrated) {
		t.Fatalf("relay enqueue: error = %v, want %v", r.err, errNotMigrated)
	}
	wantNoTable(t, ctx, dsn, "relay migrate status and relay enqueue")
}

// TestMigrate_DownOnANeverMigratedDatabaseCreatesNothing rolls back a
// database that was never migrated, as a mistyped URL would name: there is
// nothing to roll back, and the database still holds no table afterwards.
func TestMigrate_DownOnANeverMigratedDatabaseCreatesNothing(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	dsn := emptyDatabaseURL(t)
	r := runRelay(ctx, nil, "", "migrate", "down", "--database-url", dsn)
	if r.err != nil {
		t.Fatalf("relay migrate down: %v", r.err)
	}
	if diff := cmp.Diff("no migration to roll back\n", r.stdout); diff != "" {
		t.Errorf("relay migrate down: stdout (-want +got):\n%s", diff)
	}
	wantNoTable(t, ctx, dsn, "relay migrate down")
}

// wantNoTable fails the test if the database at dsn holds a table in its
// current schema after what ran.
func wantNoTable(t *testing.T, ctx context.Context, dsn, after string) {
	t.Helper()
	var tables []string
	rows, err := mustPool(t, dsn).Query(ctx, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
	if err == nil {
		tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(tables) > 0 {
		t.Errorf("the database holds %v after %s, want no table", tables, after)
	}
}

// TestMigrate_UpTakesOverWhatAnEarlierBuildRecorded migrates a database
// whose migrations an earlier build of Relay, which carried the first 16,
// recorded in goose's default table: up says it recorded them in
// relay_migrations, and applies the rest; down then rolls back the newest.
func TestMigrate_UpTakesOverWhatAnEarlierBuildRecorded(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	dsn := dbtest.NewURL(t)
	const earlier = 16
	m, err := migrations.NewMigrator(mustPool(t, dsn))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.DownTo(ctx, earlier); err != nil {
		t.Fatal(err)
	}
	if _, err := mustPool(t, dsn).Exec(ctx, "ALTER TABLE "+migrations.VersionTable+" RENAME TO goose_db_version"); err != nil {
		t.Fatal(err)
	}
	all := len(migrationNames)
	var rest []string
	for v := earlier + 1; v <= all; v++ {
		rest = append(rest, fmt.Sprintf("applied migration %d %s", v, migrationNames[v-1]))
	}
	for _, s := range []struct {
		args []string
		want string
	}{
		{[]string{"migrate", "status"}, migrateStatus(earlier)},
		{[]string{"migrate", "up"}, fmt.Sprintf("recorded migrations 1 to %d, which an earlier relay recorded in goose_db_version, in %s\n",
			earlier, migrations.VersionTable) + strings.Join(rest, "\n")},
		{[]string{"migrate", "down"}, fmt.Sprintf("rolled back migration %d %s", all, migrationNames[all-1])},
	} {
		r := runRelay(ctx, nil, "", append(s.args, "--database-url", dsn)...)
		if r.err != nil {
			t.Fatalf("relay %s: %v", strings.Join(s.args, " "), r.err)
		}
		if diff := cmp.Diff(s.want+"\n", r.stdout); diff != "" {
			t.Errorf("relay %s: stdout (-want +got):\n%s", strings.Join(s.args, " "), diff)
		}
	}
}

// TestMigrate_ADatabaseANewerBuildMigratedIsToldApartAndNotRolledBack
// records in a migrated database a migration this build does not carry,
// as a newer build of Relay would. Status lists it, up says the database
// is ahead, down refuses to roll back what only the newer build knows how
// to, and a command that needs the schema runs with a warning.
func TestMigrate_ADatabaseANewerBuildMigratedIsToldApartAndNotRolledBack(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	dsn := dbtest.NewURL(t)
	newer := len(migrationNames) + 1
	if _, err := mustPool(t, dsn).Exec(ctx, "INSERT INTO "+migrations.VersionTable+" (version_id, is_applied) VALUES ($1, true)", newer); err != nil {
		t.Fatal(err)
	}
	relay := func(args ...string) result {
		t.Helper()
		return runRelay(ctx, map[string]string{"DATABASE_URL": dsn}, "", args...)
	}
	wantStatus := fmt.Sprintf("%s\n%-9d%-9s%s\n", migrateStatus(len(migrationNames)), newer, "applied", "(not in this build: applied by a newer relay)")

	r := relay("migrate", "status")
	if r.err != nil {
		t.Fatalf("relay migrate status: %v", r.err)
	}
	if diff := cmp.Diff(wantStatus, r.stdout); diff != "" {
		t.Errorf("relay migrate status: stdout (-want +got):\n%s", diff)
	}

	r = relay("migrate", "up")
	want := fmt.Sprintf("no migrations to apply: the database also holds migration %d, newer than this build's newest (%d)\n", newer, len(migrationNames))
	if r.err != nil || r.stdout != want {
		t.Errorf("relay migrate up: %v, stdout %q; want %q", r.err, r.stdout, want)
	}

	r = relay("migrate", "down")
	if !errors.Is(r.err, migrations.ErrUnknownMigration) || !strings.Contains(r.err.Error(), fmt.Sprint(newer)) {
		t.Errorf("relay migrate down: error = %v, want %v naming %d", r.err, migrations.ErrUnknownMigration, newer)
	}
	if r := relay("migrate", "status"); r.stdout != wantStatus {
		t.Errorf("after relay migrate down, status:\n%s\nwant it unchanged:\n%s", r.stdout, wantStatus)
	}

	r = relay("enqueue", "noop")
	if r.err != nil {
		t.Fatalf("relay enqueue: %v", r.err)
	}
	if !strings.Contains(r.stderr, "does not carry") || !strings.Contains(r.stderr, fmt.Sprintf("unknown_migrations=[%d]", newer)) {
		t.Errorf("relay enqueue warned nothing of migration %d; stderr:\n%s", newer, r.stderr)
	}
}

// migrationNames are Relay's migrations, in the order relay migrate
// applies them.
var migrationNames = []string{
	"00001_create_jobs.sql",
	"00002_create_workers.sql",
	"00003_create_worker_sessions.sql",
	"00004_cap_job_errors.sql",
	"00005_create_job_summaries.sql",
	"00006_index_job_lists.sql",
	"00007_index_finished_jobs.sql",
	"00008_notify_returned_jobs.sql",
	"00009_index_leases_by_their_columns.sql",
	"00010_index_ready_jobs_by_their_columns.sql",
	"00011_index_listings_apart_for_backlog_and_history.sql",
	"00012_list_history_queue_by_queue.sql",
	"00013_index_history_by_state_and_kind_again.sql",
	"00014_notify_each_queue_on_its_own_channel.sql",
	"00015_stop_notifying_the_shared_channels.sql",
	"00016_let_enqueues_announce_after_commit.sql",
	"00017_refuse_infinite_times.sql",
}

// migrateStatus is what relay migrate status prints with the first
// applied of migrationNames applied and the rest pending.
func migrateStatus(applied int) string {
	lines := []string{"VERSION  STATE    MIGRATION"}
	for i, name := range migrationNames {
		state := "pending"
		if i < applied {
			state = "applied"
		}
		lines = append(lines, fmt.Sprintf("%-9d%-9s%s", i+1, state, name))
	}
	return strings.Join(lines, "\n")
}

// migrateUpFromNone is what relay migrate prints as it applies every
// migration to a database that has none.
func migrateUpFromNone() string {
	lines := make([]string, len(migrationNames))
	for i, name := range migrationNames {
		lines[i] = fmt.Sprintf("applied migration %d %s", i+1, name)
	}
	return strings.Join(lines, "\n")
}

func TestEnqueue_InsertsTheJobAndPrintsItWithoutTheLeaseToken(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	dsn := dbtest.NewURL(t)
	env := map[string]string{"DATABASE_URL": dsn}

	enqueue := func(t *testing.T, stdin string, args ...string) map[string]any {
		t.Helper()
		r := runRelay(ctx, env, stdin, append([]string{"enqueue"}, args...)...)
		if r.err != nil {
			t.Fatalf("relay enqueue %s: %v", strings.Join(args, " "), r.err)
		}
		var job map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &job); err != nil {
			t.Fatalf("stdout is not a JSON object: %v\n%s", err, r.stdout)
		}
		for _, k := range []string{"lease_token", "LeaseToken"} {
			if _, ok := job[k]; ok {
				t.Errorf("printed the lease token: %s", r.stdout)
			}
		}
		return job
	}
	pick := func(job map[string]any, keys ...string) map[string]any {
		out := map[string]any{}
		for _, k := range keys {
			out[k] = job[k]
		}
		return out
	}
	keys := []string{"queue", "kind", "payload", "priority", "state", "attempt", "max_attempts"}

	t.Run("a flag's value that is a double dash", func(t *testing.T) {
		job := enqueue(t, "", "--idempotency-key", "--", "noop", "--priority", "5")
		want := map[string]any{"kind": "noop", "priority": 5.0, "idempotency_key": "--"}
		if diff := cmp.Diff(want, pick(job, "kind", "priority", "idempotency_key")); diff != "" {
			t.Errorf("job (-want +got):\n%s", diff)
		}
	})

	t.Run("flags before and after the kind", func(t *testing.T) {
		job := enqueue(t, "", "--queue", "q1", "hash", "--payload", `{"iterations": 5}`, "--priority", "-3", "--max-attempts", "2")
		want := map[string]any{"queue": "q1", "kind": "hash", "payload": map[string]any{"iterations": 5.0},
			"priority": -3.0, "state": "available", "attempt": 0.0, "max_attempts": 2.0}
		if diff := cmp.Diff(want, pick(job, keys...)); diff != "" {
			t.Errorf("job (-want +got):\n%s", diff)
		}
		stored, err := db.New(mustPool(t, dsn)).JobGet(ctx, int64(job["id"].(float64)))
		if err != nil {
			t.Fatalf("the printed job is not in the database: %v", err)
		}
		if stored.Kind != "hash" || stored.Queue != "q1" || stored.MaxAttempts != 2 || stored.Priority != -3 {
			t.Errorf("stored job = %+v", stored)
		}
	})
	t.Run("defaults", func(t *testing.T) {
		job := enqueue(t, "", "noop")
		want := map[string]any{"queue": "default", "kind": "noop", "payload": map[string]any{},
			"priority": 0.0, "state": "available", "attempt": 0.0, "max_attempts": 25.0}
		if diff := cmp.Diff(want, pick(job, keys...)); diff != "" {
			t.Errorf("job (-want +got):\n%s", diff)
		}
	})
	t.Run("payload from standard input", func(t *testing.T) {
		job := enqueue(t, `{"ms": 1}`+"\n", "sleep", "--payload", "-")
		if diff := cmp.Diff(map[string]any{"ms": 1.0}, job["payload"]); diff != "" {
			t.Errorf("payload (-want +got):\n%s", diff)
		}
	})
	t.Run("delay and run-at schedule the job", func(t *testing.T) {
		before := time.Now()
		job := enqueue(t, "", "noop", "--delay", "1h")
		runAt, _ := time.Parse(time.RFC3339Nano, job["run_at"].(string))
		if d := runAt.Sub(before); d < 59*time.Minute || d > 61*time.Minute {
			t.Errorf("run_at %s is %s from now, want about 1h", runAt, d)
		}
		want := time.Now().Add(48 * time.Hour).UTC().Truncate(time.Second)
		job = enqueue(t, "", "noop", "--run-at", want.Format(time.RFC3339))
		runAt, _ = time.Parse(time.RFC3339Nano, job["run_at"].(string))
		if !runAt.Equal(want) {
			t.Errorf("run_at = %s, want %s", runAt, want)
		}
	})
	t.Run("idempotency key returns the existing job", func(t *testing.T) {
		first := enqueue(t, "", "noop", "--idempotency-key", "once")
		second := enqueue(t, "", "noop", "--idempotency-key", "once")
		if first["id"] != second["id"] {
			t.Errorf("second enqueue made job %v, want the first, %v", second["id"], first["id"])
		}
		if first["existing"] != nil || second["existing"] != true {
			t.Errorf("existing = %v then %v, want absent then true", first["existing"], second["existing"])
		}
		other := enqueue(t, "", "noop", "--idempotency-key", "once", "--queue", "elsewhere")
		if other["id"] == first["id"] {
			t.Errorf("the same key in another queue returned the first job")
		}
	})
	t.Run("idempotency key of a job whose result nests deeper than encoding/json reads returns it", func(t *testing.T) {
		first := enqueue(t, "", "noop", "--idempotency-key", "deep")
		const depth = 10050 // jsonb holds it; encoding/json reads 10,000 levels
		deep := strings.Repeat("[", depth) + strings.Repeat("]", depth)
		if _, err := mustPool(t, dsn).Exec(ctx, `UPDATE jobs SET state = 'succeeded', finished_at = now(), result = $2::text::jsonb WHERE id = $1`,
			int64(first["id"].(float64)), deep); err != nil {
			t.Fatal(err)
		}
		r := runRelay(ctx, env, "", "enqueue", "noop", "--idempotency-key", "deep")
		if r.err != nil {
			t.Fatalf("relay enqueue: %v", r.err)
		}
		want := fmt.Sprintf(`"result":%s,"idempotency_key":"deep","existing":true}`+"\n", deep)
		if !strings.HasPrefix(r.stdout, fmt.Sprintf(`{"id":%v,`, first["id"])) || !strings.HasSuffix(r.stdout, want) {
			t.Errorf("printed %.100s...%.100s, want job %v, on one line, with its result as stored", r.stdout, r.stdout[max(len(r.stdout)-100, 0):], first["id"])
		}
	})
	t.Run("idempotency key of a different job is refused as the API refuses it", func(t *testing.T) {
		first := enqueue(t, "", "noop", "--idempotency-key", "twice", "--payload", `{"n":1}`)
		r := runRelay(ctx, env, "", "enqueue", "noop", "--idempotency-key", "twice", "--payload", `{"n":2}`)
		want := fmt.Sprintf(`enqueue: --idempotency-key "twice" was already used in queue "default" for a different job (job %v); nothing was enqueued`, first["id"])
		if r.err == nil || r.err.Error() != want {
			t.Errorf("reusing the key for another payload: err = %v, want %q", r.err, want)
		}
		if r.stdout != "" {
			t.Errorf("printed %q, want nothing", r.stdout)
		}
		same := enqueue(t, "", "noop", "--idempotency-key", "twice", "--payload", `{ "n" : 1 }`)
		if same["id"] != first["id"] || same["existing"] != true {
			t.Errorf("the same job again (payload spaced differently) = job %v, existing %v; want job %v, existing true", same["id"], same["existing"], first["id"])
		}
	})
}

func mustPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := connect(t.Context(), slog.New(slog.DiscardHandler), dsn, "relay test", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestDev_RunsJobsOnAThrowawayDatabaseAndRemovesIt runs the README's first
// command, `relay dev` without DATABASE_URL, in-process.
func TestDev_RunsJobsOnAThrowawayDatabaseAndRemovesIt(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server; skipped with -short")
	}
	ctx := testContext(t, 60*time.Second)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"relay", "dev", "--addr", "127.0.0.1:0"}, func(string) string { return "" },
			strings.NewReader(""), &stdout, &stderr)
	}()

	// The banner names the address and the cluster's directory.
	bannerRE := regexp.MustCompile(`curl -s (localhost:\d+)/v1/jobs -d`)
	dirRE := regexp.MustCompile(`\(in (\S+)\)`)
	var addr, dir string
	for addr == "" {
		select {
		case err := <-done:
			t.Fatalf("relay dev exited early: %v\nstderr:\n%s", err, stderr.String())
		case <-ctx.Done():
			t.Fatalf("no banner after 60s\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if m := bannerRE.FindStringSubmatch(stdout.String()); m != nil {
			addr = m[1]
		}
		if m := dirRE.FindStringSubmatch(stdout.String()); m != nil {
			dir = m[1]
		}
	}
	if dir == "" {
		t.Fatalf("the banner does not say where the throwaway database is:\n%s", stdout.String())
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("throwaway cluster directory: %v", err)
	}

	job := postJob(t, ctx, "http://"+addr, "", `{"kind":"hash","payload":{"iterations":1000}}`)
	got := waitForState(t, ctx, "http://"+addr, "", job.ID, "succeeded")
	if got.Result["digest"] == nil || got.Result["attempt"] != 1.0 {
		t.Errorf("result = %v, want a digest from attempt 1", got.Result)
	}

	stop() // Ctrl-C
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("relay dev: %v\nstderr:\n%s", err, stderr.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay dev did not stop within 30s")
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("throwaway cluster directory %s still there (stat: %v)", dir, err)
	}
}

// apiJob is the part of the API's job that the tests look at.
type apiJob struct {
	ID        int64          `json:"id"`
	State     string         `json:"state"`
	Attempt   int            `json:"attempt"`
	LastError *string        `json:"last_error"`
	LeasedBy  *string        `json:"leased_by"`
	Result    map[string]any `json:"result"`
}

func apiRequest(ctx context.Context, method, url, token, body string) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, b, err
}

func postJob(t *testing.T, ctx context.Context, base, token, body string) apiJob {
	t.Helper()
	resp, b, err := apiRequest(ctx, http.MethodPost, base+"/v1/jobs", token, body)
	if err != nil {
		t.Fatalf("POST /v1/jobs: %v", err)
	}
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("POST /v1/jobs: %s: %s", resp.Status, b)
	}
	var job apiJob
	if err := json.Unmarshal(b, &job); err != nil {
		t.Fatalf("POST /v1/jobs: %v: %s", err, b)
	}
	return job
}

// waitForState polls the job until it reaches state, failing the test if
// it reaches another final state or ctx ends first.
func waitForState(t *testing.T, ctx context.Context, base, token string, id int64, state string) apiJob {
	t.Helper()
	var job apiJob
	for {
		resp, b, err := apiRequest(ctx, http.MethodGet, fmt.Sprintf("%s/v1/jobs/%d", base, id), token, "")
		if err == nil && resp.StatusCode == http.StatusOK {
			job = apiJob{}
			if err := json.Unmarshal(b, &job); err != nil {
				t.Fatalf("GET job %d: %v: %s", id, err, b)
			}
			if job.State == state {
				return job
			}
			if job.State == "dead" || job.State == "cancelled" || job.State == "succeeded" {
				t.Fatalf("job %d ended %s (attempt %d, last error %v), want %s", id, job.State, job.Attempt, deref(job.LastError), state)
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job %d still %q (attempt %d, last error %v), want %s: %v", id, job.State, job.Attempt, deref(job.LastError), state, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// TestRun_EnqueueStopsWaitingForStandardInputWhenSignalled gives relay
// enqueue --payload - a standard input that stays open, and stops it as a
// signal does, by ending its context: it returns at once, saying why,
// rather than waiting for input that never comes.
func TestRun_EnqueueStopsWaitingForStandardInputWhenSignalled(t *testing.T) {
	stdin, writer := io.Pipe()
	defer writer.Close()
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		var stdout, stderr syncBuffer
		done <- run(ctx, []string{"relay", "enqueue", "hash", "--payload", "-"},
			func(k string) string { return map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x"}[k] },
			stdin, &stdout, &stderr)
	}()
	time.Sleep(100 * time.Millisecond)
	stop()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "standard input") {
			t.Errorf("error %v, want the read of standard input cancelled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("relay enqueue still waited for standard input 10s after its context ended")
	}
}

// failingWriter fails every write, as a standard output closed or on a
// full disk does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// TestRun_EnqueueThatCannotPrintItsJobSaysTheJobWasEnqueued: relay
// enqueue whose standard output fails once the job is stored fails, and
// says that the job was enqueued, and which, so that no one enqueues it
// again for the error.
func TestRun_EnqueueThatCannotPrintItsJobSaysTheJobWasEnqueued(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	dsn := dbtest.NewURL(t)
	var stderr syncBuffer
	err := run(ctx, []string{"relay", "enqueue", "noop"}, func(k string) string { return map[string]string{"DATABASE_URL": dsn}[k] },
		strings.NewReader(""), failingWriter{}, &stderr)
	if err == nil {
		t.Fatal("relay enqueue printed its job to a standard output that fails every write")
	}
	var id int64
	if err := mustPool(t, dsn).QueryRow(ctx, `SELECT id FROM jobs`).Scan(&id); err != nil {
		t.Fatalf("the job was not stored: %v", err)
	}
	if want := fmt.Sprintf("job %d was enqueued", id); !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "no space left on device") {
		t.Errorf("error %q does not say %q, and why it was not printed", err, want)
	}
}

// TestRun_StoppedWhileConnectingSaysSo stops relay enqueue while its
// server accepts the connection and never answers: the error says the
// connection was given up, not that the database cannot be reached.
func TestRun_StoppedWhileConnectingSaysSo(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			defer conn.Close() // held open, unanswered, until the test ends
		}
	}()
	ctx, stop := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer stop()
	r := runRelay(ctx, map[string]string{"DATABASE_URL": "postgres://postgres@" + ln.Addr().String() + "/x"}, "", "enqueue", "hash")
	var unreachable *connectError
	if errors.As(r.err, &unreachable) || !errors.Is(r.err, context.DeadlineExceeded) {
		t.Errorf("error %v, want the connection given up as the context ended", r.err)
	}
}

// TestDev_StoppedWhileStartingItsDatabaseSaysSo stops relay dev, as Ctrl-C
// does, while its throwaway PostgreSQL is still being made: the error says
// that the start was given up, not that initdb failed.
func TestDev_StoppedWhileStartingItsDatabaseSaysSo(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server; skipped with -short")
	}
	ctx, stop := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer stop()
	r := runRelay(ctx, nil, "", "dev", "--addr", "127.0.0.1:0")
	if !errors.Is(r.err, context.DeadlineExceeded) || strings.Contains(r.err.Error(), "signal: killed") {
		t.Errorf("error %v, want the start of the throwaway database given up as the context ended", r.err)
	}
}

// TestRun_NeverShowsAPasswordThatHoldsAnAt: a URL whose password holds an
// unescaped '@' is read by pgx, as by libpq, as ending at that '@', the
// rest of the password taken for the host; one whose password holds a '/'
// before or after an '@' ends the URL's authority at that '/', the rest
// read as the database's name, or as a port that pgx's error shows, or a
// part of the password as the host, which a connection looks up and names.
// Every command refuses each with a usage error that says to write the '@'
// as %40, and shows no part of the password after its first two bytes.
func TestRun_NeverShowsAPasswordThatHoldsAnAt(t *testing.T) {
	migrated := dbtest.NewURL(t)
	for _, password := range []string{"pass@word-tail", "pa@zq/word-tail", "pa/zq@word-tail", "pazq/word-tail"} {
		dsn := "postgres://u:" + password + "@127.0.0.1:1/x"
		for _, tt := range []struct {
			name string
			env  map[string]string
			args []string
		}{
			{"serve", map[string]string{"DATABASE_URL": dsn}, []string{"serve", "--addr", "127.0.0.1:0"}},
			{"work", map[string]string{"DATABASE_URL": dsn}, []string{"work"}},
			{"dev", map[string]string{"DATABASE_URL": dsn}, []string{"dev", "--addr", "127.0.0.1:0"}},
			{"migrate", map[string]string{"DATABASE_URL": dsn}, []string{"migrate", "status"}},
			{"enqueue", map[string]string{"DATABASE_URL": dsn}, []string{"enqueue", "noop"}},
			{"session database", map[string]string{"DATABASE_URL": migrated, "RELAY_SESSION_DATABASE_URL": dsn}, []string{"work"}},
		} {
			t.Run(password+"/"+tt.name, func(t *testing.T) {
				r := runRelay(testContext(t, 20*time.Second), tt.env, "", tt.args...)
				if r.err == nil {
					t.Fatal("succeeded")
				}
				for _, out := range []string{r.err.Error(), r.stdout, r.stderr} {
					for _, part := range []string{"zq", "word-tail"} {
						if strings.Contains(out, part) {
							t.Errorf("shows %q of the password: %q", part, out)
						}
					}
				}
				var u *cli.UsageError
				if !errors.As(r.err, &u) || !strings.Contains(r.err.Error(), "%40") {
					t.Errorf("error = %v (%T), want a usage error that says to write '@' as %%40", r.err, r.err)
				}
			})
		}
	}
}
