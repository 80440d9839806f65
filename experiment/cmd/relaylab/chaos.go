package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/relayq/relay/experiment/chaos"
	"github.com/relayq/relay/internal/cli"
)

// chaosUsage is the help of `relay experiment chaos`.
const chaosUsage = `Runs Relay's fault-injection programme: for each scenario, a workload of
short sleep and hash jobs on several real worker processes (this binary, as
"relaylab chaos-worker"; the API is --relay-bin's serve), while one kind of fault
is injected, then checks the recorded history of every job:

  kill          SIGKILL a random worker every --fault-every; start another
  pause         SIGSTOP the busiest worker for 1.75 leases, then SIGCONT it
  partition     cut workers off PostgreSQL through a fault proxy: a reset, a
                silent blackhole, and cuts just as a completion commits
  backend-kill  pg_terminate_backend on random worker connections
  restart       restart PostgreSQL mid-run (a private cluster started with
                initdb/pg_ctl, never the server of --database-url), while
                jobs are enqueued through the HTTP API
  poison        jobs that panic, always fail, or kill their own process
  starvation    jobs that hold every connection of the handlers' pool
  bad-input     malformed, oversized, duplicate-key and hostile requests
  pgbouncer     workers and API through a transaction-mode PgBouncer, half
                the workers with their session on PostgreSQL itself, half
                on leases alone; SIGKILL them in turn, as kill does

It fails (status 1) if any job was lost, any unexpected job ran, any stale
acknowledgement was accepted, any finished job changed, any job was
reclaimed prematurely, or any scenario's own invariant broke. Duplicates are
counted, not failed: delivery is at least once. Each scenario writes
chaos-<scenario>-<stamp>.json to --out; a summary table goes to stdout.`

