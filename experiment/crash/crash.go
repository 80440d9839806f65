package crash

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/builtin"
	"github.com/relayq/relay/worker"
)

// Config configures the crash experiment. Zero fields take the
// defaults named in their comments.
type Config struct {
	// AdminURL is the PostgreSQL server the experiment creates its
	// database on. Default DefaultAdminURL.
	AdminURL string
	// RelayBin is the relay binary whose `work` processes are killed.
	// Required.
	RelayBin string
	// OutDir receives the results (JSON and SVG). Empty: nothing is written.
	OutDir string
	// LogDir receives the workers' logs. Empty: a temporary directory,
	// removed at the end.
	LogDir string
	// Trials is how many times a worker is killed. Default 5.
	Trials int
	// JobDuration is how long the sleep job runs. Default 2s.
	JobDuration time.Duration
	// KillAfter is how long after the claim the worker is killed. Default
	// half of JobDuration.
	KillAfter time.Duration
	// WorkerArgs are added to the `relay work` command line of the kill
	// trials. Default none: the worker defaults, which the experiment is
	// meant to measure.
	WorkerArgs []string
	// SkipZombie leaves out the zombie (SIGSTOP) case.
	SkipZombie bool
	// ZombieLease and ZombieHeartbeat are the lease and heartbeat interval of
	// the zombie case's workers. Defaults 2s and a quarter of ZombieLease.
	ZombieLease     time.Duration
	ZombieHeartbeat time.Duration
	// PauseAfter is how long after the claim the zombie is frozen. Default
	// a quarter of JobDuration.
	PauseAfter time.Duration
	// Fleet is how many more relay work processes run, on a queue of
	// their own, from before the first trial to the end, idle unless
	// FleetRate says otherwise. Every worker
	// looks for dead workers' jobs less often the more live workers there
	// are (worker.DefaultReclaimInterval), the fleet as a whole about as
	// often as a few workers: a fleet shows how soon a kill is found in a
	// large one. Default none.
	Fleet int
	// FleetPoolerSize, when positive, runs the fleet's pools through a
	// PgBouncer in transaction mode with this many server connections,
	// each fleet worker's session on the server itself, so that a fleet
	// larger than the server's connections allow fits. Default none.
	FleetPoolerSize int
	// FleetRate, when positive, keeps the fleet busy: that many sleep
	// jobs a second, of FleetJob each, are put on its queue, one per
	// transaction, from before the first trial to the end. Every one
	// notifies the fleet's queue, which wakes every listening session of
	// the database. Default none: an idle fleet.
	FleetRate float64
	// FleetJob is how long each of the fleet's jobs sleeps. Default
	// harness.DefaultFleetJob.
	FleetJob time.Duration
	// Progress receives progress lines (stderr). Nil: none.
	Progress io.Writer
}

// DefaultConfig returns the defaults of the crash experiment: 5 kill
// trials of a 2 s job, and a zombie case with a 2 s lease. KillAfter,
// PauseAfter and ZombieHeartbeat are left zero: they default to a half and
// a quarter of the job, and a quarter of the zombie's lease.
func DefaultConfig() Config {
	return Config{
		AdminURL:    harness.DefaultAdminURL,
		Trials:      5,
		JobDuration: 2 * time.Second,
		ZombieLease: 2 * time.Second,
	}
}

func (c Config) withDefaults() (Config, error) {
	if c.RelayBin == "" {
		return c, errors.New("crash: no relay binary given")
	}
	d := DefaultConfig()
	c.AdminURL = cmp.Or(c.AdminURL, d.AdminURL)
	c.Trials = cmp.Or(c.Trials, d.Trials)
	c.JobDuration = cmp.Or(c.JobDuration, d.JobDuration)
	c.ZombieLease = cmp.Or(c.ZombieLease, d.ZombieLease)
	if c.KillAfter == 0 {
		c.KillAfter = c.JobDuration / 2
	}
	if c.ZombieHeartbeat == 0 {
		c.ZombieHeartbeat = c.ZombieLease / 4
	}
	if c.PauseAfter == 0 {
		c.PauseAfter = c.JobDuration / 4
	}
	switch {
	case c.Trials < 0:
		return c, fmt.Errorf("crash: trials must not be negative, got %d", c.Trials)
	case c.KillAfter >= c.JobDuration || c.PauseAfter >= c.JobDuration:
		return c, fmt.Errorf("crash: the worker must be killed and paused before the %s job ends", c.JobDuration)
	case c.ZombieHeartbeat >= c.ZombieLease:
		return c, fmt.Errorf("crash: zombie heartbeat %s must be shorter than its lease %s", c.ZombieHeartbeat, c.ZombieLease)
	}
	if err := harness.CheckFleet(c.Fleet, c.FleetPoolerSize); err != nil {
		return c, fmt.Errorf("crash: %w", err)
	}
	if err := harness.CheckFleetLoad(c.Fleet, c.FleetRate, c.FleetJob); err != nil {
		return c, fmt.Errorf("crash: %w", err)
	}
	return c, nil
}

