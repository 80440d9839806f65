// Package pgbouncer starts a private PgBouncer in front of a PostgreSQL
// server, so that tests and experiments can run Relay through the
// connection pooler most production databases sit behind.
//
// A Bouncer listens on a free port of 127.0.0.1 only. Its configuration,
// log, pid file and unix socket live in a temporary directory of its own,
// removed by Close. Every database name passes through to the server (a
// "*" fallback entry), so a database created after Start is reachable too.
// Client logins are checked against the one user of the server's URL: with
// SCRAM when that URL has a password, with none when it has not. PgBouncer
// 1.21 and later have protocol-level prepared statements turned off, so
// that every version pools as Debian 12's 1.18 does.
//
// On Linux PgBouncer dies with the process that started it, so that a
// test killed half-way leaves no PgBouncer running (its directory,
// relay-pgbouncer-*, does stay behind). PgBouncer refuses to run as root,
// so a root process starts it as the postgres system user (or, failing
// that, nobody), and not with PgBouncer's own -u option: changing its
// user, PgBouncer would cancel the signal Linux was told to send it when
// its parent dies.
package pgbouncer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/relayq/relay/internal/osuser"
)

// PoolMode is when PgBouncer gives a server connection back to its pool,
// as its pool_mode setting.
type PoolMode string

// The pool modes Relay is tested under.
const (
	// PoolModeTransaction gives the server connection back at the end of
	// each transaction: a client's consecutive transactions may run on
	// different server sessions, and session state (advisory locks,
	// LISTEN, prepared statements) stays behind on whichever server
	// connection it was created on.
	PoolModeTransaction PoolMode = "transaction"
	// PoolModeSession keeps a server connection for the client's whole
	// session and resets it (DISCARD ALL) when the client leaves.
	PoolModeSession PoolMode = "session"
)

// Defaults of Options.
const (
	DefaultPoolMode      = PoolModeTransaction
	DefaultPoolSize      = 10
	DefaultMaxClientConn = 100
)

// ExecMode is the pgx query exec mode (default_query_exec_mode) that URL
// selects: of pgx's modes, the one that runs Relay's sqlc statements
// through a transaction-mode PgBouncer without prepared statement support.
// cache_describe sends each query as the unnamed statement, parsed, bound
// and executed in one round trip, with the parameter types it learnt from
// the server the first time. The others fail:
//   - cache_statement, pgx's default, prepares a named statement on one
//     server connection and runs it later on whichever the pooler hands
//     out, where it is missing, or prepared already by another client.
//   - describe_exec describes and executes a query in two round trips,
//     which may reach two server connections: it can bind its arguments
//     to another client's unnamed statement.
//   - exec and simple_protocol, through a pooler or not, cannot encode a
//     []uuid.UUID, having no parameter type to go by.
const ExecMode = "cache_describe"

// BinaryPath is where Debian installs PgBouncer, looked at when PATH has
// none.
const BinaryPath = "/usr/sbin/pgbouncer"

// ErrNotInstalled is returned by Start when there is no PgBouncer to run.
var ErrNotInstalled = errors.New("not installed")

// Timeouts of starting and stopping the process.
const (
	startTimeout = 15 * time.Second
	stopTimeout  = 5 * time.Second
	pollInterval = 20 * time.Millisecond
)

// serverLoginRetry is PgBouncer's server_login_retry, in seconds. After a
// failed login to the server PgBouncer turns clients away for that long;
// its default of 15 would outlast a test that makes the server unreachable
// for a moment.
const serverLoginRetry = 1

// Options configure a Bouncer. The zero value means the defaults.
type Options struct {
	// PoolMode is PoolModeTransaction (the default) or PoolModeSession.
	PoolMode PoolMode
	// PoolSize is the number of server connections per database and
	// user (default_pool_size). Zero means DefaultPoolSize.
	PoolSize int
	// MaxClientConn is the number of client connections PgBouncer
	// accepts (max_client_conn). Zero means DefaultMaxClientConn.
	MaxClientConn int
	// QueryTimeout is how long PgBouncer lets a query run before it
	// closes the query's server connection and answers the client with
	// an error of its own (query_timeout), in whole seconds. Zero means
	// none, PgBouncer's default.
	QueryTimeout time.Duration
	// Binary is the pgbouncer program to run. Empty means pgbouncer on
	// PATH, or else BinaryPath.
	Binary string
}

