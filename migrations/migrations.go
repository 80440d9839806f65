// Package migrations holds Relay's schema as goose SQL files, embedded so
// that the relay binary can apply them, and the functions that do.
//
// The same files work with the stock goose command:
//
//	goose -dir migrations postgres "$DATABASE_URL" up
package migrations

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
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
	// store reads goose's version table for Inspect, which neither
	// creates it nor waits for the migration lock, as the provider would.
	store database.Store
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
	store, err := database.NewStore(database.DialectPostgres, goose.DefaultTablename)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open goose's version table: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectCustom, db, FS, goose.WithStore(store), goose.WithLocker(locker))
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return &Migrator{db: db, provider: provider, store: store}, nil
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
// returns the versions rolled back: none, creating nothing, when no
// migration is applied (see Down).
func (m *Migrator) DownTo(ctx context.Context, version int64) ([]int64, error) {
	s, err := m.refuseUnknownAbove(ctx, version)
	if err != nil {
		return nil, fmt.Errorf("migrate down to %d: %w", version, err)
	}
	if len(s.Applied) == 0 {
		return nil, nil
	}
	results, err := m.provider.DownTo(ctx, version)
	if err != nil {
		return nil, fmt.Errorf("migrate down to %d: %w", version, err)
	}
	return versions(results), nil
}

// Down rolls back the most recent migration and returns its version, or
// nothing when no migration is applied. Like Status, it then creates
// nothing: goose would first create its version and lock tables, in a
// database that may not be Relay's at all.
func (m *Migrator) Down(ctx context.Context) ([]int64, error) {
	s, err := m.refuseUnknownAbove(ctx, 0)
	if err != nil {
		return nil, fmt.Errorf("migrate down: %w", err)
	}
	if len(s.Applied) == 0 {
		return nil, nil
	}
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
	// Source is the migration's file, or empty for a version the
	// database records that this build does not carry.
	Source  string
	Applied bool
}

// Status lists every migration this build carries with whether it is
// applied, then any the database records that this build does not carry
// (applied by a newer build), in order of version. Like Inspect, it creates
// nothing and does not wait for a migration under way.
func (m *Migrator) Status(ctx context.Context) ([]Status, error) {
	s, err := m.Inspect(ctx)
	if err != nil {
		return nil, fmt.Errorf("migration status: %w", err)
	}
	out := make([]Status, 0, len(m.provider.ListSources())+len(s.Unknown))
	for _, src := range m.provider.ListSources() {
		out = append(out, Status{Version: src.Version, Source: src.Path, Applied: !slices.Contains(s.Pending, src.Version)})
	}
	for _, v := range s.Unknown {
		out = append(out, Status{Version: v, Applied: true})
	}
	slices.SortFunc(out, func(a, b Status) int { return cmp.Compare(a.Version, b.Version) })
	return out, nil
}

// Schema is what a database records of its migrations, beside those this
// build carries.
type Schema struct {
	// Applied are the versions the database records as applied, in order.
	Applied []int64
	// Pending are the versions this build carries that are not applied.
	Pending []int64
	// Unknown are the applied versions this build does not carry: a newer
	// build of Relay applied them.
	Unknown []int64
	// Newest is the newest version this build carries.
	Newest int64
}

// Inspect reads which migrations the database records as applied. It only
// reads: on a database never migrated it creates no table, and it does not
// wait while another process holds the migration lock, so it sees the
// versions a migration under way has recorded so far.
func (m *Migrator) Inspect(ctx context.Context) (Schema, error) {
	var s Schema
	sources := m.provider.ListSources()
	if len(sources) > 0 {
		s.Newest = sources[len(sources)-1].Version
	}
	applied, err := m.applied(ctx)
	if err != nil {
		return Schema{}, err
	}
	carried := make(map[int64]bool, len(sources))
	for _, src := range sources {
		carried[src.Version] = true
		if !applied[src.Version] {
			s.Pending = append(s.Pending, src.Version)
		}
	}
	for v := range applied {
		s.Applied = append(s.Applied, v)
		if !carried[v] {
			s.Unknown = append(s.Unknown, v)
		}
	}
	slices.Sort(s.Applied)
	slices.Sort(s.Unknown)
	return s, nil
}

// applied returns the versions goose's version table records as applied,
// none if the table does not exist: every version with a row, as the goose
// Provider that applies and rolls back Relay's migrations reads the table
// (a roll-back deletes the version's row). Version 0 is the row goose
// writes when it creates the table, not a migration.
func (m *Migrator) applied(ctx context.Context) (map[int64]bool, error) {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	exists, ok := m.store.(interface {
		TableExists(context.Context, database.DBTxConn) (bool, error)
	})
	if !ok {
		return nil, errors.New("goose's store cannot tell whether its version table exists")
	}
	found, err := exists.TableExists(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("look for the version table %s: %w", m.store.Tablename(), err)
	}
	applied := map[int64]bool{}
	if !found {
		return applied, nil
	}
	rows, err := m.store.ListMigrations(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("read the version table %s: %w", m.store.Tablename(), err)
	}
	for _, r := range rows {
		if r.Version != 0 {
			applied[r.Version] = true
		}
	}
	return applied, nil
}

// CheckCurrent returns ErrNotMigrated if any migration this build carries
// is pending. A database that also holds migrations of a newer build
// passes; Inspect tells them. It creates nothing and does not wait for a
// migration under way.
func (m *Migrator) CheckCurrent(ctx context.Context) error {
	s, err := m.Inspect(ctx)
	if err != nil {
		return fmt.Errorf("check migrations: %w", err)
	}
	if len(s.Pending) > 0 {
		return ErrNotMigrated
	}
	return nil
}

// ErrUnknownMigration reports a roll-back that would have to undo a
// migration this build does not carry.
var ErrUnknownMigration = errors.New("the database holds a migration this build of Relay does not carry")

// refuseUnknownAbove returns ErrUnknownMigration, naming the versions, if
// the database holds a migration after version that this build does not
// carry: only the build that applied it knows how to roll it back, and
// otherwise returns what Inspect read. It reads before the roll-back takes
// the migration lock: a newer build's migration recorded in between makes
// the roll-back fail on goose's own "version not found" instead, having
// rolled back nothing.
func (m *Migrator) refuseUnknownAbove(ctx context.Context, version int64) (Schema, error) {
	s, err := m.Inspect(ctx)
	if err != nil {
		return Schema{}, err
	}
	var above []int64
	for _, v := range s.Unknown {
		if v > version {
			above = append(above, v)
		}
	}
	if len(above) == 0 {
		return s, nil
	}
	return Schema{}, fmt.Errorf("%w: %s; roll back with the build of relay that applied it",
		ErrUnknownMigration, newerThan(above, s.Newest))
}

// Ahead names the migrations the database holds that this build does not
// carry, as "migration 17, newer than this build's newest (16)", or
// returns "" when there are none.
func (s Schema) Ahead() string {
	if len(s.Unknown) == 0 {
		return ""
	}
	return newerThan(s.Unknown, s.Newest)
}

// newerThan names versions a build whose newest migration is newest does
// not carry.
func newerThan(versions []int64, newest int64) string {
	parts := make([]string, len(versions))
	for i, v := range versions {
		parts[i] = strconv.FormatInt(v, 10)
	}
	noun := "migration"
	if len(versions) > 1 {
		noun = "migrations"
	}
	return fmt.Sprintf("%s %s, newer than this build's newest (%d)", noun, strings.Join(parts, ", "), newest)
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
