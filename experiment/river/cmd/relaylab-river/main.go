// Command relaylab-river is the lab's River: it migrates a database with
// River's own migrations, inserts the lab's jobs into it and works them
// with a River client, so that the experiments can run River beside Relay
// as separate processes, each as its users run it. It is built from the
// module experiment/river, the only one that requires River.
//
//	relaylab-river migrate|insert|feed|work [flags]
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/relayq/relay/internal/cli"
)

func main() {
	// River's workers collect garbage at the relay binary's target, so
	// that the burn-down compares the queues, not their runtimes'
	// settings.
	if percent, ok := cli.GCPercent(os.LookupEnv); ok {
		debug.SetGCPercent(percent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args, os.Getenv, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "relaylab-river: "+cli.OneLine(err))
		os.Exit(cli.ExitCode(err))
	}
}

// usage is the help of relaylab-river.
const usage = `Usage: relaylab-river migrate|insert|feed|work [flags]

The lab's River, on the database of --database-url (default $DATABASE_URL).

  migrate  applies River's migrations that the database lacks.
  insert   inserts --jobs jobs of --kind (noop, or sleep of --sleep-ms) on
           --queue, available at once.
  feed     inserts, for each line of standard input, that many jobs of
           --kind on --queue, and answers "ok N" on standard output: a
           steady load paced by the caller.
  work     works --queue with --workers workers until SIGINT or SIGTERM,
           with River's fetch settings tuned for throughput by default.

Run "relaylab-river NAME -h" for the flags of each.
`

// run is the whole program: args are os.Args, ctx is cancelled by SIGINT
// or SIGTERM, and logs go to stderr.
func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	if len(args) < 2 {
		fmt.Fprint(stderr, usage)
		return cli.Usagef("name a command: migrate, insert, feed or work")
	}
	switch args[1] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stderr, usage)
		return nil
	case "migrate":
		return runMigrate(ctx, args[2:], getenv, stderr)
	case "insert":
		return runInsert(ctx, args[2:], getenv, stderr)
	case "feed":
		return runFeed(ctx, args[2:], getenv, os.Stdin, os.Stdout, stderr)
	case "work":
		return runWork(ctx, args[2:], getenv, stderr)
	default:
		return cli.Usagef("unknown command %q: want migrate, insert, feed or work", args[1])
	}
}
