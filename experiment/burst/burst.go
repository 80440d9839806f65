package burst

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/builtin"
)

// DefaultConfigs are the reference study's configurations: one slot,
// four slots, twelve slots across three processes.
var DefaultConfigs = []harness.ProcSlots{{Procs: 1, Slots: 1}, {Procs: 1, Slots: 4}, {Procs: 3, Slots: 4}}

// Config configures the burst experiment. Zero fields take the
// defaults named in their comments.
type Config struct {
	// AdminURL is the PostgreSQL server on which a database is created for
	// each configuration. Default DefaultAdminURL.
	AdminURL string
	// RelayBin is the relay binary that runs `serve` and `work`. Required.
	RelayBin string
	// OutDir receives the results (JSON and SVG). Empty: nothing is written.
	OutDir string
	// LogDir receives the processes' logs. Empty: a temporary directory,
	// removed at the end.
	LogDir string
	// Jobs is how many jobs each configuration runs. Default 3000.
	Jobs int
	// Configs are the configurations, in order. Default DefaultConfigs.
	Configs []harness.ProcSlots
	// Workload is the hash payload of every job. Default sleep_ms 10,
	// iterations 1000.
	Workload *builtin.HashPayload
	// BatchSize is how many jobs each POST /v1/jobs/batch carries. Default
	// 100. At 1, each job is a POST /v1/jobs of its own, as a client that
	// does not batch (curl, say) sends it.
	BatchSize int
	// Submitters is how many clients submit batches at once. Default 4.
	Submitters int
	// Timeout bounds each configuration's run from the first submission.
	// Default four times its drain-time floor, plus a minute.
	Timeout time.Duration
	// KeepDatabases keeps each configuration's database instead of dropping it.
	KeepDatabases bool
	// ProbeSamples is how many samples each statement probe takes after a
	// configuration, how many jobs the worker trace follows at the end, and
	// how many samples the handler probe takes of each timing (at most 100).
	// Default 200; negative: no probes and no trace.
	ProbeSamples int
	// Progress receives the progress bar (stderr). Nil: none.
	Progress io.Writer
}

// DefaultConfig returns the defaults of the burst experiment: 3,000
// jobs of the default hash workload at each of DefaultConfigs,
// submitted in batches of 100 by 4 clients, with 200 probe samples.
func DefaultConfig() Config {
	return Config{
		AdminURL:     harness.DefaultAdminURL,
		Jobs:         3000,
		Configs:      DefaultConfigs,
		Workload:     &builtin.HashPayload{SleepMs: builtin.DefaultHashSleepMs, Iterations: builtin.DefaultHashIterations},
		BatchSize:    100,
		Submitters:   4,
		ProbeSamples: 200,
	}
}

func (c Config) withDefaults() (Config, error) {
	if c.RelayBin == "" {
		return c, errors.New("burst: no relay binary given")
	}
	d := DefaultConfig()
	c.AdminURL = cmp.Or(c.AdminURL, d.AdminURL)
	c.Jobs = cmp.Or(c.Jobs, d.Jobs)
	if len(c.Configs) == 0 {
		c.Configs = d.Configs
	}
	c.Workload = cmp.Or(c.Workload, d.Workload)
	c.BatchSize = cmp.Or(c.BatchSize, d.BatchSize)
	c.Submitters = cmp.Or(c.Submitters, d.Submitters)
	c.ProbeSamples = cmp.Or(c.ProbeSamples, d.ProbeSamples)
	switch {
	case c.Jobs < 1:
		return c, fmt.Errorf("burst: jobs must be at least 1, got %d", c.Jobs)
	case c.BatchSize < 1 || c.BatchSize > 1000:
		return c, fmt.Errorf("burst: batch size must be between 1 and 1000, got %d", c.BatchSize)
	case c.Submitters < 1:
		return c, fmt.Errorf("burst: submitters must be at least 1, got %d", c.Submitters)
	case c.Workload.SleepMs < 0 || c.Workload.Iterations < 0:
		return c, errors.New("burst: the workload must not be negative")
	}
	for _, pc := range c.Configs {
		if pc.Procs < 1 || pc.Slots < 1 {
			return c, fmt.Errorf("burst: invalid configuration %s", pc)
		}
	}
	return c, nil
}

