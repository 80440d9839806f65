package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/relayq/relay/experiment/enqueue"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/cli"
)

// runExperimentEnqueue runs `relay experiment enqueue [flags]`; args follow
// "enqueue".
func runExperimentEnqueue(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	var (
		common experimentCommon
		cfg    enqueue.Config
	)
	fs := cli.NewFlagSet("experiment enqueue", "relay experiment enqueue [flags]",
		`Starts relay serve, with no worker slots, on a database of its own, and
has --clients clients post one no-op job per request, each one request at
a time, for --warmup and then --duration. Records the jobs accepted per
second in the measured part, the requests' latency, and what each job cost
the server: commits, WAL, and the CPU time of the database's backends.`)
	common.register(fs.FlagSet)
	fs.IntVar(&cfg.Clients, "clients", enqueue.DefaultClients, "clients posting at once")
	fs.DurationVar(&cfg.Duration, "duration", enqueue.DefaultDuration, "how long the measured part lasts")
	fs.DurationVar(&cfg.Warmup, "warmup", enqueue.DefaultWarmup, "how long the clients post before the measured part")
	fs.IntVar(&cfg.Fleet, "fleet", 0, "idle relay work processes to run beside the server, on a queue of their own that no job is posted to: what workers of other queues cost each enqueue")
	fs.IntVar(&cfg.FleetPoolerSize, "fleet-pooler", 0, "put a PgBouncer in transaction mode with this many server connections between the fleet's pools and the server, their sessions on the server itself (0: none)")
	fs.Func("announce-every", "pass this --announce-every to relay serve and record it (default: none passed, the server's own)", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("want a duration of zero or more, like 2ms")
		}
		cfg.AnnounceEvery = &d
		return nil
	})
	if err := parseExperiment(fs, args, stderr); err != nil {
		return cli.Helped(err)
	}
	if err := common.resolve(getenv); err != nil {
		return err
	}
	if cfg.Clients < 1 {
		return cli.Usagef("experiment enqueue: --clients must be at least 1, got %d", cfg.Clients)
	}
	if cfg.Duration <= 0 || cfg.Warmup <= 0 {
		return cli.Usagef("experiment enqueue: --duration and --warmup must be positive, got %s and %s", cfg.Duration, cfg.Warmup)
	}
	if err := harness.CheckFleet(cfg.Fleet, cfg.FleetPoolerSize); err != nil {
		return cli.Usagef("experiment enqueue: --fleet, --fleet-pooler: %v", err)
	}
	cfg.AdminURL, cfg.RelayBin, cfg.OutDir, cfg.LogDir = common.databaseURL, common.relayBin, common.out, common.logDir
	cfg.Progress = stderr

	res, err := enqueue.Run(ctx, cfg)
	if res != nil {
		if werr := res.WriteSummary(stdout); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		return fmt.Errorf("experiment enqueue: %w", err)
	}
	if !res.StoredAll || res.Failed > 0 {
		return fmt.Errorf("experiment enqueue: %d requests failed; %d jobs stored for %d answered 201; want none failed and one job per 201",
			res.Failed, res.Stored, res.Answered)
	}
	return nil
}
