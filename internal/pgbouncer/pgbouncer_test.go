package pgbouncer_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/pgbouncer"
)

// testTimeout bounds each test's own database calls.
const testTimeout = time.Minute

// bundle is what a test needs: its own database on the real server.
type bundle struct {
	ctx       context.Context
	serverURL string // the test's database, directly
	database  string // its name
}

func setup(t *testing.T) bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	serverURL := dbtest.NewURL(t)
	cfg, err := pgconn.ParseConfig(serverURL)
	if err != nil {
		t.Fatalf("parse %s: %v", serverURL, err)
	}
	return bundle{ctx: ctx, serverURL: serverURL, database: cfg.Database}
}

// connect opens a connection closed when the test ends.
func connect(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// backendPID returns the pid of the server process that runs conn's
// next statement.
func backendPID(t *testing.T, ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int32 {
	t.Helper()
	var pid int32
	if err := q.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatalf("pg_backend_pid: %v", err)
	}
	return pid
}

// withExecMode returns dsn with pgx's default_query_exec_mode set to mode,
// or removed (for pgx's default, cache_statement) when mode is empty.
func withExecMode(t *testing.T, dsn, mode string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("parse %s: %v", dsn, err)
	}
	q := u.Query()
	q.Del("default_query_exec_mode")
	if mode != "" {
		q.Set("default_query_exec_mode", mode)
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func TestStart_ReachesADatabaseCreatedForTheTest(t *testing.T) {
	b := setup(t)
	bouncer := pgbouncer.ForTest(t, b.serverURL, pgbouncer.Options{})

	conn := connect(t, b.ctx, bouncer.URL(b.database))
	var database string
	var jobs int
	err := conn.QueryRow(b.ctx, "SELECT current_database(), (SELECT count(*) FROM jobs)").Scan(&database, &jobs)
	if err != nil {
		t.Fatalf("query through the bouncer: %v", err)
	}
	if database != b.database {
		t.Errorf("connected to database %q, want %q", database, b.database)
	}
	if host, _, _ := net.SplitHostPort(bouncer.Addr()); host != "127.0.0.1" {
		t.Errorf("Addr() = %s, want an address of 127.0.0.1", bouncer.Addr())
	}
}

func TestStart_LetsInOnlyThePasswordOfTheServersURL(t *testing.T) {
	b := setup(t)
	admin := connect(t, b.ctx, b.serverURL)
	role := "relay_test_role_" + randomHex(t)
	password := "pw-" + randomHex(t)
	if _, err := admin.Exec(b.ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD '"+password+"'"); err != nil {
		t.Fatalf("create role: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		if _, err := admin.Exec(ctx, "DROP ROLE "+pgx.Identifier{role}.Sanitize()); err != nil {
			t.Errorf("drop role: %v", err)
		}
	})
	u, err := url.Parse(b.serverURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.UserPassword(role, password)
	// Closed, and its server connections with it, before the role is
	// dropped.
	bouncer := pgbouncer.ForTest(t, u.String(), pgbouncer.Options{})

	conn := connect(t, b.ctx, bouncer.URL(b.database))
	var user string
	if err := conn.QueryRow(b.ctx, "SELECT current_user").Scan(&user); err != nil {
		t.Fatalf("query through the bouncer: %v", err)
	}
	if user != role {
		t.Errorf("current_user = %q, want %q", user, role)
	}
	if !strings.Contains(bouncer.URL(b.database), password) {
		t.Errorf("URL() = %s, want the server URL's password in it", bouncer.URL(b.database))
	}

	wrong, err := url.Parse(bouncer.URL(b.database))
	if err != nil {
		t.Fatal(err)
	}
	wrong.User = url.UserPassword(role, "not-"+password)
	if conn, err := pgx.Connect(b.ctx, wrong.String()); err == nil {
		conn.Close(b.ctx)
		t.Error("connected through the bouncer with a wrong password")
	}
}

func TestTransactionMode_RunsAClientsTransactionsOnDifferentServerSessions(t *testing.T) {
	b := setup(t)
	bouncer := pgbouncer.ForTest(t, b.serverURL, pgbouncer.Options{PoolMode: pgbouncer.PoolModeTransaction})
	client := connect(t, b.ctx, bouncer.URL(b.database))
	other := connect(t, b.ctx, bouncer.URL(b.database))

	first := backendPID(t, b.ctx, client)
	// The server connection the client just gave back goes to whoever
	// asks next; while another client's transaction holds it, the
	// client's next transaction needs another one.
	tx, err := other.Begin(b.ctx)
	if err != nil {
		t.Fatalf("begin: %v", err)
	}
	defer tx.Rollback(b.ctx)
	held := backendPID(t, b.ctx, tx)
	second := backendPID(t, b.ctx, client)

	if held != first {
		t.Fatalf("the other client's transaction runs on backend %d, want %d, the one the client gave back", held, first)
	}
	if second == first {
		t.Errorf("both of the client's transactions ran on backend %d, want two backends", first)
	}
}

func TestAdvisoryLock_OutlivesTheClientSessionOnlyInTransactionMode(t *testing.T) {
	tests := []struct {
		mode          pgbouncer.PoolMode
		wantHeldAfter bool
	}{
		// The lock belongs to a pooled server session, which goes on
		// after the client leaves and is handed to the next client: a
		// worker's session lock taken like this would never say the
		// worker died. Relay's worker session must not go through a
		// transaction-mode pooler.
		{pgbouncer.PoolModeTransaction, true},
		// Session mode resets the server session (DISCARD ALL) when the
		// client leaves, releasing the lock as PostgreSQL would.
		{pgbouncer.PoolModeSession, false},
	}
	for _, tt := range tests {
		t.Run(string(tt.mode), func(t *testing.T) {
			b := setup(t)
			bouncer := pgbouncer.ForTest(t, b.serverURL, pgbouncer.Options{PoolMode: tt.mode})
			admin := connect(t, b.ctx, b.serverURL)
			const key = 1380273299

			client, err := pgx.Connect(b.ctx, bouncer.URL(b.database))
			if err != nil {
				t.Fatalf("connect: %v", err)
			}
			var locker int32
			if err := client.QueryRow(b.ctx, "SELECT pg_backend_pid() FROM pg_advisory_lock($1::bigint)", key).Scan(&locker); err != nil {
				t.Fatalf("lock: %v", err)
			}
			// The client's transaction is over; the lock is not.
			if holder := lockHolder(t, b.ctx, admin, key); holder != locker {
				t.Fatalf("after the client's transaction, the lock is held by backend %d, want %d", holder, locker)
			}

			if err := client.Close(b.ctx); err != nil {
				t.Fatalf("close the client: %v", err)
			}
			// PgBouncer resets a server session after its client has gone:
			// give it time to.
			var holder int32
			for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				if holder = lockHolder(t, b.ctx, admin, key); holder == 0 {
					break
				}
			}
			if held := holder != 0; held != tt.wantHeldAfter {
				t.Fatalf("after the client disconnected, lock held = %v (backend %d), want %v", held, holder, tt.wantHeldAfter)
			}
			if !tt.wantHeldAfter {
				return
			}
			// And a new client, on the server session it inherits, takes
			// the "held" lock at once.
			next := connect(t, b.ctx, bouncer.URL(b.database))
			var got bool
			var pid int32
			if err := next.QueryRow(b.ctx, "SELECT pg_try_advisory_lock($1::bigint), pg_backend_pid()", key).Scan(&got, &pid); err != nil {
				t.Fatalf("try lock: %v", err)
			}
			if !got || pid != locker {
				t.Errorf("a new client got the lock = %v on backend %d, want true on backend %d", got, pid, locker)
			}
		})
	}
}

// lockHolder returns the backend that holds the advisory lock on key, or
// 0 when none does.
func lockHolder(t *testing.T, ctx context.Context, admin *pgx.Conn, key int64) int32 {
	t.Helper()
	var pid int32
	err := admin.QueryRow(ctx, `
		SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND granted
		  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
		  AND ((classid::bigint << 32) | objid::bigint) = $1 AND objsubid = 1`, key).Scan(&pid)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatalf("look up the lock: %v", err)
	}
	return pid
}

