// Package dbtest gives each test a PostgreSQL database of its own, migrated
// to the current schema and dropped when the test ends.
//
// The server comes from RELAY_TEST_DATABASE_URL when it is set (a URL whose
// user may create databases); otherwise a PostgreSQL container of
// RELAY_TEST_POSTGRES_IMAGE (default postgres:15-alpine) is started with
// testcontainers-go's postgres module, one per test process (see
// devdb.StartContainer, and devdb.HostNetworkProvider for an engine without
// a bridge network). When neither works, the test fails and says how to
// provide one: a test suite that silently skips its database tests would
// pass without testing anything.
package dbtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/devdb"
	"github.com/relayq/relay/internal/pgurl"
	"github.com/relayq/relay/migrations"
)

// EnvURL names the environment variable that points the tests at a server.
const EnvURL = "RELAY_TEST_DATABASE_URL"

// EnvImage names the environment variable that chooses the image of the
// container the tests start when EnvURL is empty: devdb.ContainerImage if
// it is empty too.
const EnvImage = "RELAY_TEST_POSTGRES_IMAGE"

// ContainerConfig returns the configuration of the PostgreSQL containers
// that tests start, from EnvImage.
func ContainerConfig() devdb.ContainerConfig {
	image := os.Getenv(EnvImage)
	if image == "" {
		image = devdb.ContainerImage
	}
	return devdb.ContainerConfig{Image: image}
}

// templateLockKey serialises template creation across test processes.
const templateLockKey = 1380273242

var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error
	// container is the server when it runs in a container, kept for the
	// test process's whole life: it holds the lock that shows its owner
	// alive.
	container *devdb.Cluster

	templateMu    sync.Mutex
	templateReady = map[string]bool{}
)

// New returns a pool on a fresh migrated database. The pool is closed and
// the database dropped when the test ends.
func New(t testing.TB) *pgxpool.Pool {
	t.Helper()
	return Connect(t, NewURL(t))
}

// Connect returns a pool on the database of url, as NewURL or a proxy in
// front of it gives it, closed when the test ends.
func Connect(t testing.TB, url string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("dbtest: connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// NewURL returns the connection URL of a fresh migrated database, for tests
// that hand it to other processes. The database is dropped when the test
// ends, after terminating any session still connected to it.
func NewURL(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	admin, err := adminURL(ctx)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	template, err := ensureTemplate(ctx, admin)
	if err != nil {
		t.Fatalf("dbtest: prepare template database: %v", err)
	}
	name := "relay_test_" + randomSuffix()
	if err := adminExec(ctx, admin, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{template}.Sanitize()); err != nil {
		t.Fatalf("dbtest: create database: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := adminExec(ctx, admin, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("dbtest: drop database %s: %v", name, err)
		}
	})
	dsn, err := pgurl.WithDatabase(admin, name)
	if err != nil {
		t.Fatalf("dbtest: %v", err)
	}
	return dsn
}

// Named returns the URL of a migrated database named after prefix and the
// current schema, creating it if it does not exist yet. Unlike the databases
// of New and NewURL it is kept, for tools such as sqlc vet that need a
// migrated database outside a test.
func Named(ctx context.Context, prefix string) (string, error) {
	admin, err := adminURL(ctx)
	if err != nil {
		return "", err
	}
	template, err := ensureTemplate(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("prepare template database: %w", err)
	}
	name := prefix + strings.TrimPrefix(template, "relay_template")
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", pgurl.Redact(admin), err)
	}
	defer conn.Close(context.Background())
	exists, err := db.New(conn).DatabaseExists(ctx, name)
	if err != nil {
		return "", fmt.Errorf("look up database: %w", err)
	}
	if !exists {
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{template}.Sanitize()); err != nil {
			return "", fmt.Errorf("create database: %w", err)
		}
	}
	return pgurl.WithDatabase(admin, name)
}

// adminURL resolves the server once per test process.
func adminURL(ctx context.Context) (string, error) {
	serverOnce.Do(func() {
		if u := os.Getenv(EnvURL); u != "" {
			serverURL = u
			return
		}
		// The container lives as long as the test process: testcontainers'
		// reaper removes it, or, without the reaper, the next test process
		// (see devdb.StartContainer).
		cfg := ContainerConfig()
		c, err := devdb.StartContainer(ctx, slog.New(slog.DiscardHandler), cfg)
		if err != nil {
			serverErr = fmt.Errorf("no database for tests: %s is not set and a PostgreSQL container of %s could not be started: %w; "+
				"set %s to a PostgreSQL URL whose user may create databases, e.g. postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
				EnvURL, cfg.Image, err, EnvURL)
			return
		}
		container = c
		serverURL = c.URL()
	})
	return serverURL, serverErr
}

// ensureTemplate creates, once per schema version, a migrated database that
// every test database is copied from, so that each test pays for a copy
// rather than for running the migrations.
func ensureTemplate(ctx context.Context, admin string) (string, error) {
	name, err := templateName()
	if err != nil {
		return "", err
	}
	templateMu.Lock()
	defer templateMu.Unlock()
	if templateReady[name] {
		return name, nil
	}

	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return "", fmt.Errorf("connect to %s: %w", pgurl.Redact(admin), err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", templateLockKey); err != nil {
		return "", fmt.Errorf("lock: %w", err)
	}
	defer conn.Exec(context.Background(), "SELECT pg_advisory_unlock($1)", templateLockKey) //nolint:errcheck

	exists, err := db.New(conn).DatabaseExists(ctx, name)
	if err != nil {
		return "", fmt.Errorf("look up template: %w", err)
	}
	if !exists {
		// Built under another name and renamed when complete, so that a
		// run interrupted half-way never leaves a half-migrated template.
		building := name + "_building"
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{building}.Sanitize()+" WITH (FORCE)"); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{building}.Sanitize()); err != nil {
			return "", err
		}
		if err := migrate(ctx, admin, building); err != nil {
			return "", err
		}
		if _, err := conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{building}.Sanitize()+" RENAME TO "+pgx.Identifier{name}.Sanitize()); err != nil {
			return "", err
		}
	}
	templateReady[name] = true
	return name, nil
}

func migrate(ctx context.Context, admin, database string) error {
	dsn, err := pgurl.WithDatabase(admin, database)
	if err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	_, err = migrations.Up(ctx, pool)
	return err
}

// templateName derives the template's name from the migration files and
// the table that records them, so a changed schema gets a new template
// instead of a stale one.
func templateName() (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00", migrations.VersionTable)
	err := fs.WalkDir(migrations.FS, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS, path)
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", path, len(b))
		h.Write(b)
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("hash migrations: %w", err)
	}
	return "relay_template_" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

func adminExec(ctx context.Context, admin, sql string) error {
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", pgurl.Redact(admin), err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

func randomSuffix() string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b[:])
}
