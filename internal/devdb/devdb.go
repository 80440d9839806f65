// Package devdb starts a throwaway PostgreSQL server for development and
// tests: `relay dev` runs on one, and a test harness can stop and restart
// one to see how Relay copes with its database going away.
//
// Start prefers a private local cluster: initdb and pg_ctl are looked up on
// PATH, then in /usr/lib/postgresql/*/bin and /usr/pgsql-*/bin (newest
// version first); the cluster lives in a new temporary directory, listens on
// a free port of 127.0.0.1 (and on a unix socket in that directory), trusts
// every local connection, and runs with fsync off, since its data is thrown
// away anyway. PostgreSQL refuses to run as root, so when the process is root
// the cluster runs as the "postgres" system user (or, failing that,
// "nobody"), and the directory is handed to that user. When no local cluster
// can be started, Start falls back to a postgres:15-alpine container through
// testcontainers-go, which needs a Docker engine.
//
// Stop removes everything: the server, its directory or its container. A
// process killed with SIGKILL cannot clean up after itself: its cluster
// directory (named relay-devdb-*) stays in the temporary directory, and its
// server keeps running. The process holds a lock in that directory for the
// cluster's whole life, so the next StartLocal sees that the owner is dead,
// stops the server and removes the directory. It leaves alone, with a
// warning that says how to remove them, the directories without a lock
// that older versions left, since nothing shows whether their owners still
// live.
package devdb

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/testcontainers/testcontainers-go"

	"github.com/relayq/relay/internal/osuser"
)

// ErrNotLocal is returned by StopServer and StartServer on a cluster that
// runs in a container.
var ErrNotLocal = errors.New("devdb: the cluster runs in a container, not locally")

// ShutdownMode is how StopServer stops the server, as pg_ctl's -m option.
type ShutdownMode string

// The shutdown modes of pg_ctl.
const (
	// ShutdownFast disconnects every client and shuts down cleanly.
	ShutdownFast ShutdownMode = "fast"
	// ShutdownImmediate aborts at once, like a crash: the next start
	// recovers from the write-ahead log.
	ShutdownImmediate ShutdownMode = "immediate"
)

// Cluster is a running throwaway PostgreSQL server. Its methods are safe
// for concurrent use.
type Cluster struct {
	log *slog.Logger
	url string

	// A local cluster.
	dir     string   // temporary directory holding everything below
	lock    *os.File // holds the lock that shows the cluster (or container) in use
	dataDir string
	logFile string
	bin     string // directory of initdb, pg_ctl and postgres
	port    int
	cred    *syscall.Credential // user to run as, when root

	// A container.
	container testcontainers.Container

	mu      sync.Mutex
	stopped bool
}

// Start starts a throwaway PostgreSQL server: a local cluster if it can, a
// container otherwise. The caller must call Stop. The error, when neither
// works, says why each failed.
func Start(ctx context.Context, logger *slog.Logger) (*Cluster, error) {
	return start(ctx, logger, StartLocal, ContainerConfig{})
}

// start is Start with the local cluster's starter and the container's
// configuration given, so that tests can take the container fallback.
func start(ctx context.Context, logger *slog.Logger, startLocal func(context.Context, *slog.Logger) (*Cluster, error), cfg ContainerConfig) (*Cluster, error) {
	if logger == nil {
		logger = slog.Default()
	}
	c, localErr := startLocal(ctx, logger)
	if localErr == nil {
		return c, nil
	}
	if ctx.Err() != nil {
		return nil, stopped(ctx)
	}
	logger.Info("no local PostgreSQL cluster; trying a container", "reason", localErr)
	c, containerErr := StartContainer(ctx, logger, cfg)
	if containerErr != nil && ctx.Err() != nil {
		return nil, stopped(ctx)
	}
	if containerErr != nil {
		return nil, fmt.Errorf("devdb: cannot start a throwaway PostgreSQL: %v; and no container either: %v "+
			"(install PostgreSQL's server binaries or Docker, or set DATABASE_URL)", localErr, containerErr)
	}
	return c, nil
}

// stopped is the error of a start given up as ctx ended, as when relay is
// stopped meanwhile: the commands it killed say no more than "signal:
// killed".
func stopped(ctx context.Context) error {
	return fmt.Errorf("devdb: start of a throwaway PostgreSQL given up: %w", context.Cause(ctx))
}