// Settings records the settings of a burst run.
type Settings struct {
	Jobs       int                 `json:"jobs"`
	Configs    []string            `json:"configs"`
	JobKind    string              `json:"job_kind"`
	Workload   builtin.HashPayload `json:"workload"`
	Submission string              `json:"submission"`
	BatchSize  int                 `json:"batch_size"`
	Submitters int                 `json:"submitters"`
	// WorkerFlags are the flags of every `relay work` process beyond
	// --id, --queue, --slots and --log-format: none, the defaults.
	WorkerFlags []string `json:"worker_flags"`
}

// Check accounts for every job of a configuration.
type Check struct {
	// Submitted is how many job ids the API returned (distinct).
	Submitted int `json:"submitted"`
	// InDatabase is how many jobs the queue holds.
	InDatabase int `json:"in_database"`
	// Lost counts submitted ids missing from the database.
	Lost int `json:"lost"`
	// Running, NotSucceeded: jobs left running, and jobs that ended in
	// any state but succeeded.
	Running      int `json:"running"`
	NotSucceeded int `json:"not_succeeded"`
	// NotOnce counts jobs that did not succeed exactly once: attempt other
	// than 1, an error history, no result, or a result from another attempt.
	NotOnce int `json:"not_once"`
	// OK: every job accounted for and succeeded exactly once.
	OK bool `json:"ok"`
}

// JobTiming is one job's timestamps, in milliseconds from the
// configuration's first submission (database clock). In JSON it is the
// array [id, created, started, finished], to keep thousands of them short.
type JobTiming struct {
	ID       int64
	Created  float64
	Started  float64
	Finished float64
}

// MarshalJSON encodes t as [id, created, started, finished].
func (t JobTiming) MarshalJSON() ([]byte, error) {
	return json.Marshal([4]float64{float64(t.ID), t.Created, t.Started, t.Finished})
}

// UnmarshalJSON decodes [id, created, started, finished].
func (t *JobTiming) UnmarshalJSON(b []byte) error {
	var a [4]float64
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	*t = JobTiming{ID: int64(a[0]), Created: a[1], Started: a[2], Finished: a[3]}
	return nil
}

