package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/migrations"
)

// migrateFlags are the flags of relay migrate.
type migrateFlags struct {
	logs cli.LogFlags
	db   cli.DBFlags
}

// newMigrateFlagSet returns the flag set of relay migrate, which parses
// into f.
func newMigrateFlagSet(f *migrateFlags) *cli.FlagSet {
	fs := cli.NewFlagSet("migrate", "relay migrate [up|down|status] [flags]",
		`Applies Relay's schema migrations, embedded in the binary:
  up      apply every pending migration (the default)
  down    roll back the most recent migration
  status  list the migrations and whether each is applied`)
	f.logs.Register(fs)
	f.db.Register(fs)
	return fs
}

func runMigrate(ctx context.Context, env *environment, args []string) error {
	var f migrateFlags
	fs := newMigrateFlagSet(&f)
	pos, err := fs.Parse(args, env.stderr)
	if err != nil {
		return cli.Helped(err)
	}
	action := "up"
	switch len(pos) {
	case 0:
	case 1:
		action = pos[0]
	default:
		return cli.Usagef("migrate: want one of up, down or status, got %q", pos)
	}
	if action != "up" && action != "down" && action != "status" {
		return cli.Usagef("migrate: unknown action %q: want up, down or status", action)
	}
	logger, err := f.logs.Logger(env.stderr)
	if err != nil {
		return err
	}
	dsn, err := f.db.Resolve(env.getenv)
	if err != nil {
		return err
	}
	pool, err := connect(ctx, logger, dsn, "relay migrate", 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := migrations.NewMigrator(pool)
	if err != nil {
		return err
	}
	defer m.Close()
	m.Logger = logger

	if action != "status" {
		adopted, err := m.Adopt(ctx)
		if err != nil {
			return err
		}
		if len(adopted) > 0 {
			fmt.Fprintf(env.stdout, "recorded migrations %d to %d, which an earlier relay recorded in goose_db_version, in %s\n",
				adopted[0], adopted[len(adopted)-1], migrations.VersionTable)
		}
	}
	switch action {
	case "up":
		applied, err := m.Up(ctx)
		if err != nil {
			return err
		}
		if len(applied) == 0 {
			return printUpToDate(ctx, env, m)
		}
		return printVersions(ctx, env, m, "applied", applied)
	case "down":
		undone, err := m.Down(ctx)
		if err != nil {
			return err
		}
		if len(undone) == 0 {
			if _, err := fmt.Fprintln(env.stdout, "no migration to roll back"); err != nil {
				return fmt.Errorf("print the outcome: %w", err)
			}
			return nil
		}
		return printVersions(ctx, env, m, "rolled back", undone)
	default:
		statuses, err := m.Status(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(env.stdout, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "VERSION\tSTATE\tMIGRATION")
		for _, s := range statuses {
			state := "pending"
			if s.Applied {
				state = "applied"
			}
			source := s.Source
			if source == "" {
				source = "(not in this build: applied by a newer relay)"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\n", s.Version, state, source)
		}
		return tw.Flush()
	}
}

// printUpToDate says that up had nothing to apply, and whether the
// database is ahead of this build.
func printUpToDate(ctx context.Context, env *environment, m *migrations.Migrator) error {
	s, err := m.Inspect(ctx)
	if err != nil {
		return err
	}
	msg := "no migrations to apply: the database is up to date"
	if ahead := s.Ahead(); ahead != "" {
		msg = "no migrations to apply: the database also holds " + ahead
	}
	if _, err := fmt.Fprintln(env.stdout, msg); err != nil {
		return fmt.Errorf("print the outcome: %w", err)
	}
	return nil
}

// printVersions prints one line per migration version, with its file
// name. The migrations are done: an error says so.
func printVersions(ctx context.Context, env *environment, m *migrations.Migrator, verb string, versions []int64) error {
	done := fmt.Sprintf("%s migration %d", verb, versions[0])
	if len(versions) > 1 {
		done = fmt.Sprintf("%s migrations %d to %d", verb, versions[0], versions[len(versions)-1])
	}
	statuses, err := m.Status(ctx)
	if err != nil {
		return fmt.Errorf("%s, but listing the migrations failed: %w", done, err)
	}
	source := make(map[int64]string, len(statuses))
	for _, s := range statuses {
		source[s.Version] = s.Source
	}
	for _, v := range versions {
		if _, err := fmt.Fprintf(env.stdout, "%s migration %d %s\n", verb, v, source[v]); err != nil {
			return fmt.Errorf("%s, but printing it failed: %w", done, err)
		}
	}
	return nil
}
