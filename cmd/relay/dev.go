package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/internal/devdb"
	"github.com/relayq/relay/internal/pgurl"
	"github.com/relayq/relay/internal/shell"
	"github.com/relayq/relay/migrations"
)

// devSlots is how many worker slots `relay dev` runs by default.
const devSlots = 4

// devStopTimeout bounds removing the throwaway database at exit.
const devStopTimeout = 30 * time.Second

// newDevFlagSet returns the flag set of relay dev, which parses into opts.
func newDevFlagSet(opts *serveFlags) *cli.FlagSet {
	fs := cli.NewFlagSet("dev", "relay dev [flags]",
		`Runs a zero-configuration playground: the HTTP API with worker slots for the
built-in job kinds, on a database migrated to the current schema.

The database is --database-url or DATABASE_URL when given (it is migrated
up). Otherwise relay starts a throwaway PostgreSQL of its own: a temporary
cluster made with initdb and pg_ctl (found on PATH or in
/usr/lib/postgresql/*/bin or /usr/pgsql-*/bin), or failing that a container
through Docker. It is removed, with all its data, when relay stops (Ctrl-C,
SIGTERM, or SIGHUP when its terminal closes). The clusters that a relay
killed outright (with SIGKILL) left in the temporary directory are stopped
and removed when the next relay dev starts.

Without an API token (--api-token or RELAY_API_TOKEN) it listens only on a
loopback address, unless --insecure-no-auth is given.`)
	opts.register(fs, devSlots)
	return fs
}

func runDev(ctx context.Context, env *environment, args []string) (err error) {
	var opts serveFlags
	fs := newDevFlagSet(&opts)
	pos, err := fs.Parse(args, env.stderr)
	if err != nil {
		return cli.Helped(err)
	}
	if len(pos) > 0 {
		return cli.Usagef("dev: unexpected argument %q", pos[0])
	}
	logger, err := opts.logs.Logger(env.stderr)
	if err != nil {
		return err
	}
	if err := opts.resolve(ctx, env.getenv); err != nil {
		return err
	}

	dsn, _ := opts.db.Resolve(env.getenv)
	where := "the database at " + pgurl.Redact(dsn)
	throwaway := dsn == ""
	if throwaway && opts.worker.Slots > 0 && opts.worker.SessionURL != "" {
		// The workers' sessions would be registered on another server
		// than their jobs, and the workers would claim nothing.
		return cli.Usagef("%s: --session-database-url (or RELAY_SESSION_DATABASE_URL) names a database, but without DATABASE_URL relay dev starts one of its own: "+
			"give --database-url (or DATABASE_URL) too, or leave the session database out", opts.command)
	}
	if throwaway {
		cluster, err := devdb.Start(ctx, logger)
		if err != nil {
			return err
		}
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), devStopTimeout)
			defer cancel()
			if stopErr := cluster.Stop(stopCtx); stopErr != nil && err == nil {
				err = fmt.Errorf("remove the throwaway database: %w", stopErr)
			}
		}()
		dsn = cluster.URL()
		where = "a throwaway PostgreSQL at " + pgurl.Redact(dsn)
		if dir := cluster.Dir(); dir != "" {
			where += " (in " + dir + ")"
		}
		where += ", removed when relay stops"
	}
	if err := migrateUp(ctx, logger, dsn); err != nil {
		return err
	}
	return serve(ctx, logger, dsn, &opts, func(addr net.Addr) {
		printDevBanner(env, devBanner{addr: addr, token: opts.apiToken, slots: opts.worker.Slots,
			where: where, dsn: dsn, throwaway: throwaway})
	})
}

// migrateUp applies every pending migration.
func migrateUp(ctx context.Context, logger *slog.Logger, dsn string) error {
	pool, err := connect(ctx, logger, dsn, "relay dev", 0)
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := migrations.Up(ctx, pool)
	if err != nil {
		return err
	}
	if len(applied) > 0 {
		logger.Info("applied migrations", "versions", applied)
	}
	return nil
}

// devBanner is what the banner of `relay dev` tells.
type devBanner struct {
	addr      net.Addr // where the API listens
	token     string   // the API token, if any, never printed
	slots     int
	where     string // the database, in words
	dsn       string
	throwaway bool // whether relay started the database
}

// printDevBanner tells how to try the playground.
func printDevBanner(env *environment, d devBanner) {
	host := d.addr.String()
	// localhost reaches a listener on every interface or on 127.0.0.1, but
	// not necessarily one on another loopback address such as ::1.
	if tcp, ok := d.addr.(*net.TCPAddr); ok && (tcp.IP.IsUnspecified() || tcp.IP.Equal(net.IPv4(127, 0, 0, 1))) {
		host = fmt.Sprintf("localhost:%d", tcp.Port)
	}
	auth := ""
	var b strings.Builder
	fmt.Fprintf(&b, "\nRelay is running: the API on http://%s with %d worker slots,\non %s.\n\n", host, d.slots, d.where)
	if d.token != "" {
		auth = ` -H "Authorization: Bearer $RELAY_API_TOKEN"`
		b.WriteString("The API requires its bearer token: set RELAY_API_TOKEN to it where you run curl.\n\n")
	}
	fmt.Fprintf(&b, "Try:\n  curl -s%s %s/v1/jobs -d '{\"kind\":\"hash\",\"payload\":{\"iterations\":1000}}'\n", auth, host)
	fmt.Fprintf(&b, "  curl -s%s %s/v1/jobs/1    # 1: the id the first command printed\n\n", auth, host)
	if d.throwaway {
		// relay made this database: its URL holds no secret of the user's.
		fmt.Fprintf(&b, "For relay enqueue (or psql) in another terminal, first:\n  export DATABASE_URL=%s\n\n", shell.Quote(d.dsn))
	} else {
		b.WriteString("For relay enqueue in another terminal, set DATABASE_URL there to the database given here.\n\n")
	}
	fmt.Fprintf(&b, "Built-in kinds: hash, sleep, fail, noop. Press Ctrl-C to stop.\n\n")
	fmt.Fprint(env.stdout, b.String())
}