// ConfigRun is the record of one configuration.
type ConfigRun struct {
	Config     string `json:"config"`
	Procs      int    `json:"procs"`
	Slots      int    `json:"slots_per_proc"`
	TotalSlots int    `json:"total_slots"`
	Jobs       int    `json:"jobs"`
	Database   string `json:"database"`

	// Database-clock instants: the read just before the first request,
	// the read after the last response, the first claim, the last finish.
	FirstSubmit time.Time `json:"first_submit"`
	SubmitDone  time.Time `json:"submit_done"`
	FirstStart  time.Time `json:"first_start"`
	LastFinish  time.Time `json:"last_finish"`

	SubmitSeconds float64 `json:"submit_seconds"`
	// SubmitRate is jobs per second of submission through the API.
	SubmitRate float64 `json:"submit_rate"`
	// DrainSeconds is last finish − first submit.
	DrainSeconds float64 `json:"drain_seconds"`
	// Throughput is the jobs that finished (those of JobTimings) over
	// DrainSeconds.
	Throughput float64 `json:"throughput"`
	// Bound is TotalSlots / the workload's sleep: what the slots could do
	// if each job took exactly its sleep and nothing else.
	Bound float64 `json:"bound"`
	// Efficiency is Throughput / Bound.
	Efficiency float64 `json:"efficiency"`
	// Reference is the reference study's throughput for this
	// configuration, if it had one.
	Reference float64 `json:"reference,omitempty"`

	QueueWait  harness.Percentiles `json:"queue_wait"`
	Completion harness.Percentiles `json:"completion"`
	// CompletionP95FloorMs is the least completion p95 possible: the time
	// the slots need to run 95% of the jobs at exactly their sleep each,
	// all submitted at once. P95OverFloor is the measured p95 over it.
	CompletionP95FloorMs float64 `json:"completion_p95_floor_ms"`
	P95OverFloor         float64 `json:"p95_over_floor"`

	// Where the time went. StartupMs is first claim − first submit.
	// ServiceMsPerJob is how long each job held its slot on average, from
	// first claim to last finish: TotalSlots·(last finish − first start)
	// over the jobs that finished.
	// OverheadMsPerJob is ServiceMsPerJob minus the sleep.
	// SlotUtilization is Σ(finished − started) / (TotalSlots·(last finish −
	// first start)): below 1, slots stood idle without a job. A slot waiting
	// for its acknowledgement still holds its job in the database (the
	// statement that finishes one job claims the next), so this does not
	// show that wait: the worker trace does.
	// ClaimStatements and CompleteStatements count the statements that
	// claimed and that completed the jobs (distinct worker and database
	// timestamp: every statement has its own now()); JobsPerClaim and
	// JobsPerCompletion are the jobs that finished over them: how much the
	// workers batch.
	ClaimStatements    int     `json:"claim_statements"`
	CompleteStatements int     `json:"complete_statements"`
	JobsPerClaim       float64 `json:"jobs_per_claim_statement"`
	JobsPerCompletion  float64 `json:"jobs_per_complete_statement"`
	StartupMs          float64 `json:"startup_ms"`
	ServiceMsPerJob    float64 `json:"service_ms_per_job"`
	OverheadMsPerJob   float64 `json:"overhead_ms_per_job"`
	SlotUtilization    float64 `json:"slot_utilization"`
	// CPU during the run, from first submit to last finish: the machine's
	// busy share and busy CPU seconds, and the CPU seconds of this
	// database's PostgreSQL backends, of the server's background processes
	// (WAL writer, checkpointer...), of the relay processes and of this
	// experiment. OtherCPUSec is the rest of the machine's busy time: other
	// databases' backends and other programs, load that is not the
	// experiment's; PostgresOtherCPUSec is its PostgreSQL part.
	// MachineStealSec is CPU time the hypervisor gave to other machines
	// while this one had work to run: it is in none of the others.
	MachineCPUBusy      float64        `json:"machine_cpu_busy,omitempty"`
	MachineCPUSec       float64        `json:"machine_cpu_busy_seconds,omitempty"`
	MachineStealSec     float64        `json:"machine_cpu_steal_seconds,omitempty"`
	PostgresCPUSec      float64        `json:"postgres_backends_cpu_seconds,omitempty"`
	PostgresServerCPU   float64        `json:"postgres_server_cpu_seconds,omitempty"`
	PostgresOtherCPUSec float64        `json:"postgres_other_databases_cpu_seconds,omitempty"`
	OtherCPUSec         float64        `json:"other_cpu_seconds,omitempty"`
	WorkersCPUSec       float64        `json:"workers_cpu_seconds,omitempty"`
	ServeCPUSec         float64        `json:"serve_cpu_seconds,omitempty"`
	ExperimentCPUSec    float64        `json:"experiment_cpu_seconds,omitempty"`
	JobsPerWorker       map[string]int `json:"jobs_per_worker"`
	// ServiceInterval is, with one slot in all, the distribution of the
	// time between two consecutive claims: one job's whole cycle.
	ServiceInterval *harness.Percentiles `json:"service_interval,omitempty"`
	// Probe times the worker's statements in this database once the run is
	// over and the processes are stopped.
	Probe *StatementProbe `json:"statement_probe,omitempty"`
	Check Check           `json:"check"`
	// JobTimings holds every job that started and finished, as [id,
	// created, started, finished] in milliseconds from FirstSubmit, ordered
	// by id. Jobs left unfinished are in Check, not here.
	JobTimings []JobTiming `json:"job_timings"`
}

// HandlerProbe times the hash handler in the experiment's process.
type HandlerProbe struct {
	// Handler is the whole handler with the configured workload.
	Handler harness.Percentiles `json:"handler"`
	// HashOnly is the same handler without its sleep: the CPU part.
	HashOnly harness.Percentiles `json:"hash_only"`
}

// Result is the record of a burst run, as written to its JSON file.
type Result struct {
	Experiment  string              `json:"experiment"`
	Environment harness.Environment `json:"environment"`
	Settings    Settings            `json:"settings"`
	Runs        []ConfigRun         `json:"runs"`
	// Probe times the handler alone, for the breakdown of overheads.
	Probe *HandlerProbe `json:"handler_probe,omitempty"`
	// WorkerTrace follows a one-slot worker in the experiment's process.
	WorkerTrace *WorkerTrace `json:"worker_trace,omitempty"`
	// ReferenceOneSlotP95Ms is the reference study's one-slot completion p95.
	ReferenceOneSlotP95Ms float64 `json:"reference_one_slot_p95_ms"`
	// TargetEfficiency is the efficiency every configuration should reach.
	TargetEfficiency float64 `json:"target_efficiency"`
	// Files lists the files this run wrote.
	Files []string `json:"files"`
}

