package worker_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/faultproxy"
	"github.com/relayq/relay/internal/modelcheck"
	"github.com/relayq/relay/worker"
)

// bundle is what most tests need: a fresh database and its queries.
type bundle struct {
	ctx  context.Context
	url  string
	pool *pgxpool.Pool
	q    *db.Queries
}

func setup(t *testing.T) *bundle {
	t.Helper()
	url := dbtest.NewURL(t)
	pool := dbtest.Connect(t, url)
	return &bundle{ctx: context.Background(), url: url, pool: pool, q: db.New(pool)}
}

// proxied starts a fault proxy in front of the test database and returns
// it with the URL of the database through it.
func (b *bundle) proxied(t *testing.T) (*faultproxy.Proxy, string) {
	t.Helper()
	p, through, err := faultproxy.StartFor(b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p, through
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

// claim claims up to n jobs of the default queue as the given worker,
// without a session.
func (b *bundle) claim(t *testing.T, workerID string, n int32, lease time.Duration) []db.JobCompleteAndClaimRow {
	t.Helper()
	return b.claimUnder(t, workerID, nil, n, lease)
}

// claimUnder claims up to n jobs of the default queue as the given worker,
// under the session with key session (none if nil).
func (b *bundle) claimUnder(t *testing.T, workerID string, session *int32, n int32, lease time.Duration) []db.JobCompleteAndClaimRow {
	t.Helper()
	rows, err := b.q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
		Queue: "default", ClaimTokens: leaseTokens(int(n)), LeaseMs: lease.Milliseconds(), WorkerID: workerID,
		SessionKey: session,
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
func (b *bundle) claimOne(t *testing.T, workerID string, lease time.Duration) (int64, pgtype.UUID) {
	t.Helper()
	rows := b.claim(t, workerID, 1, lease)
	if len(rows) != 1 {
		t.Fatalf("claim by %s: got %d jobs, want 1", workerID, len(rows))
	}
	return *rows[0].ID, rows[0].LeaseToken
}

// session is a worker session registered on a connection of its own, as a
// worker's session is.
type session struct {
	key  int32
	conn *pgx.Conn
}

// crowd holds n live worker sessions on the default queue, of the worker
// ids crowd-1 to crowd-n, on one connection of their own, which it
// returns: closing it ends them all at once. They end when the test does
// at the latest.
func (b *bundle) crowd(t *testing.T, n int) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(b.ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	var held int
	if err := conn.QueryRow(b.ctx, `
		WITH s AS (
			INSERT INTO worker_sessions (session_key, worker_id, queue, pid, host)
			SELECT nextval('worker_session_key_seq')::integer, 'crowd-' || g, 'default', 1, 'test'
			FROM generate_series(1, $1::integer) AS g
			RETURNING session_key)
		SELECT count(pg_advisory_lock(1380273241, s.session_key)) FROM s`, n).Scan(&held); err != nil || held != n {
		t.Fatalf("hold the crowd's sessions: %d, %v", held, err)
	}
	return conn
}

// register registers a session of the worker id, replacing previous (0:
// none), and fails the test if the registration is refused. The session
// ends when the test does, or at end.
func (b *bundle) register(t *testing.T, id string, previous int32) *session {
	t.Helper()
	s, err := b.tryRegister(t, id, previous)
	if err != nil {
		t.Fatalf("register %s: %v", id, err)
	}
	return s
}

// tryRegister registers a session of the worker id, replacing previous (0:
// none). A refused registration returns pgx.ErrNoRows.
func (b *bundle) tryRegister(t *testing.T, id string, previous int32) (*session, error) {
	t.Helper()
	conn, err := pgx.ConnectConfig(b.ctx, b.pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	p := db.WorkerRegisterParams{ID: id, Queue: "default", PID: 1, Host: "test"}
	if previous != 0 {
		p.PreviousSessionKey = &previous
	}
	reg, err := db.New(conn).WorkerRegister(b.ctx, p)
	if err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return &session{key: reg.SessionKey, conn: conn}, nil
}

// end closes the session's connection and waits until the server has
// dropped its lock.
func (s *session) end(t *testing.T, b *bundle) {
	t.Helper()
	if err := s.conn.Close(b.ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		alive, err := b.q.WorkerSessionAlive(b.ctx, s.key)
		if err != nil {
			t.Fatal(err)
		}
		if !alive {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("session %d still holds its lock 10s after its connection closed", s.key)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// complete completes one claim and reports whether the database accepted it.
func (b *bundle) complete(t *testing.T, id int64, token pgtype.UUID, result string) bool {
	t.Helper()
	rows, err := b.q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
		CompleteIDs: []int64{id}, CompleteTokens: []pgtype.UUID{token},
		CompleteResults: [][]byte{json.RawMessage(result)},
		Queue:           "default", WorkerID: "unused",
	})
	if err != nil {
		t.Fatalf("complete: %v", err)
	}
	return len(rows) == 1 && len(rows[0].CompletedIDs) == 1 && rows[0].CompletedIDs[0] == id
}

// completeAlone completes the job id under token with result in a
// statement without a claim (JobCompleteMany), and reports whether the
// completion was accepted.
func (b *bundle) completeAlone(t *testing.T, id int64, token pgtype.UUID, result string) bool {
	t.Helper()
	ids, err := b.q.JobCompleteMany(b.ctx, db.JobCompleteManyParams{
		IDs: []int64{id}, Tokens: []pgtype.UUID{token}, Results: [][]byte{json.RawMessage(result)},
	})
	if err != nil {
		t.Fatalf("complete without a claim: %v", err)
	}
	return len(ids) == 1 && ids[0] == id
}

// holderOf returns the row of the session that holds worker id.
func (b *bundle) holderOf(t *testing.T, id string) db.WorkerHolderRow {
	t.Helper()
	h, err := b.q.WorkerHolder(b.ctx, id)
	if err != nil {
		t.Fatalf("the holder of worker id %q: %v", id, err)
	}
	return h
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

// startWorker runs a worker on the test's pool until the test ends and
// returns it with a function that stops it and waits for Run to return,
// which must return nil.
func (b *bundle) startWorker(t *testing.T, cfg worker.Config, register func(*worker.Worker)) (*worker.Worker, func()) {
	t.Helper()
	w, run := b.runWorker(t, b.pool, cfg, register)
	stop := func() {
		t.Helper()
		if err := run.stop(); err != nil {
			t.Errorf("worker Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return w, stop
}

// running is a worker's Run in a goroutine of its own.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

// stop cancels Run and returns what it returned; it waits at most 30s.
func (r *running) stop() error {
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(30 * time.Second):
			r.err = errors.New("worker did not stop within 30s")
		}
	})
	return r.err
}

// wait waits up to timeout for Run to return by itself, and returns what
// it returned.
func (r *running) wait(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.once.Do(func() { r.err = err })
		return err
	case <-time.After(timeout):
		t.Fatalf("worker Run still running after %s", timeout)
		return nil
	}
}

// runWorker starts Run of a new worker on pool; the test stops it at the
// end if it still runs.
func (b *bundle) runWorker(t *testing.T, pool *pgxpool.Pool, cfg worker.Config, register func(*worker.Worker)) (*worker.Worker, *running) {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = 50 * time.Millisecond
	}
	w, err := worker.New(pool, cfg)
	if err != nil {
		t.Fatalf("new worker: %v", err)
	}
	register(w)
	ctx, cancel := context.WithCancel(b.ctx)
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() { _ = r.stop() })
	return w, r
}

// nextRound is the JobCompleteAndClaim of a worker's round for worker:
// it completes, with an empty result, the jobs held (rows an earlier claim
// returned, each with a job) and claims up to claim more.
func nextRound(worker string, held []db.JobCompleteAndClaimRow, claim int) db.JobCompleteAndClaimParams {
	params := db.JobCompleteAndClaimParams{Queue: "default", ClaimTokens: leaseTokens(claim), LeaseMs: 60_000, WorkerID: worker}
	for _, r := range held {
		params.CompleteIDs = append(params.CompleteIDs, *r.ID)
		params.CompleteTokens = append(params.CompleteTokens, r.LeaseToken)
		params.CompleteResults = append(params.CompleteResults, json.RawMessage(`{}`))
	}
	return params
}

// cancelOnceStarted asks to cancel job id once its handler has closed
// started, as an operator would while it runs.
func (b *bundle) cancelOnceStarted(t *testing.T, started <-chan struct{}, id int64) {
	t.Helper()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler never started")
	}
	if got, err := b.q.JobCancel(b.ctx, id); err != nil || !got.Applied {
		t.Fatalf("cancel job %d: applied %t, %v", id, got.Applied, err)
	}
}

// holdRow locks job id's row in a transaction of its own, as a claim that
// followed the row's update chain, a cancel or an operator's SELECT ... FOR
// UPDATE does, until the caller commits the transaction returned (rolled
// back when the test ends otherwise).
func (b *bundle) holdRow(t *testing.T, id int64) pgx.Tx {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) })
	if _, err := tx.Exec(b.ctx, "SELECT FROM jobs WHERE id = $1 FOR UPDATE", id); err != nil {
		t.Fatal(err)
	}
	return tx
}

