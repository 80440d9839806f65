package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/relayq/relay/experiment/burst"
	"github.com/relayq/relay/experiment/crash"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/cli"
)

// experimentUsage is the help of relaylab, which `relay experiment` runs.
const experimentUsage = `Usage: relay experiment crash|burst|burndown|enqueue|soak|chaos [flags]

Runs one of Relay's recorded experiments against real relay processes (the
relay binary beside this one, else on PATH, or --relay-bin) and the
PostgreSQL server of --database-url
(default $DATABASE_URL, else ` + harness.DefaultAdminURL + `),
on which it creates, and afterwards drops, databases of its own: the URL's
user must be allowed to create databases.

  crash  SIGKILLs the worker running a 2 s job, --trials times, and times
         how soon another worker re-claims and completes it; then freezes a
         worker past its lease (SIGSTOP) and shows from its own log that its
         stale acknowledgement is rejected once it is thawed (SIGCONT).
  burst  submits --jobs hash jobs through the HTTP API to each --configs
         configuration (PROCSxSLOTS) and measures throughput and latency
         from the database's timestamps.
  burndown
         pre-fills --jobs no-op jobs and times relay work processes of each
         --configs shape emptying them, then River's workers (the lab's
         relaylab-river) the same; records what each job cost the server:
         WAL, commits, index entries, backend CPU.
  enqueue
         --clients clients post one no-op job per request to relay serve,
         with no workers; records the jobs accepted per second, latency,
         and commits, WAL and backend CPU per job.
  soak   a steady load of 1 ms jobs through five phases (clean,
         idle-in-transaction, repeatable-read readers, 1.5x load,
         recovery), sampling completions, pickup latency, backlog, table
         and index sizes, dead rows, WAL and the xmin horizon's age; on a
         private PostgreSQL cluster of its own unless --database-url.
  chaos  the fault-injection programme (relay experiment chaos -h); its
         worker processes are this binary, as "relaylab chaos-worker".

Each run writes a JSON file of raw results and SVG charts to --out, shows
its progress on stderr and prints a summary table on stdout. It fails
(status 1) when a job was lost or ran other than as the experiment
requires; figures that miss their targets are reported, not failed.
Run "relay experiment NAME -h" for the flags of each.
`

// runExperiment runs `relay experiment crash|burst|burndown|enqueue|soak|chaos [flags]`; args
// follow "experiment".
func runExperiment(ctx context.Context, env *environment, args []string) error {
	getenv, stdout, stderr := env.getenv, env.stdout, env.stderr
	if len(args) == 0 {
		fmt.Fprint(stderr, experimentUsage)
		return cli.Usagef("experiment: name an experiment: crash, burst, burndown, enqueue, soak or chaos")
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stderr, experimentUsage)
		return nil
	case "crash":
		return runExperimentCrash(ctx, args[1:], getenv, stdout, stderr)
	case "burst":
		return runExperimentBurst(ctx, args[1:], getenv, stdout, stderr)
	case "burndown":
		return runExperimentBurndown(ctx, args[1:], getenv, stdout, stderr)
	case "enqueue":
		return runExperimentEnqueue(ctx, args[1:], getenv, stdout, stderr)
	case "soak":
		return runExperimentSoak(ctx, args[1:], getenv, stdout, stderr)
	// The fault-injection programme and its worker process (chaos.go).
	case "chaos":
		return runChaos(ctx, args[1:], getenv, stdout, stderr)
	case "chaos-worker":
		return runChaosWorker(ctx, args[1:], getenv, stdout, stderr)
	default:
		return cli.Usagef("experiment: unknown experiment %q: want crash, burst, burndown, enqueue, soak or chaos", args[0])
	}
}

// experimentCommon are the flags both experiments share.
type experimentCommon struct {
	databaseURL string
	out         string
	relayBin    string
	logDir      string
}

func (c *experimentCommon) register(fs *flag.FlagSet) {
	fs.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL server to create the experiment's databases on (default $DATABASE_URL, else "+harness.DefaultAdminURL+")")
	fs.StringVar(&c.out, "out", "experiment/results", "directory for the results (JSON and SVG); empty: write nothing")
	fs.StringVar(&c.relayBin, "relay-bin", "", "relay binary to run as serve and work processes (default: relay beside this binary, else on PATH)")
	fs.StringVar(&c.logDir, "log-dir", "", "keep the relay processes' logs in this directory (default: a temporary directory, removed)")
}