// Settings records the settings of a crash run.
type Settings struct {
	Trials        int      `json:"trials"`
	JobKind       string   `json:"job_kind"`
	JobDurationMs float64  `json:"job_duration_ms"`
	KillAfterMs   float64  `json:"kill_after_claim_ms"`
	WorkerArgs    []string `json:"kill_worker_extra_args"`
	// The worker defaults the kill trials run with, unless WorkerArgs
	// change them.
	DefaultLeaseMs           float64 `json:"worker_default_lease_ms"`
	DefaultReclaimIntervalMs float64 `json:"worker_default_reclaim_interval_ms"`
	ZombieLeaseMs            float64 `json:"zombie_lease_ms"`
	ZombieHeartbeatMs        float64 `json:"zombie_heartbeat_ms"`
	PauseAfterMs             float64 `json:"zombie_pause_after_claim_ms"`
	// Fleet counts the workers beside each trial's (Config.Fleet), and
	// FleetPooler is the PgBouncer their pools went through, if any.
	Fleet       int                 `json:"fleet,omitempty"`
	FleetPooler *harness.PoolerInfo `json:"fleet_pooler,omitempty"`
}

// WorkerRef names one worker process.
type WorkerRef struct {
	ID  string `json:"id"`
	PID int    `json:"pid"`
}

// TrialJob is the job of one crash trial, taken from one worker and run by
// another: the fields the kill and zombie cases share, and which both
// embed. Its timestamps are from the database clock.
type TrialJob struct {
	JobID int64 `json:"job_id"`
	// Replacement is the worker that did not hold the job at first, and
	// should run it once the first one is gone.
	Replacement WorkerRef `json:"replacement"`
	// Claim1 is the first claim (started_at of attempt 1).
	Claim1 time.Time `json:"claim1"`
	// Reclaim is when the job was taken back, from its error history, for
	// ReclaimReason ("worker session ended" or "lease expired").
	Reclaim       time.Time `json:"reclaim"`
	ReclaimReason string    `json:"reclaim_reason"`
	// Claim2 is the replacement's claim (started_at of attempt 2).
	Claim2 time.Time `json:"claim2"`
	// Completion is finished_at.
	Completion time.Time `json:"completion"`

	// State and Attempts are the job's; ResultAttempt, ResultWorker and
	// ResultPID are what its result says produced it (zero without a
	// result).
	State         string          `json:"state"`
	Attempts      int             `json:"attempts"`
	ResultAttempt int             `json:"result_attempt"`
	ResultWorker  string          `json:"result_worker"`
	ResultPID     int             `json:"result_pid"`
	ErrorHistory  json.RawMessage `json:"error_history"`
	// OK: the trial's invariants hold (see KillTrial and ZombieTrial);
	// Problems lists those that do not.
	OK       bool     `json:"ok"`
	Problems []string `json:"problems,omitempty"`
}

// record fills j from job, the trial's job read once it has finished, and
// adds to Problems what the kill and zombie cases both require: a reclaim
// of attempt 1 in the error history, and success on attempt 2, run by the
// replacement.
func (j *TrialJob) record(job db.Job) {
	j.State, j.Attempts = string(job.State), int(job.Attempt)
	var r builtin.Result
	if len(job.Result) > 0 && json.Unmarshal(job.Result, &r) == nil {
		j.ResultAttempt, j.ResultWorker, j.ResultPID = r.Attempt, r.Worker, r.PID
	}
	j.ErrorHistory = job.Errors
	if job.StartedAt != nil {
		j.Claim2 = *job.StartedAt
	}
	if job.FinishedAt != nil {
		j.Completion = *job.FinishedAt
	}
	if e, ok := reclaimEntry(job.Errors, 1); ok {
		j.Reclaim, j.ReclaimReason = e.At, e.Error
	} else {
		j.Problems = append(j.Problems, "no reclaim entry for attempt 1 in the error history")
	}
	if j.State != string(db.JobStateSucceeded) || j.Attempts != 2 || j.ResultAttempt != 2 {
		j.Problems = append(j.Problems, fmt.Sprintf("job %s on attempt %d (result says %d), want succeeded on 2", j.State, j.Attempts, j.ResultAttempt))
	}
	if j.ResultWorker != j.Replacement.ID {
		j.Problems = append(j.Problems, fmt.Sprintf("result from worker %q, want the replacement %q", j.ResultWorker, j.Replacement.ID))
	}
}

