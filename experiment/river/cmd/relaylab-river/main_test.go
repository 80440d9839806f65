package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/internal/dbtest"
)

func TestRun_RejectsAMistakenCommandLineAsUsage(t *testing.T) {
	getenv := func(string) string { return "postgres://127.0.0.1:1/none" }
	for _, args := range [][]string{
		{},
		{"compact"},
		{"insert", "--kind", "hash"},
		{"insert", "--batch", "0"},
		{"work", "--workers", "0"},
		{"work", "--fetch-cooldown", "50ms", "--fetch-poll-interval", "20ms"},
		{"work", "--completed-retention", "-1s"},
		{"migrate", "extra"},
	} {
		err := run(t.Context(), append([]string{"relaylab-river"}, args...), getenv, &bytes.Buffer{})
		if cli.ExitCode(err) != 2 {
			t.Errorf("relaylab-river %s: %v (exit %d), want a usage error (exit 2)", strings.Join(args, " "), err, cli.ExitCode(err))
		}
	}
}

// TestRun_MigrateInsertWork runs the commands as the lab runs them, in
// process: work returns nil once its context, which SIGINT and SIGTERM
// cancel, ends.
func TestRun_MigrateInsertWork(t *testing.T) {
	url := dbtest.NewURL(t)
	getenv := databaseEnv(url)
	var logs bytes.Buffer
	for _, args := range [][]string{
		{"migrate"},
		{"insert", "--jobs", "50", "--queue", "q"},
		{"insert", "--jobs", "5", "--queue", "q", "--kind", "sleep", "--sleep-ms", "2"},
	} {
		if err := run(t.Context(), append([]string{"relaylab-river"}, args...), getenv, &logs); err != nil {
			t.Fatalf("relaylab-river %s: %v\n%s", strings.Join(args, " "), err, logs.String())
		}
	}
	// Stopped as soon as it works, while jobs may still be running.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	workLogs := &syncBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"relaylab-river", "work", "--queue", "q", "--workers", "4", "--log-format", "json"}, getenv, workLogs)
	}()
	for !strings.Contains(workLogs.String(), `"msg":"working"`) {
		select {
		case err := <-done:
			t.Fatalf("relaylab-river work ended before it worked: %v\n%s", err, workLogs.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("relaylab-river work: %v\n%s", err, workLogs.String())
	}
	logs.WriteString(workLogs.String())
	for _, want := range []string{`"msg":"working"`, `"fetch_cooldown":"2ms"`, `"fetch_poll_interval":"20ms"`, `"msg":"stopped"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("work's log lacks %s:\n%s", want, logs.String())
		}
	}
}

// syncBuffer is a bytes.Buffer that a command may write while the test
// reads it.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestRunFeed_InsertsEachLinesJobsAndAnswersItThenStopsAtABadLine(t *testing.T) {
	url := dbtest.NewURL(t)
	getenv := databaseEnv(url)
	var logs bytes.Buffer
	if err := run(t.Context(), []string{"relaylab-river", "migrate"}, getenv, &logs); err != nil {
		t.Fatalf("migrate: %v\n%s", err, logs.String())
	}
	var out bytes.Buffer
	err := runFeed(t.Context(), []string{"--queue", "q", "--sleep-ms", "1"}, getenv, strings.NewReader("3\n2\nlots\n4\n"), &out, &logs)
	if err == nil {
		t.Fatalf("feed accepted a line that is not a number")
	}
	want := "ok 3\nok 2\nerror: want a number of jobs of at least 1, got \"lots\"\n"
	if out.String() != want {
		t.Errorf("feed answered %q, want %q", out.String(), want)
	}
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(t.Context(), "SELECT count(*) FROM river_job WHERE queue = 'q' AND kind = 'sleep'").Scan(&n); err != nil || n != 5 {
		t.Errorf("river_job holds %d sleep jobs of q (%v), want 5", n, err)
	}
}

// databaseEnv is an environment that holds DATABASE_URL=url alone.
func databaseEnv(url string) func(string) string {
	return func(k string) string {
		if k == "DATABASE_URL" {
			return url
		}
		return ""
	}
}