// resolve fills in the defaults that come from the environment: the
// database's, and the relay binary's.
func (c *experimentCommon) resolve(getenv func(string) string) error {
	c.resolveDatabase(getenv)
	if c.relayBin == "" {
		bin, err := labBinary("relay", "--relay-bin")
		if err != nil {
			return err
		}
		c.relayBin = bin
	}
	return nil
}

// resolveDatabase fills in the database's default, for an experiment that
// runs no relay binary.
func (c *experimentCommon) resolveDatabase(getenv func(string) string) {
	if c.databaseURL == "" {
		c.databaseURL = getenv("DATABASE_URL")
	}
	if c.databaseURL == "" {
		c.databaseURL = harness.DefaultAdminURL
	}
}

// labBinary finds a binary the experiments run, relay or the lab's
// relaylab-river: beside this one, else on PATH. flag is the flag that
// names it instead.
func labBinary(name, flag string) (string, error) {
	if exe, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(exe), name)
		if info, err := os.Stat(beside); err == nil && !info.IsDir() {
			return beside, nil
		}
	}
	if path, err := exec.LookPath(name); err == nil {
		return path, nil
	}
	return "", cli.Usagef("experiment: no %s binary beside this one or on PATH: give %s, or build them all with `make build`", name, flag)
}

// parseExperiment parses an experiment's flags; experiments take no
// positional arguments. On -h it returns cli.ErrHelp, as flagSet.parse does.
func parseExperiment(fs *cli.FlagSet, args []string, stderr io.Writer) error {
	pos, err := fs.Parse(args, stderr)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return cli.Usagef("%s: unexpected argument %q", fs.Name(), pos[0])
	}
	return nil
}

func runExperimentCrash(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		common      experimentCommon
		cfg         = crash.DefaultConfig()
		workerFlags string
		noZombie    bool
	)
	fs := cli.NewFlagSet("experiment crash", "relay experiment crash [flags]",
		`SIGKILLs the worker running a sleep job, --trials times, and times how
soon another worker re-claims and completes it; then freezes a worker past
its lease (SIGSTOP) and shows from its own log that its stale
acknowledgement is rejected once it is thawed (SIGCONT).`)
	common.register(fs.FlagSet)
	fs.IntVar(&cfg.Trials, "trials", cfg.Trials, "how many times a worker is killed mid-job")
	fs.DurationVar(&cfg.JobDuration, "job-duration", cfg.JobDuration, "how long the sleep job runs")
	fs.DurationVar(&cfg.KillAfter, "kill-after", 0, "how long after the claim the worker is killed (default: half the job)")
	fs.StringVar(&workerFlags, "worker-flags", "", `extra flags for the killed trials' workers, e.g. "--reclaim-interval 100ms" (default: none, the worker defaults)`)
	fs.BoolVar(&noZombie, "no-zombie", false, "leave out the zombie (SIGSTOP) case")
	fs.DurationVar(&cfg.ZombieLease, "zombie-lease", cfg.ZombieLease, "lease of the zombie case's workers")
	fs.DurationVar(&cfg.ZombieHeartbeat, "zombie-heartbeat", 0, "heartbeat interval of the zombie case's workers (default: a quarter of --zombie-lease)")
	fs.DurationVar(&cfg.PauseAfter, "pause-after", 0, "how long after the claim the zombie is frozen (default: a quarter of the job)")
	fs.IntVar(&cfg.Fleet, "fleet", 0, "relay work processes to run beside the trials' workers, on a queue of their own, idle unless --fleet-rate says otherwise: each worker of a large fleet looks for dead workers' jobs less often")
	fs.IntVar(&cfg.FleetPoolerSize, "fleet-pooler", 0, "put a PgBouncer in transaction mode with this many server connections between the fleet's pools and the server, their sessions on the server itself (0: none)")
	fs.Float64Var(&cfg.FleetRate, "fleet-rate", 0, "keep the fleet busy: put this many sleep jobs a second on its queue, one per call of client.Insert, through the trials (0: an idle fleet)")
	fs.DurationVar(&cfg.FleetJob, "fleet-job", 0, fmt.Sprintf("how long each of the fleet's jobs sleeps, whole milliseconds (default %s with --fleet-rate)", harness.DefaultFleetJob))
	if err := parseExperiment(fs, args, stderr); err != nil {
		return cli.Helped(err)
	}
	if err := common.resolve(getenv); err != nil {
		return err
	}
	cfg.AdminURL, cfg.RelayBin, cfg.OutDir, cfg.LogDir = common.databaseURL, common.relayBin, common.out, common.logDir
	cfg.WorkerArgs = strings.Fields(workerFlags)
	cfg.SkipZombie = noZombie
	cfg.Progress = stderr
	if cfg.Trials < 1 {
		return cli.Usagef("experiment crash: --trials must be at least 1, got %d", cfg.Trials)
	}
	if err := harness.CheckFleet(cfg.Fleet, cfg.FleetPoolerSize); err != nil {
		return cli.Usagef("experiment crash: --fleet, --fleet-pooler: %v", err)
	}
	if err := harness.CheckFleetLoad(cfg.Fleet, cfg.FleetRate, cfg.FleetJob); err != nil {
		return cli.Usagef("experiment crash: --fleet, --fleet-rate, --fleet-job: %v", err)
	}

	res, err := crash.Run(ctx, cfg)
	if res != nil {
		if werr := res.WriteSummary(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		return fmt.Errorf("experiment crash: %w", err)
	}
	failed := 0
	for _, t := range res.Trials {
		if !t.OK {
			failed++
		}
	}
	if res.Zombie != nil && !res.Zombie.OK {
		failed++
	}
	if failed > 0 {
		return fmt.Errorf("experiment crash: %d case(s) broke an invariant (see PROBLEM lines above)", failed)
	}
	return nil
}

