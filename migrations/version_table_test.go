package migrations_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/database"
	"github.com/pressly/goose/v3/lock"

	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/migrations"
)

// newest is the newest migration this build carries.
var newest = func() int64 {
	entries, err := migrations.FS.ReadDir(".")
	if err != nil {
		panic(err)
	}
	return int64(len(entries))
}()

// earlierNewest is the newest migration that the earlier builds of Relay,
// which recorded their migrations in goose_db_version, carried.
const earlierNewest int64 = 16

// run returns the versions from from to to, in order.
func run(from, to int64) []int64 {
	var out []int64
	for v := from; v <= to; v++ {
		out = append(out, v)
	}
	return out
}

// emptySchema returns a pool whose search_path is a new, empty schema of
// a fresh database, closed when the test ends: what Relay creates there is
// all the schema holds.
func emptySchema(t *testing.T) *pgxpool.Pool {
	t.Helper()
	url := dbtest.NewURL(t)
	exec(t, dbtest.Connect(t, url), "CREATE SCHEMA app")
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.RuntimeParams["search_path"] = "app"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// migrateAsEarlierBuild applies Relay's migrations up to version as builds
// before relay_migrations did: goose's Provider over goose's default
// version table, goose_db_version.
func migrateAsEarlierBuild(t *testing.T, pool *pgxpool.Pool, version int64) {
	t.Helper()
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations.FS)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(t.Context(), version); err != nil {
		t.Fatalf("migrate up to %d as an earlier build: %v", version, err)
	}
}

