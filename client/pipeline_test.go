package client_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/faultproxy"
)

// countingConn counts the writes a client makes, one a round trip, as
// pgx writes what it sends before each wait for an answer, and the Sync
// messages in them, each of which ends an implicit transaction.
type countingConn struct {
	net.Conn
	writes, syncs *atomic.Int64
}

// Write counts b, and the Sync messages in it, and sends it on. Past the
// startup, a write holds whole messages: a type byte and a length that
// counts itself. Sync is 'S' with nothing after.
func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	for m := b; len(m) >= 5; {
		n := int(binary.BigEndian.Uint32(m[1:5]))
		if m[0] == 'S' && n == 4 {
			c.syncs.Add(1)
		}
		if n < 4 || len(m) < 1+n {
			break
		}
		m = m[1+n:]
	}
	return c.Conn.Write(b)
}

// countWire has the connections of cfg count their writes and Syncs
// (countingConn), in the clear, so that the messages can be read.
func countWire(cfg *pgconn.Config) (writes, syncs *atomic.Int64) {
	writes, syncs = new(atomic.Int64), new(atomic.Int64)
	cfg.TLSConfig = nil
	cfg.Fallbacks = nil
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: writes, syncs: syncs}, nil
	}
	return writes, syncs
}

// statementTracer records the SQL of each statement pgx traces.
type statementTracer struct {
	mu  sync.Mutex
	sql []string
}

// TraceQueryStart records the statement's SQL.
func (s *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, data.SQL)
	return ctx
}

// TraceQueryEnd records nothing.
func (s *statementTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// names returns the sqlc names of the statements traced so far.
func (s *statementTracer) names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var names []string
	for _, sql := range s.sql {
		if name, ok := strings.CutPrefix(sql, "-- name: "); ok {
			names = append(names, strings.Fields(name)[0])
		}
	}
	return names
}