// KillTrial is one SIGKILL of the worker running a job, with the job's
// timeline from the database clock. It is OK when its job succeeded on
// attempt 2, run by the replacement.
type KillTrial struct {
	Trial  int       `json:"trial"`
	Victim WorkerRef `json:"victim"`
	// Kill is the database clock read right before SIGKILL was sent.
	Kill time.Time `json:"kill"`
	// LiveWorkers counts the live worker sessions right before the kill,
	// the victim's included: each of them looks for dead workers' jobs
	// less often the more there are.
	LiveWorkers int64 `json:"live_workers_at_kill"`

	KillToReclaimMs    float64 `json:"kill_to_reclaim_ms"`
	KillToClaim2Ms     float64 `json:"kill_to_claim2_ms"`
	KillToCompletionMs float64 `json:"kill_to_completion_ms"`

	TrialJob
}

// ZombieTrial is the SIGSTOP case: the worker holding the job freezes past
// its lease, a replacement runs the job, and the frozen worker, thawed,
// tries to acknowledge it with its old token. It is OK when, besides what
// a kill trial requires, the job was reclaimed for its expired lease and
// the stale acknowledgement was rejected.
type ZombieTrial struct {
	Zombie      WorkerRef `json:"zombie"`
	LeaseMs     float64   `json:"lease_ms"`
	HeartbeatMs float64   `json:"heartbeat_ms"`

	// Pause and Resume are the database clock read right after SIGSTOP
	// and SIGCONT were sent.
	Pause  time.Time `json:"pause"`
	Resume time.Time `json:"resume"`
	// RejectedAck is the time of the zombie's first log line saying an
	// acknowledgement of the job was rejected (the zombie's clock: the same
	// host as the database in these runs).
	RejectedAck time.Time `json:"rejected_ack"`

	PauseToReclaimMs    float64 `json:"pause_to_reclaim_ms"`
	PauseToClaim2Ms     float64 `json:"pause_to_claim2_ms"`
	PauseToCompletionMs float64 `json:"pause_to_completion_ms"`
	ResumeToRejectionMs float64 `json:"resume_to_rejection_ms"`

	// Rejection says what the zombie reported about the job: "completion
	// rejected" or "failure rejected" (the database refused its outcome),
	// "heartbeat rejected" (its lease was gone, so its handler was
	// cancelled), or, when it logged none of these, "outcome dropped" (it
	// dropped its outcome unsent, its lease known lost).
	Rejection string `json:"rejection"`
	// StaleAckRejected: the zombie logged the rejection, and the job still
	// holds attempt 2's result, unchanged.
	StaleAckRejected bool `json:"stale_ack_rejected"`
	// ZombieLog holds the zombie's log lines about the job.
	ZombieLog []harness.LogLine `json:"zombie_log"`
	// ResultUnchanged: the job read after the thaw is as it was before.
	ResultUnchanged bool `json:"result_unchanged"`

	TrialJob
}

// Summary holds the crash experiment's figures.
type Summary struct {
	Trials int `json:"trials"`
	// CompletedOnAttempt2 counts the kill trials whose job succeeded on
	// attempt 2, run by the replacement.
	CompletedOnAttempt2 int `json:"completed_on_attempt2"`
	// The kill-to-reclaim figures are those of the trials whose job's
	// history holds the reclaim; the others, of every trial.
	KillToReclaimMedianMs   float64 `json:"kill_to_reclaim_median_ms"`
	KillToReclaimWorstMs    float64 `json:"kill_to_reclaim_worst_ms"`
	KillToClaim2MedianMs    float64 `json:"kill_to_claim2_median_ms"`
	KillToClaim2WorstMs     float64 `json:"kill_to_claim2_worst_ms"`
	KillToCompletionMedian  float64 `json:"kill_to_completion_median_ms"`
	KillToCompletionWorstMs float64 `json:"kill_to_completion_worst_ms"`
	// TargetMet: every killed worker's job was claimed again within
	// TargetMs of the kill.
	TargetMs  float64 `json:"target_ms"`
	TargetMet bool    `json:"target_met"`
	// ReferenceKillToCompletionMs is the reference study's figure.
	ReferenceKillToCompletionMs float64 `json:"reference_kill_to_completion_ms"`
	// StaleAckRejected reports the zombie case.
	StaleAckRejected bool `json:"stale_ack_rejected"`
}

// Result is the record of a crash run, as written to its JSON file.
type Result struct {
	Experiment  string              `json:"experiment"`
	Environment harness.Environment `json:"environment"`
	Settings    Settings            `json:"settings"`
	Trials      []KillTrial         `json:"trials"`
	Zombie      *ZombieTrial        `json:"zombie,omitempty"`
	// FleetLoad is what became of a busy fleet's jobs (Config.FleetRate),
	// read after the last trial.
	FleetLoad *harness.FleetLoad `json:"fleet_load,omitempty"`
	Summary   Summary            `json:"summary"`
	// Files lists the files this run wrote.
	Files []string `json:"files"`
}

