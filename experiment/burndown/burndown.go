// Package burndown is the burn-down experiment: it pre-fills a queue with
// no-op jobs, then starts worker processes on it and measures how fast
// they empty it, from the first claim to the last finish on the database's
// clock, and what that cost the server per job: WAL records and bytes,
// commits, writes to the queue's table (HOT or touching every index) and
// the CPU time of the database's backends. It runs each configuration on
// Relay (relay work) and on River, the reference system (relaylab-river
// work), one after the other, each on a database of its own, so that both
// see the same conditions, and records the machine's CPU steal beside
// each run. Config.Rounds repeats the whole, the systems' order reversed
// every other round, and sums up the ratios by their median. Run runs it;
// `relaylab burndown` is its command.
package burndown

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/builtin"
)

// DefaultConfigs are the worker shapes the burn-down is recorded at: one
// process of 50 slots, one of 200, two of 100.
var DefaultConfigs = []harness.ProcSlots{{Procs: 1, Slots: 50}, {Procs: 1, Slots: 200}, {Procs: 2, Slots: 100}}

// DefaultJobs is how many jobs each configuration burns down.
const DefaultJobs = 100_000

// queue is the queue the jobs are put on.
const queue = "burndown"

// stopGrace bounds a worker's shutdown once the queue is empty.
const stopGrace = 10 * time.Second

// Config configures the burn-down. Zero fields take the defaults named in
// their comments.
type Config struct {
	// AdminURL is the PostgreSQL server on which a database is created for
	// each configuration. Default harness.DefaultAdminURL, unless
	// PrivateCluster.
	AdminURL string
	// PrivateCluster runs the whole burn-down on a PostgreSQL cluster of
	// its own (harness.StartCluster: PostgreSQL's defaults, autovacuum on),
	// started for the run and removed at its end, instead of AdminURL's.
	PrivateCluster bool
	// Systems are the systems each configuration runs on, in this order.
	// Default DefaultSystems.
	Systems []string
	// RelayBin is the relay binary that runs `work`. Required.
	RelayBin string
	// RiverBin is the relaylab-river binary that runs River. Required when
	// Systems holds SystemRiver.
	RiverBin string
	// RiverWorkArgs are added to the command line of every `relaylab-river
	// work`. Nil: none, the adapter's tuned defaults.
	RiverWorkArgs []string
	// OutDir receives the JSON result. Empty: nothing is written.
	OutDir string
	// LogDir receives the processes' logs. Empty: a temporary directory,
	// removed at the end.
	LogDir string
	// Jobs is how many no-op jobs each configuration burns down. Default
	// DefaultJobs.
	Jobs int
	// Configs are the worker shapes to run. Default DefaultConfigs.
	Configs []harness.ProcSlots
	// Timeout bounds each configuration's burn-down. Default 10 minutes.
	Timeout time.Duration
	// Rounds is how many times every configuration runs on every system.
	// Each round runs the configurations in order and, in each, the
	// systems in Systems' order in odd rounds and in the reverse order in
	// even ones, so that a machine whose speed drifts through the rounds
	// favours neither. Default 1.
	Rounds int
	// WorkersFirst starts the workers on the empty queue, has them run
	// WarmUpJobs jobs enqueued one at a time, and only then fills the
	// queue, in one transaction: a burst into a queue that stood idle.
	// The plans the workers' connections keep were then made over a
	// nearly empty table.
	WorkersFirst bool
	// PoolerSize, when positive, puts a PgBouncer in transaction mode,
	// started for each configuration with PoolerSize server connections,
	// between every relay work process's pool and the server, and keeps
	// each process's session on the server itself: how a fleet of many
	// processes is meant to run (docs/scaling.md). Relay only.
	PoolerSize int
	// Progress receives progress lines. Nil: none.
	Progress io.Writer
}