// A job stored outside a transaction is announced after its commit, and
// the caller waits for the server once for both: the announcement is
// sent behind the insert, each in an implicit transaction of its own.
// Where it cannot be (a keyed insert, which announces only a job it
// stored; a connection in another statement mode, as relay runs behind a
// pooler; one whose statements a tracer watches), the announcement costs
// a second round trip, and a tracer sees it.
func TestInsert_OutsideATransactionWaitsForTheServerOnce(t *testing.T) {
	ctx := t.Context()
	insert := func(req client.Request) func(t *testing.T, pool *pgxpool.Pool) {
		return func(t *testing.T, pool *pgxpool.Pool) {
			t.Helper()
			if _, _, err := client.Insert(ctx, pool, newJob(t, req)); err != nil {
				t.Fatal(err)
			}
		}
	}
	insertMany := func(reqs ...client.Request) func(t *testing.T, pool *pgxpool.Pool) {
		return func(t *testing.T, pool *pgxpool.Pool) {
			t.Helper()
			var jobs []client.Job
			for _, req := range reqs {
				jobs = append(jobs, newJob(t, req))
			}
			if _, err := client.InsertMany(ctx, pool, jobs); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, tc := range []struct {
		name  string
		mode  pgx.QueryExecMode // pgx's default if zero
		trace bool
		store func(t *testing.T, pool *pgxpool.Pool)
		trips int64
		// transactions counts the insert's and the announcement's, each
		// ended by a Sync of its own.
		transactions int64
		// traces are the statements a tracer sees, if there is one.
		traces []string
	}{
		{name: "Insert of a ready job", store: insert(client.Request{}), trips: 1, transactions: 2},
		{name: "Insert of a job to run in an hour, which is not announced", store: insert(client.Request{Delay: ptr(time.Hour)}), trips: 1, transactions: 1},
		{name: "InsertMany of ready jobs on two queues", store: insertMany(client.Request{}, client.Request{Queue: ptr("other")}), trips: 1, transactions: 2},
		{name: "Insert under an idempotency key", store: func(t *testing.T, pool *pgxpool.Pool) {
			insert(client.Request{IdempotencyKey: ptr(time.Now().String())})(t, pool)
		}, trips: 2, transactions: 2},
		{name: "Insert of a ready job, in the cache_describe mode", mode: pgx.QueryExecModeCacheDescribe, store: insert(client.Request{}), trips: 2, transactions: 2},
		{name: "Insert of a ready job, traced", trace: true, store: insert(client.Request{}), trips: 2, transactions: 2,
			traces: []string{"JobInsert", "JobAnnounce"}},
		{name: "InsertMany of ready jobs, traced", trace: true, store: insertMany(client.Request{}), trips: 2, transactions: 2,
			traces: []string{"JobInsertMany", "JobAnnounceMany"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(dbtest.NewURL(t))
			if err != nil {
				t.Fatal(err)
			}
			writes, syncs := countWire(&cfg.ConnConfig.Config)
			if tc.mode != 0 {
				cfg.ConnConfig.DefaultQueryExecMode = tc.mode
			}
			tracer := &statementTracer{}
			if tc.trace {
				cfg.ConnConfig.Tracer = tracer
			}
			cfg.MaxConns = 1
			cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
			pool, err := pgxpool.NewWithConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			tc.store(t, pool) // prepares the statements on the connection
			before, syncsBefore := writes.Load(), syncs.Load()
			tracedBefore := len(tracer.names())
			tc.store(t, pool)
			if trips := writes.Load() - before; trips != tc.trips {
				t.Errorf("waited for the server %d times, want %d", trips, tc.trips)
			}
			if transactions := syncs.Load() - syncsBefore; transactions != tc.transactions {
				t.Errorf("sent %d implicit transactions, want %d", transactions, tc.transactions)
			}
			if tc.trace {
				if got := tracer.names()[tracedBefore:]; strings.Join(got, " ") != strings.Join(tc.traces, " ") {
					t.Errorf("traced %q, want %q", got, tc.traces)
				}
			}
		})
	}
}

// A job is announced only once it is stored, even when its insert has to
// wait, and the announcement sent behind the insert waits with it.
func TestInsert_AnnouncesAJobOnlyOnceItsInsertHasCommitted(t *testing.T) {
	ctx := t.Context()
	cfg, err := pgxpool.ParseConfig(dbtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// One connection, whose statements the first store prepares: a
	// statement prepared after the lock below would wait for it already,
	// before anything is sent.
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	others, err := pgxpool.New(ctx, cfg.ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer others.Close()
	job := newJob(t, client.Request{})
	for _, tc := range []struct {
		name  string
		store func() error
	}{
		{name: "Insert", store: func() error {
			_, _, err := client.Insert(ctx, pool, job)
			return err
		}},
		{name: "InsertMany", store: func() error {
			_, err := client.InsertMany(ctx, pool, []client.Job{job, job})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listener, _ := dbtest.Listen(t, others, "default")
			if err := tc.store(); err != nil {
				t.Fatal(err)
			}
			dbtest.Heard(t, ctx, listener)
			blocker, err := others.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer blocker.Rollback(context.Background())
			if _, err := blocker.Exec(ctx, "LOCK TABLE jobs IN SHARE MODE"); err != nil {
				t.Fatal(err)
			}
			stored := make(chan error, 1)
			go func() { stored <- tc.store() }()
			waitForLockWaiter(t, others)
			if heard := dbtest.Heard(t, ctx, listener); len(heard) != 0 {
				t.Errorf("heard %d notifications while the insert waited, want none", len(heard))
			}
			if err := blocker.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-stored; err != nil {
				t.Fatal(err)
			}
			if heard := dbtest.Heard(t, ctx, listener); len(heard) != 1 {
				t.Errorf("heard %d notifications once the insert committed, want 1", len(heard))
			}
		})
	}
}

// waitForLockWaiter waits until a session of pool's database waits for a
// lock on jobs.
func waitForLockWaiter(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks
			WHERE NOT granted AND relation = 'jobs'::regclass
			  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting)
		if err != nil {
			t.Fatal(err)
		}
		if waiting > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no insert waited for the lock on jobs within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An insert that fails with the announcement sent behind it returns the
// database's error and stores nothing, and its connection then stores the
// next, which is announced, in one round trip: a failure that does not
// say a statement is stale leaves the statements prepared.
func TestInsert_AFailedInsertLeavesItsConnectionReady(t *testing.T) {
	pool := dbtest.New(t)
	ctx := t.Context()
	cfg := pool.Config().ConnConfig
	writes, _ := countWire(&cfg.Config)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	listener, _ := dbtest.Listen(t, pool, "default")
	good := newJob(t, client.Request{})
	bad := good
	bad.MaxAttempts = 0
	for i := range 3 {
		if _, err := client.InsertMany(ctx, conn, []client.Job{good, bad}); err == nil || !strings.Contains(err.Error(), "jobs_attempts_valid") {
			t.Fatalf("InsertMany %d with a job of no attempts: %v, want a violation of jobs_attempts_valid", i+1, err)
		}
		if _, _, err := client.Insert(ctx, conn, bad); err == nil || !strings.Contains(err.Error(), "jobs_attempts_valid") {
			t.Fatalf("Insert %d of a job of no attempts: %v, want a violation of jobs_attempts_valid", i+1, err)
		}
	}
	dbtest.Heard(t, ctx, listener) // the failed inserts' announcements, which tell of nothing new
	before := writes.Load()
	if _, err := client.InsertMany(ctx, conn, []client.Job{good, good}); err != nil {
		t.Fatalf("insert after the failed ones: %v", err)
	}
	if trips := writes.Load() - before; trips != 1 {
		t.Errorf("the insert after the failed ones waited for the server %d times, want 1", trips)
	}
	if heard := dbtest.Heard(t, ctx, listener); len(heard) != 1 {
		t.Errorf("heard %d notifications for the insert after, want 1", len(heard))
	}
	if stored := dbtest.CountJobs(t, pool); stored != 2 {
		t.Errorf("%d jobs stored, want 2", stored)
	}
}

// An insert whose commit fails, as one whose deferred constraint fails
// there does, returns the commit's error and stores nothing, through a
// pool, a pool's connection and a connection of its own.
func TestInsert_ACommitThatFailsFailsTheInsert(t *testing.T) {
	pool := dbtest.New(t)
	ctx := t.Context()
	for _, sql := range []string{
		`CREATE FUNCTION refuse_at_commit() RETURNS trigger LANGUAGE plpgsql AS $$
		 BEGIN RAISE EXCEPTION 'refused at commit'; END $$`,
		`CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON jobs
		 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_at_commit()`,
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	job := newJob(t, client.Request{})
	pooled, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer pooled.Release()
	own := connect(t, pool)
	for _, tc := range []struct {
		name string
		dbtx db.DBTX
	}{
		{"a pool", pool},
		{"a pool's connection", pooled},
		{"a connection of its own", own},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pgErr *pgconn.PgError
			_, _, err := client.Insert(ctx, tc.dbtx, job)
			if !errors.As(err, &pgErr) || pgErr.Message != "refused at commit" {
				t.Errorf("Insert: %v, want the commit's error", err)
			}
			ids, err := client.InsertMany(ctx, tc.dbtx, []client.Job{job, job})
			if !errors.As(err, &pgErr) || pgErr.Message != "refused at commit" {
				t.Errorf("InsertMany: ids %v, err %v; want the commit's error", ids, err)
			}
			if stored := dbtest.CountJobs(t, pool); stored != 0 {
				t.Errorf("%d jobs stored, want none", stored)
			}
		})
	}
}

// An insert that finds its prepared statement stale, dropped under its
// connection (DEALLOCATE ALL) or planned for a table whose columns a
// migration has changed since, prepares it again and is stored once and
// announced, without failing: the server refused the stale statement, so
// nothing of it was stored. So it goes whether the insert is sent with its
// announcement behind it (Insert, InsertMany) or through pgx's own
// statement cache (an idempotency key, InsertAll, a traced connection),
// and for an idempotent replay, which stores nothing.
func TestInsert_PreparesAStaleStatementAgainAndStoresOnce(t *testing.T) {
	insert := func(ctx context.Context, d db.DBTX, job client.Job) error {
		_, _, err := client.Insert(ctx, d, job)
		return err
	}
	insertKeyed := func(ctx context.Context, d db.DBTX, job client.Job) error {
		job.IdempotencyKey = ptr(fmt.Sprint(time.Now().UnixNano()))
		_, _, err := client.Insert(ctx, d, job)
		return err
	}
	// replay inserts one key twice: the first call stores the job and
	// replays it, preparing the lookup of the key's job; the next replays
	// it twice.
	replay := func(ctx context.Context, d db.DBTX, job client.Job) error {
		job.IdempotencyKey = ptr("the same key")
		for range 2 {
			if _, _, err := client.Insert(ctx, d, job); err != nil {
				return err
			}
		}
		return nil
	}
	insertMany := func(ctx context.Context, d db.DBTX, job client.Job) error {
		_, err := client.InsertMany(ctx, d, []client.Job{job})
		return err
	}
	insertAll := func(ctx context.Context, d db.DBTX, job client.Job) error {
		_, err := client.InsertAll(ctx, d, []client.Job{job})
		return err
	}
	// Where the insert runs: a connection of its own, a pool of one
	// connection (so that the statement made stale is the one the insert
	// uses), or a connection with a tracer, on which Insert and InsertMany
	// send their announcement in a round trip of its own.
	onConnection := func(t *testing.T, pool *pgxpool.Pool) db.DBTX { return connect(t, pool) }
	onPool := func(t *testing.T, pool *pgxpool.Pool) db.DBTX {
		cfg := pool.Config().Copy()
		cfg.MaxConns = 1
		one, err := pgxpool.NewWithConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(one.Close)
		return one
	}
	onTraced := func(t *testing.T, pool *pgxpool.Pool) db.DBTX {
		cfg := pool.Config().ConnConfig.Copy()
		cfg.Tracer = &statementTracer{}
		conn, err := pgx.ConnectConfig(t.Context(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	const (
		deallocated = "DEALLOCATE ALL"
		altered     = "ALTER TABLE jobs ALTER COLUMN idempotency_key TYPE varchar"
	)
	for _, tc := range []struct {
		name    string
		staled  string // what makes the statements prepared on the connection stale
		insert  func(context.Context, db.DBTX, client.Job) error
		through func(*testing.T, *pgxpool.Pool) db.DBTX
		// heard is how many notifications the insert after sends: where
		// the insert alone is stale and its announcement is sent behind
		// it, the announcement behind its refused form runs as well, and
		// tells of nothing new.
		heard  int
		stored int // jobs stored in all
	}{
		{"Insert, its statements deallocated", deallocated, insert, onConnection, 1, 2},
		{"InsertMany, its statements deallocated", deallocated, insertMany, onConnection, 1, 2},
		{"Insert, a column it returns changed", altered, insert, onConnection, 2, 2},
		{"Insert with an idempotency key, its statements deallocated", deallocated, insertKeyed, onConnection, 1, 2},
		{"Insert with an idempotency key, a column it returns changed", altered, insertKeyed, onConnection, 1, 2},
		{"Insert replaying an idempotency key, its statements deallocated", deallocated, replay, onConnection, 0, 1},
		{"Insert replaying an idempotency key, a column it returns changed", altered, replay, onConnection, 0, 1},
		{"InsertAll, its statements deallocated", deallocated, insertAll, onConnection, 1, 2},
		{"InsertAll, a column it returns changed", altered, insertAll, onConnection, 1, 2},
		{"InsertAll through a pool, its statements deallocated", deallocated, insertAll, onPool, 1, 2},
		{"Insert with an idempotency key through a pool, its statements deallocated", deallocated, insertKeyed, onPool, 1, 2},
		{"Insert on a traced connection, its statements deallocated", deallocated, insert, onTraced, 1, 2},
		{"InsertMany on a traced connection, its statements deallocated", deallocated, insertMany, onTraced, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := dbtest.New(t)
			ctx := t.Context()
			d := tc.through(t, pool)
			listener, _ := dbtest.Listen(t, pool, "default")
			job := newJob(t, client.Request{})
			if err := tc.insert(ctx, d, job); err != nil {
				t.Fatal(err)
			}
			dbtest.Heard(t, ctx, listener)
			if _, err := d.Exec(ctx, tc.staled); err != nil {
				t.Fatal(err)
			}
			if err := tc.insert(ctx, d, job); err != nil {
				t.Fatalf("insert with its statements stale: %v", err)
			}
			if heard := dbtest.Heard(t, ctx, listener); len(heard) != tc.heard {
				t.Errorf("heard %d notifications for the insert with its statements stale, want %d", len(heard), tc.heard)
			}
			if stored := dbtest.CountJobs(t, pool); stored != tc.stored {
				t.Errorf("%d jobs stored, want %d", stored, tc.stored)
			}
		})
	}
}

// An insert whose connection is lost once its transaction has committed,
// before the answer comes back, fails with ErrOutcomeUnknown. It is
// not sent again on another of the pool's connections, and the job is
// stored once.
func TestInsert_AConnectionLostAtTheCommitFailsTheInsert(t *testing.T) {
	ctx := t.Context()
	proxy, pool, through := proxiedPools(t)
	job := newJob(t, client.Request{})
	if _, _, err := client.Insert(ctx, through, job); err != nil {
		t.Fatal(err) // prepares its statements before the cut
	}
	proxy.CutAfterCommit(faultproxy.CommitCut{Statement: "-- name: JobInsert :one", Times: 1})
	_, _, err := client.Insert(ctx, through, job)
	if !errors.Is(err, client.ErrOutcomeUnknown) {
		t.Errorf("Insert whose connection was lost at its commit: %v, want ErrOutcomeUnknown", err)
	}
	if proxy.Armed() != 0 {
		t.Fatal("the connection was never cut at the insert's commit")
	}
	if stored := dbtest.CountJobs(t, pool); stored != 2 {
		t.Errorf("%d jobs stored, want 2: the first insert's and the one whose answer was lost", stored)
	}
}