// The targets and reference figures of the crash experiment.
const (
	targetMs       = 1000
	referenceMs    = 3000
	stopGrace      = 5 * time.Second
	startupTimeout = 30 * time.Second
)

// Run runs the crash experiment: Trials times, it starts two `relay
// work` processes, enqueues a sleep job, SIGKILLs the process that claimed
// it mid-job and follows the job until the other one has run it; then, in
// the zombie case, it freezes the worker holding a job past its lease with
// SIGSTOP, lets the other worker run the job, thaws the frozen one and
// reads from its own log that its acknowledgement was rejected. It records
// every timeline from the database clock, writes the results to
// cfg.OutDir, and returns them. A trial whose invariants fail is recorded
// with its problems, not returned as an error: errors are for runs that
// could not be carried out.
func Run(ctx context.Context, cfg Config) (_ *Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	logDir, cleanLogs, err := harness.LogDirFor(cfg.LogDir, "relay-crash-logs-")
	if err != nil {
		return nil, err
	}
	defer cleanLogs()

	d, err := harness.CreateDatabase(ctx, cfg.AdminURL, "relay_exp_crash_")
	if err != nil {
		return nil, err
	}
	defer d.DropAtEnd(ctx, &err)

	res := &Result{
		Experiment:  "crash",
		Environment: harness.CollectEnvironment(ctx, d, cfg.RelayBin),
		Settings: Settings{
			Trials:                   cfg.Trials,
			JobKind:                  builtin.KindSleep,
			JobDurationMs:            harness.Millis(cfg.JobDuration),
			KillAfterMs:              harness.Millis(cfg.KillAfter),
			WorkerArgs:               append([]string{}, cfg.WorkerArgs...),
			DefaultLeaseMs:           harness.Millis(worker.DefaultLease),
			DefaultReclaimIntervalMs: harness.Millis(worker.DefaultReclaimInterval),
		},
	}
	if !cfg.SkipZombie {
		res.Settings.ZombieLeaseMs = harness.Millis(cfg.ZombieLease)
		res.Settings.ZombieHeartbeatMs = harness.Millis(cfg.ZombieHeartbeat)
		res.Settings.PauseAfterMs = harness.Millis(cfg.PauseAfter)
	}

	prog := harness.NewProgress(cfg.Progress, "crash", cfg.Trials)
	var fleet *harness.Fleet
	if cfg.Fleet > 0 {
		fleet, err = harness.StartFleet(ctx, harness.FleetConfig{
			RelayBin: cfg.RelayBin, LogDir: logDir, Size: cfg.Fleet, PoolerSize: cfg.FleetPoolerSize, Queue: fleetQueue,
			Rate: cfg.FleetRate, JobDuration: cfg.FleetJob,
		}, d, prog)
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		defer fleet.Stop()
		res.Settings.Fleet = cfg.Fleet
		res.Settings.FleetPooler = fleet.Pooler
	}
	for i := 1; i <= cfg.Trials; i++ {
		prog.Update(i-1, fmt.Sprintf("kill trial %d: starting workers", i))
		trial, err := killTrial(ctx, cfg, d, logDir, i, prog)
		if err != nil {
			return nil, fmt.Errorf("kill trial %d: %w", i, err)
		}
		res.Trials = append(res.Trials, *trial)
		prog.Update(i, fmt.Sprintf("kill trial %d: re-claimed %.0f ms after the kill, done %.0f ms after", i, trial.KillToClaim2Ms, trial.KillToCompletionMs))
	}
	if !cfg.SkipZombie {
		prog.Note("zombie: starting workers (lease %s, heartbeat %s)", cfg.ZombieLease, cfg.ZombieHeartbeat)
		z, err := zombieTrial(ctx, cfg, d, logDir, prog)
		if err != nil {
			return nil, fmt.Errorf("zombie trial: %w", err)
		}
		res.Zombie = z
	}
	if fleet != nil {
		if res.FleetLoad, err = fleet.Load(ctx, d); err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
	}
	res.Environment.LoadAverageEnd = harness.LoadAverage()
	res.Summary = summarize(res)
	prog.Finish("done: %d kill trials, re-claim median %.0f ms, worst %.0f ms", len(res.Trials),
		res.Summary.KillToClaim2MedianMs, res.Summary.KillToClaim2WorstMs)

	if cfg.OutDir != "" {
		if err := res.write(cfg.OutDir); err != nil {
			return res, err
		}
	}
	return res, nil
}