// The reference study's throughputs, by configuration, and its one-slot p95.
var studyThroughput = map[string]float64{"1x1": 62, "1x4": 255, "3x4": 862}

const (
	referenceP95Ms    = 44000
	targetEfficiency  = 0.95
	jobQueue          = "burst"
	progressEvery     = 250 * time.Millisecond
	stopGrace         = 10 * time.Second
	startupTimeout    = 30 * time.Second
	requestTimeout    = time.Minute
	probeQueue        = "probe"
	handlerProbeLimit = 100
)

// Run runs the burst experiment: for each configuration, on a fresh
// database, it starts `relay serve` and the `relay work` processes, waits
// until the workers are registered and idle, submits the jobs through the
// API's batch endpoint from several concurrent clients, waits for the
// queue to drain, and measures throughput and latencies from the database
// timestamps, checking that every job succeeded exactly once. It then
// probes the latency of the worker's complete-and-claim statement and of
// the handler alone, writes the results to cfg.OutDir and returns them. A
// configuration whose jobs fail the check is recorded (Check.OK false),
// not returned as an error: errors are for runs that could not be carried
// out.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	logDir, cleanLogs, err := harness.LogDirFor(cfg.LogDir, "relay-burst-logs-")
	if err != nil {
		return nil, err
	}
	defer cleanLogs()

	res := &Result{
		Experiment: "burst",
		Settings: Settings{
			Jobs:        cfg.Jobs,
			JobKind:     builtin.KindHash,
			Workload:    *cfg.Workload,
			Submission:  submission(cfg),
			BatchSize:   cfg.BatchSize,
			Submitters:  cfg.Submitters,
			WorkerFlags: []string{},
		},
		ReferenceOneSlotP95Ms: referenceP95Ms,
		TargetEfficiency:      targetEfficiency,
	}
	for _, pc := range cfg.Configs {
		res.Settings.Configs = append(res.Settings.Configs, pc.String())
	}
	for i, pc := range cfg.Configs {
		run, env, err := runConfig(ctx, cfg, pc, logDir)
		if err != nil {
			return nil, fmt.Errorf("configuration %s: %w", pc, err)
		}
		if i == 0 {
			res.Environment = env
		}
		res.Runs = append(res.Runs, *run)
	}
	if cfg.ProbeSamples > 0 {
		p := probeHandler(ctx, *cfg.Workload, min(cfg.ProbeSamples, handlerProbeLimit))
		res.Probe = &p
		prog := harness.NewProgress(cfg.Progress, "burst trace", 0)
		prog.Note("following a one-slot worker in this process through %d jobs", cfg.ProbeSamples)
		if res.WorkerTrace, err = traceWorker(ctx, cfg.AdminURL, *cfg.Workload, cfg.ProbeSamples); err != nil {
			return nil, err
		}
		prog.Finish("done")
	}
	res.Environment.LoadAverageEnd = harness.LoadAverage()
	if cfg.OutDir != "" {
		if err := res.write(cfg.OutDir); err != nil {
			return res, err
		}
	}
	return res, nil
}

