package worker_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/worker"
)

// bundle is what most tests need: a fresh database and its queries.
type bundle struct {
	ctx  context.Context
	pool *pgxpool.Pool
	q    *db.Queries
}

func setup(t *testing.T) *bundle {
	t.Helper()
	pool := dbtest.New(t)
	return &bundle{ctx: context.Background(), pool: pool, q: db.New(pool)}
}

// enqueue inserts a ready job of the given kind on the default queue.
func (b *bundle) enqueue(t *testing.T, kind string, payload string, maxAttempts int32) db.Job {
	t.Helper()
	job, err := b.q.JobInsert(b.ctx, db.JobInsertParams{
		Queue: "default", Kind: kind, Payload: json.RawMessage(payload), MaxAttempts: maxAttempts,
	})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	return job
}

// claim claims up to n jobs of the default queue as the given worker.
func (b *bundle) claim(t *testing.T, workerID string, n int32, lease time.Duration) []db.JobCompleteAndClaimRow {
	t.Helper()
	rows, err := b.q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
		Queue: "default", MaxJobs: n, LeaseMs: lease.Milliseconds(), WorkerID: workerID,
	})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	var claimed []db.JobCompleteAndClaimRow
	for _, r := range rows {
		if r.ID != nil {
			claimed = append(claimed, r)
		}
	}
	return claimed
}

// claimOne claims exactly one job or fails the test.
func (b *bundle) claimOne(t *testing.T, workerID string, lease time.Duration) (int64, uuid.UUID) {
	t.Helper()
	rows := b.claim(t, workerID, 1, lease)
	if len(rows) != 1 {
		t.Fatalf("claim by %s: got %d jobs, want 1", workerID, len(rows))
	}
	return *rows[0].ID, *rows[0].LeaseToken
}

// complete completes one claim and reports whether the database accepted it.
func (b *bundle) complete(t *testing.T, id int64, token uuid.UUID, result string) bool {
	t.Helper()
	rows, err := b.q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
		CompleteIds: []int64{id}, CompleteTokens: []uuid.UUID{token},
		CompleteResults: []json.RawMessage{json.RawMessage(result)},
		Queue:           "default", WorkerID: "unused",
	})
	if err != nil {
		t.Fatalf("complete: %v", err)
	}
	return len(rows) == 1 && len(rows[0].CompletedIds) == 1 && rows[0].CompletedIds[0] == id
}

func (b *bundle) get(t *testing.T, id int64) db.Job {
	t.Helper()
	job, err := b.q.JobGet(b.ctx, id)
	if err != nil {
		t.Fatalf("get job %d: %v", id, err)
	}
	return job
}

// waitForLeaseExpiry waits until the database clock has passed the job's
// lease expiry.
func (b *bundle) waitForLeaseExpiry(t *testing.T, id int64) {
	t.Helper()
	job := b.get(t, id)
	if job.LeaseExpiresAt == nil {
		t.Fatalf("job %d holds no lease", id)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var expired bool
		if err := b.pool.QueryRow(b.ctx, "SELECT now() > $1", *job.LeaseExpiresAt).Scan(&expired); err != nil {
			t.Fatal(err)
		}
		if expired {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("lease of job %d never expired", id)
}

// waitForState polls the job until it reaches state or the timeout passes.
func (b *bundle) waitForState(t *testing.T, id int64, state db.JobState, timeout time.Duration) db.Job {
	t.Helper()
	return b.waitFor(t, id, timeout, "state "+string(state), func(j db.Job) bool { return j.State == state })
}

// waitFor polls the job until done reports true of it, and returns it. Once
// the timeout has passed, it fails the test, saying what the job should have
// become (want) and what it is.
func (b *bundle) waitFor(t *testing.T, id int64, timeout time.Duration, want string, done func(db.Job) bool) db.Job {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		job := b.get(t, id)
		if done(job) {
			return job
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %d after %s: state %s, leased by %q (last error %v); want %s",
				id, timeout, job.State, deref(job.LeasedBy), deref(job.LastError), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// startWorker runs a worker until the test ends and returns it with a
// function that stops it and waits for Run to return.
func (b *bundle) startWorker(t *testing.T, cfg worker.Config, register func(*worker.Worker)) (*worker.Worker, func()) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	w, err := worker.New(b.pool, cfg)
	if err != nil {
		t.Fatalf("new worker: %v", err)
	}
	register(w)
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stopped := false
	stop := func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("worker Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("worker did not stop within 30s")
		}
	}
	t.Cleanup(stop)
	return w, stop
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