func summarize(res *Result) Summary {
	s := Summary{Trials: len(res.Trials), TargetMs: targetMs, ReferenceKillToCompletionMs: referenceMs}
	var reclaim, claim2, done []float64
	for _, t := range res.Trials {
		if t.OK {
			s.CompletedOnAttempt2++
		}
		if !t.Reclaim.IsZero() {
			reclaim = append(reclaim, t.KillToReclaimMs)
		}
		claim2 = append(claim2, t.KillToClaim2Ms)
		done = append(done, t.KillToCompletionMs)
	}
	s.KillToReclaimMedianMs, s.KillToReclaimWorstMs = harness.MedianWorst(reclaim)
	s.KillToClaim2MedianMs, s.KillToClaim2WorstMs = harness.MedianWorst(claim2)
	s.KillToCompletionMedian, s.KillToCompletionWorstMs = harness.MedianWorst(done)
	s.TargetMet = len(res.Trials) > 0 && s.CompletedOnAttempt2 == len(res.Trials) && s.KillToClaim2WorstMs < targetMs
	s.StaleAckRejected = res.Zombie != nil && res.Zombie.StaleAckRejected
	return s
}

// startPair starts two idle workers with the given names (used as worker ids)
// on queue, and waits until both are registered.
func startPair(ctx context.Context, procs *harness.Procs, q *db.Queries, queue string, names [2]string, extra []string) (map[string]*harness.Proc, error) {
	byID := map[string]*harness.Proc{}
	for _, name := range names {
		args := append([]string{"work", "--id", name, "--queue", queue, "--slots", "1", "--log-format", "json"}, extra...)
		p, err := procs.Start(ctx, name, args...)
		if err != nil {
			return nil, err
		}
		byID[name] = p
	}
	waitCtx, cancel := context.WithTimeout(ctx, startupTimeout)
	defer cancel()
	if err := harness.WaitWorkers(waitCtx, q, procs, names[0], names[1]); err != nil {
		return nil, err
	}
	return byID, nil
}

// enqueueSleep inserts one sleep job of duration d on queue.
func enqueueSleep(ctx context.Context, dbtx db.DBTX, queue string, d time.Duration) (int64, error) {
	payload, _ := json.Marshal(builtin.SleepPayload{Ms: d.Milliseconds()})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	job, _, err := client.Insert(ctx, dbtx, harness.Job(queue, builtin.KindSleep, payload, client.DefaultMaxAttempts))
	if err != nil {
		return 0, fmt.Errorf("enqueue: %w", err)
	}
	return job.ID, nil
}

// waitJob polls the job until done says it has reached the awaited state.
func waitJob(ctx context.Context, q *db.Queries, id int64, every time.Duration, done func(db.Job) bool) (db.Job, error) {
	for {
		getCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		job, err := q.JobGet(getCtx, id)
		cancel()
		if err != nil && ctx.Err() == nil {
			return job, fmt.Errorf("read job %d: %w", id, err)
		}
		if err == nil && done(job) {
			return job, nil
		}
		select {
		case <-ctx.Done():
			return job, fmt.Errorf("job %d still %s: %w", id, job.State, ctx.Err())
		case <-time.After(every):
		}
	}
}

func jobFinished(j db.Job) bool {
	return j.State == db.JobStateSucceeded || j.State == db.JobStateDead || j.State == db.JobStateCancelled
}

// errorEntry is one entry of a job's error history.
type errorEntry struct {
	Attempt int       `json:"attempt"`
	Worker  string    `json:"worker"`
	Error   string    `json:"error"`
	At      time.Time `json:"at"`
}

// reclaimEntry finds the entry for the reclaim of the given attempt.
func reclaimEntry(history json.RawMessage, attempt int) (errorEntry, bool) {
	var entries []errorEntry
	if err := json.Unmarshal(history, &entries); err != nil {
		return errorEntry{}, false
	}
	for _, e := range entries {
		if e.Attempt == attempt && (e.Error == "worker session ended" || e.Error == "lease expired") {
			return e, true
		}
	}
	return errorEntry{}, false
}

// trialProcs returns an empty set of worker processes on d for one trial,
// and the function that ends them, to be deferred: it stops them
// gracefully, kills any left, and notes on prog, after label, a stop that
// failed. The trial's figures are taken by then, so a failed stop is not
// an error of the trial.
func trialProcs(ctx context.Context, cfg Config, d *harness.Database, logDir string, prog *harness.Progress, label string) (*harness.Procs, func()) {
	procs := harness.NewProcs(cfg.RelayBin, logDir, "DATABASE_URL="+d.URL)
	return procs, func() {
		defer procs.KillAll()
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*stopGrace)
		defer cancel()
		if err := procs.StopAll(stopCtx, stopGrace); err != nil {
			prog.Note("%s: stopping workers: %v", label, err)
		}
	}
}

// liveWorkers counts the live worker sessions of the database, as a
// worker of queue counts them.
func liveWorkers(ctx context.Context, q *labdb.Queries, queue string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := q.ExperimentFleetCount(ctx, queue)
	if err != nil {
		return 0, fmt.Errorf("count the live workers: %w", err)
	}
	return int64(n.Live), nil
}