// runConfig runs one configuration on a database of its own, and returns
// its record and the environment it ran in, read as it started.
func runConfig(ctx context.Context, cfg Config, pc harness.ProcSlots, logDir string) (_ *ConfigRun, env harness.Environment, err error) {
	prog := harness.NewProgress(cfg.Progress, fmt.Sprintf("burst %-5s", pc), cfg.Jobs)
	prog.Note("creating and migrating a database")
	d, err := harness.CreateDatabase(ctx, cfg.AdminURL, "relay_exp_burst_")
	if err != nil {
		return nil, env, err
	}
	defer func() {
		if cfg.KeepDatabases {
			d.Pool.Close()
			return
		}
		d.DropAtEnd(ctx, &err)
	}()
	env = harness.CollectEnvironment(ctx, d, cfg.RelayBin)

	procs := harness.NewProcs(cfg.RelayBin, logDir, "DATABASE_URL="+d.URL)
	defer procs.KillAll()
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*stopGrace)
		defer cancel()
		_ = procs.StopAll(stopCtx, stopGrace)
	}()

	prog.Note("starting relay serve and %d worker process(es) of %d slot(s)", pc.Procs, pc.Slots)
	startCtx, cancel := context.WithTimeout(ctx, startupTimeout)
	defer cancel()
	serve, base, err := harness.StartServe(startCtx, procs, "burst-"+pc.String()+"-serve")
	if err != nil {
		return nil, env, err
	}
	var workers []*harness.Proc
	var ids []string
	for i := 1; i <= pc.Procs; i++ {
		id := fmt.Sprintf("burst-%s-w%d", pc, i)
		p, err := procs.Start(startCtx, id, "work", "--id", id, "--queue", jobQueue,
			"--slots", strconv.Itoa(pc.Slots), "--log-format", "json")
		if err != nil {
			return nil, env, err
		}
		workers = append(workers, p)
		ids = append(ids, id)
	}
	if err := harness.WaitWorkers(startCtx, d.Q, procs, ids...); err != nil {
		return nil, env, err
	}
	cancel()

	bodies, err := batchBodies(cfg)
	if err != nil {
		return nil, env, err
	}
	timeout := cfg.Timeout
	if timeout == 0 {
		floor := slotsFloor(cfg.Jobs, pc.TotalSlots(), time.Duration(cfg.Workload.SleepMs)*time.Millisecond)
		timeout = 4*floor + time.Minute
	}
	runCtx, cancelRun := context.WithTimeout(ctx, timeout)
	defer cancelRun()

	run := &ConfigRun{
		Config: pc.String(), Procs: pc.Procs, Slots: pc.Slots, TotalSlots: pc.TotalSlots(),
		Jobs: cfg.Jobs, Database: d.Name, Reference: studyThroughput[pc.String()],
		JobsPerWorker: map[string]int{},
	}
	if cfg.KeepDatabases {
		run.Database += " (kept)"
	}

	cpuBefore, cpuOK := harness.ReadCPU()
	pgBefore := harness.SamplePostgresCPU(d.Name)
	relayBefore := map[*harness.Proc]time.Duration{}
	for _, p := range procs.List() {
		relayBefore[p], _ = harness.ProcCPU(p.PID())
	}
	selfBefore, _ := harness.ProcCPU(os.Getpid())

	// The bar's clock starts with the submission.
	prog.Restart()
	if run.FirstSubmit, err = d.Now(runCtx); err != nil {
		return nil, env, err
	}
	type submitResult struct {
		ids []int64
		err error
	}
	submitted := make(chan submitResult, 1)
	go func() {
		ids, err := submit(runCtx, base, bodies, cfg.Submitters, cfg.BatchSize == 1)
		submitted <- submitResult{ids, err}
	}()

	// Watch the queue drain, and the processes stay up.
	var jobIDs []int64
	submitting := true
	tick := time.NewTicker(progressEvery)
	defer tick.Stop()
	for {
		select {
		case s := <-submitted:
			if s.err != nil {
				return nil, env, fmt.Errorf("submit: %w", s.err)
			}
			jobIDs = s.ids
			submitting = false
			if run.SubmitDone, err = d.Now(runCtx); err != nil {
				return nil, env, err
			}
			continue
		case <-tick.C:
		case <-runCtx.Done():
			return nil, env, fmt.Errorf("jobs not drained within %s: %w", timeout, runCtx.Err())
		}
		if err := procs.CheckRunning("during the run"); err != nil {
			return nil, env, err
		}
		pctx, cancel := context.WithTimeout(runCtx, 5*time.Second)
		p, err := d.Lab.ExperimentQueueProgress(pctx, jobQueue)
		cancel()
		if err != nil {
			return nil, env, fmt.Errorf("progress: %w", err)
		}
		note := fmt.Sprintf("running %d", p.Running)
		if submitting {
			note += fmt.Sprintf(", %d submitted so far", p.Total)
		}
		prog.Update(int(p.Finished), note)
		if !submitting && int(p.Finished) >= cfg.Jobs && p.Running == 0 {
			break
		}
	}

	// CPU used during the run, before anything stops.
	pgAfter := harness.SamplePostgresCPU(d.Name)
	if cpuOK {
		if after, ok := harness.ReadCPU(); ok {
			run.MachineCPUBusy = harness.Round3(cpuBefore.Utilization(after))
			run.MachineCPUSec = harness.Round3((after.Busy - cpuBefore.Busy).Seconds())
			run.MachineStealSec = harness.Round3((after.Steal - cpuBefore.Steal).Seconds())
		}
	}
	run.PostgresCPUSec = harness.Round3(harness.CPUSince(pgBefore.DB, pgAfter.DB).Seconds())
	run.PostgresServerCPU = harness.Round3(harness.CPUSince(pgBefore.Server, pgAfter.Server).Seconds())
	run.PostgresOtherCPUSec = harness.Round3(harness.CPUSince(pgBefore.Other, pgAfter.Other).Seconds())
	for _, p := range procs.List() {
		if cpu, ok := harness.ProcCPU(p.PID()); ok {
			used := (cpu - relayBefore[p]).Seconds()
			if p == serve {
				run.ServeCPUSec = harness.Round3(run.ServeCPUSec + used)
			} else {
				run.WorkersCPUSec = harness.Round3(run.WorkersCPUSec + used)
			}
		}
	}
	if self, ok := harness.ProcCPU(os.Getpid()); ok {
		run.ExperimentCPUSec = harness.Round3((self - selfBefore).Seconds())
	}
	if run.MachineCPUSec > 0 {
		run.OtherCPUSec = harness.Round3(max(0, run.MachineCPUSec-run.PostgresCPUSec-run.PostgresServerCPU-
			run.WorkersCPUSec-run.ServeCPUSec-run.ExperimentCPUSec))
	}

	readCtx, cancelRead := context.WithTimeout(ctx, time.Minute)
	defer cancelRead()
	rows, err := d.Lab.ExperimentJobTimes(readCtx, jobQueue)
	if err != nil {
		return nil, env, fmt.Errorf("read job timestamps: %w", err)
	}
	analyze(run, cfg, rows, jobIDs)
	prog.Finish("%d jobs in %.2fs: %.0f jobs/s of a %.0f bound (efficiency %.3f), completion p95 %.0f ms; all once: %v",
		cfg.Jobs, run.DrainSeconds, run.Throughput, run.Bound, run.Efficiency, run.Completion.P95, run.Check.OK)

	// Probe the statements once the workers are gone, so that the probe
	// has the database to itself.
	stopCtx, cancelStop := context.WithTimeout(ctx, 2*stopGrace)
	defer cancelStop()
	if err := procs.StopAll(stopCtx, stopGrace); err != nil {
		return nil, env, fmt.Errorf("stop processes: %w", err)
	}
	if cfg.ProbeSamples > 0 {
		probe, err := probeStatements(ctx, d, cfg.ProbeSamples, time.Duration(cfg.Workload.SleepMs)*time.Millisecond)
		if err != nil {
			return nil, env, err
		}
		run.Probe = probe
	}
	return run, env, nil
}

