package devdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestRemoveAbandoned_RemovesAClusterWhoseOwnerDiedAndLeavesALiveOne(t *testing.T) {
	ctx, parent, logs := setupAbandoned(t)
	live := startTestCluster(t, ctx, parent)
	dead := startTestCluster(t, ctx, parent)
	deadPID, running, _ := postmasterOf(ctx, dead.dataDir)
	if !running {
		t.Fatalf("no postmaster runs in %s", dead.dir)
	}
	dead.lock.Close() // what the kernel does when the owner dies

	removeAbandoned(ctx, logs.logger(), parent)

	if _, err := os.Stat(dead.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the dead owner's cluster directory is still there (stat: %v)", err)
	}
	if isPostmaster(t, deadPID, dead.dataDir) {
		t.Errorf("the dead owner's postmaster (pid %d) still runs", deadPID)
	}
	if got := logs.matching("removed a throwaway PostgreSQL"); len(got) != 1 ||
		got[0].attrs["dir"] != dead.dir || got[0].attrs["stopped_pid"] != fmt.Sprint(deadPID) {
		t.Errorf("log lines about removed clusters = %v, want one with dir=%s stopped_pid=%d", got, dead.dir, deadPID)
	}
	if err := ping(ctx, live.URL()); err != nil {
		t.Errorf("the live owner's cluster no longer answers: %v", err)
	}
	if _, err := os.Stat(filepath.Join(live.dir, lockFileName)); err != nil {
		t.Errorf("the live owner's cluster directory: %v", err)
	}
}

// A postmaster.pid outlives a server killed with it, and its pid may go to
// another process, even to another cluster's postmaster.
func TestRemoveAbandoned_SignalsNoProcessButTheClustersOwnPostmaster(t *testing.T) {
	ctx, parent, logs := setupAbandoned(t)
	live := startTestCluster(t, ctx, parent)
	livePID, _, _ := postmasterOf(ctx, live.dataDir)
	livePIDFile, err := os.ReadFile(filepath.Join(live.dataDir, "postmaster.pid"))
	if err != nil {
		t.Fatal(err)
	}
	sleeper := exec.Command("sleep", "300")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	sleeperExited := make(chan struct{})
	go func() {
		sleeper.Wait()
		close(sleeperExited)
	}()
	t.Cleanup(func() {
		sleeper.Process.Kill()
		<-sleeperExited
	})

	stale := map[string][]byte{
		"another program's pid":          fmt.Appendf(nil, "%d\n/nowhere\n", sleeper.Process.Pid),
		"another cluster's postmaster":   livePIDFile,
		"a pid that no process has":      []byte("999999999\n/nowhere\n"),
		"a pid file that is not a pid's": []byte("garbage\n"),
	}
	var dirs []string
	for name, pidFile := range stale {
		dir := fakeDeadCluster(t, parent, pidFile)
		dirs = append(dirs, dir)
		t.Logf("%s: %s", name, dir)
	}

	removeAbandoned(ctx, logs.logger(), parent)

	select {
	case <-sleeperExited:
		t.Errorf("the program whose pid a stale postmaster.pid named was signalled")
	default:
	}
	if !isPostmaster(t, livePID, live.dataDir) {
		t.Errorf("the live cluster's postmaster (pid %d), which a stale postmaster.pid named, is gone", livePID)
	}
	if err := ping(ctx, live.URL()); err != nil {
		t.Errorf("the live cluster no longer answers: %v", err)
	}
	for _, dir := range dirs {
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there (stat: %v)", dir, err)
		}
	}
	for _, r := range logs.matching("removed a throwaway PostgreSQL") {
		if _, ok := r.attrs["stopped_pid"]; ok {
			t.Errorf("log line says it stopped a postmaster: %v", r)
		}
	}
}