// runChaos runs `relay experiment chaos [flags]`; args follow "chaos".
func runChaos(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		common    experimentCommon
		scenarios string
		short     bool
		base      = chaos.DefaultConfig("")
	)
	fs := cli.NewFlagSet("experiment chaos", "relay experiment chaos [flags]", chaosUsage)
	common.register(fs.FlagSet)
	fs.StringVar(&scenarios, "scenarios", "all", "scenarios to run, separated by commas ("+scenarioNames()+")")
	fs.BoolVar(&short, "short", false, "the test suite's short form: a few hundred jobs, seconds per scenario (flags below still apply)")
	fs.IntVar(&base.Jobs, "jobs", 0, fmt.Sprintf("jobs per scenario (default %d; %d with --short)", base.Jobs, chaos.ShortConfig("").Jobs))
	fs.IntVar(&base.Workers, "workers", 0, fmt.Sprintf("worker processes at once (default %d)", base.Workers))
	fs.IntVar(&base.Slots, "slots", 0, fmt.Sprintf("slots per worker (default %d)", base.Slots))
	fs.DurationVar(&base.Lease, "lease", 0, fmt.Sprintf("the workers' lease (default %s)", base.Lease))
	fs.DurationVar(&base.Heartbeat, "heartbeat", 0, fmt.Sprintf("the workers' heartbeat interval (default %s; %s with --short; a fifth of --lease if that is given)",
		base.Heartbeat, chaos.ShortConfig("").Heartbeat))
	fs.DurationVar(&base.Duration, "duration", 0, fmt.Sprintf("how long each scenario enqueues and injects faults (default %s)", base.Duration))
	fs.DurationVar(&base.FaultEvery, "fault-every", 0, fmt.Sprintf("period of the kill and backend-kill faults (default %s)", base.FaultEvery))
	fs.DurationVar(&base.Downtime, "downtime", 0, fmt.Sprintf("how long the restart scenario keeps PostgreSQL down (default %s)", base.Downtime))
	fs.Uint64Var(&base.Seed, "seed", 0, "seed of the workload and of the choice of victims (default 1)")
	if err := parseExperiment(fs, args, stderr); err != nil {
		return cli.Helped(err)
	}
	if err := common.resolve(getenv); err != nil {
		return err
	}
	labBin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("experiment chaos: find this binary, which runs the chaos workers: %w", err)
	}
	list, err := chaos.ParseScenarios(scenarios)
	if err != nil {
		return cli.Usagef("experiment chaos: --scenarios: %v", err)
	}
	switch {
	case base.Jobs < 0 || base.Workers < 0 || base.Slots < 0:
		return cli.Usagef("experiment chaos: --jobs, --workers and --slots must not be negative")
	case base.Lease < 0 || base.Heartbeat < 0 || base.Duration < 0 || base.FaultEvery < 0 || base.Downtime < 0:
		return cli.Usagef("experiment chaos: durations must not be negative")
	}

	var results []*chaos.Result
	var errs []error
	for _, s := range list {
		cfg := chaos.DefaultConfig(s)
		if short {
			cfg = chaos.ShortConfig(s)
		}
		cfg.Jobs = cmp.Or(base.Jobs, cfg.Jobs)
		cfg.Workers = cmp.Or(base.Workers, cfg.Workers)
		cfg.Slots = cmp.Or(base.Slots, cfg.Slots)
		cfg.Lease = cmp.Or(base.Lease, cfg.Lease)
		cfg.Heartbeat = cmp.Or(base.Heartbeat, cfg.Heartbeat)
		cfg.Duration = cmp.Or(base.Duration, cfg.Duration)
		cfg.FaultEvery = cmp.Or(base.FaultEvery, cfg.FaultEvery)
		cfg.Downtime = cmp.Or(base.Downtime, cfg.Downtime)
		cfg.Seed = cmp.Or(base.Seed, cfg.Seed)
		if base.Lease > 0 && base.Heartbeat == 0 {
			cfg.Heartbeat = cfg.Lease / 5
		}
		cfg.AdminURL, cfg.RelayBin, cfg.WorkerBin, cfg.OutDir, cfg.LogDir = common.databaseURL, common.relayBin, labBin, common.out, common.logDir
		cfg.Progress = stderr
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
		res, err := chaos.Run(ctx, cfg)
		if err != nil {
			errs = append(errs, fmt.Errorf("experiment chaos %s: %w", s, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if res.File != "" {
			fmt.Fprintf(stderr, "chaos %s: results in %s\n", s, res.File)
		}
		results = append(results, res)
	}
	if len(results) > 0 {
		fmt.Fprintln(stdout)
		chaos.PrintSummary(stdout, results)
	}
	for _, r := range results {
		if !r.Passed {
			errs = append(errs, fmt.Errorf("experiment chaos %s: invariants broken: %v", r.Scenario, r.Failures))
		}
	}
	return errors.Join(errs...)
}

// runChaosWorker runs `relay experiment chaos-worker [flags]`, the worker
// process of `relay experiment chaos`: the standard worker with the
// built-in handlers plus the chaos kinds (chaos_panic, chaos_fail,
// chaos_exit, chaos_hold_conns, chaos_flaky), every execution recorded in
// the harness's tables. Not meant to be run by hand.
func runChaosWorker(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		logs         cli.LogFlags
		dbf          cli.DBFlags
		wf           cli.WorkerFlags
		recordURL    string
		handlerConns int
	)
	fs := cli.NewFlagSet("experiment chaos-worker", "relaylab chaos-worker --id ID [flags]",
		`The worker process of "relay experiment chaos": a worker with the built-in
handlers and the chaos job kinds, recording every execution and the fate of
its acknowledgement in the tables the harness added to the database. Its
connections are named relay-worker-ID. Not meant to be run by hand.`)
	logs.Register(fs)
	dbf.Register(fs)
	wf.Register(fs, 10, "jobs to run at once")
	fs.StringVar(&recordURL, "record-database-url", "", "where to record executions, never through a fault proxy (default: --database-url)")
	fs.IntVar(&handlerConns, "handler-pool-size", chaos.DefaultHandlerPoolSize, "connections of the handlers' own pool")
	pos, err := fs.Parse(args, stderr)
	if err != nil {
		return cli.Helped(err)
	}
	if len(pos) > 0 {
		return cli.Usagef("experiment chaos-worker: unexpected argument %q", pos[0])
	}
	if wf.ID == "" {
		return cli.Usagef("experiment chaos-worker: --id is required")
	}
	if handlerConns < 1 {
		return cli.Usagef("experiment chaos-worker: --handler-pool-size must be at least 1, got %d", handlerConns)
	}
	logger, err := logs.Logger(stderr)
	if err != nil {
		return err
	}
	wf.ResolveEnv(getenv)
	cfg, err := wf.Config(logger)
	if err != nil {
		return err
	}
	dsn, err := dbf.Resolve(getenv)
	if err != nil {
		return err
	}
	err = chaos.RunWorker(ctx, chaos.WorkerConfig{
		DatabaseURL:     dsn,
		RecordURL:       recordURL,
		HandlerPoolSize: handlerConns,
		Worker:          cfg,
		Logger:          logger,
	})
	if err != nil {
		return fmt.Errorf("experiment chaos-worker: %w", err)
	}
	return nil
}

// scenarioNames lists the chaos scenarios, for the help.
func scenarioNames() string {
	var names []string
	for _, s := range chaos.Scenarios() {
		names = append(names, string(s))
	}
	return strings.Join(names, ", ")
}