// submission describes how the jobs are submitted, for the result.
func submission(cfg Config) string {
	if cfg.BatchSize == 1 {
		return fmt.Sprintf("POST /v1/jobs of one job each from %d concurrent HTTP clients (keep-alive), all at once", cfg.Submitters)
	}
	return fmt.Sprintf("POST /v1/jobs/batch of %d jobs from %d concurrent HTTP clients (keep-alive), all at once",
		cfg.BatchSize, cfg.Submitters)
}

// batchBodies encodes the request bodies of the whole burst: batches of
// cfg.BatchSize jobs, or single jobs when it is 1.
func batchBodies(cfg Config) ([][]byte, error) {
	payload, err := json.Marshal(cfg.Workload)
	if err != nil {
		return nil, fmt.Errorf("encode workload: %w", err)
	}
	type jobReq struct {
		Kind    string          `json:"kind"`
		Queue   string          `json:"queue"`
		Payload json.RawMessage `json:"payload"`
	}
	var bodies [][]byte
	for start := 0; start < cfg.Jobs; start += cfg.BatchSize {
		n := min(cfg.BatchSize, cfg.Jobs-start)
		batch := struct {
			Jobs []jobReq `json:"jobs"`
		}{Jobs: make([]jobReq, n)}
		for i := range batch.Jobs {
			batch.Jobs[i] = jobReq{Kind: builtin.KindHash, Queue: jobQueue, Payload: payload}
		}
		var b []byte
		if n == 1 && cfg.BatchSize == 1 {
			b, err = json.Marshal(batch.Jobs[0])
		} else {
			b, err = json.Marshal(batch)
		}
		if err != nil {
			return nil, fmt.Errorf("encode batch: %w", err)
		}
		bodies = append(bodies, b)
	}
	return bodies, nil
}

