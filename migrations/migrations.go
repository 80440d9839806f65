// Package migrations holds Relay's schema as goose SQL files, embedded so
// that the relay binary can apply them, and the functions that do.
//
// The same files work with the stock goose command, given Relay's version
// table:
//
//	goose -table relay_migrations -dir migrations postgres "$DATABASE_URL" up
package migrations

import (
	"cmp"
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/relayq/relay/db"
)

// FS holds the migration files.
//
//go:embed *.sql
var FS embed.FS

// ErrNotMigrated reports a database whose schema is behind the migrations
// this build of Relay carries.
var ErrNotMigrated = errors.New("database schema is not up to date: run `relay migrate up`")

// VersionTable is the table Relay records its applied migrations in, in
// the first schema of the connection's search_path: goose's version table
// under a name of Relay's own, so that an application that keeps its own
// goose migrations in goose's default table, goose_db_version, in the same
// schema never has them read as Relay's, nor Relay's as its own.
const VersionTable = "relay_migrations"

// legacyVersionTable is goose's default version table, where builds of
// Relay before VersionTable recorded their migrations, and legacyNewest
// the newest migration those builds carried: a version above it in that
// table is never Relay's.
const (
	legacyVersionTable       = goose.DefaultTablename
	legacyNewest       int64 = 16
)

// Migrator applies and inspects the embedded migrations on one database.
type Migrator struct {
	db       *sql.DB
	pool     *pgxpool.Pool
	queries  *db.Queries
	provider *goose.Provider
	// store reads and writes VersionTable for Inspect, which neither
	// creates it nor waits for the migration lock, as the provider would,
	// and for Adopt; legacy reads legacyVersionTable.
	store, legacy database.Store

	// Logger, if not nil, is told when the Migrator has waited
	// LockWaitNotice for the migration lock that another run holds, and
	// again every LockWaitRepeat while it still waits, so that a run
	// waiting up to 15 minutes for another says so.
	Logger *slog.Logger
}

