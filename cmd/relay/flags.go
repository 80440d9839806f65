package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgurl"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/worker"
)

// usageError is a mistake in the command line. main exits with status 2 for
// it, 1 for any other error.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// errHelp reports that a command printed its help: the program exits 0.
var errHelp = errors.New("help requested")

// flagSet is a command's flags with the text its -h prints above them.
type flagSet struct {
	*flag.FlagSet
	usage string
}

// newFlagSet returns a flag set that reports nothing itself: parse turns its
// errors into one line, and prints the usage only when asked to.
func newFlagSet(name, synopsis, description string) *flagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flagSet{FlagSet: fs, usage: "Usage: " + synopsis + "\n\n" + description + "\n"}
}

// parse parses args, which may mix flags and positional arguments in any
// order ("--" ends the flags), and returns the positional arguments. On -h
// it prints the usage to stderr and returns errHelp; a bad flag is a
// usageError of one line.
func (fs *flagSet) parse(args []string, stderr io.Writer) ([]string, error) {
	var positional []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stderr, fs.usage)
			fmt.Fprintln(stderr, "\nFlags:")
			fs.SetOutput(stderr)
			fs.PrintDefaults()
			fs.SetOutput(io.Discard)
			return nil, errHelp
		}
		if err != nil {
			return nil, usageErrorf("%s: %v (run \"relay %s -h\" for usage)", fs.Name(), err, fs.Name())
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// helped turns errHelp into success.
func helped(err error) error {
	if errors.Is(err, errHelp) {
		return nil
	}
	return err
}

// logFlags are the logging flags every command has.
type logFlags struct {
	format string
	level  string
}

func (l *logFlags) register(fs *flagSet) {
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error")
}

// logger returns a logger writing to w as the flags ask.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.level)); err != nil {
		return nil, usageErrorf("invalid --log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, usageErrorf("invalid --log-format %q: want text or json", l.format)
	}
}

// dbFlags is the --database-url flag, with DATABASE_URL as its fallback.
type dbFlags struct{ url string }

func (d *dbFlags) register(fs *flagSet) {
	// The environment is read after parsing, so that -h never prints a
	// password from it as the default.
	fs.StringVar(&d.url, "database-url", "", "PostgreSQL URL (default $DATABASE_URL)")
}

// resolve returns the database URL from the flag or the environment.
func (d *dbFlags) resolve(getenv func(string) string) (string, error) {
	if d.url != "" {
		return d.url, nil
	}
	if u := getenv("DATABASE_URL"); u != "" {
		return u, nil
	}
	return "", usageErrorf("no database: give --database-url or set DATABASE_URL (e.g. postgres://user:password@localhost:5432/relay)")
}

// connectTimeout bounds the first connection to the database.
const connectTimeout = 10 * time.Second

// servingMinConns is how many connections the pool of a long-running
// command (serve, work) keeps open even when idle, unless the URL sets
// pool_min_conns to a positive number: a worker's acknowledgements,
// heartbeats and reclaims, or the API's first requests after a quiet
// spell, then never wait for a new PostgreSQL backend to start.
const servingMinConns = 3

// poolConfig parses dsn into a pool configuration: appName shows in
// pg_stat_activity unless the URL sets application_name, and the pool keeps
// minConns connections open unless the URL sets pool_min_conns.
func poolConfig(dsn, appName string, minConns int32) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL: %w", err)
	}
	if _, ok := cfg.ConnConfig.RuntimeParams["application_name"]; !ok {
		cfg.ConnConfig.RuntimeParams["application_name"] = appName
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	if cfg.MinConns == 0 {
		cfg.MinConns = min(minConns, cfg.MaxConns)
	}
	return cfg, nil
}

// connect opens a pool on dsn, configured by poolConfig, and checks that
// the database answers. Behind a connection pooler, it runs statements as
// a transaction-mode pooler needs them (see adaptToPooler).
func connect(ctx context.Context, logger *slog.Logger, dsn, appName string, minConns int32) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(dsn, appName, minConns)
	if err != nil {
		return nil, err
	}
	if err := adaptToPooler(ctx, logger, cfg); err != nil {
		return nil, &connectError{dsn: pgurl.Redact(dsn), err: err}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open database pool: %w", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	if err := pool.Ping(pingCtx); err != nil {
		pool.Close()
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to the database: %w", context.Cause(ctx))
		}
		return nil, &connectError{dsn: pgurl.Redact(dsn), err: err}
	}
	return pool, nil
}

// adaptToPooler finds out, with one connection, whether cfg reaches
// PostgreSQL through a connection pooler such as PgBouncer: the server
// process it talks to is then not the one its connection announced. If so,
// and the URL leaves pgx's statement mode at its default, it switches the
// pool to the cache_describe mode: pgx's default prepares each statement
// on one server connection and runs it later on another, which a
// transaction-mode pooler hands out per transaction.
func adaptToPooler(ctx context.Context, logger *slog.Logger, cfg *pgxpool.Config) error {
	if cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return nil // chosen in the URL
	}
	probe := cfg.ConnConfig.Copy()
	probe.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, probe)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	backend, err := db.New(conn).BackendPID(ctx)
	if err != nil {
		return fmt.Errorf("read the server process: %w", err)
	}
	if announced := int32(conn.PgConn().PID()); backend != announced {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		logger.Info("the database URL goes through a connection pooler; statements run unprepared (default_query_exec_mode=cache_describe)",
			"announced_pid", announced, "server_pid", backend)
	}
	return nil
}