// StartLocal starts a private local cluster with initdb and pg_ctl, never a
// container, after removing those that dead processes left in the
// temporary directory, logging one line for each. The caller must call
// Stop.
func StartLocal(ctx context.Context, logger *slog.Logger) (*Cluster, error) {
	if logger == nil {
		logger = slog.Default()
	}
	parent := os.TempDir()
	removeAbandoned(ctx, logger, parent)
	return startLocal(ctx, logger, parent)
}

// startLocal starts a local cluster in a new directory of parent.
func startLocal(ctx context.Context, logger *slog.Logger, parent string) (_ *Cluster, err error) {
	bin, err := findBinaries()
	if err != nil {
		return nil, err
	}
	cred, err := osuser.Unprivileged()
	if err != nil {
		return nil, fmt.Errorf("devdb: %w", err)
	}
	dir, err := os.MkdirTemp(parent, dirPrefix)
	if err != nil {
		return nil, fmt.Errorf("devdb: create directory: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	c := &Cluster{
		log:     logger,
		dir:     dir,
		lock:    lock,
		dataDir: filepath.Join(dir, "data"),
		logFile: filepath.Join(dir, "postgres.log"),
		bin:     bin,
		cred:    cred,
	}
	defer func() {
		if err != nil {
			c.stopLocal(context.WithoutCancel(ctx), ShutdownImmediate)
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("devdb: hand %s to uid %d: %w", dir, cred.Uid, err)
		}
	}
	if out, err := c.command(ctx, "initdb", "-D", c.dataDir, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("devdb: initdb: %w: %s", err, lastLine(out))
	}
	// A free port can be taken between finding it and the server binding
	// it: try a few.
	for try := 1; ; try++ {
		if c.port, err = freePort(); err != nil {
			return nil, err
		}
		if err = c.configure(); err != nil {
			return nil, err
		}
		if err = c.startServer(ctx); err == nil || try == 3 || ctx.Err() != nil {
			break
		}
		logger.Debug("devdb: start failed; trying another port", "err", err)
	}
	if err != nil {
		return nil, err
	}
	c.url = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
	logger.Info("started a throwaway PostgreSQL", "dir", dir, "port", c.port, "bin", bin)
	return c, nil
}

// URL returns a connection URL for the server's postgres database, as the
// superuser postgres.
func (c *Cluster) URL() string { return c.url }

// Dir returns the directory of a local cluster (removed by Stop), or "" for
// a container.
func (c *Cluster) Dir() string { return c.dir }

// Stop stops the server and removes everything it had: the cluster's
// directory, or the container. It is safe to call more than once.
func (c *Cluster) Stop(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return nil
	}
	c.stopped = true
	if c.container != nil {
		if err := c.container.Terminate(ctx); err != nil {
			return fmt.Errorf("devdb: remove container: %w", err)
		}
		closeOwnerLock(c.lock)
		return nil
	}
	err := c.stopLocal(ctx, ShutdownFast)
	if err == nil {
		c.log.Info("removed the throwaway PostgreSQL", "dir", c.dir)
	}
	return err
}

// StopServer stops a local cluster's server, keeping its data, so that
// StartServer can start it again on the same port. Connections fail in
// between.
func (c *Cluster) StopServer(ctx context.Context, mode ShutdownMode) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocally(); err != nil {
		return err
	}
	out, err := c.command(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", string(mode), "-w", "-t", "60").CombinedOutput()
	if err != nil {
		return fmt.Errorf("devdb: pg_ctl stop: %w: %s", err, lastLine(out))
	}
	return nil
}

// StartServer starts a local cluster's server again after StopServer, on
// the same port and with the same data.
func (c *Cluster) StartServer(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.usableLocally(); err != nil {
		return err
	}
	return c.startServer(ctx)
}

// usableLocally says why the server cannot be stopped or started on its
// own: it runs in a container, or the cluster was removed. Called with c.mu
// held.
func (c *Cluster) usableLocally() error {
	switch {
	case c.container != nil:
		return ErrNotLocal
	case c.stopped:
		return errors.New("devdb: cluster already removed")
	}
	return nil
}