// fleetQueue is the queue the fleet's workers wait on, which no job is
// ever put on.
const fleetQueue = "crash-fleet"

func killTrial(ctx context.Context, cfg Config, d *harness.Database, logDir string, n int, prog *harness.Progress) (*KillTrial, error) {
	queue := fmt.Sprintf("crash-%d", n)
	names := [2]string{fmt.Sprintf("kill%d-a", n), fmt.Sprintf("kill%d-b", n)}
	procs, stop := trialProcs(ctx, cfg, d, logDir, prog, fmt.Sprintf("kill trial %d", n))
	defer stop()
	byID, err := startPair(ctx, procs, d.Q, queue, names, cfg.WorkerArgs)
	if err != nil {
		return nil, err
	}

	id, err := enqueueSleep(ctx, d.Pool, queue, cfg.JobDuration)
	if err != nil {
		return nil, err
	}
	t := &KillTrial{Trial: n, TrialJob: TrialJob{JobID: id}}
	prog.Update(n-1, fmt.Sprintf("kill trial %d: waiting for the claim of job %d", n, id))
	claim1, victim, replacement, err := waitForClaim(ctx, d, id, byID)
	if err != nil {
		return nil, err
	}
	t.Claim1 = claim1
	t.Victim = WorkerRef{ID: victim.Name, PID: victim.PID()}
	t.Replacement = WorkerRef{ID: replacement.Name, PID: replacement.PID()}

	// Kill mid-job: KillAfter after the claim, by the database clock.
	if err := sleepUntil(ctx, d, t.Claim1.Add(cfg.KillAfter)); err != nil {
		return nil, err
	}
	prog.Update(n-1, fmt.Sprintf("kill trial %d: SIGKILL %s (pid %d)", n, victim.Name, victim.PID()))
	if t.LiveWorkers, err = liveWorkers(ctx, d.Lab, queue); err != nil {
		return nil, err
	}
	// The clock is read before the signal: the victim's session ends, and
	// another worker may take its job back, before a reading after it
	// would come back. So every figure from the kill is an upper bound, by
	// the reading's round trip.
	if t.Kill, err = d.Now(ctx); err != nil {
		return nil, err
	}
	if err := victim.Kill(); err != nil {
		return nil, err
	}

	// The job must come back without the victim: by its session with the
	// defaults, by its lease at worst.
	doneCtx, cancel := context.WithTimeout(ctx, 2*worker.DefaultLease+2*cfg.JobDuration+10*time.Second)
	job, err := waitJob(doneCtx, d.Q, id, 20*time.Millisecond, jobFinished)
	cancel()
	if err != nil {
		return nil, err
	}
	t.record(job)
	t.measure()
	t.OK = len(t.Problems) == 0
	return t, nil
}

// measure times the trial's events from the kill. Without a reclaim in
// the job's history (a failed trial) KillToReclaimMs stays zero, and the
// summary leaves the trial out of its kill-to-reclaim figures.
func (t *KillTrial) measure() {
	if !t.Reclaim.IsZero() {
		t.KillToReclaimMs = harness.Millis(t.Reclaim.Sub(t.Kill))
	}
	t.KillToClaim2Ms = harness.Millis(t.Claim2.Sub(t.Kill))
	t.KillToCompletionMs = harness.Millis(t.Completion.Sub(t.Kill))
}

// rejectionLine reports whether l is the zombie's last word on job id:
// its completion (or failure) was rejected by the fence, or its outcome
// dropped because its lease was already known lost.
func rejectionLine(l harness.LogLine, id int64) bool {
	if j, ok := l.Int("job"); !ok || j != id {
		return false
	}
	return strings.Contains(l.Msg, "completion rejected") ||
		strings.Contains(l.Msg, "failure rejected") ||
		strings.Contains(l.Msg, "outcome of this attempt dropped")
}

