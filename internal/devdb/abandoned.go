package devdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/relayq/relay/internal/shell"
)

// dirPrefix begins the name of every local cluster's directory.
const dirPrefix = "relay-devdb-"

// lockFileName is the file in a cluster's directory that the process owning
// the cluster holds an exclusive flock on from the directory's creation
// until its removal. The kernel releases the lock when the process dies,
// however it dies, so a lock that can be taken means a dead owner.
const lockFileName = "owner.lock"

// abandonedStopTimeout bounds the fast shutdown of an abandoned cluster's
// postmaster before it is killed.
const abandonedStopTimeout = 30 * time.Second

// lockDir creates the lock file in a new cluster's directory and takes its
// lock, which the returned file holds until it is closed. The file records
// the owner's pid, for people.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFileName), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("devdb: create lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("devdb: lock %s: %w", f.Name(), err)
	}
	if _, err := fmt.Fprintf(f, "%d\n", os.Getpid()); err != nil {
		f.Close()
		return nil, fmt.Errorf("devdb: write lock file: %w", err)
	}
	return f, nil
}

// removeAbandoned stops and removes the local clusters that dead processes
// left in parent: a process killed with SIGKILL, or that crashed, could not
// remove its own. It logs one line for each cluster it removes, and for
// each it cannot remove, the commands that would. It never touches a
// cluster whose owner lives.
//
// A directory without a lock file comes from a version of Relay that took
// none, and nothing shows whether its owner still uses it: such a cluster
// is left alone, with a warning that says how to stop it.
func removeAbandoned(ctx context.Context, logger *slog.Logger, parent string) {
	dirs, err := filepath.Glob(filepath.Join(parent, dirPrefix+"*"))
	if err != nil {
		logger.Debug("devdb: list clusters", "dir", parent, "err", err)
		return
	}
	for _, dir := range dirs {
		if ctx.Err() != nil {
			return
		}
		if info, err := os.Lstat(dir); err != nil || !info.IsDir() {
			continue
		}
		removeIfAbandoned(ctx, logger, dir)
	}
}

// removeIfAbandoned removes the cluster in dir if its owner is dead.
func removeIfAbandoned(ctx context.Context, logger *slog.Logger, dir string) {
	dataDir := filepath.Join(dir, "data")
	f, err := os.Open(filepath.Join(dir, lockFileName))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		warnUnlocked(ctx, logger, dir, dataDir)
		return
	case err != nil:
		// Most likely another user's cluster, which is none of ours.
		logger.Debug("devdb: cannot open a cluster's lock file; leaving the cluster", "dir", dir, "err", err)
		return
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		logger.Debug("devdb: a cluster's owner is alive; leaving the cluster", "dir", dir, "err", err)
		return
	}
	// The owner is dead, and while this process holds the lock no other
	// one removes the cluster at the same time.
	pid, running, err := postmasterOf(ctx, dataDir)
	if err == nil && running {
		err = stopPostmaster(ctx, pid, dataDir)
	}
	if err != nil {
		logger.Warn(fmt.Sprintf("cannot stop the throwaway PostgreSQL (pid %d) that a dead process left in %s: %v; stop and remove it with: %s",
			pid, dir, err, stopCommand(pid, dir)))
		return
	}
	if err := os.RemoveAll(dir); err != nil {
		logger.Warn(fmt.Sprintf("cannot remove the directory of a throwaway PostgreSQL that a dead process left: %v; remove it with: rm -rf %s",
			err, shell.Quote(dir)))
		return
	}
	attrs := []any{"dir", dir}
	if running {
		attrs = append(attrs, "stopped_pid", pid)
	}
	logger.Info("removed a throwaway PostgreSQL that a dead process left behind", attrs...)
}