// submit posts every body from submitters concurrent clients, to
// base/v1/jobs/batch, or to base/v1/jobs when each body is one job
// (single), and returns the job ids the API gave back.
func submit(ctx context.Context, base string, bodies [][]byte, submitters int, single bool) ([]int64, error) {
	client := &http.Client{
		Timeout:   requestTimeout,
		Transport: &http.Transport{MaxIdleConnsPerHost: submitters, MaxConnsPerHost: submitters},
	}
	defer client.CloseIdleConnections()
	next := make(chan []byte, len(bodies))
	for _, b := range bodies {
		next <- b
	}
	close(next)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu   sync.Mutex
		ids  []int64
		errs []error
		wg   sync.WaitGroup
	)
	for range submitters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for body := range next {
				got, err := post(ctx, client, base, body, single)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
					mu.Unlock()
					cancel()
					return
				}
				ids = append(ids, got...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		return ids, errs[0]
	}
	return ids, nil
}

// post posts one body to base/v1/jobs/batch, or to base/v1/jobs if single,
// and returns the ids of the jobs it created.
func post(ctx context.Context, client *http.Client, base string, body []byte, single bool) ([]int64, error) {
	route := "/v1/jobs/batch"
	if single {
		route = "/v1/jobs"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+route, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", route, err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", route, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, fmt.Errorf("POST %s: read response: %w", route, err)
	}
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("POST %s: %s: %s", route, resp.Status, bytes.TrimSpace(b))
	}
	var out struct {
		ID  int64   `json:"id"`
		IDs []int64 `json:"ids"`
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("POST %s: decode response: %w", route, err)
	}
	if single {
		return []int64{out.ID}, nil
	}
	return out.IDs, nil
}

