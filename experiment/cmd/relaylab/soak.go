package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/soak"
	"github.com/relayq/relay/internal/cli"
)

// runExperimentSoak runs `relay experiment soak [flags]`; args follow
// "soak".
func runExperimentSoak(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		common   experimentCommon
		cfg      soak.Config
		workers  string
		system   string
		riverBin string
		phase    time.Duration
		phases   = map[soak.PhaseKind]*time.Duration{}
	)
	fs := cli.NewFlagSet("experiment soak", "relay experiment soak [flags]",
		`Offers a steady load of --job-ms sleep jobs at --rate jobs/s to relay work
processes (--workers PROCSxSLOTS), or with --system river to River's
workers through relaylab-river, through five phases: clean; a session idle
in a transaction that holds a transaction id; --readers REPEATABLE READ
readers counting the jobs table every --reader-interval, each in one
transaction for the phase; --overload times the load; recovery. Every
--interval it samples the completion rate, the pickup latency (ready to
claimed, p50/p95/p99), the backlog, the size and dead rows of every table
and index, the WAL written and the age of the xmin horizon.

It runs on a private PostgreSQL cluster that it starts with PostgreSQL's
defaults (autovacuum on) and removes at the end, unless --database-url
names a server ($DATABASE_URL is not used).`)
	common.register(fs.FlagSet)
	fs.Lookup("database-url").Usage = "PostgreSQL server to create the soak's database on (default: a private cluster; $DATABASE_URL is not used)"
	fs.DurationVar(&phase, "phase", soak.DefaultPhaseDuration, "how long each phase runs, unless its own flag says otherwise")
	for _, k := range soak.Kinds {
		phases[k] = new(time.Duration)
		fs.DurationVar(phases[k], "phase-"+string(k), 0, "how long the "+string(k)+" phase runs (default --phase; negative, such as -1s: leave it out)")
	}
	fs.Float64Var(&cfg.Rate, "rate", soak.DefaultRate, "offered load, jobs per second")
	fs.Float64Var(&cfg.OverloadFactor, "overload", soak.DefaultOverloadFactor, "the overload phase's load, as a multiple of --rate")
	fs.IntVar(&cfg.Readers, "readers", soak.DefaultReaders, "REPEATABLE READ readers in the repeatable-read phase")
	fs.DurationVar(&cfg.ReaderInterval, "reader-interval", soak.DefaultReaderInterval, "how often each reader counts the jobs table")
	fs.IntVar(&cfg.ReadersNice, "readers-nice", 0, "nice value, 1 to 19, each reader gives its backend's process for the phase, so that the readers yield the CPU (on the private cluster only, not with --database-url; default 0: left as is)")
	fs.BoolVar(&cfg.ReadersApart, "readers-apart", false, "the readers count a jobs table of their own, in a database of their own on the same server, filled as their phase starts until a count of it takes as long as one of the queue's: their load without their pinned horizon or the queue's pages")
	fs.DurationVar(&cfg.Interval, "interval", soak.DefaultInterval, "how often the soak samples")
	fs.StringVar(&workers, "workers", soak.DefaultWorkers.String(), "relay work processes and their slots, PROCSxSLOTS")
	fs.Int64Var(&cfg.JobMs, "job-ms", soak.DefaultJobMs, "how long each sleep job runs, in milliseconds")
	fs.DurationVar(&cfg.RetainSucceeded, "retain-succeeded", 0, "how long the workers keep a succeeded job (relay work's --retain-succeeded, River's CompletedJobRetentionPeriod; default the system's, a day)")
	fs.StringVar(&system, "system", "relay", "the queue under test: relay, or river (River, the reference, through relaylab-river)")
	fs.StringVar(&riverBin, "river-bin", "", "relaylab-river binary that runs River (default: relaylab-river beside this binary, else on PATH)")
	if err := parseExperiment(fs, args, stderr); err != nil {
		return cli.Helped(err)
	}
	// The soak's own server unless one is named on the command line: the
	// environment's DATABASE_URL is often the shared server, whose
	// settings (autovacuum off) are not a production server's.
	givenURL := false
	fs.Visit(func(f *flag.Flag) { givenURL = givenURL || f.Name == "database-url" })
	if err := common.resolve(getenv); err != nil {
		return err
	}
	if givenURL {
		cfg.AdminURL = common.databaseURL
	}
	shape, err := harness.ParseConfigs(workers)
	if err != nil || len(shape) != 1 {
		return cli.Usagef("experiment soak: --workers: want one PROCSxSLOTS such as 2x10, got %q", workers)
	}
	cfg.Workers = shape[0]
	if phase <= 0 {
		return cli.Usagef("experiment soak: --phase must be positive, got %s", phase)
	}
	cfg.Phases = map[soak.PhaseKind]time.Duration{}
	for k, d := range phases {
		cfg.Phases[k] = phase
		if *d != 0 {
			cfg.Phases[k] = *d
		}
	}
	switch {
	case cfg.Rate <= 0:
		return cli.Usagef("experiment soak: --rate must be positive, got %v", cfg.Rate)
	case cfg.OverloadFactor <= 0:
		return cli.Usagef("experiment soak: --overload must be positive, got %v", cfg.OverloadFactor)
	case cfg.Readers < 1:
		return cli.Usagef("experiment soak: --readers must be at least 1, got %d", cfg.Readers)
	case cfg.ReadersNice < 0 || cfg.ReadersNice > soak.MaxNice:
		return cli.Usagef("experiment soak: --readers-nice must be from 0 to %d, got %d", soak.MaxNice, cfg.ReadersNice)
	case cfg.ReadersNice > 0 && givenURL:
		return cli.Usagef("experiment soak: --readers-nice lowers the priority of the private cluster's backends, on this host; it cannot with --database-url")
	case cfg.ReaderInterval <= 0:
		return cli.Usagef("experiment soak: --reader-interval must be positive, got %s", cfg.ReaderInterval)
	case cfg.Interval <= time.Second:
		return cli.Usagef("experiment soak: --interval must be longer than 1s, got %s", cfg.Interval)
	case cfg.JobMs < 0:
		return cli.Usagef("experiment soak: --job-ms must not be negative, got %d", cfg.JobMs)
	case cfg.RetainSucceeded < 0:
		return cli.Usagef("experiment soak: --retain-succeeded must not be negative, got %s", cfg.RetainSucceeded)
	case cfg.RetainSucceeded != 0 && cfg.RetainSucceeded < soak.MinRetainSucceeded(cfg.Interval):
		return cli.Usagef("experiment soak: --retain-succeeded must be at least %s (twice --interval and the window's lag), "+
			"or a job may be deleted before the sample that counts it; got %s", soak.MinRetainSucceeded(cfg.Interval), cfg.RetainSucceeded)
	}
	cfg.RelayBin, cfg.OutDir, cfg.LogDir = common.relayBin, common.out, common.logDir
	switch system {
	case "relay":
	case "river":
		if riverBin == "" {
			if riverBin, err = labBinary("relaylab-river", "--river-bin"); err != nil {
				return err
			}
		}
		river := soak.RiverConfig{Bin: riverBin, Workers: cfg.Workers, JobMs: cfg.JobMs, RetainCompleted: cfg.RetainSucceeded}
		cfg.NewSystem = func(d *harness.Database, logDir string) soak.System {
			c := river
			c.Database, c.LogDir = d, logDir
			return soak.NewRiver(c)
		}
	default:
		return cli.Usagef("experiment soak: --system: want relay or river, got %q", system)
	}
	cfg.Progress = stderr

	res, err := soak.Run(ctx, cfg)
	if res != nil {
		if werr := res.WriteSummary(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		return fmt.Errorf("experiment soak: %w", err)
	}
	return nil
}
