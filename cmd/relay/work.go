package main

import (
	"context"
	"fmt"

	"github.com/relayq/relay/internal/builtin"
	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/worker"
)

// workFlags are the flags of relay work.
type workFlags struct {
	logs   cli.LogFlags
	db     cli.DBFlags
	worker cli.WorkerFlags
}

// newWorkFlagSet returns the flag set of relay work, which parses into f.
func newWorkFlagSet(f *workFlags) *cli.FlagSet {
	fs := cli.NewFlagSet("work", "relay work [flags]",
		`Runs a worker with the built-in job handlers (hash, sleep, fail, noop) on
one queue. Any number of workers may run against one database. On SIGINT,
SIGTERM or SIGHUP the worker stops claiming, lets running jobs finish for up
to --shutdown-grace, then releases the rest to other workers.`)
	f.logs.Register(fs)
	f.db.Register(fs)
	f.worker.Register(fs, worker.DefaultSlots, "jobs to run at once")
	return fs
}

func runWork(ctx context.Context, env *environment, args []string) error {
	var f workFlags
	fs := newWorkFlagSet(&f)
	pos, err := fs.Parse(args, env.stderr)
	if err != nil {
		return cli.Helped(err)
	}
	if len(pos) > 0 {
		return cli.Usagef("work: unexpected argument %q", pos[0])
	}
	logger, err := f.logs.Logger(env.stderr)
	if err != nil {
		return err
	}
	if f.worker.Slots < 1 {
		return cli.Usagef("--slots must be at least 1, got %d", f.worker.Slots)
	}
	f.worker.ResolveEnv(env.getenv)
	cfg, err := f.worker.Config(logger)
	if err != nil {
		return err
	}
	dsn, err := f.db.Resolve(env.getenv)
	if err != nil {
		return err
	}
	pool, err := connectWorker(ctx, logger, dsn, "relay work", servingMinConns, cfg.Lease)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireMigrated(ctx, logger, pool); err != nil {
		return err
	}
	if err := reachSession(ctx, cfg.SessionDatabaseURL); err != nil {
		return err
	}
	w, err := worker.New(pool, cfg)
	if err != nil {
		return fmt.Errorf("create worker: %w", err)
	}
	builtin.Register(w)
	// Run's errors (an id another live worker holds) say what they are.
	return w.Run(ctx)
}