// analyze fills run's figures and checks from the jobs' rows.
func analyze(run *ConfigRun, cfg Config, rows []labdb.ExperimentJobTimesRow, submitted []int64) {
	sleep := time.Duration(cfg.Workload.SleepMs) * time.Millisecond
	chk := &run.Check
	seen := map[int64]bool{}
	for _, id := range submitted {
		seen[id] = false
	}
	chk.Submitted = len(seen)
	chk.InDatabase = len(rows)

	var wait, completion []float64
	var busy time.Duration
	type stmtKey struct {
		worker string
		at     time.Time
	}
	claims, completes := map[stmtKey]bool{}, map[stmtKey]bool{}
	for _, r := range rows {
		if _, ok := seen[r.ID]; ok {
			seen[r.ID] = true
		}
		switch {
		case r.State == labdb.JobStateRunning:
			chk.Running++
		case r.State != labdb.JobStateSucceeded:
			chk.NotSucceeded++
		}
		if r.State == labdb.JobStateSucceeded && (r.Attempt != 1 || r.ErrorCount != 0 || !r.HasResult || r.ResultAttempt != 1) {
			chk.NotOnce++
		}
		if r.ResultWorker != "" {
			run.JobsPerWorker[r.ResultWorker]++
		}
		if r.StartedAt == nil || r.FinishedAt == nil {
			continue
		}
		if run.FirstStart.IsZero() || r.StartedAt.Before(run.FirstStart) {
			run.FirstStart = *r.StartedAt
		}
		if r.FinishedAt.After(run.LastFinish) {
			run.LastFinish = *r.FinishedAt
		}
		busy += r.FinishedAt.Sub(*r.StartedAt)
		claims[stmtKey{r.ResultWorker, r.StartedAt.UTC()}] = true
		completes[stmtKey{r.ResultWorker, r.FinishedAt.UTC()}] = true
		wait = append(wait, harness.Millis(r.StartedAt.Sub(r.CreatedAt)))
		completion = append(completion, harness.Millis(r.FinishedAt.Sub(r.CreatedAt)))
		run.JobTimings = append(run.JobTimings, JobTiming{
			ID:       r.ID,
			Created:  harness.Round2(harness.Millis(r.CreatedAt.Sub(run.FirstSubmit))),
			Started:  harness.Round2(harness.Millis(r.StartedAt.Sub(run.FirstSubmit))),
			Finished: harness.Round2(harness.Millis(r.FinishedAt.Sub(run.FirstSubmit))),
		})
	}
	for _, found := range seen {
		if !found {
			chk.Lost++
		}
	}
	chk.OK = chk.Submitted == cfg.Jobs && chk.InDatabase == cfg.Jobs && chk.Lost == 0 &&
		chk.Running == 0 && chk.NotSucceeded == 0 && chk.NotOnce == 0

	run.SubmitSeconds = harness.Round3(run.SubmitDone.Sub(run.FirstSubmit).Seconds())
	if run.SubmitSeconds > 0 {
		run.SubmitRate = math.Round(float64(cfg.Jobs) / run.SubmitDone.Sub(run.FirstSubmit).Seconds())
	}
	finished := len(run.JobTimings)
	drain := run.LastFinish.Sub(run.FirstSubmit)
	run.DrainSeconds = harness.Round3(drain.Seconds())
	if drain > 0 {
		run.Throughput = harness.Round3(float64(finished) / drain.Seconds())
	}
	if sleep > 0 {
		run.Bound = harness.Round3(float64(run.TotalSlots) / sleep.Seconds())
		run.Efficiency = harness.Round3(run.Throughput / run.Bound)
	}
	run.ClaimStatements, run.CompleteStatements = len(claims), len(completes)
	if len(claims) > 0 && len(completes) > 0 {
		run.JobsPerClaim = harness.Round3(float64(finished) / float64(len(claims)))
		run.JobsPerCompletion = harness.Round3(float64(finished) / float64(len(completes)))
	}
	run.QueueWait = harness.PercentilesOf(wait)
	run.Completion = harness.PercentilesOf(completion)
	// The 95th percentile job cannot finish before the slots have run
	// ceil(0.95·N) jobs at exactly their sleep each.
	nth := int(math.Ceil(0.95 * float64(cfg.Jobs)))
	p95Floor := slotsFloor(nth, run.TotalSlots, sleep)
	run.CompletionP95FloorMs = harness.Millis(p95Floor)
	if p95Floor > 0 {
		run.P95OverFloor = harness.Round3(run.Completion.P95 / harness.Millis(p95Floor))
	}
	run.StartupMs = harness.Millis(run.FirstStart.Sub(run.FirstSubmit))
	if span := run.LastFinish.Sub(run.FirstStart); span > 0 && finished > 0 {
		service := time.Duration(float64(run.TotalSlots) * float64(span) / float64(finished))
		run.ServiceMsPerJob = harness.Millis(service)
		run.OverheadMsPerJob = harness.Millis(service - sleep)
		run.SlotUtilization = harness.Round3(float64(busy) / (float64(run.TotalSlots) * float64(span)))
	}
	if run.TotalSlots == 1 && len(run.JobTimings) > 1 {
		starts := make([]float64, 0, len(run.JobTimings))
		for _, j := range run.JobTimings {
			starts = append(starts, j.Started)
		}
		sort.Float64s(starts)
		gaps := make([]float64, 0, len(starts)-1)
		for i := 1; i < len(starts); i++ {
			gaps = append(gaps, harness.Round3(starts[i]-starts[i-1]))
		}
		p := harness.PercentilesOf(gaps)
		run.ServiceInterval = &p
	}
	sort.Slice(run.JobTimings, func(i, j int) bool { return run.JobTimings[i].ID < run.JobTimings[j].ID })
}

// slotsFloor is the least time slots need to run jobs that take exactly
// sleep each: ceil(jobs/slots) rounds of sleep.
func slotsFloor(jobs, slots int, sleep time.Duration) time.Duration {
	rounds := (jobs + slots - 1) / slots
	return time.Duration(rounds) * sleep
}