func TestTransactionMode_BreaksPgxsDefaultExecModeButNotURLs(t *testing.T) {
	tests := []struct {
		name    string
		dsn     func(t *testing.T, bouncerURL string) string
		wantErr bool
	}{
		{"pgx default", func(t *testing.T, u string) string { return withExecMode(t, u, "") }, true},
		{"URL as is", func(t *testing.T, u string) string { return u }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t)
			bouncer := pgbouncer.ForTest(t, b.serverURL, pgbouncer.Options{PoolMode: pgbouncer.PoolModeTransaction})
			dsn := tt.dsn(t, bouncer.URL(b.database))
			client := connect(t, b.ctx, dsn)
			other := connect(t, b.ctx, dsn)
			q := db.New(client)

			ids, err := q.JobInsertMany(b.ctx, insertParams("first"))
			if err != nil {
				t.Fatalf("first JobInsertMany: %v", err)
			}
			// Another client's transaction takes the server session the
			// statements were used on, so the next ones run on another.
			tx, err := other.Begin(b.ctx)
			if err != nil {
				t.Fatalf("begin: %v", err)
			}
			defer tx.Rollback(b.ctx)
			backendPID(t, b.ctx, tx)

			_, err = q.JobInsertMany(b.ctx, insertParams("second"))
			if err == nil {
				var job db.Job
				job, err = q.JobGet(b.ctx, ids[1])
				if err == nil && (string(job.Payload) != `{"n": 2}` || job.State != db.JobStateAvailable) {
					t.Errorf("JobGet(%d) = payload %s, state %s; want {\"n\": 2}, available", ids[1], job.Payload, job.State)
				}
			}
			var pgErr *pgconn.PgError
			switch {
			case !tt.wantErr && err != nil:
				t.Fatalf("sqlc statements on another server session: %v", err)
			case tt.wantErr && err == nil:
				t.Fatal("sqlc statements on another server session succeeded, want an error about a prepared statement")
			case tt.wantErr && !(errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "42P05")):
				// 26000: the statement is not prepared on this server
				// session; 42P05: it was, by another client.
				t.Fatalf("got %v, want an error about a prepared statement (SQLSTATE 26000 or 42P05)", err)
			}
			t.Logf("%s: %v", tt.name, err)
		})
	}
}