// connectError says, in one line, why the database could not be reached.
type connectError struct {
	dsn string
	err error
}

func (e *connectError) Error() string {
	// pgx reports each address it tried on a line of its own, after a
	// first line naming the user and database: keep the last attempt.
	msg := strings.TrimSpace(e.err.Error())
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		msg = strings.TrimSpace(msg[i+1:])
	}
	return fmt.Sprintf("cannot reach the database %s: %s", e.dsn, msg)
}

func (e *connectError) Unwrap() error { return e.err }

// errNotMigrated is what a command that needs the schema says without it.
var errNotMigrated = errors.New(`database not migrated: run "relay migrate up"`)

// requireMigrated fails with errNotMigrated unless every migration this
// build carries is applied.
func requireMigrated(ctx context.Context, pool *pgxpool.Pool) error {
	err := migrations.CheckCurrent(ctx, pool)
	if errors.Is(err, migrations.ErrNotMigrated) {
		return errNotMigrated
	}
	if err != nil {
		return fmt.Errorf("check the schema: %w", err)
	}
	return nil
}

// workerFlags configure a worker.
type workerFlags struct {
	sessionURL      string
	queue           string
	slots           int
	id              string
	lease           time.Duration
	heartbeat       time.Duration
	poll            time.Duration
	reclaimInterval time.Duration
	prefetch        int
	prefetchWait    time.Duration
	shutdownGrace   time.Duration
	backoffBase     time.Duration
}

func (w *workerFlags) register(fs *flagSet, defaultSlots int, slotsHelp string) {
	fs.StringVar(&w.sessionURL, "session-database-url", "", "PostgreSQL URL of the worker's session, which shows it alive: PostgreSQL itself or a session-mode pool, never a transaction-mode pooler (default $RELAY_SESSION_DATABASE_URL, else the database URL)")
	fs.StringVar(&w.queue, "queue", worker.DefaultQueue, "queue to work on")
	fs.IntVar(&w.slots, "slots", defaultSlots, slotsHelp)
	fs.StringVar(&w.id, "id", "", "worker id, unique among live workers (default host-pid-random)")
	fs.DurationVar(&w.lease, "lease", worker.DefaultLease, "how long a claim holds a job without a heartbeat")
	fs.DurationVar(&w.heartbeat, "heartbeat", 0, "how often leases are renewed (default lease/3)")
	fs.DurationVar(&w.poll, "poll", worker.DefaultPollInterval, "how often an idle worker looks for jobs no notification announced")
	fs.DurationVar(&w.reclaimInterval, "reclaim-interval", worker.DefaultReclaimInterval, "how often jobs of dead workers and expired leases are taken back")
	fs.IntVar(&w.prefetch, "prefetch", 0, "jobs claimed ahead of a free slot while jobs are short (default: as many as --slots; -1: none)")
	fs.DurationVar(&w.prefetchWait, "prefetch-wait", worker.DefaultPrefetchWait, "longest a job claimed ahead waits for a slot before it is handed back")
	fs.DurationVar(&w.shutdownGrace, "shutdown-grace", worker.DefaultShutdownGrace, "how long running jobs may finish at shutdown before they are released (negative: release at once)")
	fs.DurationVar(&w.backoffBase, "backoff-base", worker.DefaultBackoffBase,
		fmt.Sprintf("retry backoff after the first failure, doubling each attempt up to %s (for tests and demos)", worker.DefaultBackoffMax))
}

// resolveEnv fills in what comes from the environment. It runs after the
// flags are parsed, so that -h never prints a password from it.
func (w *workerFlags) resolveEnv(getenv func(string) string) {
	if w.sessionURL == "" {
		w.sessionURL = getenv("RELAY_SESSION_DATABASE_URL")
	}
}

// config returns the worker configuration the flags describe.
func (w *workerFlags) config(logger *slog.Logger) (worker.Config, error) {
	if w.backoffBase <= 0 {
		return worker.Config{}, usageErrorf("--backoff-base must be positive, got %s", w.backoffBase)
	}
	return worker.Config{
		SessionDatabaseURL: w.sessionURL,
		Queue:              w.queue,
		Slots:              w.slots,
		ID:                 w.id,
		Lease:              w.lease,
		HeartbeatInterval:  w.heartbeat,
		PollInterval:       w.poll,
		ReclaimInterval:    w.reclaimInterval,
		Prefetch:           w.prefetch,
		PrefetchWait:       w.prefetchWait,
		ShutdownGrace:      w.shutdownGrace,
		Backoff:            worker.ExponentialBackoff(w.backoffBase, worker.DefaultBackoffMax),
		Logger:             logger,
	}, nil
}