// configure appends the cluster's settings to its postgresql.conf; later
// lines override earlier ones.
func (c *Cluster) configure() error {
	conf := fmt.Sprintf("\n# relay devdb\nport = %d\nlisten_addresses = '127.0.0.1'\n"+
		"unix_socket_directories = '%s'\nmax_connections = 200\n"+
		"fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n",
		c.port, strings.ReplaceAll(c.dir, "'", "''"))
	f, err := os.OpenFile(filepath.Join(c.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("devdb: configure: %w", err)
	}
	if _, err := f.WriteString(conf); err != nil {
		f.Close()
		return fmt.Errorf("devdb: configure: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("devdb: configure: %w", err)
	}
	return nil
}

func (c *Cluster) startServer(ctx context.Context) error {
	out, err := c.command(ctx, "pg_ctl", "start", "-D", c.dataDir, "-l", c.logFile, "-w", "-t", "60").CombinedOutput()
	if err != nil {
		return fmt.Errorf("devdb: pg_ctl start: %w: %s (server log: %s)", err, lastLine(out), c.serverLogTail())
	}
	return nil
}

// stopLocal stops the server, killing it if pg_ctl cannot, removes the
// directory, and then lets go of its lock.
func (c *Cluster) stopLocal(ctx context.Context, mode ShutdownMode) error {
	defer c.lock.Close()
	var errs []error
	if _, err := os.Stat(filepath.Join(c.dataDir, "postmaster.pid")); err == nil {
		out, err := c.command(ctx, "pg_ctl", "stop", "-D", c.dataDir, "-m", string(mode), "-w", "-t", "30").CombinedOutput()
		if err != nil {
			errs = append(errs, fmt.Errorf("devdb: pg_ctl stop: %w: %s", err, lastLine(out)))
			c.kill(ctx)
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("devdb: remove %s: %w", c.dir, err))
	}
	return errors.Join(errs...)
}

// kill sends SIGKILL to the postmaster named in postmaster.pid, if that
// process is still the cluster's postmaster. Its children exit when they
// find it gone.
func (c *Cluster) kill(ctx context.Context) {
	// The last resort, even when ctx has ended.
	if pid, running, err := postmasterOf(context.WithoutCancel(ctx), c.dataDir); err == nil && running {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// command prepares one of the PostgreSQL programs, run as the cluster's
// user, in a process group of its own so that a Ctrl-C at the terminal
// reaches relay, which then stops the server in order, and not the server
// directly.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "LC_ALL=C", "LANG=C", "PGTZ=UTC")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

func (c *Cluster) serverLogTail() string {
	b, err := os.ReadFile(c.logFile)
	if err != nil {
		return "none"
	}
	return lastLine(b)
}

// findBinaries returns the directory holding initdb and pg_ctl.
func findBinaries() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		dir := filepath.Dir(p)
		if _, err := exec.LookPath(filepath.Join(dir, "pg_ctl")); err == nil {
			return dir, nil
		}
		if real, err := filepath.EvalSymlinks(p); err == nil {
			dir := filepath.Dir(real)
			if _, err := exec.LookPath(filepath.Join(dir, "pg_ctl")); err == nil {
				return dir, nil
			}
		}
	}
	var dirs []string
	for _, pattern := range []string{"/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin"} {
		m, _ := filepath.Glob(pattern)
		dirs = append(dirs, m...)
	}
	// Newest version first: compare the version's number, not its text.
	version := func(dir string) float64 {
		s := filepath.Base(filepath.Dir(dir))
		s = strings.TrimPrefix(s, "pgsql-")
		v, _ := strconv.ParseFloat(s, 64)
		return v
	}
	sort.SliceStable(dirs, func(i, j int) bool { return version(dirs[i]) > version(dirs[j]) })
	for _, dir := range dirs {
		_, err1 := exec.LookPath(filepath.Join(dir, "initdb"))
		_, err2 := exec.LookPath(filepath.Join(dir, "pg_ctl"))
		if err1 == nil && err2 == nil {
			return dir, nil
		}
	}
	return "", errors.New("devdb: initdb and pg_ctl not found on PATH nor in /usr/lib/postgresql/*/bin or /usr/pgsql-*/bin")
}

// freePort returns a TCP port of 127.0.0.1 that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("devdb: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lastLine returns the last non-empty line of a program's output.
func lastLine(b []byte) string {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	if len(lines) == 0 || len(lines[len(lines)-1]) == 0 {
		return "no output"
	}
	return string(bytes.TrimSpace(lines[len(lines)-1]))
}
