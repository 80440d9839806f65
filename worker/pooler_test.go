package worker_test

import (
	"bytes"
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/pgbouncer"
	"github.com/relayq/relay/worker"
)

// These tests run workers through a real PgBouncer in transaction mode,
// where a session advisory lock taken through the pooler stays behind on
// whichever server connection it was taken on, and LISTEN hears nothing.

// throughPooler starts a transaction-mode PgBouncer in front of the test
// database and returns a pool through it.
func (b *bundle) throughPooler(t *testing.T) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	bouncer := pgbouncer.ForTest(t, b.url, pgbouncer.Options{PoolMode: pgbouncer.PoolModeTransaction})
	return bouncer.URL(cfg.Database)
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
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

// logger returns a logger that writes its records, from Info up, as text
// to s.
func (s *syncBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(s, nil)) }

// waitForLog polls the buffer until it holds every one of parts, and fails
// the test with what it holds once timeout has passed: a worker logs an
// outcome after its statement's answer, so after the database shows it.
func (s *syncBuffer) waitForLog(t *testing.T, timeout time.Duration, parts ...string) {
	t.Helper()
	for deadline := time.Now().Add(timeout); ; time.Sleep(5 * time.Millisecond) {
		got := s.String()
		missing := slices.IndexFunc(parts, func(p string) bool { return !strings.Contains(got, p) })
		if missing < 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s the log does not hold %q; it holds:\n%s", timeout, parts[missing], got)
		}
	}
}

func TestWorker_ThroughATransactionPoolerWithoutASessionRunsOnLeasesAloneAndSaysSo(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pooled := dbtest.Connect(t, b.throughPooler(t))
	var logs syncBuffer
	started := make(chan int64, 1)
	release := make(chan struct{})
	b.runWorker(t, pooled, worker.Config{
		Slots: 2, Lease: 2 * time.Second, PollInterval: 20 * time.Millisecond,
		Logger: logs.logger(),
	}, func(w *worker.Worker) {
		w.HandleFunc("quick", func(ctx context.Context, j *worker.Job) (any, error) { return j.Attempt, nil })
		w.HandleFunc("held", func(ctx context.Context, j *worker.Job) (any, error) {
			started <- j.ID
			<-release
			return "done", nil
		})
	})
	var quick []db.Job
	for range 20 {
		quick = append(quick, b.enqueue(t, "quick", `{}`, 1))
	}
	held := b.enqueue(t, "held", `{}`, 1)
	for _, job := range quick {
		b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	}
	<-started
	// Renewed by heartbeats past its lease, and claimed under no session.
	time.Sleep(3 * time.Second)
	got := b.get(t, held.ID)
	if got.State != db.JobStateRunning || got.Attempt != 1 || got.LeaseSession != nil {
		t.Errorf("held job: %s at attempt %d under session %v; want running its first attempt under no session", got.State, got.Attempt, got.LeaseSession)
	}
	close(release)
	b.waitForState(t, held.ID, db.JobStateSucceeded, 10*time.Second)
	if !strings.Contains(logs.String(), "goes through a connection pooler") {
		t.Errorf("the worker did not say it runs on leases alone; its log:\n%s", logs.String())
	}
	var sessions int
	if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM worker_sessions").Scan(&sessions); err != nil {
		t.Fatal(err)
	}
	if sessions != 0 {
		t.Errorf("%d sessions registered through the pooler, want none: their locks would stay on pooled server connections", sessions)
	}
}

func TestWorker_ThroughATransactionPoolerWithoutASessionLooksForJobsWithEveryCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pooled := dbtest.Connect(t, b.throughPooler(t))
	// Enqueued before the worker starts, so that its first claim finds it.
	held := b.enqueue(t, "held", `{}`, 1)
	started := make(chan struct{}, 1)
	release := make(chan struct{})
	// Its first claim asks for two jobs and finds one, so the queue is
	// empty as far as the worker knows; with no claims ahead and no poll
	// in the test's time, nothing but a completion can make it look for
	// the second job.
	b.runWorker(t, pooled, worker.Config{Slots: 2, Prefetch: -1, PollInterval: time.Hour}, func(w *worker.Worker) {
		w.HandleFunc("held", func(ctx context.Context, j *worker.Job) (any, error) {
			started <- struct{}{}
			<-release
			return nil, nil
		})
		w.HandleFunc("quick", func(ctx context.Context, j *worker.Job) (any, error) { return nil, nil })
	})
	<-started
	quick := b.enqueue(t, "quick", `{}`, 1)
	close(release)
	b.waitForState(t, held.ID, db.JobStateSucceeded, 10*time.Second)
	b.waitForState(t, quick.ID, db.JobStateSucceeded, 10*time.Second)
}

func TestWorker_ThroughATransactionPoolerWithADirectSessionIsJudgedByItsSession(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pooledURL := b.throughPooler(t)
	proxy, direct := b.proxied(t)
	job := b.enqueue(t, "task", `{}`, 3)
	first := newHolder()
	const lease = time.Minute
	// The first worker's session reaches PostgreSQL through a proxy that
	// the test cuts: its process is gone, as far as the database knows.
	b.runWorker(t, dbtest.Connect(t, pooledURL), worker.Config{
		ID: "first", Slots: 1, Lease: lease, ShutdownGrace: -1, SessionDatabaseURL: direct,
	}, func(w *worker.Worker) {
		w.Handle("task", first)
	})
	<-first.started
	if got := b.get(t, job.ID); got.LeaseSession == nil {
		t.Fatalf("the job was claimed under no session, though the worker's session is direct")
	}
	proxy.Cut()
	b.runWorker(t, dbtest.Connect(t, pooledURL), worker.Config{
		ID: "second", Slots: 1, Lease: lease, ReclaimInterval: 50 * time.Millisecond, SessionDatabaseURL: b.url,
	}, func(w *worker.Worker) {
		w.HandleFunc("task", func(ctx context.Context, j *worker.Job) (any, error) { return "second", nil })
	})
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 5*time.Second)
	if got.Attempt != 2 || !strings.Contains(string(got.Errors), "worker session ended") {
		t.Errorf("succeeded at attempt %d, history %s; want attempt 2 after its session ended", got.Attempt, got.Errors)
	}
	// The first worker, alive but without its session, learns that the job
	// was taken back long before its next heartbeat (20s), and stops it.
	first.waitLeaseLost(t)
}
