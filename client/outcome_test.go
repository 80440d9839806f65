package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/faultproxy"
)

// insertPath is one way of storing a job that commits on its own.
type insertPath struct {
	name   string
	insert func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error
}

// insertPaths are the ways of storing a job that commits on its own; the
// Enqueuer's StoreTimeout is timeout, which its callers' ctx does not
// bound.
func insertPaths(timeout time.Duration) []insertPath {
	return []insertPath{
		{"Insert", func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
			_, _, err := client.Insert(ctx, pool, job)
			return err
		}},
		{"InsertWithAnIdempotencyKey", func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
			job.IdempotencyKey = ptr("key")
			_, _, err := client.Insert(ctx, pool, job)
			return err
		}},
		{"InsertMany", func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
			_, err := client.InsertMany(ctx, pool, []client.Job{job})
			return err
		}},
		{"InsertAll", func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
			_, err := client.InsertAll(ctx, pool, []client.Job{job})
			return err
		}},
		{"Enqueuer.Insert", func(ctx context.Context, pool *pgxpool.Pool, job client.Job) error {
			enq := client.NewEnqueuer(pool, client.EnqueuerConfig{AnnounceEvery: -1, StoreTimeout: timeout})
			defer enq.Close(context.WithoutCancel(ctx))
			_, err := enq.Insert(ctx, job)
			return err
		}},
	}
}

// TestInsert_AnAnswerLostToATimeoutIsErrOutcomeUnknownNotTheContexts
// times out each way of storing a job while its commit waits, and the
// commit lands all the same: the error is ErrOutcomeUnknown, not a
// context error, which would say that nothing was stored.
// dbtest.LoseASlowCommitsAnswer tries again when the commit did not land.
func TestInsert_AnAnswerLostToATimeoutIsErrOutcomeUnknownNotTheContexts(t *testing.T) {
	t.Parallel()
	const timeout = 300 * time.Millisecond
	for _, path := range insertPaths(timeout) {
		t.Run(path.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.New(t)
			dbtest.SlowCommitsPastCancels(t, pool, 3*timeout)
			job := newJob(t, client.Request{Payload: json.RawMessage(dbtest.SlowCommitPayload)})
			err := dbtest.LoseASlowCommitsAnswer(t, pool, func() error {
				ctx := t.Context()
				if path.name != "Enqueuer.Insert" { // bounded by its StoreTimeout
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, timeout)
					defer cancel()
				}
				return path.insert(ctx, pool, job)
			})
			if !errors.Is(err, client.ErrOutcomeUnknown) {
				t.Errorf("insert timed out at its commit: %v, want ErrOutcomeUnknown", err)
			}
			if errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("insert timed out at its commit: %v is context.DeadlineExceeded, which says that nothing was stored", err)
			}
			if n := dbtest.CountJobs(t, pool); n != 1 {
				t.Errorf("%d jobs stored once the commit landed, want 1", n)
			}
		})
	}
}

// TestInsert_AContextEndedBeforeTheStatementIsSentStoresNothing gives
// each way of storing a job a context already cancelled: the error is
// the context's, not ErrOutcomeUnknown, and nothing is stored.
func TestInsert_AContextEndedBeforeTheStatementIsSentStoresNothing(t *testing.T) {
	t.Parallel()
	for _, path := range insertPaths(client.DefaultStoreTimeout) {
		t.Run(path.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.New(t)
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			err := path.insert(ctx, pool, newJob(t, client.Request{}))
			if !errors.Is(err, context.Canceled) {
				t.Errorf("insert with its context cancelled: %v, want context.Canceled", err)
			}
			if errors.Is(err, client.ErrOutcomeUnknown) {
				t.Errorf("insert with its context cancelled: %v, want it not ErrOutcomeUnknown: nothing was sent", err)
			}
			if n := dbtest.CountJobs(t, pool); n != 0 {
				t.Errorf("%d jobs stored, want none", n)
			}
		})
	}
}

// TestTxCommit_AConnectionLostAtTheCommitIsErrOutcomeUnknown cuts the
// connection of a Tx just after the server committed it, before its
// answer arrives: Commit fails with ErrOutcomeUnknown, and the job, which
// was stored, is there, and announced all the same through another
// connection of the pool, since Commit cannot tell. A Tx whose connection
// closed before its commit, and one an earlier error failed, which Commit
// rolls back, say so with pgx's own errors, not ErrOutcomeUnknown.
func TestTxCommit_AConnectionLostAtTheCommitIsErrOutcomeUnknown(t *testing.T) {
	ctx := t.Context()
	proxy, pool, through := proxiedPools(t)
	listener, _ := dbtest.Listen(t, pool, "default")

	tx, err := client.Begin(ctx, through)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := client.Insert(ctx, tx, newJob(t, client.Request{})); err != nil {
		t.Fatal(err)
	}
	proxy.CutAfterCommit(faultproxy.CommitCut{Statement: "commit", Times: 1})
	err = tx.Commit(ctx)
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("Commit whose connection was lost as it committed: %v want ErrOutcomeUnknown", err)
	}
	if proxy.Armed() != 0 {
		t.Fatal("the connection was never cut at the commit")
	}
	if stored := dbtest.CountJobs(t, pool); stored != 1 {
		t.Errorf("%d jobs stored, want 1: the committed transaction's", stored)
	}
	if heard := dbtest.Heard(t, ctx, listener); len(heard) != 1 {
		t.Errorf("heard %d notifications of the job whose commit landed, want 1", len(heard))
	}

	closed, err := client.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Conn().Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := closed.Commit(ctx); err == nil || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("Commit on a connection closed before it: %v, want an error that is not ErrOutcomeUnknown", err)
	}

	failed, err := client.Begin(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failed.Exec(ctx, "SELECT 1/0"); err == nil {
		t.Fatal("a division by zero did not fail the transaction")
	}
	err = failed.Commit(ctx)
	if !errors.Is(err, pgx.ErrTxCommitRollback) || errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("Commit of a failed transaction: %v, want pgx.ErrTxCommitRollback alone", err)
	}
}

// proxiedPools returns a fresh database's pool, and a pool that reaches
// it through proxy, a faultproxy, all closed as the test ends.
func proxiedPools(t *testing.T) (proxy *faultproxy.Proxy, pool, through *pgxpool.Pool) {
	t.Helper()
	url := dbtest.NewURL(t)
	proxy, proxied, err := faultproxy.StartFor(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { proxy.Close() })
	for _, p := range []struct {
		pool **pgxpool.Pool
		url  string
	}{{&pool, url}, {&through, proxied}} {
		*p.pool, err = pgxpool.New(t.Context(), p.url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup((*p.pool).Close)
	}
	return proxy, pool, through
}