// withDefaults fills in the zero fields and checks the others.
func (o Options) withDefaults() (Options, error) {
	switch o.PoolMode {
	case "":
		o.PoolMode = DefaultPoolMode
	case PoolModeTransaction, PoolModeSession:
	default:
		return o, fmt.Errorf("pool mode %q: want %q or %q", o.PoolMode, PoolModeTransaction, PoolModeSession)
	}
	if o.PoolSize == 0 {
		o.PoolSize = DefaultPoolSize
	}
	if o.MaxClientConn == 0 {
		o.MaxClientConn = DefaultMaxClientConn
	}
	if o.QueryTimeout < 0 || o.QueryTimeout%time.Second != 0 {
		return o, fmt.Errorf("query timeout %s: want whole seconds", o.QueryTimeout)
	}
	if o.PoolSize < 0 || o.MaxClientConn < 0 {
		return o, fmt.Errorf("pool size %d and max client connections %d: want positive numbers", o.PoolSize, o.MaxClientConn)
	}
	return o, nil
}

// Bouncer is a running PgBouncer. Its methods are safe for concurrent use.
type Bouncer struct {
	dir     string
	bin     string
	config  string
	logFile string
	version [2]int // major, minor
	port    int
	user    *url.Userinfo
	cred    *syscall.Credential // user to run as, when root

	mu     sync.Mutex
	proc   *process // nil while stopped
	closed bool
}

// Start starts a PgBouncer in front of the server of serverURL, a
// postgres:// URL whose user and password it logs in with. ctx bounds the
// start only, not the life of the process: call Close to stop it. When
// PgBouncer is missing the error wraps ErrNotInstalled and says how to
// install it; when it exits before accepting connections, the error holds
// its log.
func Start(ctx context.Context, serverURL string, opts Options) (_ *Bouncer, err error) {
	opts, err = opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	bin, err := findBinary(opts.Binary)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	version, err := binaryVersion(ctx, bin)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	srv, err := parseServer(serverURL)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	cred, err := osuser.Unprivileged()
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	dir, err := os.MkdirTemp("", "relay-pgbouncer-")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: create directory: %w", err)
	}
	b := &Bouncer{
		dir:     dir,
		bin:     bin,
		config:  filepath.Join(dir, "pgbouncer.ini"),
		logFile: filepath.Join(dir, "pgbouncer.log"),
		version: version,
		user:    srv.userinfo(),
		cred:    cred,
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if err := b.writeAuthFile(srv); err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	// A free port can be taken between finding it and PgBouncer binding
	// it: try a few.
	for try := 1; ; try++ {
		if b.port, err = freePort(); err != nil {
			return nil, fmt.Errorf("pgbouncer: %w", err)
		}
		if err = b.writeConfig(srv, opts); err != nil {
			return nil, fmt.Errorf("pgbouncer: %w", err)
		}
		b.proc, err = b.start(ctx)
		if err == nil || !errors.Is(err, errAddrInUse) || try == 3 {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	return b, nil
}

// URL returns a connection URL for database through the bouncer, as the
// user (and with the password) of the server's URL. It selects ExecMode
// (default_query_exec_mode), which pgx reads; psql and libpq refuse
// that parameter.
func (b *Bouncer) URL(database string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     b.user,
		Host:     b.Addr(),
		Path:     "/" + database,
		RawQuery: "sslmode=disable&default_query_exec_mode=" + ExecMode,
	}
	return u.String()
}

// Version returns PgBouncer's version, major.minor.
func (b *Bouncer) Version() string {
	return fmt.Sprintf("%d.%d", b.version[0], b.version[1])
}

// Addr returns the host:port the bouncer listens on.
func (b *Bouncer) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port))
}

// Kill ends the PgBouncer process with SIGKILL, as a crash would: clients
// lose their connections at once, and so does the server. Restart starts
// it again.
func (b *Bouncer) Kill() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errors.New("pgbouncer: already closed")
	}
	if b.proc == nil {
		return nil
	}
	b.proc.kill()
	b.proc = nil
	return nil
}

// Restart stops PgBouncer if it runs and starts it again on the same
// address, with the same settings. Clients lose their connections and can
// connect again once it returns.
func (b *Bouncer) Restart(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errors.New("pgbouncer: already closed")
	}
	if b.proc != nil {
		b.proc.stop()
		b.proc = nil
	}
	proc, err := b.start(ctx)
	if err != nil {
		return fmt.Errorf("pgbouncer: restart: %w", err)
	}
	b.proc = proc
	return nil
}