// LockWaitNotice is how long a Migrator waits for the migration lock
// before it tells its Logger, and LockWaitRepeat how often it tells it
// again.
const (
	LockWaitNotice = 2 * time.Second
	LockWaitRepeat = 15 * time.Second
)

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
// the lock for up to lockWaitLimit, trying every lockTry. While it holds
// the lock, a migrator renews that lease on a connection of its own,
// opened with the pool's configuration beside the pool's connections, so
// that a migration that runs long on a pool of one connection does not let
// the lease run out (see lockDB).
func NewMigrator(pool *pgxpool.Pool) (*Migrator, error) {
	store, err := database.NewStore(database.DialectPostgres, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("open the version table %s: %w", VersionTable, err)
	}
	legacy, err := database.NewStore(database.DialectPostgres, legacyVersionTable)
	if err != nil {
		return nil, fmt.Errorf("open the version table %s: %w", legacyVersionTable, err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	// The provider takes no lock of its own: the Migrator holds the lock
	// around it (see locked), so that what an earlier build recorded is
	// adopted under the same hold as the migrations are applied.
	provider, err := goose.NewProvider(goose.DialectCustom, sqlDB, FS, goose.WithStore(store))
	if err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return &Migrator{db: sqlDB, pool: pool, queries: db.New(pool), provider: provider, store: store, legacy: legacy}, nil
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
	var results []*goose.MigrationResult
	_, err := m.locked(ctx, func() (err error) {
		results, err = m.provider.Up(ctx)
		return err
	})
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
	var results []*goose.MigrationResult
	_, err := m.locked(ctx, func() (err error) {
		results, err = m.provider.UpTo(ctx, version)
		return err
	})
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
	var results []*goose.MigrationResult
	_, err = m.locked(ctx, func() (err error) {
		results, err = m.provider.DownTo(ctx, version)
		return err
	})
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
	var result *goose.MigrationResult
	_, err = m.locked(ctx, func() (err error) {
		result, err = m.provider.Down(ctx)
		return err
	})
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

// applied returns the versions Relay's migrations are recorded as applied:
// those VersionTable records or, where it records none, those an earlier
// build recorded in legacyVersionTable (see Adopt).
func (m *Migrator) applied(ctx context.Context) (map[int64]bool, error) {
	applied, err := m.recorded(ctx, m.store)
	if err != nil || len(applied) > 0 {
		return applied, err
	}
	earlier, err := m.legacyVersions(ctx)
	if err != nil {
		return nil, err
	}
	for _, v := range earlier {
		applied[v] = true
	}
	return applied, nil
}

// recorded returns the versions a goose version table records as applied,
// none if the table does not exist: every version with a row, as the goose
// Provider that applies and rolls back Relay's migrations reads the table
// (a roll-back deletes the version's row). Version 0 is the row goose
// writes when it creates the table, not a migration.
func (m *Migrator) recorded(ctx context.Context, store database.Store) (map[int64]bool, error) {
	conn, err := m.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	found, err := tableExists(ctx, store, conn)
	if err != nil {
		return nil, err
	}
	applied := map[int64]bool{}
	if !found {
		return applied, nil
	}
	rows, err := store.ListMigrations(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("read the version table %s: %w", store.Tablename(), err)
	}
	for _, r := range rows {
		if r.Version != 0 {
			applied[r.Version] = true
		}
	}
	return applied, nil
}

// tableExists reports whether store's version table exists in the first
// schema of the connection's search_path.
func tableExists(ctx context.Context, store database.Store, conn database.DBTxConn) (bool, error) {
	exists, ok := store.(interface {
		TableExists(context.Context, database.DBTxConn) (bool, error)
	})
	if !ok {
		return false, errors.New("goose's store cannot tell whether its version table exists")
	}
	found, err := exists.TableExists(ctx, conn)
	if err != nil {
		return false, fmt.Errorf("look for the version table %s: %w", store.Tablename(), err)
	}
	return found, nil
}

// ErrUnclearHistory reports a database whose goose_db_version records
// versions that cannot be told to be Relay's or another program's, though
// the database holds Relay's tables.
var ErrUnclearHistory = errors.New("cannot tell which of the migrations goose_db_version records are Relay's")

// earlierBuilds returns the migrations an earlier build of Relay recorded
// in legacyVersionTable, in order: none where VersionTable records any, or
// where legacyVersionTable records none of Relay's versions, or where the
// schema that holds it, the first of the search_path, does not hold
// Relay's first table (the versions are then another program's). Relay's
// versions there are the run from 1 up to legacyNewest that goose applied
// in order, and the schema holds the tables and view they created;
// anything else, beside Relay's tables, is ErrUnclearHistory.
func (m *Migrator) earlierBuilds(ctx context.Context) ([]int64, error) {
	own, err := m.recorded(ctx, m.store)
	if err != nil || len(own) > 0 {
		return nil, err
	}
	return m.legacyVersions(ctx)
}

// legacyVersions returns Relay's migrations that legacyVersionTable
// records, as earlierBuilds does, whatever VersionTable records.
func (m *Migrator) legacyVersions(ctx context.Context) ([]int64, error) {
	recorded, err := m.recorded(ctx, m.legacy)
	if err != nil {
		return nil, err
	}
	var versions []int64
	for v := range recorded {
		if v <= legacyNewest {
			versions = append(versions, v)
		}
	}
	if len(versions) == 0 {
		return nil, nil
	}
	slices.Sort(versions)
	found, err := m.queries.RelayTablesFound(ctx)
	if err != nil {
		return nil, fmt.Errorf("look for Relay's tables: %w", err)
	}
	if !found.Jobs {
		return nil, nil
	}
	newest := versions[len(versions)-1]
	unlike := ""
	switch {
	case versions[0] != 1 || newest != int64(len(versions)):
		unlike = "they are not a run from 1, as goose applies Relay's migrations"
	case newest >= 2 && !found.Workers:
		unlike = "migration 2's table workers is missing"
	case newest >= 3 && !found.WorkerSessions:
		unlike = "migration 3's table worker_sessions is missing"
	case newest >= 5 && !found.JobSummaries:
		unlike = "migration 5's view job_summaries is missing"
	}
	if unlike != "" {
		return nil, fmt.Errorf("%w: the database holds a table jobs and %s records versions %v of 1 to %d, but %s; "+
			"insert the versions of the Relay migrations this database holds into %s (version_id, is_applied), which relay migrate reads first, "+
			"creating it where it does not exist as `goose -table %s postgres \"$DATABASE_URL\" version` does",
			ErrUnclearHistory, legacyVersionTable, versions, legacyNewest, unlike, VersionTable, VersionTable)
	}
	return versions, nil
}

// Adopt records in VersionTable the migrations an earlier build of Relay
// recorded in goose's default table, goose_db_version, and returns them:
// none when VersionTable already records a migration, or when
// goose_db_version holds none of Relay's (see earlierBuilds). It runs under
// the migration lock, in one transaction, and leaves goose_db_version as it
// was, for an application that shares it and for an earlier build still
// running. Up, UpTo, Down and DownTo adopt first, under the same hold of
// the lock as they migrate; Inspect reads what Adopt would record without
// writing it.
func (m *Migrator) Adopt(ctx context.Context) ([]int64, error) {
	versions, err := m.earlierBuilds(ctx)
	if err != nil || len(versions) == 0 {
		return nil, err
	}
	// Another migrator may have adopted them while this one waited.
	return m.locked(ctx, nil)
}

// locked takes the migration lock, records what an earlier build recorded
// (see Adopt), runs f, if any, under the same hold, and releases the lock;
// it returns the versions it adopted. An earlier build migrating at once,
// which takes the same lock but records in goose_db_version, has then
// either recorded every migration it applied before f reads VersionTable,
// or waits for f to finish. Each hold has a locker of its own, and so the
// whole of lockWaitLimit to wait: goose's locker counts its tries over its
// whole life.
func (m *Migrator) locked(ctx context.Context, f func() error) ([]int64, error) {
	locker, err := lock.NewPostgresTableLocker(lock.WithTableLockTimeout(lockTry, uint64(lockWaitLimit/lockTry)))
	if err != nil {
		return nil, fmt.Errorf("make the migration lock: %w", err)
	}
	lockDB, closeLockDB, err := m.lockDB()
	if err != nil {
		return nil, err
	}
	defer closeLockDB()
	taken := make(chan struct{})
	waited := make(chan struct{})
	go func() {
		defer close(waited)
		m.noticeLockWait(ctx, taken)
	}()
	err = locker.Lock(ctx, lockDB)
	close(taken)
	<-waited
	if err != nil {
		return nil, fmt.Errorf("take the migration lock: %w", err)
	}
	defer locker.Unlock(context.WithoutCancel(ctx), lockDB) //nolint:errcheck // the lock's lease ends on its own
	adopted, err := m.adopted(ctx)
	if err != nil || f == nil {
		return adopted, err
	}
	return adopted, f()
}

// noticeLockWait tells m.Logger, after LockWaitNotice and then every
// LockWaitRepeat until taken is closed or ctx ends, that the migrator is
// still waiting for the lock.
func (m *Migrator) noticeLockWait(ctx context.Context, taken <-chan struct{}) {
	if m.Logger == nil {
		return
	}
	start := time.Now()
	timer := time.NewTimer(LockWaitNotice)
	defer timer.Stop()
	for {
		select {
		case <-taken:
			return
		case <-ctx.Done():
			return
		case <-timer.C:
			timer.Reset(LockWaitRepeat)
			m.Logger.InfoContext(ctx, "waiting for the migration lock, which another run holds, or one that died until its lease runs out",
				"waited", time.Since(start).Round(time.Second), "gives_up_after", lockWaitLimit)
		}
	}
}

// lockDB returns the handle the migration lock is taken, renewed and
// released through, on a pool of one connection of its own, made with
// m.pool's configuration, and the function that closes it. goose's
// Provider holds one of m.pool's connections for the whole of a run, and
// the lock's heartbeat, which renews its lease every 5 s, would wait for
// one of them: on a pool of one connection (pool_max_conns=1), for as long
// as the run, and a migration that took longer than the lease, 30 s, would
// let another migrator take the lock and apply it beside this one.
func (m *Migrator) lockDB() (*sql.DB, func(), error) {
	cfg := m.pool.Config()
	cfg.MaxConns, cfg.MinConns, cfg.MinIdleConns = 1, 0, 0
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("open a connection for the migration lock: %w", err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	return sqlDB, func() {
		sqlDB.Close()
		pool.Close()
	}, nil
}

// adopted records in VersionTable what an earlier build recorded, as Adopt
// does, and returns it; the caller holds the migration lock.
func (m *Migrator) adopted(ctx context.Context) ([]int64, error) {
	versions, err := m.earlierBuilds(ctx)
	if err != nil || len(versions) == 0 {
		return nil, err
	}
	if err := m.record(ctx, versions); err != nil {
		return nil, fmt.Errorf("record migrations %v of %s in %s: %w", versions, legacyVersionTable, VersionTable, err)
	}
	return versions, nil
}

// record writes versions to VersionTable in one transaction, creating the
// table first, with goose's version-0 row, where it does not exist.
func (m *Migrator) record(ctx context.Context, versions []int64) (err error) {
	exists, err := tableExists(ctx, m.store, m.db)
	if err != nil {
		return err
	}
	tx, err := m.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tx.Rollback() //nolint:errcheck // the error that made it roll back is returned
		}
	}()
	if !exists {
		if err := m.store.CreateVersionTable(ctx, tx); err != nil {
			return err
		}
		if err := m.store.Insert(ctx, tx, database.InsertRequest{Version: 0}); err != nil {
			return err
		}
	}
	for _, v := range versions {
		if err := m.store.Insert(ctx, tx, database.InsertRequest{Version: v}); err != nil {
			return err
		}
	}
	return tx.Commit()
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
