package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/pgurl"
	"github.com/relayq/relay/migrations"
)

// DefaultAdminURL is the server the experiments create their databases on
// when no URL is given.
const DefaultAdminURL = "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

// ApplicationName is the application_name of a Database's own pool, by
// which its sessions are told apart from those of the processes it starts.
const ApplicationName = "relay experiment"

// DatabaseTimeout bounds creating, migrating or dropping one database.
const DatabaseTimeout = 2 * time.Minute

// Database is a fresh database created on an admin server for one
// experiment run, migrated with Relay's schema unless it was made by
// CreateEmptyDatabase, and dropped by Drop.
type Database struct {
	// Name is the database's name.
	Name string
	// URL connects to it, with the admin URL's credentials.
	URL string
	// Pool is the experiment's own connection pool on it.
	Pool *pgxpool.Pool
	// Q runs Relay's statements on Pool (of no use on a database made by
	// CreateEmptyDatabase).
	Q *db.Queries
	// Lab runs the lab's own statements (queries/lab) on Pool.
	Lab *labdb.Queries

	admin string
}

// CreateDatabase creates a database named prefix plus a random suffix on
// the server of adminURL (whose user must be allowed to create databases),
// applies Relay's migrations to it and opens a pool on it.
func CreateDatabase(ctx context.Context, adminURL, prefix string) (_ *Database, err error) {
	ctx, cancel := context.WithTimeout(ctx, DatabaseTimeout)
	defer cancel()
	d, err := CreateEmptyDatabase(ctx, adminURL, prefix)
	if err != nil {
		return nil, err
	}
	if _, err := migrations.Up(ctx, d.Pool); err != nil {
		dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DatabaseTimeout)
		defer cancel()
		_ = d.Drop(dropCtx)
		return nil, fmt.Errorf("migrate %s: %w", d.Name, err)
	}
	return d, nil
}

// CreateEmptyDatabase is CreateDatabase without Relay's migrations: a
// database for another system's schema, such as River's, which the
// experiment then migrates with that system's own tools.
func CreateEmptyDatabase(ctx context.Context, adminURL, prefix string) (_ *Database, err error) {
	ctx, cancel := context.WithTimeout(ctx, DatabaseTimeout)
	defer cancel()
	var suffix [5]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return nil, fmt.Errorf("create database: %w", err)
	}
	name := prefix + hex.EncodeToString(suffix[:])
	dsn, err := pgurl.WithDatabase(adminURL, name)
	if err != nil {
		return nil, err
	}
	// CREATE and DROP DATABASE take an identifier, which no statement
	// parameter can carry, and cannot run in a transaction or be prepared:
	// they are the only SQL of this package, quoted by pgx.Identifier.
	if err := AdminExec(ctx, adminURL, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		return nil, fmt.Errorf("create database %s: %w", name, err)
	}
	d := &Database{Name: name, URL: dsn, admin: adminURL}
	defer func() {
		if err != nil {
			dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DatabaseTimeout)
			defer cancel()
			_ = d.Drop(dropCtx)
		}
	}()
	if d.Pool, err = OpenPool(ctx, dsn, ApplicationName, PoolSize, 0); err != nil {
		return nil, fmt.Errorf("database %s: %w", name, err)
	}
	d.Q = db.New(d.Pool)
	d.Lab = labdb.New(d.Pool)
	return d, nil
}

// Drop closes the pool and drops the database, ending any session still
// connected to it.
func (d *Database) Drop(ctx context.Context) error {
	if d.Pool != nil {
		d.Pool.Close()
	}
	if err := AdminExec(ctx, d.admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{d.Name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("drop database %s: %w", d.Name, err)
	}
	return nil
}

// DropAtEnd drops the database, for a run to defer once it has created
// it: within DatabaseTimeout, even after ctx is done, and with the drop's
// error put in *err unless the run already failed.
func (d *Database) DropAtEnd(ctx context.Context, err *error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), DatabaseTimeout)
	defer cancel()
	if dropErr := d.Drop(ctx); dropErr != nil && *err == nil {
		*err = dropErr
	}
}

// Now reads the database clock (clock_timestamp()).
func (d *Database) Now(ctx context.Context) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	t, err := d.Lab.ExperimentClock(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the database clock: %w", err)
	}
	return t, nil
}

// PoolSize is the size of an experiment's own pool.
const PoolSize = 8

// OpenPool opens a pool on dsn whose connections carry appName as their
// application_name, of at most maxConns connections (pgxpool's default if
// 0). A connection attempt gives up after connectTimeout, unless dsn sets
// connect_timeout itself; if connectTimeout is 0, only the context of the
// attempt bounds it. Each of adjust then changes the configuration. The
// pool connects lazily: the database need not be reachable yet.
func OpenPool(ctx context.Context, dsn, appName string, maxConns int32, connectTimeout time.Duration, adjust ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parse the database URL: %w", err)
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = appName
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	for _, f := range adjust {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open a pool: %w", err)
	}
	return pool, nil
}

func AdminExec(ctx context.Context, adminURL, sql string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to the admin database %s: %w", pgurl.Redact(adminURL), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// pollInterval is how often the experiments poll the database while
// waiting for a state.
const JobPollInterval = 5 * time.Millisecond

// WaitWorkers waits until a worker is registered with a live session under
// each of ids: the processes are then ready to claim.
func WaitWorkers(ctx context.Context, q *db.Queries, procs *Procs, ids ...string) error {
	for {
		listCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		workers, err := q.WorkerList(listCtx)
		cancel()
		if err != nil && ctx.Err() == nil {
			return fmt.Errorf("list workers: %w", err)
		}
		alive := map[string]bool{}
		for _, w := range workers {
			if w.SessionAlive {
				alive[w.ID] = true
			}
		}
		missing := 0
		for _, id := range ids {
			if !alive[id] {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		if err := procs.CheckRunning("before registering"); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("wait for %d of %d workers to register: %w", missing, len(ids), ctx.Err())
		case <-time.After(10 * JobPollInterval):
		}
	}
}

// StartServe starts `relay serve` on a free port of 127.0.0.1 and waits
// until /readyz answers 200. It returns the process and the API's base URL.
func StartServe(ctx context.Context, procs *Procs, name string, extraArgs ...string) (*Proc, string, error) {
	args := append([]string{"serve", "--addr", "127.0.0.1:0", "--log-format", "json"}, extraArgs...)
	p, err := procs.Start(ctx, name, args...)
	if err != nil {
		return nil, "", err
	}
	// The listening address, port included, is in the log line that
	// announces the API.
	line, err := p.WaitLog(ctx, func(l LogLine) bool { return strings.Contains(l.Str("addr"), ":") })
	if err != nil {
		return p, "", fmt.Errorf("wait for relay serve to listen: %w", err)
	}
	base := "http://" + line.Str("addr")
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/readyz", nil)
		if err != nil {
			return p, "", fmt.Errorf("readyz request: %w", err)
		}
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, base, nil
			}
		}
		if p.Exited() {
			return p, "", fmt.Errorf("relay serve exited: %v", p.ExitErr())
		}
		select {
		case <-ctx.Done():
			return p, "", fmt.Errorf("wait for %s/readyz: %w", base, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}