// holdRowFor holds job id's row as holdRow does, for d, then lets it go.
func (b *bundle) holdRowFor(t *testing.T, id int64, d time.Duration) {
	t.Helper()
	tx := b.holdRow(t, id)
	time.Sleep(d)
	if err := tx.Commit(b.ctx); err != nil {
		t.Fatal(err)
	}
}

// blocks reports whether a session waits for a lock that tx holds.
func (b *bundle) blocks(t *testing.T, tx pgx.Tx) bool {
	t.Helper()
	return dbtest.Blocks(t, b.pool, tx)
}

// waitBlocks waits up to 10 s for tx to hold up another session, what
// names, and fails the test if it never does.
func (b *bundle) waitBlocks(t *testing.T, tx pgx.Tx, what string) {
	t.Helper()
	dbtest.WaitBlocks(t, b.pool, tx, what)
}

// claimedIDs lists the jobs a round's rows claimed, in the order of the rows.
func claimedIDs(rows []db.JobCompleteAndClaimRow) []int64 {
	var ids []int64
	for _, r := range rows {
		if r.ID != nil {
			ids = append(ids, *r.ID)
		}
	}
	return ids
}

// leaseTokens draws n fresh lease tokens, for a claim of n jobs.
func leaseTokens(n int) []pgtype.UUID {
	tokens := make([]pgtype.UUID, n)
	for i := range tokens {
		tokens[i] = newToken()
	}
	return tokens
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

// reclaim runs JobReclaim and returns the jobs it took back.
func (b *bundle) reclaim(t testing.TB, params db.JobReclaimParams) []modelcheck.Reclaimed {
	t.Helper()
	rows, err := b.q.JobReclaim(b.ctx, params)
	if err != nil {
		t.Fatal(err)
	}
	taken, _ := modelcheck.ReclaimedOf(rows)
	return taken
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// newToken draws a fresh random lease token.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }
