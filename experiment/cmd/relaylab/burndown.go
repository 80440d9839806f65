package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/relayq/relay/experiment/burndown"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/cli"
)

// runExperimentBurndown runs `relay experiment burndown [flags]`; args
// follow "burndown".
func runExperimentBurndown(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		common     experimentCommon
		cfg        burndown.Config
		configs    string
		systems    string
		riverFlags string
	)
	fs := cli.NewFlagSet("experiment burndown", "relay experiment burndown [flags]",
		`Pre-fills --jobs no-op jobs for each --configs shape (PROCSxSLOTS), on a
database of its own, then starts that many worker processes and times
them emptying the queue, from the first claim to the last finish on the
database's clock. Each configuration runs on each of --systems in turn:
relay work processes, and River (the reference system, through the lab's
relaylab-river, on a database River migrated itself). Records what each
job cost the server: WAL records and bytes, commits, updates of the
queue's table (HOT or not) and the index entries they wrote, and the CPU
time of the database's backends; and Relay's throughput over River's.
With --rounds, the whole sequence runs again, the systems in the other
order every other round, and the ratios' median is reported: a virtual
machine's speed drifts by minutes, which each run's CPU steal shows.

It runs on a private PostgreSQL cluster that it starts with PostgreSQL's
defaults (autovacuum on) and removes at the end, unless --database-url
names a server ($DATABASE_URL is not used).`)
	common.register(fs.FlagSet)
	fs.Lookup("database-url").Usage = "PostgreSQL server to create the experiment's databases on (default: a private cluster; $DATABASE_URL is not used)"
	fs.IntVar(&cfg.Jobs, "jobs", burndown.DefaultJobs, "jobs per configuration")
	fs.StringVar(&configs, "configs", harness.FormatConfigs(burndown.DefaultConfigs), "configurations, PROCSxSLOTS separated by commas")
	fs.StringVar(&systems, "systems", strings.Join(burndown.DefaultSystems, ","), "systems to run each configuration on, in order: relay, river or both, separated by commas")
	fs.StringVar(&cfg.RiverBin, "river-bin", "", "relaylab-river binary that runs River (default: relaylab-river beside this binary, else on PATH)")
	fs.StringVar(&riverFlags, "river-flags", "", `extra flags for River's workers, e.g. "--fetch-cooldown 5ms" (default: none, the adapter's tuned fetch settings)`)
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "bound on each configuration's burn-down (default 10m)")
	fs.IntVar(&cfg.Rounds, "rounds", 1, "times to run every configuration on every system, the systems' order reversed in every other round; the ratios' median over the rounds is reported")
	fs.IntVar(&cfg.PoolerSize, "pooler", 0, "put a PgBouncer in transaction mode with this many server connections between each relay work process's pool and the server, its session on the server itself (0: none; relay only)")
	fs.BoolVar(&cfg.WorkersFirst, "workers-first", false, fmt.Sprintf("start the workers on the empty queue and run %d jobs enqueued one at a time before filling it at once", burndown.WarmUpJobs))
	if err := parseExperiment(fs, args, stderr); err != nil {
		return cli.Helped(err)
	}
	cfg.Systems = strings.Split(systems, ",")
	if slices.Contains(cfg.Systems, burndown.SystemRiver) && cfg.RiverBin == "" {
		bin, err := labBinary("relaylab-river", "--river-bin")
		if err != nil {
			return err
		}
		cfg.RiverBin = bin
	}
	if slices.Contains(cfg.Systems, burndown.SystemRelay) {
		if err := common.resolve(getenv); err != nil {
			return err
		}
	} else {
		common.resolveDatabase(getenv)
	}
	var err error
	if cfg.Configs, err = harness.ParseConfigs(configs); err != nil {
		return cli.Usagef("experiment burndown: --configs: %v", err)
	}
	if cfg.Jobs < 1 {
		return cli.Usagef("experiment burndown: --jobs must be at least 1, got %d", cfg.Jobs)
	}
	if cfg.Rounds < 1 {
		return cli.Usagef("experiment burndown: --rounds must be at least 1, got %d", cfg.Rounds)
	}
	if cfg.PoolerSize < 0 {
		return cli.Usagef("experiment burndown: --pooler must not be negative, got %d", cfg.PoolerSize)
	}
	if cfg.PoolerSize > 0 && slices.Contains(cfg.Systems, burndown.SystemRiver) {
		return cli.Usagef("experiment burndown: --pooler runs relay only; add --systems relay")
	}
	if cfg.Timeout < 0 {
		return cli.Usagef("experiment burndown: --timeout must not be negative, got %s", cfg.Timeout)
	}
	// A private cluster unless a server is named on the command line: the
	// environment's DATABASE_URL is often the shared server, whose settings
	// (autovacuum off) are not a production server's.
	givenURL := false
	fs.Visit(func(f *flag.Flag) { givenURL = givenURL || f.Name == "database-url" })
	cfg.RelayBin, cfg.OutDir, cfg.LogDir = common.relayBin, common.out, common.logDir
	if givenURL {
		cfg.AdminURL = common.databaseURL
	} else {
		cfg.PrivateCluster = true
	}
	cfg.RiverWorkArgs = strings.Fields(riverFlags)
	cfg.Progress = stderr

	res, err := burndown.Run(ctx, cfg)
	if res != nil {
		if werr := res.WriteSummary(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		return fmt.Errorf("experiment burndown: %w", err)
	}
	for _, run := range res.Runs {
		if !run.OK {
			return fmt.Errorf("experiment burndown: %s, configuration %s: %d of %d jobs succeeded, %d retried; want every job once", run.System, run.Config, run.Succeeded, run.Jobs, run.Retried)
		}
	}
	return nil
}