// Close stops PgBouncer, waits for it to exit and removes its directory.
// It reports a PgBouncer that had exited on its own before. It is safe to
// call more than once.
func (b *Bouncer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	var errs []error
	if b.proc != nil {
		if err := b.proc.exited(); err != nil {
			errs = append(errs, fmt.Errorf("pgbouncer: exited before Close (%w); log:\n%s", err, b.logTail()))
		}
		b.proc.stop()
		b.proc = nil
	}
	if err := os.RemoveAll(b.dir); err != nil {
		errs = append(errs, fmt.Errorf("pgbouncer: remove %s: %w", b.dir, err))
	}
	return errors.Join(errs...)
}

// errAddrInUse marks a start that failed because another process has the
// port.
var errAddrInUse = errors.New("address already in use")

// start starts the process and waits until it accepts connections. Called
// with b.mu held, or before b is shared.
//
// A PgBouncer that cannot bind its TCP port keeps running on its unix
// socket, and a connection to the port would reach whoever has it: so it
// is PgBouncer's log that says whether the port is its own.
func (b *Bouncer) start(ctx context.Context) (*process, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	log, err := os.OpenFile(b.logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	defer log.Close() // the child has its own copy
	info, err := log.Stat()
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	from := info.Size() // what an earlier run wrote
	cmd := exec.Command(b.bin, b.config)
	cmd.Dir = b.dir
	cmd.Stdout = log
	cmd.Stderr = log
	cmd.SysProcAttr = sysProcAttr(b.cred)
	p, err := startProcess(cmd)
	if err != nil {
		return nil, fmt.Errorf("run %s: %w", b.bin, err)
	}
	listening := []byte("listening on " + b.Addr() + "\n")
	refused := []byte("cannot listen on " + b.Addr() + ":")
	var d net.Dialer
	for {
		if err := p.exited(); err != nil {
			return nil, fmt.Errorf("exited before accepting connections (%w); log:\n%s", err, b.logTail())
		}
		out, err := b.logFrom(from)
		if err != nil {
			p.kill()
			return nil, err
		}
		if bytes.Contains(out, refused) {
			p.kill()
			return nil, fmt.Errorf("listen on %s: %w; log:\n%s", b.Addr(), errAddrInUse, b.logTail())
		}
		if bytes.Contains(out, listening) {
			conn, err := d.DialContext(ctx, "tcp", b.Addr())
			if err == nil {
				conn.Close()
				return p, nil
			}
		}
		select {
		case <-ctx.Done():
			p.kill()
			return nil, fmt.Errorf("not accepting connections on %s: %w; log:\n%s", b.Addr(), ctx.Err(), b.logTail())
		case <-p.done:
		case <-time.After(pollInterval):
		}
	}
}

// logFrom returns PgBouncer's log from offset on.
func (b *Bouncer) logFrom(offset int64) ([]byte, error) {
	f, err := os.Open(b.logFile)
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	defer f.Close()
	out, err := io.ReadAll(io.NewSectionReader(f, offset, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("read log: %w", err)
	}
	return out, nil
}

// logTail returns the end of PgBouncer's log, for error messages.
func (b *Bouncer) logTail() string {
	const max = 4 << 10
	out, err := os.ReadFile(b.logFile)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return "(empty)"
	}
	if len(out) > max {
		out = out[len(out)-max:]
		if i := bytes.IndexByte(out, '\n'); i >= 0 {
			out = out[i+1:]
		}
	}
	return string(out)
}

// findBinary returns the pgbouncer program to run.
func findBinary(bin string) (string, error) {
	hint := "install it with `apt-get install pgbouncer` (Debian, Ubuntu) or your system's package manager"
	if bin != "" {
		p, err := exec.LookPath(bin)
		if err != nil {
			return "", fmt.Errorf("%w: %v; %s", ErrNotInstalled, err, hint)
		}
		return p, nil
	}
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if p, err := exec.LookPath(BinaryPath); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%w: no pgbouncer on PATH nor at %s; %s", ErrNotInstalled, BinaryPath, hint)
}

// binaryVersion returns the major and minor version of the pgbouncer
// program bin.
func binaryVersion(ctx context.Context, bin string) ([2]int, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--version").CombinedOutput()
	if err != nil {
		return [2]int{}, fmt.Errorf("%s --version: %w: %s", bin, err, bytes.TrimSpace(out))
	}
	// "PgBouncer 1.18.0" and then the versions of its libraries.
	var v [2]int
	if _, err := fmt.Sscanf(string(out), "PgBouncer %d.%d", &v[0], &v[1]); err != nil {
		return [2]int{}, fmt.Errorf("%s --version: no version in %q", bin, out)
	}
	return v, nil
}

// freePort returns a TCP port of 127.0.0.1 that nothing listens on now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