// warnUnlocked warns of a cluster without a lock file, left by an older
// version of Relay. A directory in which initdb has not run yet may be a
// new cluster between its creation and its lock: it is passed over.
func warnUnlocked(ctx context.Context, logger *slog.Logger, dir, dataDir string) {
	if _, err := os.Stat(filepath.Join(dataDir, "PG_VERSION")); err != nil {
		return
	}
	const why = "an older relay made it, and nothing shows whether that relay still uses it"
	if pid, running, err := postmasterOf(ctx, dataDir); running || err != nil {
		logger.Warn(fmt.Sprintf("left alone a throwaway PostgreSQL (pid %d) in %s: %s; if nothing does, stop and remove it with: %s",
			pid, dir, why, stopCommand(pid, dir)))
		return
	}
	logger.Warn(fmt.Sprintf("left alone the directory of a stopped throwaway PostgreSQL, %s: %s; if nothing does, remove it with: rm -rf %s",
		dir, why, shell.Quote(dir)))
}

// stopCommand is a shell command that stops the postmaster pid with a fast
// shutdown, waits for it to exit and removes dir.
func stopCommand(pid int, dir string) string {
	return fmt.Sprintf("kill -INT %d && while kill -0 %d 2>/dev/null; do sleep 1; done && rm -rf %s", pid, pid, shell.Quote(dir))
}

// postmasterOf returns the pid that dataDir's postmaster.pid names, and
// whether that process is a live postgres serving dataDir: a pid file
// outlives a killed server, and its pid may since have gone to another
// process, which must not be signalled. With no pid file, or none that
// names a pid, no server runs. The error says that it could not tell.
func postmasterOf(ctx context.Context, dataDir string) (pid int, running bool, err error) {
	b, err := os.ReadFile(filepath.Join(dataDir, "postmaster.pid"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read postmaster.pid: %w", err)
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err = strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, false, nil
	}
	args, err := commandLine(ctx, pid)
	if err != nil {
		return pid, false, fmt.Errorf("command line of pid %d: %w", pid, err)
	}
	if len(args) == 0 || filepath.Base(args[0]) != "postgres" {
		return pid, false, nil
	}
	for i := 1; i+1 < len(args); i++ {
		if args[i] == "-D" && filepath.Clean(args[i+1]) == filepath.Clean(dataDir) {
			return pid, true, nil
		}
	}
	return pid, false, nil
}

// commandLine returns the arguments process pid was started with, or none
// if it has exited (a zombie has none either). It reads /proc where there
// is one, and asks ps elsewhere, splitting its line at spaces.
func commandLine(ctx context.Context, pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	switch {
	case err == nil:
		return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), nil
	case errors.Is(err, fs.ErrNotExist):
		if _, statErr := os.Stat("/proc/self/cmdline"); statErr == nil {
			return nil, nil // a system with /proc: no such process
		}
	default:
		return nil, err
	}
	out, err := exec.CommandContext(ctx, "ps", "-ww", "-o", "stat=", "-o", "command=", "-p", strconv.Itoa(pid)).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return nil, nil // no such process
	}
	if err != nil {
		return nil, fmt.Errorf("ps: %w", err)
	}
	stat, command, _ := strings.Cut(string(bytes.TrimSpace(out)), " ")
	if strings.HasPrefix(stat, "Z") {
		return nil, nil
	}
	return strings.Fields(command), nil
}

// stopPostmaster stops the postmaster pid of dataDir with a fast shutdown
// (SIGINT), or kills it if that takes longer than abandonedStopTimeout, and
// returns once it has exited. Its children exit with it.
func stopPostmaster(ctx context.Context, pid int, dataDir string) error {
	if err := syscall.Kill(pid, syscall.SIGINT); err != nil {
		return fmt.Errorf("signal pid %d: %w", pid, err)
	}
	err := waitPostmasterExit(ctx, dataDir, abandonedStopTimeout)
	if !errors.Is(err, errStillRunning) {
		return err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill pid %d: %w", pid, err)
	}
	if err := waitPostmasterExit(ctx, dataDir, 5*time.Second); err != nil {
		return fmt.Errorf("after SIGKILL: %w", err)
	}
	return nil
}

// errStillRunning says that a postmaster has not exited in time.
var errStillRunning = errors.New("postmaster still running")

// waitPostmasterExit waits until dataDir's postmaster has exited, for up
// to timeout.
func waitPostmasterExit(ctx context.Context, dataDir string, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		if _, running, err := postmasterOf(ctx, dataDir); err == nil && !running {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return errStillRunning
		case <-time.After(50 * time.Millisecond):
		}
	}
}
