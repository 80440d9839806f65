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

// TestWork_TheIDOfAWorkerWhoseHostWentSilentIsFreedWithinALease: a worker
// whose host vanishes without a word (power lost, a network cut that
// sends no reset) leaves a session the server cannot see end. The server
// ends it once its connection has been silent for about a lease, and a
// worker started again under the same id, as an orchestrator restarts one
// elsewhere, registers; before, it was refused for the two hours and more
// of the server's TCP keepalive. The silence is made by dropping, with
// iptables, every packet between the session's connection and the
// server, then killing the worker, whose connections' ends never arrive.
func TestWork_TheIDOfAWorkerWhoseHostWentSilentIsFreedWithinALease(t *testing.T) {
	iptables := needPacketFilter(t)
	ctx := testContext(t, 90*time.Second)
	dsn := emptyDatabaseURL(t)
	server := loopbackServer(t, dsn)
	if _, stderr, code := runBinary(t, ctx, "migrate", "--database-url", dsn); code != 0 {
		t.Fatalf("relay migrate: status %d: %s", code, stderr)
	}
	const lease = 3 * time.Second
	args := []string{"work", "--database-url", dsn, "--id", "pod-0", "--lease", lease.String(), "--log-format", "json", "--log-level", "debug"}
	first := startProc(t, ctx, "first", args...)
	waitRegistered(t, ctx, first)

	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// The session is the connection that holds its key's advisory lock.
	var backend, clientPort int
	err = conn.QueryRow(ctx, `
		SELECT a.pid, a.client_port
		FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
		JOIN workers AS w ON w.session_key = l.objid::integer
		WHERE l.locktype = 'advisory' AND l.classid = 1380273241 AND l.granted
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND w.id = 'pod-0'`).Scan(&backend, &clientPort)
	if err != nil {
		t.Fatalf("find the session's server process: %v", err)
	}
	if clientPort <= 0 {
		t.Fatalf("the session's client port is %d: it does not reach the server over TCP", clientPort)
	}

	dropBetween(t, iptables, clientPort, server.Port)
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-first.done
	killed := time.Now()
	if !backendAlive(t, ctx, conn, backend) {
		t.Fatal("the session ended as its worker was killed: the dropped packets did not silence its connection")
	}
	for backendAlive(t, ctx, conn, backend) {
		if time.Since(killed) > 10*lease {
			t.Fatalf("the silent session (server pid %d) still lives %s after its worker was killed, ten leases of %s", backend, time.Since(killed).Round(time.Millisecond), lease)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("the silent session ended %s after its worker was killed (lease %s)", time.Since(killed).Round(time.Millisecond), lease)

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

// backendAlive reports whether the server process pid still serves a
// session.
func backendAlive(t *testing.T, ctx context.Context, conn *pgx.Conn, pid int) bool {
	t.Helper()
	var alive bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive); err != nil {
		t.Fatal(err)
	}
	return alive
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
