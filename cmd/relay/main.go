// Command relay runs Relay, a background-job queue on PostgreSQL: its schema
// migrations, its HTTP API, its workers with the built-in job handlers, and
// a zero-configuration playground.
//
//	relay dev                     # throwaway PostgreSQL + API + 4 worker slots
//	relay migrate [up|down|status]
//	relay serve [--slots N]       # the HTTP API, optionally with workers
//	relay work                    # a worker process
//	relay enqueue KIND [--payload JSON]
//	relay experiment crash|burst|burndown|enqueue|soak|chaos  # runs relaylab, the lab's command
//	relay version
//
// Run "relay COMMAND -h" for a command's flags. The database comes from
// --database-url or DATABASE_URL. SIGINT, SIGTERM and SIGHUP (the terminal
// closing) shut down gracefully, but SIGINT and SIGHUP not where relay
// starts with them ignored, as under nohup.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"

	"github.com/relayq/relay/internal/cli"
)

// version is the release, set at build time with
// -ldflags "-X main.version=v1.2.3"; otherwise the module version, if any.
var version = ""

// shutdownSignals returns the signals that start a graceful shutdown.
// SIGHUP is among them because closing the terminal that runs `relay dev`
// sends it, and the default action, dying at once, would leave the
// throwaway database running. SIGHUP and SIGINT are not when relay started
// with them ignored, as `nohup relay serve` starts it with SIGHUP, and a
// shell a command it runs in the background with SIGINT: catching them
// would undo what was asked, and stop relay when its terminal closes.
func shutdownSignals() []os.Signal {
	sigs := []os.Signal{syscall.SIGTERM}
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGHUP} {
		if !signal.Ignored(sig) {
			sigs = append(sigs, sig)
		}
	}
	return sigs
}

func main() {
	if percent, ok := cli.GCPercent(os.LookupEnv); ok {
		debug.SetGCPercent(percent)
	}
	// The first signal starts a graceful shutdown; later ones are ignored
	// until it is done, so that `relay dev` always gets to remove its
	// throwaway database. Every step of the shutdown has a time limit.
	ctx, stop := signal.NotifyContext(context.Background(), shutdownSignals()...)
	err := run(ctx, os.Args, os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		// One line, whatever the error.
		fmt.Fprintln(os.Stderr, "relay: "+cli.OneLine(err))
		os.Exit(cli.ExitCode(err))
	}
}

// command is one subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *environment, args []string) error
	// flags returns a new flag set of the command, the one run parses its
	// arguments with, so that a command line can be checked without
	// running it. It is nil for experiment, whose arguments are relaylab's.
	flags func() *cli.FlagSet
}

// environment is what the program gets from the outside, passed to every
// command instead of reaching for os globals, so that tests can run it.
type environment struct {
	getenv         func(string) string
	stdin          io.Reader
	stdout, stderr io.Writer
}

func commands() []command {
	return []command{
		{"dev", "run a playground: a throwaway PostgreSQL, the API and 4 worker slots", runDev,
			func() *cli.FlagSet { return newDevFlagSet(new(serveFlags)) }},
		{"migrate", "apply (up), roll back (down) or list (status) the schema migrations", runMigrate,
			func() *cli.FlagSet { return newMigrateFlagSet(new(migrateFlags)) }},
		{"serve", "serve the HTTP API, with --slots N also N worker slots", runServe,
			func() *cli.FlagSet { return newServeFlagSet(new(serveFlags)) }},
		{"work", "run a worker with the built-in job handlers", runWork,
			func() *cli.FlagSet { return newWorkFlagSet(new(workFlags)) }},
		{"enqueue", "enqueue a job directly in the database and print it", runEnqueue,
			func() *cli.FlagSet { return newEnqueueFlagSet(new(enqueueFlags)) }},
		{"experiment", "run a recorded experiment: crash, burst, burndown, enqueue, soak or chaos", runExperiment, nil},
		{"version", "print the version", runVersion, newVersionFlagSet},
	}
}

// run is the whole program: args are os.Args, and ctx is cancelled by
// one of shutdownSignals.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	env := &environment{getenv: getenv, stdin: stdin, stdout: stdout, stderr: stderr}
	if len(args) < 2 {
		printUsage(stderr)
		return cli.Usagef("no command given")
	}
	name, rest := args[1], args[2:]
	switch name {
	case "-h", "-help", "--help", "help":
		if name == "help" && len(rest) > 0 {
			// relay help COMMAND is relay COMMAND -h.
			return run(ctx, []string{args[0], rest[0], "-h"}, getenv, stdin, stdout, stderr)
		}
		printUsage(stderr)
		return nil
	case "-version", "--version":
		name = "version"
	}
	for _, c := range commands() {
		if c.name == name {
			return c.run(ctx, env, rest)
		}
	}
	return cli.Usagef("unknown command %q (run \"relay -h\" for the list)", name)
}

func printUsage(w io.Writer) {
	fmt.Fprint(w, `relay: a background-job queue on PostgreSQL.

Usage:
  relay COMMAND [flags]

Commands:
`)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, `
Run "relay COMMAND -h" for the flags of a command.

Environment:
  DATABASE_URL     PostgreSQL URL, when --database-url is not given
  RELAY_ADDR       serve/dev listen address, when --addr is not given
  RELAY_API_TOKEN  bearer token the API requires, when --api-token is not given;
                   without one, serve/dev listen only on a loopback address
                   unless --insecure-no-auth is given
  RELAY_SESSION_DATABASE_URL
                   PostgreSQL URL of a worker's session, when
                   --session-database-url is not given
  GOGC             the garbage collector's target (default 400, not Go's 100)
`)
}

// newVersionFlagSet returns the flag set of relay version, which has no
// flags but -h.
func newVersionFlagSet() *cli.FlagSet {
	return cli.NewFlagSet("version", "relay version", "Prints the version of relay.")
}

func runVersion(_ context.Context, env *environment, args []string) error {
	fs := newVersionFlagSet()
	pos, err := fs.Parse(args, env.stderr)
	if err != nil {
		return cli.Helped(err)
	}
	if len(pos) > 0 {
		return cli.Usagef("version: unexpected argument %q", pos[0])
	}
	if _, err := fmt.Fprintln(env.stdout, versionString()); err != nil {
		return fmt.Errorf("print the version: %w", err)
	}
	return nil
}

// versionString names the release, the VCS revision and the Go version.
func versionString() string {
	v, rev, dirty := version, "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if v == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	if v == "" {
		v = "devel"
	}
	out := "relay " + v
	if rev != "" {
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if dirty {
			rev += "-dirty"
		}
		out += " (" + rev + ")"
	}
	return out + " " + runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH
}