// versionsIn returns the versions a goose version table records, in order
// of its rows, without goose's version 0; nil if the table does not exist.
func versionsIn(t *testing.T, pool *pgxpool.Pool, table string) []int64 {
	t.Helper()
	var exists bool
	if err := pool.QueryRow(t.Context(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if !exists {
		return nil
	}
	rows, err := pool.Query(t.Context(), "SELECT version_id FROM "+pgx.Identifier{table}.Sanitize()+" WHERE version_id <> 0 ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return versions
}

// TestMigrations_RecordInATableOfRelaysOwn migrates an empty schema: the
// versions go to relay_migrations, and goose's default table is not made.
func TestMigrations_RecordInATableOfRelaysOwn(t *testing.T) {
	t.Parallel()
	pool := emptySchema(t)
	applied, err := migrations.Up(t.Context(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(run(1, newest), applied); diff != "" {
		t.Errorf("applied (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(run(1, newest), versionsIn(t, pool, migrations.VersionTable)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", migrations.VersionTable, diff)
	}
	if got := versionsIn(t, pool, "goose_db_version"); got != nil {
		t.Errorf("goose_db_version records %v, want no such table", got)
	}
}

// TestMigrations_LeaveAnApplicationsGooseHistoryAlone migrates a schema
// where an application keeps its own goose migrations in goose's default
// table, with version numbers that overlap Relay's, run past them, or are
// goose's timestamps. Every Relay migration is applied, as in an empty
// schema, and the application's history is left as it was.
func TestMigrations_LeaveAnApplicationsGooseHistoryAlone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		versions []int64
	}{
		{"the first three", run(1, 3)},
		{"as many as Relay's and more", run(1, newest+4)},
		{"timestamps", []int64{20250101120000, 20250102120000}},
		{"one Relay also numbers, alone", []int64{5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pool := emptySchema(t)
			exec(t, pool, `CREATE TABLE goose_db_version (
				id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now());
				INSERT INTO goose_db_version (version_id, is_applied) VALUES (0, true);
				CREATE TABLE accounts (id bigint PRIMARY KEY)`)
			for _, v := range tc.versions {
				exec(t, pool, fmt.Sprintf("INSERT INTO goose_db_version (version_id, is_applied) VALUES (%d, true)", v))
			}
			m, err := migrations.NewMigrator(pool)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			before, err := m.Inspect(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(run(1, newest), before.Pending); diff != "" {
				t.Errorf("pending before up (-want +got):\n%s", diff)
			}
			applied, err := m.Up(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(run(1, newest), applied); diff != "" {
				t.Errorf("applied (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.versions, versionsIn(t, pool, "goose_db_version")); diff != "" {
				t.Errorf("the application's goose_db_version after up (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMigrations_TakeOverWhatAnEarlierBuildRecorded migrates a schema an
// earlier build of Relay migrated, and recorded in goose_db_version, up to
// a version, with a job in it. Before anything is written, Inspect reads
// the earlier build's versions as applied; up then records them in
// relay_migrations, applies only the rest, leaves goose_db_version as it
// was and the job where it was, and down rolls back from the newest.
func TestMigrations_TakeOverWhatAnEarlierBuildRecorded(t *testing.T) {
	t.Parallel()
	for _, version := range []int64{1, 3, 12, earlierNewest} {
		t.Run(fmt.Sprint(version), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := emptySchema(t)
			migrateAsEarlierBuild(t, pool, version)
			exec(t, pool, "INSERT INTO jobs (kind) VALUES ('kept')")
			m, err := migrations.NewMigrator(pool)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()

			s, err := m.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(run(1, version), s.Applied); diff != "" {
				t.Errorf("applied before up (-want +got):\n%s", diff)
			}
			if got := versionsIn(t, pool, migrations.VersionTable); got != nil {
				t.Errorf("Inspect made %s, recording %v", migrations.VersionTable, got)
			}

			applied, err := m.Up(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(run(version+1, newest), applied, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("applied by up (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(run(1, newest), versionsIn(t, pool, migrations.VersionTable)); diff != "" {
				t.Errorf("%s after up (-want +got):\n%s", migrations.VersionTable, diff)
			}
			if diff := cmp.Diff(run(1, version), versionsIn(t, pool, "goose_db_version")); diff != "" {
				t.Errorf("goose_db_version after up (-want +got):\n%s", diff)
			}
			if got := one(t, pool, "SELECT string_agg(kind, ',') FROM jobs"); got != "kept" {
				t.Errorf("jobs after up: %q, want kept", got)
			}
			undone, err := m.Down(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]int64{newest}, undone); diff != "" {
				t.Errorf("rolled back by down (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMigrations_TakeOverIntoAnEmptyVersionTable migrates a schema an
// earlier build migrated in full, where relay_migrations already exists
// and records nothing, as the stock goose command leaves it when it is
// given -table relay_migrations and fails on the first migration: up
// records the earlier build's versions there and applies only those the
// earlier build did not carry.
func TestMigrations_TakeOverIntoAnEmptyVersionTable(t *testing.T) {
	t.Parallel()
	pool := emptySchema(t)
	migrateAsEarlierBuild(t, pool, earlierNewest)
	exec(t, pool, `CREATE TABLE relay_migrations (
		id serial PRIMARY KEY, version_id bigint NOT NULL, is_applied boolean NOT NULL, tstamp timestamp DEFAULT now());
		INSERT INTO relay_migrations (version_id, is_applied) VALUES (0, true)`)
	applied, err := migrations.Up(t.Context(), pool)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(run(earlierNewest+1, newest), applied, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("applied by up (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(run(1, newest), versionsIn(t, pool, migrations.VersionTable)); diff != "" {
		t.Errorf("%s after up (-want +got):\n%s", migrations.VersionTable, diff)
	}
}

// TestMigrations_RefuseAnEarlierHistoryThatIsNotClearlyRelays migrates
// schemas that hold Relay's table jobs while goose_db_version records
// versions that do not match what Relay's migrations make. Up, down and
// Inspect each refuse with ErrUnclearHistory, and write nothing.
func TestMigrations_RefuseAnEarlierHistoryThatIsNotClearlyRelays(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		damage string
	}{
		{"a version missing from the run", "DELETE FROM goose_db_version WHERE version_id = 2"},
		{"the run not from 1", "DELETE FROM goose_db_version WHERE version_id = 1"},
		{"a table of a recorded migration missing", "DROP TABLE worker_sessions CASCADE"},
		{"a view of a recorded migration missing", "DROP VIEW job_summaries"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			pool := emptySchema(t)
			migrateAsEarlierBuild(t, pool, 6)
			exec(t, pool, tc.damage)
			recorded := versionsIn(t, pool, "goose_db_version")
			m, err := migrations.NewMigrator(pool)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			steps := map[string]func() error{
				"inspect": func() error { _, err := m.Inspect(ctx); return err },
				"up":      func() error { _, err := m.Up(ctx); return err },
				"down":    func() error { _, err := m.Down(ctx); return err },
			}
			for name, step := range steps {
				if err := step(); !errors.Is(err, migrations.ErrUnclearHistory) {
					t.Errorf("%s: error = %v, want %v", name, err, migrations.ErrUnclearHistory)
				}
			}
			if got := versionsIn(t, pool, migrations.VersionTable); got != nil {
				t.Errorf("%s was made, recording %v", migrations.VersionTable, got)
			}
			if diff := cmp.Diff(recorded, versionsIn(t, pool, "goose_db_version")); diff != "" {
				t.Errorf("goose_db_version (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMigrations_MigratorsAtOnceTakeOverAnEarlierHistoryOnce runs three
// migrators, each with a pool of its own, at once against a schema an
// earlier build migrated up to 10. Every one succeeds, relay_migrations
// records each version once, and each remaining migration is applied
// once.
func TestMigrations_MigratorsAtOnceTakeOverAnEarlierHistoryOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	first := emptySchema(t)
	migrateAsEarlierBuild(t, first, 10)
	const migrators = 3
	applied := make([][]int64, migrators)
	errs := make([]error, migrators)
	var wg sync.WaitGroup
	for i := range migrators {
		pool, err := pgxpool.NewWithConfig(ctx, first.Config())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		wg.Go(func() { applied[i], errs[i] = migrations.Up(ctx, pool) })
	}
	wg.Wait()
	var all []int64
	for i := range migrators {
		if errs[i] != nil {
			t.Errorf("migrator %d: %v", i, errs[i])
		}
		all = append(all, applied[i]...)
	}
	slices.Sort(all)
	if diff := cmp.Diff(run(11, newest), all); diff != "" {
		t.Errorf("migrations applied, by all migrators (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(run(1, newest), versionsIn(t, first, migrations.VersionTable)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", migrations.VersionTable, diff)
	}
}

// TestMigrations_WaitForAnEarlierBuildMigratingAtOnce migrates an empty
// schema while an earlier build, holding the migration lock, migrates it
// into goose_db_version: up waits for the lock, then records the earlier
// build's versions and applies only those it did not carry, rather than
// applying Relay's first migration again over the tables the earlier
// build made.
func TestMigrations_WaitForAnEarlierBuildMigratingAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pool := emptySchema(t)
	earlier, err := lock.NewPostgresTableLocker()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	if err := earlier.Lock(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		applied []int64
		err     error
	}
	done := make(chan outcome, 1)
	go func() {
		applied, err := migrations.Up(ctx, pool)
		done <- outcome{applied, err}
	}()
	select {
	case o := <-done:
		t.Fatalf("up returned while another migrator held the lock: %v, %v", o.applied, o.err)
	case <-time.After(2 * time.Second):
	}
	migrateAsEarlierBuild(t, pool, earlierNewest)
	if err := earlier.Unlock(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}
	o := <-done
	if o.err != nil {
		t.Fatalf("up: %v", o.err)
	}
	if diff := cmp.Diff(run(earlierNewest+1, newest), o.applied, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("applied by up (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(run(1, newest), versionsIn(t, pool, migrations.VersionTable)); diff != "" {
		t.Errorf("%s after up (-want +got):\n%s", migrations.VersionTable, diff)
	}
}

// TestMigrations_RefusalSaysHowToMakeTheVersionTable refuses an earlier
// history that is not clearly Relay's, in a schema where relay_migrations
// does not exist, as the refusal leaves it: the error says how to create
// the table its remedy inserts into, and once that is done as it says and
// the versions inserted, up applies the rest.
func TestMigrations_RefusalSaysHowToMakeTheVersionTable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := emptySchema(t)
	migrateAsEarlierBuild(t, pool, 6)
	exec(t, pool, "DELETE FROM goose_db_version WHERE version_id = 2")
	_, err := migrations.Up(ctx, pool)
	if !errors.Is(err, migrations.ErrUnclearHistory) {
		t.Fatalf("up: error = %v, want %v", err, migrations.ErrUnclearHistory)
	}
	const create = "goose -table relay_migrations postgres \"$DATABASE_URL\" version"
	if !strings.Contains(err.Error(), create) {
		t.Fatalf("up: error %q does not say how to create %s: %s", err, migrations.VersionTable, create)
	}
	// What that goose command does: goose's version table, with its
	// version-0 row.
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	store, err := database.NewStore(database.DialectPostgres, migrations.VersionTable)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.CreateVersionTable(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}
	if err := store.Insert(ctx, sqlDB, database.InsertRequest{Version: 0}); err != nil {
		t.Fatal(err)
	}
	exec(t, pool, "INSERT INTO relay_migrations (version_id, is_applied) SELECT v, true FROM generate_series(1, 6) AS v")
	applied, err := migrations.Up(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(run(7, newest), applied); diff != "" {
		t.Errorf("applied by up (-want +got):\n%s", diff)
	}
}

// TestMigrations_LookForRelaysTablesBesideTheVersionTable migrates a
// schema first on a search_path whose next schema holds Relay's tables: an
// earlier build migrated it and this build rolled every migration back,
// leaving goose_db_version recording them all. The tables of the other
// schema are not taken for this one's: nothing is applied, and up applies
// every migration here.
func TestMigrations_LookForRelaysTablesBesideTheVersionTable(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	url := dbtest.NewURL(t) // Relay's tables in public
	exec(t, dbtest.Connect(t, url), "CREATE SCHEMA app")
	onPath := func(path string) *pgxpool.Pool {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		cfg.ConnConfig.RuntimeParams["search_path"] = path
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	app := onPath("app")
	migrateAsEarlierBuild(t, app, earlierNewest)
	m, err := migrations.NewMigrator(app)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if _, err := m.DownTo(ctx, 0); err != nil {
		t.Fatal(err)
	}

	both := onPath("app, public")
	s, err := migrations.Up(ctx, both)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(run(1, newest), s); diff != "" {
		t.Errorf("applied by up (-want +got):\n%s", diff)
	}
	if got := one(t, app, "SELECT (to_regclass('app.jobs') IS NOT NULL)::text"); got != "true" {
		t.Errorf("app.jobs exists: %s, want true", got)
	}
}

// TestMigrator_SaysSoWhileItWaitsForTheLockAnotherRunHolds holds the
// migration lock as another run would while a migrator runs up with a
// Logger: once it has waited LockWaitNotice it says so, and once the lock
// is released it migrates.
func TestMigrator_SaysSoWhileItWaitsForTheLockAnotherRunHolds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	pool := emptySchema(t)
	other, err := lock.NewPostgresTableLocker()
	if err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	if err := other.Lock(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var logs lockedBuffer
	m.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	done := make(chan error, 1)
	go func() {
		_, err := m.Up(ctx)
		done <- err
	}()
	const notice = `msg="waiting for the migration lock`
	waitFor := migrations.LockWaitNotice + 5*time.Second
	for deadline := time.Now().Add(waitFor); !strings.Contains(logs.String(), notice); {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for the lock and never said so; logs:\n%s", waitFor, logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := other.Unlock(ctx, sqlDB); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("up, once the lock was released: %v", err)
	}
}

// lockedBuffer is a bytes.Buffer that a logger writes to from another
// goroutine while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
