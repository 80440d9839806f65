// Package migrations holds Relay's schema as goose SQL files, embedded so
// that the relay binary can apply them, and the functions that do.
//
// The same files work with the stock goose command:
//
//	goose -dir migrations postgres "$DATABASE_URL" up
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS

// ErrNotMigrated reports a database whose schema is behind the migrations
// this build of Relay carries.
var ErrNotMigrated = errors.New("database schema is not up to date: run `relay migrate up`")

// Migrator applies and inspects the embedded migrations on one database.
type Migrator struct {
	db       *sql.DB
	provider *goose.Provider
}

// NewMigrator returns a Migrator for the database behind pool. Close it when
// done; it does not close the pool.
//
// Migrators of one database take turns: each applies or rolls back
// migrations, or lists them, under goose's lock, a row of the table
// goose_lock held on a lease its holder renews, so that processes that
// migrate at once, as the replicas of one deployment may, apply each
// migration once and the others wait. Unlike an advisory lock held by a
// session, it holds behind a transaction-mode pooler. A migrator that dies
// holding it keeps the others waiting for its lease, 30 s; one waits for
// the lock for up to lockWaitLimit, trying every lockTry.
func NewMigrator(pool *pgxpool.Pool) (*Migrator, error) {
	locker, err := lock.NewPostgresTableLocker(lock.WithTableLockTimeout(lockTry, uint64(lockWaitLimit/lockTry)))
	if err != nil {
		return nil, fmt.Errorf("make the migration lock: %w", err)
	}
	db := stdlib.OpenDBFromPool(pool)
	provider, err := goose.NewProvider(goose.DialectPostgres, db, FS, goose.WithLocker(locker))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return &Migrator{db: db, provider: provider}, nil
}

// lockTry and lockWaitLimit are how often a Migrator tries to take the
// migration lock while another holds it, and for how long.
const (
	lockTry       = 500 * time.Millisecond
	lockWaitLimit = 15 * time.Minute
)

// Up applies every pending migration to the database behind pool and
// returns the versions applied.
func Up(ctx context.Context, pool *pgxpool.Pool) ([]int64, error) {
	m, err := NewMigrator(pool)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	return m.Up(ctx)
}

// CheckCurrent returns ErrNotMigrated unless every migration this build
// carries is applied to the database behind pool.
func CheckCurrent(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := NewMigrator(pool)
	if err != nil {
		return err
	}
	defer m.Close()
	return m.CheckCurrent(ctx)
}

// Close releases the Migrator's handle on the pool.
func (m *Migrator) Close() error { return m.db.Close() }

// Up applies every pending migration and returns the versions applied.
func (m *Migrator) Up(ctx context.Context) ([]int64, error) {
	results, err := m.provider.Up(ctx)
	if err != nil {
		return nil, fmt.Errorf("migrate up: %w%s", err, appliedBefore(err))
	}
	return versions(results), nil
}

// appliedBefore says which migrations were applied before the one that
// failed, for the error of a run that applied some, and nothing otherwise.
func appliedBefore(err error) string {
	var partial *goose.PartialError
	if !errors.As(err, &partial) || len(partial.Applied) == 0 {
		return ""
	}
	return fmt.Sprintf(" (applied before it: %v)", versions(partial.Applied))
}

// UpTo applies the pending migrations up to and including version, and
// returns the versions applied.
func (m *Migrator) UpTo(ctx context.Context, version int64) ([]int64, error) {
	results, err := m.provider.UpTo(ctx, version)
	if err != nil {
		return nil, fmt.Errorf("migrate up to %d: %w%s", version, err, appliedBefore(err))
	}
	return versions(results), nil
}

// DownTo rolls back every migration after version, newest first, and
// returns the versions rolled back.
func (m *Migrator) DownTo(ctx context.Context, version int64) ([]int64, error) {
	results, err := m.provider.DownTo(ctx, version)
	if err != nil {
		return nil, fmt.Errorf("migrate down to %d: %w", version, err)
	}
	return versions(results), nil
}

// Down rolls back the most recent migration and returns its version, or
// nothing when no migration is applied.
func (m *Migrator) Down(ctx context.Context) ([]int64, error) {
	result, err := m.provider.Down(ctx)
	if errors.Is(err, goose.ErrNoNextVersion) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("migrate down: %w", err)
	}
	return versions([]*goose.MigrationResult{result}), nil
}

// Status describes one migration and whether it is applied.
type Status struct {
	Version int64
	Source  string
	Applied bool
}

// Status lists every migration with whether it has been applied.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	statuses, err := m.provider.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	out := make([]Status, 0, len(statuses))
	for _, s := range statuses {
		out = append(out, Status{
			Version: s.Source.Version,
			Source:  s.Source.Path,
			Applied: s.State == goose.StateApplied,
		})
	}
	return out, nil
}

// CheckCurrent returns ErrNotMigrated if any migration is pending.
func (m *Migrator) CheckCurrent(ctx context.Context) error {
	pending, err := m.provider.HasPending(ctx)
	if err != nil {
		return fmt.Errorf("check migrations: %w", err)
	}
	if pending {
		return ErrNotMigrated
	}
	return nil
}

func versions(results []*goose.MigrationResult) []int64 {
	out := make([]int64, 0, len(results))
	for _, r := range results {
		if r != nil && r.Source != nil {
			out = append(out, r.Source.Version)
		}
	}
	return out
}
