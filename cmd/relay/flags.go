package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/internal/pgurl"
	"github.com/relayq/relay/migrations"
	"github.com/relayq/relay/worker"
)

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
// minConns connections open unless the URL sets pool_min_conns. A dsn
// that does not parse is a usage error.
func poolConfig(dsn, appName string, minConns int32) (*pgxpool.Config, error) {
	if err := pgurl.CheckURLText(dsn); err != nil {
		return nil, cli.Usagef("invalid database URL: %v", err)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		// A mistake in --database-url or DATABASE_URL, as one in
		// --session-database-url is: pgx's message hides the password.
		return nil, cli.Usagef("invalid database URL: %v", err)
	}
	if err := pgurl.CheckHosts(&cfg.ConnConfig.Config); err != nil {
		return nil, cli.Usagef("invalid database URL: %v", err)
	}
	if err := pgurl.CheckExecMode(cfg.ConnConfig.DefaultQueryExecMode); err != nil {
		return nil, cli.Usagef("database URL: %v", err)
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
// a transaction-mode pooler needs them (see adaptToPooler). Elsewhere the
// server ends each of its connections once it has been silent for
// worker.DefaultLease (worker.EndSilentConnections), so that a host that
// vanishes without a word does not hold them for hours.
func connect(ctx context.Context, logger *slog.Logger, dsn, appName string, minConns int32) (*pgxpool.Pool, error) {
	return open(ctx, logger, dsn, appName, minConns, func(cfg *pgxpool.Config) {
		worker.EndSilentConnections(cfg, worker.DefaultLease)
	})
}

// connectWorker is connect for the pool of a worker of lease (its
// Config.Lease), whose connections keep a generic plan for each statement
// (worker.KeepGenericPlans) and end once silent for a lease.
func connectWorker(ctx context.Context, logger *slog.Logger, dsn, appName string, minConns int32, lease time.Duration) (*pgxpool.Pool, error) {
	return open(ctx, logger, dsn, appName, minConns, func(cfg *pgxpool.Config) {
		worker.KeepGenericPlans(cfg)
		worker.EndSilentConnections(cfg, lease)
	})
}

// open opens a pool as poolConfig and adaptToPooler say, with adjust
// applied to its configuration once it is known whether a pooler stands
// between.
func open(ctx context.Context, logger *slog.Logger, dsn, appName string, minConns int32, adjust func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := poolConfig(dsn, appName, minConns)
	if err != nil {
		return nil, err
	}
	if err := adaptToPooler(ctx, logger, cfg); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("connect to the database: %w", context.Cause(ctx))
		}
		return nil, &connectError{dsn: pgurl.Redact(dsn), err: err}
	}
	adjust(cfg)
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
// and pgx's statement mode is its default, cache_statement, whether the
// URL names it or not, it switches the pool to the cache_describe mode:
// cache_statement prepares each statement on one server connection and
// runs it later on another, which a transaction-mode pooler hands out per
// transaction.
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

// reachSession checks that a worker's session database, --session-database-url
// when given, answers, as connect checks the database: a worker claims
// nothing without its session, and would otherwise run waiting for one.
// dsn is a worker.Config's, which Validate has checked, as the URL of the
// database is in poolConfig (see pgurl).
func reachSession(ctx context.Context, dsn string) error {
	if dsn == "" {
		return nil // the session opens on the database, already reached
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return cli.Usagef("invalid session database URL: %v", err)
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = connectTimeout
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("connect to the session database: %w", context.Cause(ctx))
		}
		return &connectError{what: "session database", dsn: pgurl.Redact(dsn), err: err}
	}
	return conn.Close(ctx)
}

// connectError says, in one line, why the database could not be reached.
type connectError struct {
	what string // which database: "" for the database
	dsn  string
	err  error
}

func (e *connectError) Error() string {
	// pgx reports each address it tried on a line of its own, after a
	// first line naming the user and database: keep the last attempt.
	msg := strings.TrimSpace(e.err.Error())
	if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
		msg = strings.TrimSpace(msg[i+1:])
	}
	what := e.what
	if what == "" {
		what = "database"
	}
	return fmt.Sprintf("cannot reach the %s %s: %s", what, e.dsn, msg)
}

func (e *connectError) Unwrap() error { return e.err }

// errNotMigrated is what a command that needs the schema says without it.
var errNotMigrated = errors.New(`database not migrated: run "relay migrate up"`)

// requireMigrated fails with errNotMigrated unless every migration this
// build carries is applied. A database that also holds migrations of a
// newer build, as during a rolling upgrade, is served with a warning.
func requireMigrated(ctx context.Context, logger *slog.Logger, pool *pgxpool.Pool) error {
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		return fmt.Errorf("check the schema: %w", err)
	}
	defer m.Close()
	s, err := m.Inspect(ctx)
	if err != nil {
		return fmt.Errorf("check the schema: %w", err)
	}
	if len(s.Pending) > 0 {
		return errNotMigrated
	}
	if len(s.Unknown) > 0 {
		logger.Warn("the database holds migrations this build of relay does not carry: upgrade this process",
			"unknown_migrations", s.Unknown, "newest_known", s.Newest)
	}
	return nil
}