func zombieTrial(ctx context.Context, cfg Config, d *harness.Database, logDir string, prog *harness.Progress) (*ZombieTrial, error) {
	const queue = "zombie"
	names := [2]string{"zombie-a", "zombie-b"}
	procs, stop := trialProcs(ctx, cfg, d, logDir, prog, "zombie")
	defer stop()
	byID, err := startPair(ctx, procs, d.Q, queue, names,
		[]string{"--lease", cfg.ZombieLease.String(), "--heartbeat", cfg.ZombieHeartbeat.String()})
	if err != nil {
		return nil, err
	}
	id, err := enqueueSleep(ctx, d.Pool, queue, cfg.JobDuration)
	if err != nil {
		return nil, err
	}
	z := &ZombieTrial{TrialJob: TrialJob{JobID: id}, LeaseMs: harness.Millis(cfg.ZombieLease), HeartbeatMs: harness.Millis(cfg.ZombieHeartbeat)}

	claim1, zombie, replacement, err := waitForClaim(ctx, d, id, byID)
	if err != nil {
		return nil, err
	}
	z.Claim1 = claim1
	z.Zombie = WorkerRef{ID: zombie.Name, PID: zombie.PID()}
	z.Replacement = WorkerRef{ID: replacement.Name, PID: replacement.PID()}

	if err := sleepUntil(ctx, d, z.Claim1.Add(cfg.PauseAfter)); err != nil {
		return nil, err
	}
	prog.Note("zombie: SIGSTOP %s (pid %d) holding job %d", zombie.Name, zombie.PID(), id)
	if err := zombie.Pause(); err != nil {
		return nil, err
	}
	if z.Pause, err = d.Now(ctx); err != nil {
		return nil, err
	}

	// The zombie keeps its session: only its lease can free the job.
	doneCtx, cancel := context.WithTimeout(ctx, 3*cfg.ZombieLease+2*cfg.JobDuration+20*time.Second)
	job, err := waitJob(doneCtx, d.Q, id, 20*time.Millisecond, jobFinished)
	cancel()
	if err != nil {
		return nil, err
	}
	before := job
	prog.Note("zombie: job %d %s on attempt %d by %s; SIGCONT %s", id, job.State, job.Attempt, harness.ValueOf(job.LeasedBy), zombie.Name)
	if err := zombie.Resume(); err != nil {
		return nil, err
	}
	if z.Resume, err = d.Now(ctx); err != nil {
		return nil, err
	}

	// What the zombie itself says about the job once thawed.
	logCtx, cancel := context.WithTimeout(ctx, 2*cfg.JobDuration+cfg.ZombieLease+10*time.Second)
	_, logErr := zombie.WaitLog(logCtx, func(l harness.LogLine) bool { return rejectionLine(l, id) })
	cancel()
	if logErr != nil && ctx.Err() != nil {
		return nil, ctx.Err()
	}
	lines, err := zombie.Logs()
	if err != nil {
		return nil, err
	}
	for _, l := range lines {
		if j, ok := l.Int("job"); ok && j == id {
			z.ZombieLog = append(z.ZombieLog, l)
		}
	}
	for _, l := range z.ZombieLog {
		switch {
		case strings.Contains(l.Msg, "completion rejected") || strings.Contains(l.Msg, "failure rejected"):
			if z.Rejection == "" || z.Rejection == "outcome dropped" {
				z.Rejection = strings.SplitN(l.Msg, ":", 2)[0]
				z.RejectedAck = l.Time
			}
		case l.Str("why") == "heartbeat rejected":
			if z.Rejection == "" || z.Rejection == "outcome dropped" {
				z.Rejection = "heartbeat rejected"
				z.RejectedAck = l.Time
			}
		case strings.Contains(l.Msg, "outcome of this attempt dropped"):
			if z.Rejection == "" {
				z.Rejection = "outcome dropped"
				z.RejectedAck = l.Time
			}
		}
	}

	job, err = func() (db.Job, error) {
		getCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return d.Q.JobGet(getCtx, id)
	}()
	if err != nil {
		return nil, fmt.Errorf("read job %d: %w", id, err)
	}
	z.record(job)
	z.ResultUnchanged = job.State == before.State && job.Attempt == before.Attempt &&
		equalTime(job.FinishedAt, before.FinishedAt) && string(job.Result) == string(before.Result)
	z.PauseToReclaimMs = harness.Millis(z.Reclaim.Sub(z.Pause))
	z.PauseToClaim2Ms = harness.Millis(z.Claim2.Sub(z.Pause))
	z.PauseToCompletionMs = harness.Millis(z.Completion.Sub(z.Pause))
	if !z.RejectedAck.IsZero() {
		z.ResumeToRejectionMs = harness.Millis(z.RejectedAck.Sub(z.Resume))
	}

	if logErr != nil {
		z.Problems = append(z.Problems, "the zombie never logged the fate of its acknowledgement: "+logErr.Error())
	}
	if z.ReclaimReason != "" && z.ReclaimReason != "lease expired" {
		z.Problems = append(z.Problems, "reclaimed for "+z.ReclaimReason+", want lease expired (the frozen worker's session is alive)")
	}
	if !z.ResultUnchanged {
		z.Problems = append(z.Problems, "the job changed after the zombie was thawed")
	}
	z.StaleAckRejected = logErr == nil && z.Rejection != "" && z.ResultUnchanged && z.ResultAttempt == 2
	z.OK = len(z.Problems) == 0 && z.StaleAckRejected
	return z, nil
}

func equalTime(a, b *time.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Equal(*b)
}

// write writes the JSON record and the charts under outDir.
func (r *Result) write(outDir string) error {
	base, err := harness.ResultBase(outDir, "crash", r.Environment.Date)
	if err != nil {
		return err
	}
	svg := base + "-timeline.svg"
	if err := timelineChart(r, svg); err != nil {
		return err
	}
	r.Files = []string{base + ".json", svg}
	return harness.WriteJSON(base+".json", r)
}

