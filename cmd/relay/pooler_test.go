package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/pgbouncer"
	"github.com/relayq/relay/internal/relaybin"
)

// TestEndToEnd_ThroughPgBouncerInTransactionMode runs migrate, serve and
// workers through a real PgBouncer in transaction mode, as most production
// databases are reached, with URLs that say nothing of it: relay finds the
// pooler itself. A worker whose session goes to PostgreSQL directly is
// found dead through its session; one without is found through its lease.
func TestEndToEnd_ThroughPgBouncerInTransactionMode(t *testing.T) {
	relaybin.Path(t)
	ctx := testContext(t, 120*time.Second)
	dsn := emptyDatabaseURL(t)
	pooled := transactionPoolerURL(t, dsn)

	stdout, stderr, code := runBinary(t, ctx, "migrate", "--database-url", pooled)
	if code != 0 || !strings.Contains(stdout, "applied migration 3") || !strings.Contains(stderr, "goes through a connection pooler") {
		t.Fatalf("relay migrate through PgBouncer: status %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	const token = "pooled-secret"
	addr := freeAddr(t)
	base := "http://" + addr
	serve := startProc(t, ctx, "serve", "serve", "--addr", addr, "--database-url", pooled, "--api-token", token)
	waitHealthy(t, ctx, serve, base)

	// A worker with its session on PostgreSQL itself holds a long job,
	// then dies.
	direct := startProc(t, ctx, "direct", "work", "--database-url", pooled, "--session-database-url", dsn,
		"--id", "direct", "--slots", "1", "--lease", "1m", "--log-format", "json")
	long := postJob(t, ctx, base, token, `{"kind":"sleep","payload":{"ms":60000}}`)
	waitLeasedBy(t, ctx, base, token, long.ID, "direct")
	if err := direct.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-direct.done

	// A worker with no session (through the pooler) takes the job back at
	// once, by the session of the dead one, not after its minute of lease.
	leaseOnly := startProc(t, ctx, "lease-only", "work", "--database-url", pooled,
		"--id", "lease-only", "--slots", "2", "--lease", "2s", "--log-format", "json")
	reclaimed, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	job := waitLeasedBy(t, reclaimed, base, token, long.ID, "lease-only")
	if job.Attempt != 2 || deref(job.LastError) != "worker session ended" {
		t.Errorf("the dead worker's job: attempt %d, last error %q; want attempt 2 after its session ended", job.Attempt, deref(job.LastError))
	}

	// Jobs run through the pooler.
	var ids []int64
	for range 5 {
		ids = append(ids, postJob(t, ctx, base, token, `{"kind":"hash","payload":{"iterations":100,"sleep_ms":1}}`).ID)
	}
	for _, id := range ids {
		waitForState(t, ctx, base, token, id, "succeeded")
	}
	if !strings.Contains(leaseOnly.stderr.String(), "goes through a connection pooler") {
		t.Errorf("the worker without a session did not say it runs on leases alone:\n%s", leaseOnly.stderr.String())
	}

	// That worker dies too, holding the long job: only its lease brings
	// the job back, to a worker with a session of its own.
	if err := leaseOnly.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-leaseOnly.done
	startProc(t, ctx, "direct-2", "work", "--database-url", pooled, "--session-database-url", dsn,
		"--id", "direct-2", "--slots", "1", "--log-format", "json")
	job = waitLeasedBy(t, reclaimed, base, token, long.ID, "direct-2")
	if job.Attempt != 3 || deref(job.LastError) != "lease expired" {
		t.Errorf("the lease-only worker's job: attempt %d, last error %q; want attempt 3 after its lease expired", job.Attempt, deref(job.LastError))
	}
	serve.terminate(t, 20*time.Second)
}

// TestWork_RefusesAnIDALiveWorkerHolds starts two workers under one --id:
// the second exits at once with an error naming the first.
func TestWork_RefusesAnIDALiveWorkerHolds(t *testing.T) {
	relaybin.Path(t)
	ctx := testContext(t, 60*time.Second)
	dsn := emptyDatabaseURL(t)
	if _, stderr, code := runBinary(t, ctx, "migrate", "--database-url", dsn); code != 0 {
		t.Fatalf("relay migrate: status %d: %s", code, stderr)
	}
	// The first holds the id once its session is registered, which it
	// logs at debug level; "worker starting" comes before that.
	first := startProc(t, ctx, "first", "work", "--database-url", dsn, "--id", "pod-0", "--log-format", "json", "--log-level", "debug")
	waitRegistered(t, ctx, first)
	_, stderr, code := runBinary(t, ctx, "work", "--database-url", dsn, "--id", "pod-0", "--log-format", "json")
	want := fmt.Sprintf(`relay: worker id "pod-0" is in use by a live session (pid %d on host `, first.cmd.Process.Pid)
	if code != 1 || !strings.Contains(stderr, want) {
		t.Errorf("second worker under the same id: status %d, stderr:\n%s\nwant status 1 and %q", code, stderr, want)
	}
	first.terminate(t, 20*time.Second)
}

// waitHealthy waits until the API behind base answers /healthz.
func waitHealthy(t *testing.T, ctx context.Context, p *proc, base string) {
	t.Helper()
	up, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		resp, _, err := apiRequest(up, http.MethodGet, base+"/healthz", "", "")
		if err == nil && resp.StatusCode == http.StatusOK {
			return
		}
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", p.name, p.err, p.stderr.String())
		case <-up.Done():
			t.Fatalf("%s not healthy after 15s: %v", p.name, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitLeasedBy polls the job until it runs under worker.
func waitLeasedBy(t *testing.T, ctx context.Context, base, token string, id int64, worker string) apiJob {
	t.Helper()
	for {
		job := waitForState(t, ctx, base, token, id, "running")
		if deref(job.LeasedBy) == worker {
			return job
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job %d runs under %q (attempt %d, last error %q), want %q", id, deref(job.LeasedBy), job.Attempt, deref(job.LastError), worker)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestConnect_KeepsGenericPlansAndEndsSilentConnectionsWherePlansAreKept:
// a worker's pool asks PostgreSQL to keep a generic plan for each
// statement and to compile none, where its statements are prepared, and
// every pool asks it to end a connection silent for a lease (the worker's,
// or worker.DefaultLease for other pools), each unless the URL sets it;
// behind a transaction-mode pooler, which refuses unknown startup settings
// and where nothing is prepared, a pool asks for none of them and still
// connects.
func TestConnect_KeepsGenericPlansAndEndsSilentConnectionsWherePlansAreKept(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	dsn := emptyDatabaseURL(t)
	pooled := transactionPoolerURL(t, dsn)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("plan_cache_mode", "auto")
	q.Set("tcp_user_timeout", "9000")
	u.RawQuery = q.Encode()
	setInURL := u.String()

	// settings reads plan_cache_mode, jit, tcp_keepalives_idle and
	// tcp_user_timeout on one of pool's connections.
	settings := func(t *testing.T, pool interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}) [4]string {
		t.Helper()
		var got [4]string
		if err := pool.QueryRow(ctx, `SELECT current_setting('plan_cache_mode'), current_setting('jit'),
			current_setting('tcp_keepalives_idle'), current_setting('tcp_user_timeout')`).Scan(&got[0], &got[1], &got[2], &got[3]); err != nil {
			t.Fatal(err)
		}
		return got
	}
	plain, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defaults := settings(t, plain)
	plain.Close(ctx)

	type connectFunc func(context.Context, *slog.Logger, string, string, int32) (*pgxpool.Pool, error)
	workerOf := func(lease time.Duration) connectFunc {
		return func(ctx context.Context, logger *slog.Logger, dsn, appName string, minConns int32) (*pgxpool.Pool, error) {
			return connectWorker(ctx, logger, dsn, appName, minConns, lease)
		}
	}
	tests := []struct {
		name    string
		connect connectFunc
		dsn     string
		want    [4]string
	}{
		{"a worker's pool", workerOf(6 * time.Second), dsn, [4]string{"force_generic_plan", "off", "2", "6000"}},
		{"another pool", connect, dsn, [4]string{defaults[0], defaults[1], "10", "30000"}},
		{"a worker's pool set otherwise in the URL", workerOf(6 * time.Second), setInURL, [4]string{"auto", "off", "2", "9000"}},
		{"a worker's pool behind PgBouncer", workerOf(6 * time.Second), pooled, defaults},
		{"another pool behind PgBouncer", connect, pooled, defaults},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool, err := tt.connect(ctx, slog.New(slog.DiscardHandler), tt.dsn, "relay test", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			if got := settings(t, pool); got != tt.want {
				t.Errorf("plan_cache_mode, jit, tcp_keepalives_idle, tcp_user_timeout = %q; want %q", got, tt.want)
			}
		})
	}
}

// transactionPoolerURL starts a PgBouncer in transaction mode in front of
// dsn's database for the test, and returns its URL as a user would write
// it, without pgx settings.
func transactionPoolerURL(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	bouncer := pgbouncer.ForTest(t, dsn, pgbouncer.Options{PoolMode: pgbouncer.PoolModeTransaction})
	u, err := url.Parse(bouncer.URL(cfg.Database))
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del("default_query_exec_mode")
	u.RawQuery = q.Encode()
	return u.String()
}