// A cluster without a lock file comes from an older relay, whose owner may
// still be using it.
func TestRemoveAbandoned_LeavesAClusterWithoutALockFileAndSaysHowToRemoveIt(t *testing.T) {
	ctx, parent, logs := setupAbandoned(t)
	running := startTestCluster(t, ctx, parent)
	stopped := startTestCluster(t, ctx, parent)
	if err := stopped.StopServer(ctx, ShutdownFast); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Cluster{running, stopped} {
		if err := os.Remove(filepath.Join(c.dir, lockFileName)); err != nil {
			t.Fatal(err)
		}
	}
	pid, _, _ := postmasterOf(ctx, running.dataDir)

	removeAbandoned(ctx, logs.logger(), parent)

	if err := ping(ctx, running.URL()); err != nil {
		t.Fatalf("the cluster without a lock file no longer answers: %v", err)
	}
	for _, c := range []*Cluster{running, stopped} {
		if _, err := os.Stat(c.dataDir); err != nil {
			t.Errorf("the cluster without a lock file was touched: %v", err)
		}
	}
	warnings := logs.matching("an older relay")
	if len(warnings) != 2 {
		t.Fatalf("warnings = %v, want one for each cluster without a lock file", warnings)
	}

	// The commands the warnings give do what they say.
	for _, w := range warnings {
		_, command, ok := strings.Cut(w.msg, " with: ")
		if !ok {
			t.Fatalf("warning without a command: %v", w)
		}
		cmdCtx, cancel := context.WithTimeout(ctx, time.Minute)
		out, err := exec.CommandContext(cmdCtx, "sh", "-c", command).CombinedOutput()
		cancel()
		if err != nil {
			t.Fatalf("%s: %v: %s", command, err, out)
		}
	}
	for _, c := range []*Cluster{running, stopped} {
		if _, err := os.Stat(c.dir); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s is still there after the warning's command (stat: %v)", c.dir, err)
		}
	}
	if isPostmaster(t, pid, running.dataDir) {
		t.Errorf("postmaster %d still runs after the warning's command", pid)
	}
}

// setupAbandoned returns the test's context, a directory of its own to put
// clusters in, and a recorder of the log.
func setupAbandoned(t *testing.T) (context.Context, string, *logRecorder) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL servers; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	// Short, for the clusters' Unix-domain sockets, and open to the
	// clusters' user when the tests run as root.
	parent, err := os.MkdirTemp("", "relay-t-")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(parent) })
	return ctx, parent, &logRecorder{t: t}
}

// startTestCluster starts a cluster in parent, stopped when the test ends.
func startTestCluster(t *testing.T, ctx context.Context, parent string) *Cluster {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))
	c, err := startLocal(ctx, logger, parent)
	if err != nil {
		t.Fatalf("start a local cluster: %v\nthis test needs PostgreSQL's server binaries (initdb, pg_ctl)", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(context.Background()); err != nil {
			t.Errorf("stop %s: %v", c.dir, err)
		}
	})
	return c
}

// fakeDeadCluster makes in parent the directory of a cluster whose owner
// died: a lock file nobody holds, and a data directory with postmaster.pid.
func fakeDeadCluster(t *testing.T, parent string, pidFile []byte) string {
	t.Helper()
	dir, err := os.MkdirTemp(parent, dirPrefix)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	for name, content := range map[string][]byte{
		lockFileName:                            []byte("1\n"),
		filepath.Join("data", "PG_VERSION"):     []byte("15\n"),
		filepath.Join("data", "postmaster.pid"): pidFile,
	} {
		if err := os.MkdirAll(data, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), content, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// isPostmaster reports whether pid is a live postgres process serving
// dataDir.
func isPostmaster(t *testing.T, pid int, dataDir string) bool {
	t.Helper()
	args, err := commandLine(t.Context(), pid)
	if err != nil {
		t.Fatalf("command line of pid %d: %v", pid, err)
	}
	return len(args) > 0 && filepath.Base(args[0]) == "postgres" &&
		strings.Contains(strings.Join(args, " "), "-D "+dataDir)
}

// logRecorder keeps the log's records, and writes them to the test's
// output.
type logRecorder struct {
	t       *testing.T
	mu      sync.Mutex
	records []logRecord
}

type logRecord struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (l *logRecorder) logger() *slog.Logger {
	return slog.New(recorderHandler{l: l, text: slog.NewTextHandler(l.t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})})
}

// matching returns the records whose message contains s.
func (l *logRecorder) matching(s string) []logRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []logRecord
	for _, r := range l.records {
		if strings.Contains(r.msg, s) {
			out = append(out, r)
		}
	}
	return out
}

type recorderHandler struct {
	l    *logRecorder
	text slog.Handler
}

func (h recorderHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recorderHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.l.mu.Lock()
	h.l.records = append(h.l.records, rec)
	h.l.mu.Unlock()
	return h.text.Handle(ctx, r)
}

func (h recorderHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h recorderHandler) WithGroup(string) slog.Handler      { return h }