func (c Config) withDefaults() (Config, error) {
	if len(c.Systems) == 0 {
		c.Systems = DefaultSystems
	}
	for i, s := range c.Systems {
		if s != SystemRelay && s != SystemRiver {
			return c, fmt.Errorf("burndown: unknown system %q: want %s or %s", s, SystemRelay, SystemRiver)
		}
		if slices.Contains(c.Systems[:i], s) {
			return c, fmt.Errorf("burndown: system %q given twice", s)
		}
	}
	if c.RelayBin == "" && slices.Contains(c.Systems, SystemRelay) {
		return c, fmt.Errorf("burndown: no relay binary given")
	}
	if c.RiverBin == "" && slices.Contains(c.Systems, SystemRiver) {
		return c, fmt.Errorf("burndown: no relaylab-river binary given")
	}
	if c.AdminURL == "" && !c.PrivateCluster {
		c.AdminURL = harness.DefaultAdminURL
	}
	if c.AdminURL != "" && c.PrivateCluster {
		return c, fmt.Errorf("burndown: a server URL and a private cluster are both given")
	}
	if c.Jobs == 0 {
		c.Jobs = DefaultJobs
	}
	if len(c.Configs) == 0 {
		c.Configs = DefaultConfigs
	}
	if c.Timeout == 0 {
		c.Timeout = 10 * time.Minute
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	if c.PoolerSize < 0 {
		return c, fmt.Errorf("burndown: the pooler's size must not be negative, got %d", c.PoolerSize)
	}
	if c.PoolerSize > 0 && slices.Contains(c.Systems, SystemRiver) {
		return c, fmt.Errorf("burndown: a pooler runs %s only, not %s", SystemRelay, SystemRiver)
	}
	if c.Jobs < 1 || c.Timeout < 0 || c.Rounds < 1 {
		return c, fmt.Errorf("burndown: jobs and rounds must be at least 1 and the timeout positive, got %d, %d and %s", c.Jobs, c.Rounds, c.Timeout)
	}
	return c, nil
}

// Result is the record of one burn-down: its settings, the environment,
// one ConfigRun per round, configuration and system, and, when both
// systems ran, one Comparison per round and configuration, and one
// RatioSummary per configuration.
type Result struct {
	Experiment  string              `json:"experiment"`
	Environment harness.Environment `json:"environment"`
	// Server says where the databases were: "private cluster" (see
	// Config.PrivateCluster) or "given server"; Environment.PostgreSQL
	// holds its settings.
	Server  string   `json:"server"`
	Jobs    int      `json:"jobs"`
	JobKind string   `json:"job_kind"`
	Configs []string `json:"configs"`
	Systems []string `json:"systems"`
	Rounds  int      `json:"rounds"`
	// River is the River that ran, if it did.
	River       *RiverInfo   `json:"river,omitempty"`
	Runs        []ConfigRun  `json:"runs"`
	Comparisons []Comparison `json:"comparisons,omitempty"`
	// Ratios sums up each configuration's Comparisons over the rounds.
	Ratios []RatioSummary `json:"ratios,omitempty"`
	Files  []string       `json:"files,omitempty"`
}

// ConfigRun is one configuration's burn-down on one system in one round. Per-job
// figures divide a counter's growth over the burn-down (from the workers'
// start to their exit) by Jobs.
type ConfigRun struct {
	// Round counts from 1 (Config.Rounds).
	Round  int    `json:"round"`
	System string `json:"system"`
	Config string `json:"config"`
	Procs  int    `json:"procs"`
	Slots  int    `json:"slots"`
	Jobs   int    `json:"jobs"`
	// WorkersFirst says the workers ran WarmUpJobs jobs on the empty queue
	// before it was filled (Config.WorkersFirst).
	WorkersFirst bool `json:"workers_first,omitempty"`
	// Pooler is the PgBouncer the workers' pools went through
	// (Config.PoolerSize), nil where they connected to the server.
	Pooler *harness.PoolerInfo `json:"pooler,omitempty"`
	// Succeeded and Retried count the jobs that ended succeeded and that
	// took more than one attempt; OK is every job succeeded on attempt 1.
	Succeeded int64 `json:"succeeded"`
	Retried   int64 `json:"retried"`
	OK        bool  `json:"ok"`
	// FirstClaim to LastFinish is the burn-down, on the database's clock.
	FirstClaim time.Time `json:"first_claim"`
	LastFinish time.Time `json:"last_finish"`
	Seconds    float64   `json:"seconds"`
	JobsPerSec float64   `json:"jobs_per_sec"`
	// WAL, from pg_stat_wal: the whole server's, so other databases'
	// writes count too.
	WALRecordsPerJob float64 `json:"wal_records_per_job"`
	WALBytesPerJob   float64 `json:"wal_bytes_per_job"`
	WALFPIPerJob     float64 `json:"wal_full_page_images_per_job"`
	// CommitsPerJob counts this database's commits, the harness's own
	// progress reads included (one every 100 ms).
	CommitsPerJob float64 `json:"commits_per_job"`
	// Writes to the queue's table (Table: Relay's jobs, River's river_job):
	// every update, and those that were HOT (no index entry); and the
	// B-tree entries the burn-down wrote, counted in its WAL (see
	// harness.IndexEntries): each non-HOT update writes one in every index
	// of the table (Indexes) whose predicate the new row meets. Nil where
	// the WAL could not be read here (IndexEntriesNotMeasured says why).
	Table                   string   `json:"table"`
	UpdatesPerJob           float64  `json:"updates_per_job"`
	HOTUpdatesPerJob        float64  `json:"hot_updates_per_job"`
	IndexEntriesPerJob      *float64 `json:"index_entries_per_job,omitempty"`
	IndexEntriesNotMeasured string   `json:"index_entries_not_measured,omitempty"`
	Indexes                 int64    `json:"indexes"`
	// PostgresCPUMsPerJob is the CPU time of this database's backends, read
	// from /proc: zero when the server is not on this host.
	PostgresCPUMsPerJob float64 `json:"postgres_cpu_ms_per_job"`
	// HarnessBackends counts the harness's own sessions on the database,
	// whose CPU time PostgresCPUMsPerJob leaves out.
	HarnessBackends int `json:"harness_backends"`
	// WorkerCPUMsPerJob is the CPU time of the worker processes over the
	// same span as PostgresCPUMsPerJob, read from /proc.
	WorkerCPUMsPerJob float64 `json:"worker_cpu_ms_per_job"`
	// MachineCPUBusy is the share of the machine's CPU time that was busy
	// from the first claim to the last finish, and MachineStealSec the CPU
	// time the hypervisor gave to other machines meanwhile: the machine's
	// speed drifts with it, so runs that lost much to it are slower for
	// reasons of their own. Both are read from /proc/stat, sampled every
	// cpuTraceInterval, between the samples around that span. Zero where
	// /proc/stat cannot be read.
	MachineCPUBusy  float64 `json:"machine_cpu_busy"`
	MachineStealSec float64 `json:"machine_cpu_steal_seconds"`
	// JobsPerBusySec is JobsPerSec over MachineCPUBusy: the jobs a second
	// of the whole machine kept busy would run at the cost per job this
	// run paid, so that systems that leave different shares of the
	// machine idle can be compared by what a job costs them. Zero where
	// the busy share is.
	JobsPerBusySec float64 `json:"jobs_per_busy_sec,omitempty"`
	// Backends is what the database's client sessions other than the
	// harness's (the workers') did from the first claim to the last
	// finish, on average over samples of pg_stat_activity taken every
	// sessionTraceInterval: how many were running (or ready to run), how
	// many waited for the WAL (a commit's flush above all), and what else
	// held them up. Nil where no sample fell in the span.
	Backends *harness.SessionActivity `json:"backends,omitempty"`
}

// Comparison sets Relay's throughput beside River's at one configuration
// in one round: Ratio is Relay's jobs/s over River's, and BusyRatio the
// same over the jobs each ran per second of busy machine
// (ConfigRun.JobsPerBusySec), zero where either is.
type Comparison struct {
	Round               int     `json:"round"`
	Config              string  `json:"config"`
	RelayJobsPerSec     float64 `json:"relay_jobs_per_sec"`
	RiverJobsPerSec     float64 `json:"river_jobs_per_sec"`
	Ratio               float64 `json:"ratio"`
	RelayJobsPerBusySec float64 `json:"relay_jobs_per_busy_sec,omitempty"`
	RiverJobsPerBusySec float64 `json:"river_jobs_per_busy_sec,omitempty"`
	BusyRatio           float64 `json:"busy_ratio,omitempty"`
}

// RatioSummary is one configuration's Relay-over-River ratios across the
// rounds: each round's ratio sets two runs side by side minutes apart, and
// the median of them is the figure to quote. BusyMedian is the median of
// the rounds' BusyRatio, where every round has one.
type RatioSummary struct {
	Config     string  `json:"config"`
	Rounds     int     `json:"rounds"`
	Median     float64 `json:"median"`
	Min        float64 `json:"min"`
	Max        float64 `json:"max"`
	BusyMedian float64 `json:"busy_median,omitempty"`
}

// Run burns down cfg.Jobs no-op jobs at each configuration on each system,
// cfg.Rounds times, each on a database of its own, and writes the result
// under cfg.OutDir.
func Run(ctx context.Context, cfg Config) (_ *Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	logDir, cleanLogs, err := harness.LogDirFor(cfg.LogDir, "relay-burndown-logs-")
	if err != nil {
		return nil, err
	}
	defer cleanLogs()
	res := &Result{Experiment: "burndown", Server: "given server", Jobs: cfg.Jobs, JobKind: builtin.KindNoop, Systems: cfg.Systems, Rounds: cfg.Rounds}
	if cfg.PrivateCluster {
		cluster, err := harness.StartCluster(ctx, slog.New(slog.DiscardHandler))
		if err != nil {
			return nil, fmt.Errorf("burndown: %w", err)
		}
		defer cluster.StopAtEnd(ctx, &err)
		cfg.AdminURL, res.Server = cluster.URL(), "private cluster"
	}
	var systems []system
	for _, name := range cfg.Systems {
		switch name {
		case SystemRelay:
			systems = append(systems, relaySystem(cfg.RelayBin))
		case SystemRiver:
			version, err := riverVersion(cfg.RiverBin)
			if err != nil {
				return nil, err
			}
			res.River = &RiverInfo{Binary: cfg.RiverBin, Version: version, WorkArgs: cfg.RiverWorkArgs}
			systems = append(systems, riverSystem(cfg.RiverBin, cfg.RiverWorkArgs))
		}
	}
	for _, pc := range cfg.Configs {
		res.Configs = append(res.Configs, pc.String())
	}
	for round := 1; round <= cfg.Rounds; round++ {
		order := slices.Clone(systems)
		if round%2 == 0 {
			slices.Reverse(order)
		}
		for _, pc := range cfg.Configs {
			for _, sys := range order {
				run, env, err := runConfig(ctx, cfg, sys, pc, logDir, res.River)
				if err != nil {
					return nil, fmt.Errorf("round %d, %s, configuration %s: %w", round, sys.name, pc, err)
				}
				if len(res.Runs) == 0 {
					res.Environment = env
				}
				run.Round = round
				res.Runs = append(res.Runs, *run)
			}
			res.compare(round, pc.String())
		}
	}
	res.summarize()
	res.Environment.LoadAverageEnd = harness.LoadAverage()
	if cfg.OutDir != "" {
		base, err := harness.ResultBase(cfg.OutDir, "burndown", res.Environment.Date)
		if err != nil {
			return res, err
		}
		res.Files = []string{base + ".json"}
		if err := harness.WriteJSON(base+".json", res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// compare adds the Comparison of config in round, if both systems ran
// it.
func (r *Result) compare(round int, config string) {
	c := Comparison{Round: round, Config: config}
	for _, run := range r.Runs {
		if run.Round != round || run.Config != config {
			continue
		}
		switch run.System {
		case SystemRelay:
			c.RelayJobsPerSec, c.RelayJobsPerBusySec = run.JobsPerSec, run.JobsPerBusySec
		case SystemRiver:
			c.RiverJobsPerSec, c.RiverJobsPerBusySec = run.JobsPerSec, run.JobsPerBusySec
		}
	}
	if c.RelayJobsPerSec == 0 || c.RiverJobsPerSec == 0 {
		return
	}
	c.Ratio = harness.Round2(c.RelayJobsPerSec / c.RiverJobsPerSec)
	if c.RelayJobsPerBusySec > 0 && c.RiverJobsPerBusySec > 0 {
		c.BusyRatio = harness.Round2(c.RelayJobsPerBusySec / c.RiverJobsPerBusySec)
	}
	r.Comparisons = append(r.Comparisons, c)
}

// summarize adds a RatioSummary for each configuration compared.
func (r *Result) summarize() {
	for _, config := range r.Configs {
		var ratios, busy []float64
		for _, c := range r.Comparisons {
			if c.Config == config {
				ratios = append(ratios, c.Ratio)
				if c.BusyRatio > 0 {
					busy = append(busy, c.BusyRatio)
				}
			}
		}
		if len(ratios) == 0 {
			continue
		}
		s := RatioSummary{
			Config: config, Rounds: len(ratios),
			Median: harness.Round2(harness.Median(ratios)), Min: slices.Min(ratios), Max: slices.Max(ratios),
		}
		if len(busy) == len(ratios) {
			s.BusyMedian = harness.Round2(harness.Median(busy))
		}
		r.Ratios = append(r.Ratios, s)
	}
}

// runConfig burns down one configuration on one system, on a database of
// its own. The first River run fills in river's settings.
func runConfig(ctx context.Context, cfg Config, sys system, pc harness.ProcSlots, logDir string, river *RiverInfo) (_ *ConfigRun, env harness.Environment, err error) {
	prog := harness.NewProgress(cfg.Progress, fmt.Sprintf("burndown %-5s %-6s", sys.name, pc), cfg.Jobs)
	prog.Note("creating a database")
	d, err := sys.newDatabase(ctx, cfg.AdminURL)
	if err != nil {
		return nil, env, err
	}
	defer d.DropAtEnd(ctx, &err)
	env = harness.CollectEnvironment(ctx, d, cfg.RelayBin)

	runCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	procEnv := []string{"DATABASE_URL=" + d.URL}
	var pooler *harness.Pooler
	if cfg.PoolerSize > 0 {
		if pooler, err = harness.StartPooler(runCtx, d, cfg.PoolerSize, pc.Procs); err != nil {
			return nil, env, err
		}
		defer func() { _ = pooler.Close() }() // closed below once the workers stop; here on an early return
		procEnv = pooler.Env
	}
	procs := harness.NewProcs(sys.bin, logDir, procEnv...)
	defer procs.KillAll()
	if sys.prepare != nil {
		if err := sys.prepare(runCtx, procs); err != nil {
			return nil, env, err
		}
	}
	var workers []*harness.Proc
	start := func() error {
		prog.Note("starting %d worker process(es) of %d slot(s)", pc.Procs, pc.Slots)
		for i := 1; i <= pc.Procs; i++ {
			id := fmt.Sprintf("burndown-%s-%s-w%d", sys.name, pc, i)
			p, err := procs.Start(runCtx, id, sys.workArgs(id, pc.Slots)...)
			if err != nil {
				return err
			}
			workers = append(workers, p)
		}
		return nil
	}
	if cfg.WorkersFirst {
		if err := start(); err != nil {
			return nil, env, err
		}
		if err := warmUp(runCtx, d, sys, procs, prog); err != nil {
			return nil, env, err
		}
	}
	// With the workers already running, they start on the jobs as the
	// fill commits, a few milliseconds before the counters are read; the
	// machine's CPU is traced from before the fill, so that its trace
	// covers the first claim.
	machine := harness.TraceCPU(cpuTraceInterval)
	defer machine.Stop()
	sessions, err := harness.TraceSessions(d.Lab, harness.ApplicationName, sessionTraceInterval)
	if err != nil {
		return nil, env, err
	}
	defer sessions.Stop()
	prog.Note("inserting %d no-op jobs", cfg.Jobs)
	inserted := int64(cfg.Jobs)
	if cfg.WorkersFirst {
		inserted += WarmUpJobs
	}
	if err := fillCounted(runCtx, d, sys, procs, cfg.Jobs, cfg.WorkersFirst, inserted); err != nil {
		return nil, env, err
	}
	// The WAL from here on is read once the burn-down ends, for the index
	// entries it wrote.
	var entriesNotMeasured string
	wal, err := harness.OpenWALWindow(ctx, d.Lab, fmt.Sprintf("relaylab_burndown_%d", os.Getpid()))
	if err != nil {
		entriesNotMeasured = err.Error()
		prog.Note("index entries not measured: %v", err)
	} else {
		defer func() {
			if cerr := wal.Close(ctx, d.Lab); cerr != nil && err == nil {
				err = cerr
			}
		}()
	}
	before, err := d.Lab.BurndownCounters(ctx, sys.table)
	if err != nil {
		return nil, env, fmt.Errorf("read the counters: %w", err)
	}
	cpuBefore := harness.SamplePostgresCPU(d.Name)
	workersBefore := workersCPU(workers)
	if !cfg.WorkersFirst {
		if err := start(); err != nil {
			return nil, env, err
		}
	}
	if err := waitDrained(runCtx, d.Lab, sys, procs, prog, cfg.Jobs); err != nil {
		return nil, env, err
	}
	// The backends' CPU is read while they still run; the counters once
	// the workers' sessions have ended and reported them. The harness's
	// own backends are left out of the database's CPU.
	cpuAfter := harness.SamplePostgresCPU(d.Name)
	workersAfter := workersCPU(workers)
	machine.Stop()
	if err := sessions.Stop(); err != nil {
		return nil, env, err
	}
	own, err := d.Lab.BurndownOwnBackends(ctx, harness.ApplicationName)
	if err != nil {
		return nil, env, fmt.Errorf("list the harness's own sessions: %w", err)
	}
	for _, pid := range own {
		delete(cpuBefore.DB, int(pid))
		delete(cpuAfter.DB, int(pid))
	}
	stopCtx, stop := context.WithTimeout(ctx, 2*stopGrace)
	defer stop()
	if err := procs.StopAll(stopCtx, stopGrace); err != nil {
		return nil, env, fmt.Errorf("stop the workers: %w", err)
	}
	for _, p := range workers {
		if err := p.ExitErr(); err != nil {
			lines, _ := p.Logs()
			return nil, env, fmt.Errorf("%s did not stop cleanly: %w; last lines:\n%s", p.Name, err, harness.Tail(lines, 5))
		}
	}
	// The pooler's server connections end with it, and the counters are
	// read once every session of the workers has.
	if pooler != nil {
		if err := pooler.Close(); err != nil {
			return nil, env, fmt.Errorf("stop the pooler: %w", err)
		}
	}
	if sys.name == SystemRiver && river != nil && river.FetchCooldown == "" {
		if err := riverSettings(river, workers[0]); err != nil {
			return nil, env, err
		}
	}
	after, err := settledCounters(ctx, d.Lab, sys.table)
	if err != nil {
		return nil, env, err
	}
	var entries *float64
	if wal != nil {
		records, err := wal.Records(ctx, d.Lab)
		if err != nil {
			return nil, env, fmt.Errorf("read the burn-down's WAL: %w", err)
		}
		e := harness.Round3(float64(harness.IndexEntries(records)) / float64(cfg.Jobs))
		entries = &e
	}
	sp, err := sys.span(ctx, d.Lab)
	if err != nil {
		return nil, env, fmt.Errorf("read the burn-down's span: %w", err)
	}
	prog.Finish("done")

	n := float64(cfg.Jobs)
	per := func(a, b int64) float64 { return harness.Round3(float64(b-a) / n) }
	updates := after.TableUpdated - before.TableUpdated
	hot := after.TableHotUpdated - before.TableHotUpdated
	seconds := sp.LastFinish.Sub(sp.FirstClaim).Seconds()
	run := &ConfigRun{
		System: sys.name, Config: pc.String(), Procs: pc.Procs, Slots: pc.Slots, Jobs: cfg.Jobs, WorkersFirst: cfg.WorkersFirst,
		Succeeded: sp.Succeeded, Retried: sp.Retried,
		OK:         sp.Succeeded == int64(cfg.Jobs) && sp.Retried == 0 && sp.Total == int64(cfg.Jobs),
		FirstClaim: sp.FirstClaim, LastFinish: sp.LastFinish,
		Seconds:                 harness.Round3(seconds),
		WALRecordsPerJob:        per(before.WalRecords, after.WalRecords),
		WALBytesPerJob:          per(before.WalBytes, after.WalBytes),
		WALFPIPerJob:            per(before.WalFpi, after.WalFpi),
		CommitsPerJob:           per(before.Commits, after.Commits),
		Table:                   sys.table,
		UpdatesPerJob:           harness.Round3(float64(updates) / n),
		HOTUpdatesPerJob:        harness.Round3(float64(hot) / n),
		IndexEntriesPerJob:      entries,
		IndexEntriesNotMeasured: entriesNotMeasured,
		Indexes:                 after.TableIndexes,
		PostgresCPUMsPerJob:     harness.Round3(harness.Millis(harness.CPUSince(cpuBefore.DB, cpuAfter.DB)) / n),
		HarnessBackends:         len(own),
		WorkerCPUMsPerJob:       harness.Round3(harness.Millis(harness.CPUSince(workersBefore, workersAfter)) / n),
	}
	if pooler != nil {
		run.Pooler = &pooler.Info
	}
	if seconds > 0 {
		run.JobsPerSec = harness.Round2(n / seconds)
	}
	if busy, steal, ok := machine.Over(sp.FirstClaim, sp.LastFinish); ok {
		run.MachineCPUBusy = harness.Round3(busy)
		run.MachineStealSec = harness.Round3(steal.Seconds())
		if busy > 0 && seconds > 0 {
			run.JobsPerBusySec = harness.Round2(n / seconds / busy)
		}
	}
	if a, ok := sessions.Over(sp.FirstClaim, sp.LastFinish); ok {
		run.Backends = &a
	}
	return run, env, nil
}

// workersCPU returns the CPU time each live worker process has used, by
// pid.
func workersCPU(workers []*harness.Proc) map[int]time.Duration {
	out := make(map[int]time.Duration, len(workers))
	for _, p := range workers {
		if d, ok := harness.ProcCPU(p.PID()); ok {
			out[p.PID()] = d
		}
	}
	return out
}

// WarmUpJobs is how many jobs the workers of a WorkersFirst burn-down
// run before the queue is filled, enqueued warmUpGap apart: many times
// the five executions of a statement on a connection after which
// PostgreSQL may keep a generic plan for it, spread over a worker's few
// connections.
const (
	WarmUpJobs = 200
	warmUpGap  = 5 * time.Millisecond
)

// warmUp enqueues WarmUpJobs jobs one at a time, waits until the workers
// have finished them, and deletes them.
func warmUp(ctx context.Context, d *harness.Database, sys system, procs *harness.Procs, prog *harness.Progress) error {
	prog.Note("warming the workers up with %d jobs, one at a time", WarmUpJobs)
	for range WarmUpJobs {
		if err := sys.fill(ctx, d, procs, 1, false); err != nil {
			return fmt.Errorf("warm-up: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(warmUpGap):
		}
	}
	if err := waitDrained(ctx, d.Lab, sys, procs, prog, WarmUpJobs); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	n, err := sys.forgetWarmUp(ctx, d.Lab)
	if err != nil {
		return fmt.Errorf("delete the warm-up jobs: %w", err)
	}
	if n != WarmUpJobs {
		return fmt.Errorf("deleted %d warm-up jobs, want %d", n, WarmUpJobs)
	}
	return nil
}

// fillCounted fills the queue with jobs jobs, as sys.fill does, and
// returns once the server's statistics count inserted inserts into the
// queue's table in all: the counters read next are the burn-down's
// baseline, and a fill reported after them would count in the burn-down.
// Relay's fill reports its statistics before it returns; River's, a
// process of its own, as its server process exits, which may be just
// after the fill's process has.
func fillCounted(ctx context.Context, d *harness.Database, sys system, procs *harness.Procs, jobs int, atOnce bool, inserted int64) error {
	if err := sys.fill(ctx, d, procs, jobs, atOnce); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	for {
		c, err := d.Lab.BurndownCounters(ctx, sys.table)
		if err != nil {
			return fmt.Errorf("read the counters after the fill: %w", err)
		}
		if c.TableInserted >= inserted {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the statistics counted %d inserts into %s after the fill, want %d: %w", c.TableInserted, sys.table, inserted, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// settleTimeout bounds the wait for the workers' sessions to end and
// report their statistics.
const settleTimeout = 30 * time.Second

// settledCounters returns the counters of table once the workers'
// sessions have ended and two reads a quarter of a second apart agree on
// this database's counters: a session reports its counts as it ends,
// after its process has gone. The WAL's counters are the whole server's,
// which other databases' work moves at any time, so they take no part in
// the agreement.
func settledCounters(ctx context.Context, q *labdb.Queries, table string) (labdb.BurndownCountersRow, error) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	var last labdb.BurndownCountersRow
	for first := true; ; first = false {
		n, err := q.BurndownOtherSessions(ctx, harness.ApplicationName)
		if err != nil {
			return last, fmt.Errorf("count the workers' sessions: %w", err)
		}
		c, err := q.BurndownCounters(ctx, table)
		if err != nil {
			return last, fmt.Errorf("read the counters: %w", err)
		}
		if n == 0 && !first && databaseCounters(c) == databaseCounters(last) {
			return c, nil
		}
		last = c
		select {
		case <-ctx.Done():
			return last, fmt.Errorf("the counters did not settle (%d other sessions left): %w", n, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// databaseCounters is c without the server's WAL counters.
func databaseCounters(c labdb.BurndownCountersRow) labdb.BurndownCountersRow {
	c.WalRecords, c.WalFpi, c.WalBytes = 0, 0, 0
	return c
}

// cpuTraceInterval is how often the machine's CPU time is sampled during
// a burn-down, for its busy share over the burn-down's own span.
const cpuTraceInterval = 100 * time.Millisecond

// sessionTraceInterval is how often the workers' sessions are sampled
// during a burn-down (ConfigRun.Backends). Each sample is a statement on
// the harness's own connection, whose backend the database's CPU per job
// leaves out (BurndownOwnBackends) and the machine's busy share does not.
const sessionTraceInterval = 20 * time.Millisecond

// drainPoll is how often waitDrained looks whether the queue is drained:
// a lookup that stops at the first job not yet finished, in an index.
const drainPoll = time.Second

// progressPoll is how often waitDrained counts the finished jobs, for the
// progress bar alone. The count reads the whole queue, in PostgreSQL's
// parallel workers once it is large: 88 ms over 100,000 jobs in the middle
// of a burn-down by one process of 64 slots, 218 ms by 16 processes of 4
// (docs/experiments.md, "Where a small process's time goes"). The span
// measured runs from the first claim to the last finish on the database's
// clock, so counting seldom costs the figures nothing.
const progressPoll = 10 * time.Second

// waitDrained polls the queue until every job has finished, and fails as
// soon as a worker of procs exits. jobs is how many the progress bar
// counts to.
func waitDrained(ctx context.Context, q *labdb.Queries, sys system, procs *harness.Procs, prog *harness.Progress, jobs int) error {
	tick := time.NewTicker(drainPoll)
	defer tick.Stop()
	counted := time.Now()
	for {
		drained, err := sys.drained(ctx, q)
		if err != nil {
			return fmt.Errorf("look whether the queue is drained: %w", err)
		}
		if drained {
			prog.Update(jobs, "")
			return nil
		}
		if err := procs.CheckRunning("during the burn-down"); err != nil {
			return err
		}
		if time.Since(counted) >= progressPoll {
			finished, err := sys.finished(ctx, q)
			if err != nil {
				return fmt.Errorf("read the progress: %w", err)
			}
			prog.Update(int(finished), "")
			counted = time.Now()
		}
		select {
		case <-ctx.Done():
			countCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if finished, err := sys.finished(countCtx, q); err == nil {
				return fmt.Errorf("%d of %d jobs finished: %w", finished, jobs, ctx.Err())
			}
			return fmt.Errorf("waiting for %d jobs to finish: %w", jobs, ctx.Err())
		case <-tick.C:
		}
	}
}

// WriteSummary prints the result as a table, then Relay's throughput
// beside River's, round by round and, over several rounds, their medians.
func (r *Result) WriteSummary(w io.Writer) error {
	if slices.ContainsFunc(r.Runs, func(run ConfigRun) bool { return run.WorkersFirst }) {
		fmt.Fprintf(w, "The workers started on the empty queue and ran %d jobs, enqueued one at a time, before it was filled.\n", WarmUpJobs)
	}
	if i := slices.IndexFunc(r.Runs, func(run ConfigRun) bool { return run.Pooler != nil }); i >= 0 {
		p := r.Runs[i].Pooler
		fmt.Fprintf(w, "The workers' pools went through PgBouncer %s in %s mode with %d server connections; each worker's session went to the server itself.\n", p.Version, p.PoolMode, p.PoolSize)
	}
	tw := harness.NewTable(w)
	fmt.Fprintf(tw, "round\tsystem\tconfig\tjobs\tseconds\tjobs/s\tWAL bytes/job\tWAL records/job\tFPI/job\tcommits/job\tupdates/job\tHOT/job\tindex entries/job\tPG CPU ms/job\tworker CPU ms/job\tCPU busy\tjobs/busy s\tsteal s\tsessions mean/max\tbackends running\tWAL waits\tother waits\tall once\n")
	for _, run := range r.Runs {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%.2f\t%.0f\t%.0f\t%.2f\t%.3f\t%.2f\t%.2f\t%.2f\t%s\t%.3f\t%.3f\t%.0f%%\t%.0f\t%.2f\t%s\t%s\t%s\t%s\t%v\n",
			run.Round, run.System, run.Config, run.Jobs, run.Seconds, run.JobsPerSec, run.WALBytesPerJob, run.WALRecordsPerJob, run.WALFPIPerJob,
			run.CommitsPerJob, run.UpdatesPerJob, run.HOTUpdatesPerJob, optional(run.IndexEntriesPerJob), run.PostgresCPUMsPerJob, run.WorkerCPUMsPerJob,
			100*run.MachineCPUBusy, run.JobsPerBusySec, run.MachineStealSec, sessionCounts(run.Backends), backends(run.Backends, isRunning),
			backends(run.Backends, harness.IsWALWait), backends(run.Backends, isOtherWait), run.OK)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Comparisons) > 0 {
		fmt.Fprintf(w, "\nRelay beside River %s (%s):\n", r.River.Version, r.River.settings())
		tw := harness.NewTable(w)
		fmt.Fprintf(tw, "round\tconfig\trelay jobs/s\triver jobs/s\trelay/river\tper busy s\n")
		for _, c := range r.Comparisons {
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%.0f\t%.2f\t%.2f\n", c.Round, c.Config, c.RelayJobsPerSec, c.RiverJobsPerSec, c.Ratio, c.BusyRatio)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if r.Rounds > 1 && len(r.Ratios) > 0 {
		fmt.Fprintf(w, "\nRelay/River over %d rounds:\n", r.Rounds)
		tw := harness.NewTable(w)
		fmt.Fprintf(tw, "config\tmedian\tmin\tmax\tper busy s, median\n")
		for _, s := range r.Ratios {
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t%.2f\n", s.Config, s.Median, s.Min, s.Max, s.BusyMedian)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	for _, f := range r.Files {
		fmt.Fprintf(w, "wrote %s\n", f)
	}
	return nil
}

// backends formats the average number of sessions in the activities for
// which match is true, "-" where the sessions were not sampled.
func backends(a *harness.SessionActivity, match func(activity string) bool) string {
	if a == nil {
		return "-"
	}
	return strconv.FormatFloat(a.Sum(match), 'f', 2, 64)
}

// sessionCounts formats the mean and the most sessions of the workers
// connected at once, "-" where the sessions were not sampled.
func sessionCounts(a *harness.SessionActivity) string {
	if a == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f/%d", a.Sessions, a.MaxSessions)
}

// isRunning and isOtherWait sort the activities of a burn-down's
// sessions for its summary: running, waiting for the WAL
// (harness.IsWALWait), or held up by anything else but their client.
func isRunning(activity string) bool { return activity == harness.ActivityRunning }

func isOtherWait(activity string) bool {
	return activity != harness.ActivityRunning && activity != harness.ActivityIdle && !harness.IsWALWait(activity)
}

// optional formats a figure that may not have been measured.
func optional(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 2, 64)
}

// settings says how River was set up, in one line.
func (i *RiverInfo) settings() string {
	s := fmt.Sprintf("FetchCooldown %s, FetchPollInterval %s, %d connections per process", i.FetchCooldown, i.FetchPollInterval, i.MaxConns)
	if len(i.WorkArgs) > 0 {
		s += ", work flags " + strings.Join(i.WorkArgs, " ")
	}
	return s
}
