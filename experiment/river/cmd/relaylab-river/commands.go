package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/experiment/river/adapter"
	"github.com/relayq/relay/internal/cli"
)

// applicationName is the application_name of every connection of
// relaylab-river, as pg_stat_activity shows it.
const applicationName = "relaylab-river"

// connectTimeout bounds one connection attempt.
const connectTimeout = 10 * time.Second

// common are the flags every command has: the database and the logs.
type common struct {
	db  cli.DBFlags
	log cli.LogFlags
}

func (c *common) register(fs *cli.FlagSet) {
	c.db.Register(fs)
	c.log.Register(fs)
}

// parse parses args, which take no positional argument, and returns the
// database URL and the logger; cli.ErrHelp after -h.
func (c *common) parse(fs *cli.FlagSet, args []string, getenv func(string) string, stderr io.Writer) (string, *slog.Logger, error) {
	pos, err := fs.Parse(args, stderr)
	if err != nil {
		return "", nil, err
	}
	if len(pos) > 0 {
		return "", nil, cli.Usagef("%s: unexpected argument %q", fs.Name(), pos[0])
	}
	url, err := c.db.Resolve(getenv)
	if err != nil {
		return "", nil, err
	}
	logger, err := c.log.Logger(stderr)
	if err != nil {
		return "", nil, err
	}
	return url, logger, nil
}

// connect opens a pool on dsn of at most maxConns connections (pgxpool's
// default if 0) and checks that the database answers.
func connect(ctx context.Context, dsn string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, cli.Usagef("invalid database URL: %v", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = applicationName
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open a pool: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to the database: %w", err)
	}
	return pool, nil
}

func runMigrate(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	var c common
	fs := cli.NewFlagSet("migrate", "relaylab-river migrate [flags]",
		"Applies River's migrations (rivermigrate, line main) that the database lacks.")
	c.register(fs)
	url, logger, err := c.parse(fs, args, getenv, stderr)
	if err != nil {
		return cli.Helped(err)
	}
	pool, err := connect(ctx, url, 0)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer pool.Close()
	n, err := adapter.Migrate(ctx, pool, logger)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	logger.Info("migrated", "applied", n)
	return nil
}

func runInsert(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	var (
		c       common
		jobs    int
		kind    string
		sleepMs int
		queue   string
		batch   int
	)
	fs := cli.NewFlagSet("insert", "relaylab-river insert [flags]",
		"Inserts --jobs jobs of --kind on --queue, available at once, through River's InsertManyFast.")
	c.register(fs)
	fs.IntVar(&jobs, "jobs", 1, "how many jobs")
	fs.StringVar(&kind, "kind", adapter.KindNoop, "kind of job: "+adapter.KindNoop+" or "+adapter.KindSleep)
	fs.IntVar(&sleepMs, "sleep-ms", 1, "how long each "+adapter.KindSleep+" job sleeps")
	fs.StringVar(&queue, "queue", "default", "queue to insert on")
	fs.IntVar(&batch, "batch", adapter.DefaultInsertBatch, "jobs per statement")
	url, logger, err := c.parse(fs, args, getenv, stderr)
	if err != nil {
		return cli.Helped(err)
	}
	jobArgs, err := adapter.ArgsOf(kind, sleepMs)
	if err != nil {
		return cli.Usagef("insert: %v", err)
	}
	if jobs < 0 || batch < 1 || queue == "" {
		return cli.Usagef("insert: want --jobs of zero or more, --batch of at least 1 and a --queue, got %d, %d and %q", jobs, batch, queue)
	}
	pool, err := connect(ctx, url, 0)
	if err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	defer pool.Close()
	if err := adapter.Insert(ctx, pool, logger, jobArgs, queue, jobs, batch); err != nil {
		return fmt.Errorf("insert: %w", err)
	}
	logger.Info("inserted", "jobs", jobs, "kind", kind, "queue", queue)
	return nil
}

