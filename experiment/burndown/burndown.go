// Package burndown is the burn-down experiment: it pre-fills a queue with
// no-op jobs, then starts relay work processes on it and measures how fast
// they empty it, from the first claim to the last finish on the database's
// clock, and what that cost the server per job: WAL records and bytes,
// commits, writes to the jobs table (HOT or touching every index) and the
// CPU time of the database's backends. Run runs it; `relaylab burndown`
// is its command.
package burndown

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
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
	// each configuration. Default harness.DefaultAdminURL.
	AdminURL string
	// RelayBin is the relay binary that runs `work`. Required.
	RelayBin string
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
	// Progress receives progress lines. Nil: none.
	Progress io.Writer
}

func (c Config) withDefaults() (Config, error) {
	if c.RelayBin == "" {
		return c, fmt.Errorf("burndown: no relay binary given")
	}
	if c.AdminURL == "" {
		c.AdminURL = harness.DefaultAdminURL
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
	if c.Jobs < 1 || c.Timeout < 0 {
		return c, fmt.Errorf("burndown: jobs must be at least 1 and the timeout positive, got %d and %s", c.Jobs, c.Timeout)
	}
	return c, nil
}

// Result is the record of one burn-down: its settings, the environment and
// one ConfigRun per configuration.
type Result struct {
	Experiment  string              `json:"experiment"`
	Environment harness.Environment `json:"environment"`
	Jobs        int                 `json:"jobs"`
	JobKind     string              `json:"job_kind"`
	Configs     []string            `json:"configs"`
	Runs        []ConfigRun         `json:"runs"`
	Files       []string            `json:"files,omitempty"`
}

// ConfigRun is one configuration's burn-down. Per-job figures divide a counter's
// growth over the burn-down (from the workers' start to their exit) by
// Jobs.
type ConfigRun struct {
	Config string `json:"config"`
	Procs  int    `json:"procs"`
	Slots  int    `json:"slots"`
	Jobs   int    `json:"jobs"`
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
	// Writes to the jobs table: every update, those that were HOT (no
	// index entry), and the index entries the others wrote (one in each of
	// the table's JobsIndexes indexes).
	UpdatesPerJob      float64 `json:"jobs_updates_per_job"`
	HOTUpdatesPerJob   float64 `json:"jobs_hot_updates_per_job"`
	IndexEntriesPerJob float64 `json:"index_entries_per_job"`
	JobsIndexes        int64   `json:"jobs_indexes"`
	// PostgresCPUMsPerJob is the CPU time of this database's backends, read
	// from /proc: zero when the server is not on this host.
	PostgresCPUMsPerJob float64 `json:"postgres_cpu_ms_per_job"`
}

// Run burns down cfg.Jobs no-op jobs at each configuration, each on a
// database of its own, and writes the result under cfg.OutDir.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	logDir, cleanLogs, err := harness.LogDirFor(cfg.LogDir, "relay-burndown-logs-")
	if err != nil {
		return nil, err
	}
	defer cleanLogs()
	res := &Result{Experiment: "burndown", Jobs: cfg.Jobs, JobKind: builtin.KindNoop}
	for i, pc := range cfg.Configs {
		res.Configs = append(res.Configs, pc.String())
		run, env, err := runConfig(ctx, cfg, pc, logDir)
		if err != nil {
			return nil, fmt.Errorf("configuration %s: %w", pc, err)
		}
		if i == 0 {
			res.Environment = env
		}
		res.Runs = append(res.Runs, *run)
	}
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

// runConfig burns down one configuration on a database of its own.
func runConfig(ctx context.Context, cfg Config, pc harness.ProcSlots, logDir string) (_ *ConfigRun, env harness.Environment, err error) {
	prog := harness.NewProgress(cfg.Progress, fmt.Sprintf("burndown %-6s", pc), cfg.Jobs)
	prog.Note("creating and migrating a database")
	d, err := harness.CreateDatabase(ctx, cfg.AdminURL, "relay_exp_burndown_")
	if err != nil {
		return nil, env, err
	}
	defer func() {
		dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), harness.DatabaseTimeout)
		defer cancel()
		if dropErr := d.Drop(dropCtx); dropErr != nil && err == nil {
			err = dropErr
		}
	}()
	env = harness.CollectEnvironment(ctx, d, cfg.RelayBin)

	prog.Note("inserting %d no-op jobs", cfg.Jobs)
	if err := harness.InsertJobs(ctx, d.Pool, harness.Job(queue, builtin.KindNoop, json.RawMessage(`{}`), 25), cfg.Jobs); err != nil {
		return nil, env, err
	}
	before, err := d.Lab.BurndownCounters(ctx)
	if err != nil {
		return nil, env, fmt.Errorf("read the counters: %w", err)
	}
	cpuBefore := harness.SamplePostgresCPU(d.Name)

	runCtx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	procs := harness.NewProcs(cfg.RelayBin, logDir, "DATABASE_URL="+d.URL)
	defer procs.KillAll()
	prog.Note("starting %d worker process(es) of %d slot(s)", pc.Procs, pc.Slots)
	for i := 1; i <= pc.Procs; i++ {
		id := fmt.Sprintf("burndown-%s-w%d", pc, i)
		if _, err := procs.Start(runCtx, id, "work", "--id", id, "--queue", queue,
			"--slots", strconv.Itoa(pc.Slots), "--log-format", "json"); err != nil {
			return nil, env, err
		}
	}
	if err := waitDrained(runCtx, d.Lab, procs, prog, cfg.Jobs); err != nil {
		return nil, env, err
	}
	// The backends' CPU is read while they still run; the counters once
	// the workers' sessions have ended and reported them.
	cpuAfter := harness.SamplePostgresCPU(d.Name)
	stopCtx, stop := context.WithTimeout(ctx, 2*stopGrace)
	defer stop()
	if err := procs.StopAll(stopCtx, stopGrace); err != nil {
		return nil, env, fmt.Errorf("stop the workers: %w", err)
	}
	after, err := settledCounters(ctx, d.Lab)
	if err != nil {
		return nil, env, err
	}
	span, err := d.Lab.BurndownSpan(ctx, queue)
	if err != nil {
		return nil, env, fmt.Errorf("read the burn-down's span: %w", err)
	}
	prog.Finish("done")

	n := float64(cfg.Jobs)
	per := func(a, b int64) float64 { return harness.Round3(float64(b-a) / n) }
	updates := after.JobsUpdated - before.JobsUpdated
	hot := after.JobsHotUpdated - before.JobsHotUpdated
	seconds := span.LastFinish.Sub(span.FirstClaim).Seconds()
	run := &ConfigRun{
		Config: pc.String(), Procs: pc.Procs, Slots: pc.Slots, Jobs: cfg.Jobs,
		Succeeded: span.Succeeded, Retried: span.Retried,
		OK:         span.Succeeded == int64(cfg.Jobs) && span.Retried == 0 && span.Total == int64(cfg.Jobs),
		FirstClaim: span.FirstClaim, LastFinish: span.LastFinish,
		Seconds:             harness.Round3(seconds),
		WALRecordsPerJob:    per(before.WalRecords, after.WalRecords),
		WALBytesPerJob:      per(before.WalBytes, after.WalBytes),
		WALFPIPerJob:        per(before.WalFpi, after.WalFpi),
		CommitsPerJob:       per(before.Commits, after.Commits),
		UpdatesPerJob:       harness.Round3(float64(updates) / n),
		HOTUpdatesPerJob:    harness.Round3(float64(hot) / n),
		IndexEntriesPerJob:  harness.Round3(float64((updates-hot)*after.JobsIndexes) / n),
		JobsIndexes:         after.JobsIndexes,
		PostgresCPUMsPerJob: harness.Round3(harness.Millis(harness.CPUSince(cpuBefore.DB, cpuAfter.DB)) / n),
	}
	if seconds > 0 {
		run.JobsPerSec = harness.Round2(n / seconds)
	}
	return run, env, nil
}

