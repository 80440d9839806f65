package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestWork_AWorkerWhoseHostWentSilentLeavesItsIDAndConnectionsWithinALease:
// a worker whose host vanishes without a word (power lost, a network cut
// that sends no reset) leaves connections the server cannot see end. The
// server ends them once they have been silent for about a lease: the
// session, whose lock holds the worker's id, so that a worker started
// again under that id, as an orchestrator restarts one elsewhere,
// registers; and the pool's, each of which held one of the server's
// max_connections. Before, both stayed for the two hours and more of the
// server's TCP keepalive. The silence is made by dropping, with iptables,
// every packet between the worker's connections and the server, then
// killing the worker, whose connections' ends never arrive. A session
// opened with the pool's settings has them from its startup; one on a
// URL of its own (--session-database-url) asks for them once connected.
func TestWork_AWorkerWhoseHostWentSilentLeavesItsIDAndConnectionsWithinALease(t *testing.T) {
	iptables := needPacketFilter(t)
	for _, sessionURL := range []bool{false, true} {
		t.Run(fmt.Sprintf("session URL of its own %t", sessionURL), func(t *testing.T) {
			silentWorker(t, iptables, sessionURL)
		})
	}
}

// silentWorker runs TestWork_AWorkerWhoseHostWentSilentLeavesItsIDAndConnectionsWithinALease,
// with the worker's session on a URL of its own if sessionURL.
func silentWorker(t *testing.T, iptables string, sessionURL bool) {
	ctx := testContext(t, 90*time.Second)
	dsn := emptyDatabaseURL(t)
	server := loopbackServer(t, dsn)
	if _, stderr, code := runBinary(t, ctx, "migrate", "--database-url", dsn); code != 0 {
		t.Fatalf("relay migrate: status %d: %s", code, stderr)
	}
	const lease = 3 * time.Second
	args := []string{"work", "--database-url", dsn, "--id", "pod-0", "--lease", lease.String(), "--log-format", "json", "--log-level", "debug"}
	if sessionURL {
		args = append(args, "--session-database-url", dsn)
	}
	first := startProc(t, ctx, "first", args...)
	waitRegistered(t, ctx, first)

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// Every other connection to the test's database is the worker's.
	rows, err := conn.Query(ctx, `
		SELECT ARRAY[pid, client_port] FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`)
	if err != nil {
		t.Fatal(err)
	}
	backends, err := pgx.CollectRows(rows, pgx.RowTo[[2]int32])
	if err != nil {
		t.Fatal(err)
	}
	if len(backends) < 2 {
		t.Fatalf("the worker holds %d connections, want its session and its pool's", len(backends))
	}
	for _, b := range backends {
		if b[1] <= 0 {
			t.Fatalf("the worker's connection to server pid %d has client port %d: it does not reach the server over TCP", b[0], b[1])
		}
		dropBetween(t, iptables, int(b[1]), server.Port)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	killed := time.Now()
	if n := liveBackends(t, ctx, conn, backends); n != len(backends) {
		t.Fatalf("%d of the worker's %d connections ended as it was killed: the dropped packets did not silence them", len(backends)-n, len(backends))
	}
	for n := len(backends); n > 0; n = liveBackends(t, ctx, conn, backends) {
		if time.Since(killed) > 10*lease {
			t.Fatalf("%d of the silent worker's %d connections still live %s after it was killed, ten leases of %s",
				n, len(backends), time.Since(killed).Round(time.Millisecond), lease)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the silent worker's %d connections ended %s after it was killed (lease %s)", len(backends), time.Since(killed).Round(time.Millisecond), lease)

	second := startProc(t, ctx, "second", args...)
	waitRegistered(t, ctx, second)
	second.terminate(t, 20*time.Second)
}

// needPacketFilter returns the path of iptables, which the test needs
// with root to drop packets; it skips the test without them, unless CI=true,
// where it fails.
func needPacketFilter(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("iptables")
	if err != nil {
		// Debian's, where root's PATH is not this process's.
		path, err = exec.LookPath("/usr/sbin/iptables")
	}
	missing := ""
	switch {
	case err != nil:
		missing = "iptables (Debian's iptables package)"
	case os.Geteuid() != 0:
		missing = "root, to drop packets with iptables"
	}
	if missing == "" {
		return path
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("this test needs %s, which CI provides", missing)
	}
	t.Skipf("skipped: needs %s; runs when CI=true", missing)
	return ""
}

// loopbackServer returns the address of the PostgreSQL server dsn reaches
// over TCP, skipping the test (failing it under CI=true) when that is not
// a loopback address: packets are dropped on the loopback interface alone.
func loopbackServer(t *testing.T, dsn string) *net.TCPAddr {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ip := net.ParseIP(cfg.Host)
	if ip == nil || !ip.IsLoopback() {
		msg := fmt.Sprintf("the test database is at %q, not a loopback IP address", cfg.Host)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip("skipped: " + msg)
	}
	return &net.TCPAddr{IP: ip, Port: int(cfg.Port)}
}

// dropBetween drops every packet sent on the loopback interface between
// the local TCP ports a and b, until the test ends.
func dropBetween(t *testing.T, iptables string, a, b int) {
	t.Helper()
	rule := func(from, to int) []string {
		return []string{"OUTPUT", "-o", "lo", "-p", "tcp", "--sport", strconv.Itoa(from), "--dport", strconv.Itoa(to),
			"-m", "comment", "--comment", "relay test: silent session", "-j", "DROP"}
	}
	for _, r := range [][]string{rule(a, b), rule(b, a)} {
		if out, err := exec.Command(iptables, append([]string{"-I"}, r...)...).CombinedOutput(); err != nil {
			t.Fatalf("iptables -I %s: %v: %s", strings.Join(r, " "), err, out)
		}
		t.Cleanup(func() {
			if out, err := exec.Command(iptables, append([]string{"-D"}, r...)...).CombinedOutput(); err != nil {
				t.Errorf("iptables -D %s: %v: %s", strings.Join(r, " "), err, out)
			}
		})
	}
}

// liveBackends returns how many of backends, pairs of a server process
// and a client port, still serve a session.
func liveBackends(t *testing.T, ctx context.Context, conn *pgx.Conn, backends [][2]int32) int {
	t.Helper()
	pids := make([]int32, len(backends))
	for i, b := range backends {
		pids[i] = b[0]
	}
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)", pids).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// waitRegistered waits until the worker p has registered its session,
// which it logs at debug level.
func waitRegistered(t *testing.T, ctx context.Context, p *proc) {
	t.Helper()
	for !strings.Contains(p.stderr.String(), "worker session registered") {
		select {
		case <-p.done:
			t.Fatalf("%s exited: %v\n%s", p.name, p.err, p.stderr.String())
		case <-ctx.Done():
			t.Fatalf("%s: %v\n%s", p.name, ctx.Err(), p.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