func runExperimentBurst(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		common   experimentCommon
		cfg      = burst.DefaultConfig()
		configs  string
		workload = *cfg.Workload
	)
	fs := cli.NewFlagSet("experiment burst", "relay experiment burst [flags]",
		`Submits --jobs hash jobs through the HTTP API to each --configs
configuration (PROCSxSLOTS) and measures throughput and latency from the
database's timestamps.`)
	common.register(fs.FlagSet)
	fs.IntVar(&cfg.Jobs, "jobs", cfg.Jobs, "jobs per configuration")
	fs.StringVar(&configs, "configs", harness.FormatConfigs(cfg.Configs), "configurations, PROCSxSLOTS separated by commas")
	fs.Int64Var(&workload.SleepMs, "sleep-ms", workload.SleepMs, "each hash job's sleep_ms")
	fs.Int64Var(&workload.Iterations, "iterations", workload.Iterations, "each hash job's iterations")
	fs.IntVar(&cfg.BatchSize, "batch-size", cfg.BatchSize, "jobs per POST /v1/jobs/batch (at most 1000); 1: each job a POST /v1/jobs of its own")
	fs.IntVar(&cfg.Submitters, "submitters", cfg.Submitters, "concurrent HTTP clients submitting batches")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "bound on each configuration's run (default: 4× its drain-time floor plus a minute)")
	fs.BoolVar(&cfg.KeepDatabases, "keep-databases", false, "keep each configuration's database instead of dropping it")
	fs.IntVar(&cfg.ProbeSamples, "probe-samples", cfg.ProbeSamples, "samples of each latency probe after a configuration (negative: no probes)")
	if err := parseExperiment(fs, args, stderr); err != nil {
		return cli.Helped(err)
	}
	if err := common.resolve(getenv); err != nil {
		return err
	}
	var err error
	if cfg.Configs, err = harness.ParseConfigs(configs); err != nil {
		return cli.Usagef("experiment burst: --configs: %v", err)
	}
	switch {
	case cfg.Jobs < 1:
		return cli.Usagef("experiment burst: --jobs must be at least 1, got %d", cfg.Jobs)
	case cfg.BatchSize < 1 || cfg.BatchSize > 1000:
		return cli.Usagef("experiment burst: --batch-size must be between 1 and 1000, got %d", cfg.BatchSize)
	case cfg.Submitters < 1:
		return cli.Usagef("experiment burst: --submitters must be at least 1, got %d", cfg.Submitters)
	case workload.SleepMs < 0 || workload.Iterations < 0:
		return cli.Usagef("experiment burst: --sleep-ms and --iterations must not be negative")
	}
	cfg.Workload = &workload
	cfg.AdminURL, cfg.RelayBin, cfg.OutDir, cfg.LogDir = common.databaseURL, common.relayBin, common.out, common.logDir
	cfg.Progress = stderr

	res, err := burst.Run(ctx, cfg)
	if res != nil {
		if werr := res.WriteSummary(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		return fmt.Errorf("experiment burst: %w", err)
	}
	for _, run := range res.Runs {
		if !run.Check.OK {
			return fmt.Errorf("experiment burst: configuration %s did not run every job exactly once (see PROBLEM lines above)", run.Config)
		}
	}
	return nil
}