func runFeed(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	var (
		c       common
		kind    string
		sleepMs int
		queue   string
	)
	fs := cli.NewFlagSet("feed", "relaylab-river feed [flags]",
		`Reads numbers of jobs from standard input, a line each, inserts each
number of jobs of --kind on --queue at once through River's
InsertManyFast, and answers "ok N" on standard output after each, or
"error: ..." before it stops. Ends when standard input does.`)
	c.register(fs)
	fs.StringVar(&kind, "kind", adapter.KindSleep, "kind of job: "+adapter.KindNoop+" or "+adapter.KindSleep)
	fs.IntVar(&sleepMs, "sleep-ms", 1, "how long each "+adapter.KindSleep+" job sleeps")
	fs.StringVar(&queue, "queue", "default", "queue to insert on")
	url, logger, err := c.parse(fs, args, getenv, stderr)
	if err != nil {
		return cli.Helped(err)
	}
	jobArgs, err := adapter.ArgsOf(kind, sleepMs)
	if err != nil {
		return cli.Usagef("feed: %v", err)
	}
	if queue == "" {
		return cli.Usagef("feed: want a --queue")
	}
	pool, err := connect(ctx, url, 0)
	if err != nil {
		return fmt.Errorf("feed: %w", err)
	}
	defer pool.Close()
	return adapter.Feed(ctx, pool, logger, jobArgs, queue, stdin, stdout)
}

func runWork(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	var (
		c        common
		cfg      adapter.WorkConfig
		maxConns int
	)
	fs := cli.NewFlagSet("work", "relaylab-river work [flags]",
		`Works --queue with a River client of --workers workers until SIGINT or
SIGTERM, then stops it: running jobs get --stop-grace to finish.`)
	c.register(fs)
	fs.StringVar(&cfg.ID, "id", "", "client id (default River's: host name and time)")
	fs.StringVar(&cfg.Queue, "queue", "default", "queue to work")
	fs.IntVar(&cfg.Workers, "workers", 100, "jobs run at once (River's MaxWorkers)")
	fs.DurationVar(&cfg.FetchCooldown, "fetch-cooldown", adapter.DefaultFetchCooldown, "River's FetchCooldown: least time between two fetches")
	fs.DurationVar(&cfg.FetchPollInterval, "fetch-poll-interval", adapter.DefaultFetchPollInterval, "River's FetchPollInterval: time between fetches with no notification")
	fs.DurationVar(&cfg.StopGrace, "stop-grace", adapter.DefaultStopGrace, "how long running jobs may finish at shutdown before they are cancelled")
	fs.DurationVar(&cfg.CompletedRetention, "completed-retention", 0, "River's CompletedJobRetentionPeriod: how long a completed job is kept (default River's, a day)")
	fs.IntVar(&maxConns, "max-conns", 0, "connections of the client's pool (default pgxpool's: the larger of 4 and the number of CPUs)")
	url, logger, err := c.parse(fs, args, getenv, stderr)
	if err != nil {
		return cli.Helped(err)
	}
	if cfg.Workers < 1 || cfg.Queue == "" || maxConns < 0 || cfg.StopGrace <= 0 {
		return cli.Usagef("work: want --workers of at least 1, a --queue, --max-conns of zero or more and a positive --stop-grace")
	}
	if cfg.CompletedRetention < 0 {
		return cli.Usagef("work: --completed-retention must not be negative, got %s", cfg.CompletedRetention)
	}
	if cfg.FetchCooldown <= 0 || cfg.FetchPollInterval < cfg.FetchCooldown {
		return cli.Usagef("work: want a positive --fetch-cooldown no longer than --fetch-poll-interval, got %s and %s", cfg.FetchCooldown, cfg.FetchPollInterval)
	}
	pool, err := connect(ctx, url, int32(maxConns))
	if err != nil {
		return fmt.Errorf("work: %w", err)
	}
	defer pool.Close()
	cfg.Logger = logger
	logger.Info("working", "queue", cfg.Queue, "workers", cfg.Workers,
		"fetch_cooldown", cfg.FetchCooldown.String(), "fetch_poll_interval", cfg.FetchPollInterval.String(), "max_conns", pool.Config().MaxConns,
		"completed_retention", cfg.CompletedRetention.String())
	if err := adapter.Work(ctx, pool, cfg); err != nil {
		return fmt.Errorf("work: %w", err)
	}
	logger.Info("stopped")
	return nil
}
