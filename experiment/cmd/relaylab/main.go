// Command relaylab runs Relay's recorded experiments (crash, burst,
// burndown, enqueue, soak and chaos) and the chaos experiment's worker
// processes. It is the lab's command, built apart from relay so that relay
// carries none of the lab; `relay experiment NAME` runs `relaylab NAME`.
// The experiments drive the relay binary beside it (or --relay-bin) as
// separate processes, as a user runs it.
//
//	relaylab crash|burst|burndown|enqueue|soak|chaos [flags]
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/relayq/relay/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args, os.Getenv, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "relaylab: "+cli.OneLine(err))
		os.Exit(cli.ExitCode(err))
	}
}

// environment is what a command gets from the outside, so that tests can
// run it.
type environment struct {
	getenv         func(string) string
	stdout, stderr io.Writer
}

// run is the whole program: args are os.Args, and ctx is cancelled by
// SIGINT or SIGTERM.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	return runExperiment(ctx, &environment{getenv: getenv, stdout: stdout, stderr: stderr}, args[1:])
}