// settleTimeout bounds the wait for the workers' sessions to end and
// report their statistics.
const settleTimeout = 30 * time.Second

// settledCounters returns the counters once the workers' sessions have
// ended and two reads a quarter of a second apart agree: a session
// reports its counts as it ends, after its process has gone.
func settledCounters(ctx context.Context, q *labdb.Queries) (labdb.BurndownCountersRow, error) {
	ctx, cancel := context.WithTimeout(ctx, settleTimeout)
	defer cancel()
	var last labdb.BurndownCountersRow
	for first := true; ; first = false {
		n, err := q.BurndownOtherSessions(ctx, harness.ApplicationName)
		if err != nil {
			return last, fmt.Errorf("count the workers' sessions: %w", err)
		}
		c, err := q.BurndownCounters(ctx)
		if err != nil {
			return last, fmt.Errorf("read the counters: %w", err)
		}
		if n == 0 && !first && c == last {
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

// waitDrained polls the queue until every job has finished, and fails as
// soon as a worker of procs exits.
func waitDrained(ctx context.Context, q *labdb.Queries, procs *harness.Procs, prog *harness.Progress, jobs int) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		p, err := q.ExperimentQueueProgress(ctx, queue)
		if err != nil {
			return fmt.Errorf("read the progress: %w", err)
		}
		prog.Update(int(p.Finished), "")
		if p.Finished >= int64(jobs) {
			return nil
		}
		if err := procs.CheckRunning("during the burn-down"); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d of %d jobs finished: %w", p.Finished, jobs, ctx.Err())
		case <-tick.C:
		}
	}
}

// WriteSummary prints the result as a table.
func (r *Result) WriteSummary(w io.Writer) error {
	tw := harness.NewTable(w)
	fmt.Fprintf(tw, "config\tjobs\tseconds\tjobs/s\tWAL bytes/job\tWAL records/job\tFPI/job\tcommits/job\tupdates/job\tHOT/job\tindex entries/job\tPG CPU ms/job\tall once\n")
	for _, run := range r.Runs {
		fmt.Fprintf(tw, "%s\t%d\t%.2f\t%.0f\t%.0f\t%.2f\t%.3f\t%.2f\t%.2f\t%.2f\t%.2f\t%.3f\t%v\n",
			run.Config, run.Jobs, run.Seconds, run.JobsPerSec, run.WALBytesPerJob, run.WALRecordsPerJob, run.WALFPIPerJob,
			run.CommitsPerJob, run.UpdatesPerJob, run.HOTUpdatesPerJob, run.IndexEntriesPerJob, run.PostgresCPUMsPerJob, run.OK)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, f := range r.Files {
		fmt.Fprintf(w, "wrote %s\n", f)
	}
	return nil
}