func TestURL_RunsTheSqlcStatementsOfConcurrentClients(t *testing.T) {
	b := setup(t)
	const clients, rounds = 6, 20
	bouncer := pgbouncer.ForTest(t, b.serverURL, pgbouncer.Options{PoolMode: pgbouncer.PoolModeTransaction, PoolSize: clients / 2})
	q := db.New(connect(t, b.ctx, bouncer.URL(b.database)))
	if _, err := q.JobInsertMany(b.ctx, insertParams("claimed")); err != nil {
		t.Fatalf("JobInsertMany: %v", err)
	}
	claimed, err := q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
		CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
		Queue: "claimed", ClaimTokens: []pgtype.UUID{newToken()}, LeaseMs: time.Hour.Milliseconds(), WorkerID: "w",
	})
	if err != nil || len(claimed) != 1 || claimed[0].ID == nil {
		t.Fatalf("JobCompleteAndClaim = %v, %v; want one job", claimed, err)
	}
	id, token := *claimed[0].ID, claimed[0].LeaseToken

	// Different statements from several clients at once, on fewer server
	// connections: each must run as the statement its client sent.
	var wg sync.WaitGroup
	for range clients {
		q := db.New(connect(t, b.ctx, bouncer.URL(b.database)))
		wg.Go(func() {
			for range rounds {
				if _, err := q.JobInsertMany(b.ctx, insertParams("more")); err != nil {
					t.Errorf("JobInsertMany: %v", err)
					return
				}
				renewed, err := q.JobHeartbeatMany(b.ctx, db.JobHeartbeatManyParams{
					LeaseMs: time.Hour.Milliseconds(), IDs: []int64{id}, Tokens: []pgtype.UUID{token},
				})
				// Renewed, or left for the next heartbeat while another
				// client's heartbeat held the row.
				if err != nil || len(renewed) != 1 || renewed[0].ID != id {
					t.Errorf("JobHeartbeatMany = %v, %v; want a row for the claimed job", renewed, err)
					return
				}
				job, err := q.JobGet(b.ctx, id)
				if err != nil || job.LeaseToken != token {
					t.Errorf("JobGet(%d) = %+v, %v; want the claimed job", id, job, err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// insertParams returns JobInsertMany's arguments for two jobs of queue.
func insertParams(queue string) db.JobInsertManyParams {
	return db.JobInsertManyParams{
		Queues:      []string{queue, queue},
		Kinds:       []string{"k", "k"},
		Payloads:    [][]byte{json.RawMessage(`{"n":1}`), json.RawMessage(`{"n":2}`)},
		Priorities:  []int16{1, 2},
		MaxAttempts: []int32{3, 3},
		RunAts:      []time.Time{{}, {}},
		DelaysMs:    []int64{0, 0},
	}
}

func TestPID_IsTheBackendsOnlyWithoutABouncer(t *testing.T) {
	tests := []struct {
		name     string
		mode     pgbouncer.PoolMode // "" connects directly
		wantSame bool
	}{
		{"direct", "", true},
		// PgBouncer answers the client's startup itself, with a
		// BackendKeyData of its own making, for cancel requests to come
		// to it.
		{"session", pgbouncer.PoolModeSession, false},
		{"transaction", pgbouncer.PoolModeTransaction, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t)
			dsn := b.serverURL
			if tt.mode != "" {
				dsn = pgbouncer.ForTest(t, b.serverURL, pgbouncer.Options{PoolMode: tt.mode}).URL(b.database)
			}
			conn := connect(t, b.ctx, dsn)
			announced, backend := conn.PgConn().PID(), backendPID(t, b.ctx, conn)
			t.Logf("%s: PID() = %d, pg_backend_pid() = %d", tt.name, announced, backend)
			if same := uint32(backend) == announced; same != tt.wantSame {
				t.Errorf("PID() = %d, pg_backend_pid() = %d: same = %v, want %v", announced, backend, same, tt.wantSame)
			}
		})
	}
}

func TestRestart_TakesConnectionsAgainAtTheSameURLAfterKill(t *testing.T) {
	b := setup(t)
	bouncer := pgbouncer.ForTest(t, b.serverURL, pgbouncer.Options{})
	conn := connect(t, b.ctx, bouncer.URL(b.database))
	backendPID(t, b.ctx, conn)

	if err := bouncer.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if err := conn.Ping(b.ctx); err == nil {
		t.Fatal("a connection through the killed bouncer still works")
	}
	if c, err := pgx.Connect(b.ctx, bouncer.URL(b.database)); err == nil {
		c.Close(b.ctx)
		t.Fatal("connected to the killed bouncer")
	}

	if err := bouncer.Restart(b.ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	backendPID(t, b.ctx, connect(t, b.ctx, bouncer.URL(b.database)))
}

func TestRestart_FailsWhenAnotherProcessHasThePort(t *testing.T) {
	b := setup(t)
	bouncer := pgbouncer.ForTest(t, b.serverURL, pgbouncer.Options{})
	if err := bouncer.Kill(); err != nil {
		t.Fatalf("kill: %v", err)
	}
	// PgBouncer goes on without the port (on its unix socket): a start
	// that only tried the port would connect to this listener and pass.
	l, err := net.Listen("tcp", bouncer.Addr())
	if err != nil {
		t.Fatalf("take the port: %v", err)
	}
	defer l.Close()

	err = bouncer.Restart(b.ctx)
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("restart on a port another process has: %v, want an error that says so", err)
	}
}

func TestClose_StopsPgBouncerAndRemovesItsFiles(t *testing.T) {
	b := setup(t)
	bouncer, err := pgbouncer.Start(b.ctx, b.serverURL, pgbouncer.Options{})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	dir := bouncer.Dir()
	if _, err := os.Stat(filepath.Join(dir, "pgbouncer.ini")); err != nil {
		t.Fatalf("configuration: %v", err)
	}

	if err := bouncer.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	if c, err := net.DialTimeout("tcp", bouncer.Addr(), time.Second); err == nil {
		c.Close()
		t.Errorf("%s still accepts connections after Close", bouncer.Addr())
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stat %s after Close: %v, want it gone", dir, err)
	}
	if err := bouncer.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestStart_SaysHowToInstallAMissingPgBouncer(t *testing.T) {
	_, err := pgbouncer.Start(t.Context(), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		pgbouncer.Options{Binary: filepath.Join(t.TempDir(), "pgbouncer")})
	if !errors.Is(err, pgbouncer.ErrNotInstalled) || !strings.Contains(err.Error(), "apt-get install pgbouncer") {
		t.Fatalf("Start without PgBouncer: %v, want ErrNotInstalled and how to install it", err)
	}
}

func TestForTest_FailsTheTestWhenPgBouncerIsMissing(t *testing.T) {
	ft := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pgbouncer.ForTest(ft, "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
			pgbouncer.Options{Binary: filepath.Join(t.TempDir(), "pgbouncer")})
	}()
	<-done
	if ft.skipped || !strings.Contains(ft.fatal, "apt-get install pgbouncer") {
		t.Errorf("ForTest without PgBouncer: skipped = %v, failed with %q; want a failure that says how to install it", ft.skipped, ft.fatal)
	}
}

// fatalTB records a failure or a skip and ends the goroutine, as testing
// does, without failing or skipping the real test.
type fatalTB struct {
	testing.TB
	fatal   string
	skipped bool
}

func (f *fatalTB) Helper() {}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (f *fatalTB) Skipf(format string, args ...any) {
	f.skipped = true
	runtime.Goexit()
}

func TestStart_ReportsTheLogOfAPgBouncerThatExits(t *testing.T) {
	fake := fakePgBouncer(t, "PgBouncer 1.18.0", `echo 'FATAL cannot load config file' >&2; exit 1`)
	_, err := pgbouncer.Start(t.Context(), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		pgbouncer.Options{Binary: fake})
	if err == nil || !strings.Contains(err.Error(), "FATAL cannot load config file") {
		t.Fatalf("Start of a PgBouncer that exits: %v, want its log in the error", err)
	}
}

func TestStart_TurnsOffPreparedStatementsWhereTheyExist(t *testing.T) {
	tests := []struct {
		version string
		wantOff bool
	}{
		// 1.18 refuses to start with a setting it does not know.
		{"PgBouncer 1.18.0", false},
		{"PgBouncer 1.21.0", true},
		{"PgBouncer 1.24.1", true},
	}
	for _, tt := range tests {
		t.Run(tt.version, func(t *testing.T) {
			fake := fakePgBouncer(t, tt.version, `cat "$1" >&2; exit 1`)
			_, err := pgbouncer.Start(t.Context(), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
				pgbouncer.Options{Binary: fake})
			if err == nil {
				t.Fatal("a fake PgBouncer started")
			}
			if off := strings.Contains(err.Error(), "\nmax_prepared_statements = 0"); off != tt.wantOff {
				t.Errorf("configuration of %s turns prepared statements off = %v, want %v:\n%v", tt.version, off, tt.wantOff, err)
			}
		})
	}
}

// fakePgBouncer returns a program that answers --version with version and
// otherwise runs script, as PgBouncer would be run, with the configuration
// file as $1. It is reachable by the user PgBouncer runs as when root,
// which t.TempDir is not.
func fakePgBouncer(t *testing.T, version, script string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "relay-pgbouncer-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	fake := filepath.Join(dir, "pgbouncer")
	program := fmt.Sprintf("#!/bin/sh\nif [ \"$1\" = --version ]; then echo '%s'; exit 0; fi\n%s\n", version, script)
	if err := os.WriteFile(fake, []byte(program), 0o755); err != nil {
		t.Fatal(err)
	}
	return fake
}

func randomHex(t *testing.T) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

// newToken draws a fresh random lease token.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }
