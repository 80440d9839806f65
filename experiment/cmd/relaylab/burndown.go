package main

import (
	"context"
	"fmt"
	"io"

	"github.com/relayq/relay/experiment/burndown"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/cli"
)

// runExperimentBurndown runs `relay experiment burndown [flags]`; args
// follow "burndown".
func runExperimentBurndown(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		common  experimentCommon
		cfg     burndown.Config
		configs string
	)
	fs := cli.NewFlagSet("experiment burndown", "relay experiment burndown [flags]",
		`Pre-fills --jobs no-op jobs for each --configs shape (PROCSxSLOTS), on a
database of its own, then starts that many relay work processes and times
them emptying the queue, from the first claim to the last finish on the
database's clock. Records what each job cost the server: WAL records and
bytes, commits, updates of the jobs table (HOT or not) and the index
entries they wrote, and the CPU time of the database's backends.`)
	common.register(fs.FlagSet)
	fs.IntVar(&cfg.Jobs, "jobs", burndown.DefaultJobs, "jobs per configuration")
	fs.StringVar(&configs, "configs", harness.FormatConfigs(burndown.DefaultConfigs), "configurations, PROCSxSLOTS separated by commas")
	fs.DurationVar(&cfg.Timeout, "timeout", 0, "bound on each configuration's burn-down (default 10m)")
	if err := parseExperiment(fs, args, stderr); err != nil {
		return cli.Helped(err)
	}
	if err := common.resolve(getenv); err != nil {
		return err
	}
	var err error
	if cfg.Configs, err = harness.ParseConfigs(configs); err != nil {
		return cli.Usagef("experiment burndown: --configs: %v", err)
	}
	if cfg.Jobs < 1 {
		return cli.Usagef("experiment burndown: --jobs must be at least 1, got %d", cfg.Jobs)
	}
	if cfg.Timeout < 0 {
		return cli.Usagef("experiment burndown: --timeout must not be negative, got %s", cfg.Timeout)
	}
	cfg.AdminURL, cfg.RelayBin, cfg.OutDir, cfg.LogDir = common.databaseURL, common.relayBin, common.out, common.logDir
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
			return fmt.Errorf("experiment burndown: configuration %s: %d of %d jobs succeeded, %d retried; want every job once", run.Config, run.Succeeded, run.Jobs, run.Retried)
		}
	}
	return nil
}