// WriteSummary writes the run's figures as a table.
func (r *Result) WriteSummary(w io.Writer) error {
	harness.WriteFleetNote(w, r.Settings.Fleet, r.Settings.FleetPooler, r.FleetLoad)
	tw := harness.NewTable(w)
	fmt.Fprintln(tw, "trial\tjob\tkilled\tlive workers\treclaim reason\tkill→reclaim\tkill→claim 2\tkill→done\tattempts\tok")
	for _, t := range r.Trials {
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\t%.0f ms\t%.0f ms\t%.0f ms\t%d\t%v\n", t.Trial, t.JobID, t.Victim.ID, t.LiveWorkers,
			t.ReclaimReason, t.KillToReclaimMs, t.KillToClaim2Ms, t.KillToCompletionMs, t.Attempts, t.OK)
	}
	s := r.Summary
	fmt.Fprintf(tw, "median\t\t\t\t\t%.0f ms\t%.0f ms\t%.0f ms\t\t\n", s.KillToReclaimMedianMs, s.KillToClaim2MedianMs, s.KillToCompletionMedian)
	fmt.Fprintf(tw, "worst\t\t\t\t\t%.0f ms\t%.0f ms\t%.0f ms\t\t\n", s.KillToReclaimWorstMs, s.KillToClaim2WorstMs, s.KillToCompletionWorstMs)
	fmt.Fprintf(tw, "reference\t\t\t\t\t\t\t%.0f ms\t2\t\n", s.ReferenceKillToCompletionMs)
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nTarget: re-claimed within %.0f ms of the kill in every trial: %v (%d of %d trials succeeded on attempt 2)\n",
		s.TargetMs, s.TargetMet, s.CompletedOnAttempt2, s.Trials)
	if z := r.Zombie; z != nil {
		fmt.Fprintf(w, "\nZombie (SIGSTOP, lease %.0f ms, heartbeat %.0f ms): job %d\n", z.LeaseMs, z.HeartbeatMs, z.JobID)
		fmt.Fprintf(w, "  reclaimed %.0f ms after the pause (%s), claim 2 at %.0f ms, done at %.0f ms, by %s\n",
			z.PauseToReclaimMs, z.ReclaimReason, z.PauseToClaim2Ms, z.PauseToCompletionMs, z.Replacement.ID)
		fmt.Fprintf(w, "  thawed %s: it logged %q %.0f ms later; stale acknowledgement rejected: %v; result still attempt %d's: %v\n",
			z.Zombie.ID, z.Rejection, z.ResumeToRejectionMs, z.StaleAckRejected, z.ResultAttempt, z.ResultUnchanged)
		for _, l := range z.ZombieLog {
			fmt.Fprintf(w, "    %s %s %s\n", l.Time.Format("15:04:05.000"), l.Level, l.Msg)
		}
		for _, p := range z.Problems {
			fmt.Fprintf(w, "  PROBLEM: %s\n", p)
		}
	}
	for _, t := range r.Trials {
		for _, p := range t.Problems {
			fmt.Fprintf(w, "trial %d PROBLEM: %s\n", t.Trial, p)
		}
	}
	for _, f := range r.Files {
		fmt.Fprintf(w, "wrote %s\n", f)
	}
	return nil
}

// waitForClaim waits until job id is claimed by one of the two workers in
// byID, and returns the time of the claim, the worker that holds the job
// and the other one.
func waitForClaim(ctx context.Context, d *harness.Database, id int64, byID map[string]*harness.Proc) (time.Time, *harness.Proc, *harness.Proc, error) {
	claimCtx, cancel := context.WithTimeout(ctx, startupTimeout)
	job, err := waitJob(claimCtx, d.Q, id, harness.JobPollInterval, func(j db.Job) bool { return j.State != db.JobStateAvailable })
	cancel()
	if err != nil {
		return time.Time{}, nil, nil, err
	}
	if job.State != db.JobStateRunning || job.LeasedBy == nil || job.StartedAt == nil {
		return time.Time{}, nil, nil, fmt.Errorf("job %d is %s, not running, after its claim", id, job.State)
	}
	holder, ok := byID[*job.LeasedBy]
	if !ok {
		return time.Time{}, nil, nil, fmt.Errorf("job %d claimed by unknown worker %q", id, *job.LeasedBy)
	}
	var other *harness.Proc
	for name, p := range byID {
		if name != holder.Name {
			other = p
		}
	}
	return *job.StartedAt, holder, other, nil
}

// sleepUntil waits until the database clock reaches at.
func sleepUntil(ctx context.Context, d *harness.Database, at time.Time) error {
	now, err := d.Now(ctx)
	if err != nil {
		return err
	}
	if wait := at.Sub(now); wait > 0 {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	return nil
}
