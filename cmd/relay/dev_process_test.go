package main

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// devProc is a `relay dev` process on a throwaway cluster of its own.
type devProc struct {
	*proc
	addr    string // host:port of the API
	dir     string // the cluster's directory, named in the banner
	dataDir string
	pid     int // the cluster's postmaster
}

// TestDev_StopsAndRemovesItsClusterWhenItsTerminalCloses sends `relay dev`
// the SIGHUP that a closing terminal sends it.
func TestDev_StopsAndRemovesItsClusterWhenItsTerminalCloses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server; skipped with -short")
	}
	ctx := testContext(t, 2*time.Minute)
	dev := startDev(t, ctx, devTempDir(t), "relay dev")

	if err := dev.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("SIGHUP: %v", err)
	}
	select {
	case <-dev.done:
		if dev.err != nil {
			t.Errorf("relay dev exited with %v after SIGHUP, want status 0", dev.err)
		}
	case <-ctx.Done():
		t.Fatal("relay dev still running after SIGHUP")
	}
	if postmasterRunning(t, dev.pid, dev.dataDir) {
		t.Errorf("the cluster's postmaster (pid %d) still runs after relay dev exited", dev.pid)
	}
	if _, err := os.Stat(dev.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the cluster's directory %s is still there (stat: %v)", dev.dir, err)
	}
}

// TestDev_RemovesTheClusterOfARelayDevThatWasKilled kills one `relay dev`
// with SIGKILL, which leaves its cluster running, and starts another beside
// a third, live one.
func TestDev_RemovesTheClusterOfARelayDevThatWasKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL servers; skipped with -short")
	}
	ctx := testContext(t, 3*time.Minute)
	tmpdir := devTempDir(t)
	live := startDev(t, ctx, tmpdir, "live relay dev")
	killed := startDev(t, ctx, tmpdir, "killed relay dev")
	if err := killed.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-killed.done
	if !postmasterRunning(t, killed.pid, killed.dataDir) {
		t.Fatalf("the killed relay dev's postmaster (pid %d) stopped by itself: nothing left to remove", killed.pid)
	}

	next := startDev(t, ctx, tmpdir, "next relay dev")

	if postmasterRunning(t, killed.pid, killed.dataDir) {
		t.Errorf("the killed relay dev's postmaster (pid %d) still runs", killed.pid)
	}
	if _, err := os.Stat(killed.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the killed relay dev's directory %s is still there (stat: %v)", killed.dir, err)
	}
	var removed []string
	for _, line := range strings.Split(next.stderr.String(), "\n") {
		if strings.Contains(line, "removed a throwaway PostgreSQL that a dead process left behind") {
			removed = append(removed, line)
		}
	}
	if len(removed) != 1 || !strings.Contains(removed[0], "dir="+killed.dir) {
		t.Errorf("the next relay dev logged %q, want one line naming %s", removed, killed.dir)
	}
	if !postmasterRunning(t, live.pid, live.dataDir) {
		t.Errorf("the live relay dev's postmaster (pid %d) is gone", live.pid)
	}
	if _, err := os.Stat(live.dataDir); err != nil {
		t.Errorf("the live relay dev's cluster: %v", err)
	}
	waitHealthy(t, ctx, live.proc, "http://"+live.addr)
	live.terminate(t, 30*time.Second)
	next.terminate(t, 30*time.Second)
}

// devTempDir returns a new directory for `relay dev` processes to use as
// TMPDIR, so that they see only the clusters of this test. Its path is
// short, for the cluster's Unix-domain socket, and others may traverse it,
// for the cluster's user when the tests run as root. Any postmaster still
// running in it when the test ends is killed.
func devTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "relay-t-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		clusters, _ := filepath.Glob(filepath.Join(dir, "relay-devdb-*"))
		for _, c := range clusters {
			dataDir := filepath.Join(c, "data")
			if pid, err := readPostmasterPID(dataDir); err == nil && postmasterRunning(t, pid, dataDir) {
				t.Errorf("postmaster %d of %s still running at the end of the test; killing it", pid, c)
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		os.RemoveAll(dir)
	})
	return dir
}

// startDev starts `relay dev` on a throwaway cluster under tmpdir and
// waits for its banner.
func startDev(t *testing.T, ctx context.Context, tmpdir, name string) *devProc {
	t.Helper()
	p := startProcEnv(t, ctx, name, devEnv(tmpdir), "dev", "--addr", "127.0.0.1:0")
	bannerRE := regexp.MustCompile(`curl -s (localhost:\d+)/v1/jobs -d`)
	dirRE := regexp.MustCompile(`\(in (\S+)\)`)
	dev := &devProc{proc: p}
	for dev.addr == "" {
		select {
		case <-p.done:
			t.Fatalf("%s exited early: %v\nstderr:\n%s", name, p.err, p.stderr.String())
		case <-ctx.Done():
			t.Fatalf("%s printed no banner\nstdout:\n%s\nstderr:\n%s", name, p.stdout.String(), p.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
		if m := bannerRE.FindStringSubmatch(p.stdout.String()); m != nil {
			dev.addr = m[1]
		}
	}
	m := dirRE.FindStringSubmatch(p.stdout.String())
	if m == nil {
		t.Fatalf("the banner of %s does not say where its cluster is:\n%s", name, p.stdout.String())
	}
	dev.dir = m[1]
	dev.dataDir = filepath.Join(dev.dir, "data")
	pid, err := readPostmasterPID(dev.dataDir)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !postmasterRunning(t, pid, dev.dataDir) {
		t.Fatalf("%s: postmaster.pid names %d, which is not its cluster's postmaster", name, pid)
	}
	dev.pid = pid
	return dev
}

// devEnv is the test's environment without what would point `relay dev`
// at a database or an address of its own, and with TMPDIR set to tmpdir.
func devEnv(tmpdir string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "DATABASE_URL", "RELAY_ADDR", "RELAY_API_TOKEN", "TMPDIR":
			continue
		}
		env = append(env, kv)
	}
	return append(env, "TMPDIR="+tmpdir)
}

// readPostmasterPID reads the postmaster's pid, the first line of
// postmaster.pid in dataDir.
func readPostmasterPID(dataDir string) (int, error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}

// postmasterRunning reports whether pid is a live (not zombie) postgres
// process serving dataDir, as ps shows it.
func postmasterRunning(t *testing.T, pid int, dataDir string) bool {
	t.Helper()
	out, err := exec.Command("ps", "-ww", "-o", "stat=", "-o", "command=", "-p", strconv.Itoa(pid)).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return false // ps exits 1 when there is no such process
	}
	if err != nil {
		t.Fatalf("ps: %v", err)
	}
	stat, command, _ := strings.Cut(strings.TrimSpace(string(out)), " ")
	return !strings.HasPrefix(stat, "Z") && strings.Contains(command, "postgres") && strings.Contains(command, dataDir)
}
