package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
)

// Result is the outcome of one scenario run, as written to
// experiment/results/chaos-<scenario>-<stamp>.json.
type Result struct {
	// Scenario is the fault injected.
	Scenario Scenario `json:"scenario"`
	// Passed is whether every invariant held.
	Passed bool `json:"passed"`
	// Failures names the invariants that broke.
	Failures []string `json:"failures,omitempty"`
	// File is where the result was written, if it was.
	File string `json:"-"`
	// StartedAt is when the run started; WallSeconds how long it took.
	StartedAt   time.Time `json:"started_at"`
	WallSeconds float64   `json:"wall_seconds"`
	// Config is the run's configuration.
	Config ResultConfig `json:"config"`
	// Environment is the machine and server the run was made on.
	Environment harness.Environment `json:"environment"`
	// Drained is whether every job finished within the drain timeout.
	Drained bool `json:"drained"`
	// FaultsInjected is how many faults were recorded, of every kind.
	FaultsInjected int `json:"faults_injected"`
	// Throughput is the rate of completions, during the faults and over
	// the whole run.
	Throughput Throughput `json:"throughput"`
	// Check is what the history checker found.
	Check *Check `json:"check"`
	// Invariants lists every invariant checked, with its figure.
	Invariants []Invariant `json:"invariants"`

	// The scenario's own findings; only its own is set.
	Pause      *PauseResult      `json:"pause,omitempty"`
	Partition  *PartitionResult  `json:"partition,omitempty"`
	Restart    *RestartResult    `json:"restart,omitempty"`
	Poison     *PoisonResult     `json:"poison,omitempty"`
	Starvation *StarvationResult `json:"starvation,omitempty"`
	BadInput   *BadInputResult   `json:"bad_input,omitempty"`
}

// ResultConfig is the configuration a result was made with: the
// fields of Config of the same names, durations in milliseconds or
// seconds as their names say.
type ResultConfig struct {
	// Jobs is how many jobs the workload had.
	Jobs int `json:"jobs"`
	// Workers and Slots are the worker processes and their slots.
	Workers int `json:"workers"`
	Slots   int `json:"slots"`
	// LeaseMs, HeartbeatMs and BackoffMs are the workers' timings.
	LeaseMs     float64 `json:"lease_ms"`
	HeartbeatMs float64 `json:"heartbeat_ms"`
	BackoffMs   float64 `json:"backoff_base_ms"`
	// DurationS is how long jobs were enqueued and faults injected, and
	// FaultEveryS the period of the repeated faults.
	DurationS   float64 `json:"duration_s"`
	FaultEveryS float64 `json:"fault_every_s"`
	// Seed is the seed of the workload and of the choice of victims.
	Seed uint64 `json:"seed"`
}

func newResultConfig(c Config, jobs int) ResultConfig {
	return ResultConfig{
		Jobs: jobs, Workers: c.Workers, Slots: c.Slots,
		LeaseMs: harness.Millis(c.Lease), HeartbeatMs: harness.Millis(c.Heartbeat), BackoffMs: harness.Millis(c.BackoffBase),
		DurationS: c.Duration.Seconds(), FaultEveryS: c.FaultEvery.Seconds(), Seed: c.Seed,
	}
}

// Throughput is a rate of completed jobs.
type Throughput struct {
	// DuringFaultsPerSec is the rate between the first fault and the end
	// of the last one (the whole enqueue window when the workload itself
	// is the fault).
	DuringFaultsPerSec float64 `json:"during_faults_per_sec"`
	// FaultWindowSeconds is the length of that window.
	FaultWindowSeconds float64 `json:"fault_window_seconds"`
	// OverallPerSec is the rate from the first enqueue to the last job
	// finished.
	OverallPerSec float64 `json:"overall_per_sec"`
}

// Invariant is one checked property: Count is its figure, Want what
// it must be ("0" or ">0").
type Invariant struct {
	// Name says what is counted.
	Name string `json:"name"`
	// Count is the figure, Want what it must be.
	Count int64  `json:"count"`
	Want  string `json:"want"`
	// OK is whether Count is as wanted.
	OK bool `json:"ok"`
	// Examples describe a few of the violations.
	Examples []string `json:"examples,omitempty"`
}

// PauseResult follows the zombies: the executions a paused worker was
// running when it froze.
type PauseResult struct {
	// Pauses is how many times a worker was frozen, each for PauseMs.
	Pauses  int     `json:"pauses"`
	PauseMs float64 `json:"pause_ms"`
	// LongJobsCaught is how many young long jobs, which outlive a pause,
	// the paused workers held when they were chosen: claimed, their
	// handlers running or, claimed ahead, about to. Either way a handler
	// of theirs runs when the worker wakes, so a pause that caught one
	// must cancel a handler (UncancelledPauses).
	LongJobsCaught int64 `json:"long_jobs_caught"`
	// CancelledOnWaking counts the paused workers' handlers cancelled with
	// worker.ErrLeaseLost within a lease of waking: those running when the
	// worker froze (HandlersCancelled) and those it started, on waking,
	// for jobs it had claimed ahead before it froze.
	CancelledOnWaking int `json:"cancelled_on_waking"`
	// UncancelledPauses lists the pauses that caught young long jobs and
	// had no handler cancelled on waking.
	UncancelledPauses Finding `json:"uncancelled_pauses"`
	// InFlight is how many executions the paused workers were running.
	InFlight int `json:"in_flight"`
	// CompletionsRefused and FailuresRefused count the zombies' outcomes
	// the database refused once they woke.
	CompletionsRefused int `json:"completions_refused"`
	FailuresRefused    int `json:"failures_refused"`
	// Dropped counts outcomes the worker did not even send, its lease
	// being known lost.
	Dropped int `json:"dropped"`
	// HeartbeatsRefused counts the paused workers' heartbeats that came
	// back without the job (from their logs).
	HeartbeatsRefused int `json:"heartbeats_refused"`
	// HandlersCancelled counts zombie handlers whose context was cancelled
	// with worker.ErrLeaseLost, and CancelLatency how long after SIGCONT.
	HandlersCancelled int                 `json:"handlers_cancelled"`
	CancelLatency     harness.Percentiles `json:"cancel_latency"`
	// Unknown counts zombie executions with no acknowledgement recorded.
	Unknown int `json:"unknown"`
	// AcceptedBeforeFreeze counts acknowledgements the database applied
	// before the worker woke (sent just before it froze), which the worker
	// learned of only when it woke.
	AcceptedBeforeFreeze int `json:"accepted_before_freeze"`
	// AcceptedAfterWake lists zombie acknowledgements accepted after the
	// worker woke. Must be empty.
	AcceptedAfterWake Finding `json:"accepted_after_wake"`
}

// PartitionResult says how the partitioned workers fared.
type PartitionResult struct {
	// Partitions says how each partitioned worker recovered.
	Partitions []PartitionRecovery `json:"partitions"`
	// CommitCuts is how many connections were cut just after a completion
	// committed.
	CommitCuts int `json:"commit_cuts"`
	// AmbiguousCompletions is how many completions landed although their
	// worker was told otherwise (see Check).
	AmbiguousCompletions int64 `json:"ambiguous_completions"`
}

// PartitionRecovery is how one worker came back from a partition.
type PartitionRecovery struct {
	// Worker is the worker cut off, and Kind how (partition_cut or
	// blackhole).
	Worker string `json:"worker"`
	Kind   string `json:"kind"`
	// ReregisteredAfterMs is how long after the heal the worker had a new
	// session (-1: never).
	ReregisteredAfterMs float64 `json:"reregistered_after_ms"`
	// FirstClaimAfterMs is how long after the heal it claimed a job
	// (-1: never).
	FirstClaimAfterMs float64 `json:"first_claim_after_ms"`
}

// RestartResult says what clients and workers saw of the restarts.
type RestartResult struct {
	// Restarts describes each restart.
	Restarts []RestartRecord `json:"restarts"`
	// Answers counts the enqueue requests' answers by status ("0": no
	// answer), over the whole run.
	Answers map[string]int `json:"answers"`
	// AnswersWhileDown counts those received while the database was down.
	AnswersWhileDown map[string]int `json:"answers_while_down"`
	// Leaks lists error answers that revealed internals.
	Leaks []string `json:"leaks,omitempty"`
	// UnansweredEnqueues counts jobs stored whose 2xx never arrived.
	UnansweredEnqueues int64 `json:"unanswered_enqueues"`
}

// RestartRecord is one restart of the database.
type RestartRecord struct {
	// Mode is pg_ctl's shutdown mode: immediate (a crash) or fast.
	Mode string `json:"mode"`
	// DowntimeMs is from the stop to the server being back; StopMs and
	// StartMs how long pg_ctl took to stop and to start it.
	DowntimeMs float64 `json:"downtime_ms"`
	StopMs     float64 `json:"stop_ms"`
	StartMs    float64 `json:"start_ms"`
	// ReadyzWhileDown counts /readyz answers while the database was down.
	ReadyzWhileDown map[string]int `json:"readyz_while_down"`
	// The recovery, timed from the command that started the server again
	// (so including PostgreSQL's own start, and its crash recovery after an
	// immediate shutdown):
	//
	// FirstEnqueueOKAfterMs is when the API acknowledged an enqueue again,
	// WorkersReregisteredAfterMs when each worker had a new session, and
	// FirstClaimAfterMs when a worker claimed a job again (-1: never).
	FirstEnqueueOKAfterMs      float64            `json:"first_enqueue_ok_after_ms"`
	WorkersReregisteredAfterMs map[string]float64 `json:"workers_reregistered_after_ms"`
	FirstClaimAfterMs          float64            `json:"first_claim_after_ms"`
}

// PoisonResult counts the poison jobs and how they ended.
type PoisonResult struct {
	// Jobs counts poison jobs by kind.
	Jobs map[string]int `json:"jobs"`
	// DeadAfterMaxAttempts counts those that ended dead after exactly
	// max_attempts claims.
	DeadAfterMaxAttempts int `json:"dead_after_max_attempts"`
	// SelfExits is how many worker processes chaos_exit jobs killed.
	SelfExits int `json:"self_exits"`
	// RetriesAfterFailure is how many claims of poison jobs followed a
	// failure, and so had a backoff to honour (a claim after a reclaim has
	// none).
	RetriesAfterFailure int `json:"retries_after_failure"`
	// MinBackoffSlackMs is the smallest margin by which such a retry came
	// after its backoff (negative would be a retry too early).
	MinBackoffSlackMs float64 `json:"min_backoff_slack_ms"`
}

// StarvationResult says whether handlers holding every connection of
// their pool starved the heartbeats.
type StarvationResult struct {
	// HoldJobs jobs each held all HandlerPoolSize connections of their
	// worker's handlers' pool for HoldMs.
	HoldJobs        int     `json:"hold_jobs"`
	HoldMs          float64 `json:"hold_ms"`
	HandlerPoolSize int     `json:"handler_pool_size"`
	// HoldExecutions is how many times those jobs ran (want one each).
	HoldExecutions int `json:"hold_executions"`
	// LongestHoldRunMs is the longest run of one, waiting included: it
	// must exceed the lease for the scenario to prove anything.
	LongestHoldRunMs float64 `json:"longest_hold_run_ms"`
	// LeaseExpiredReclaims and LeaseLost count leases lost anyway.
	LeaseExpiredReclaims int `json:"lease_expired_reclaims"`
	LeaseLost            int `json:"lease_lost"`
}

// zero appends an invariant that a count must be zero.
func (res *Result) zero(name string, f Finding) {
	res.Invariants = append(res.Invariants, Invariant{Name: name, Count: f.Count, Want: "0", OK: f.Count == 0, Examples: f.Examples})
}

// some appends an invariant that a count must be positive: evidence that
// the fault really hit what the scenario means to test.
func (res *Result) some(name string, n int64) {
	res.Invariants = append(res.Invariants, Invariant{Name: name, Count: n, Want: ">0", OK: n > 0})
}

// evaluate fills in the throughput, the scenario's findings and the
// invariants, from the check and the history it read.
func (r *scenarioRun) evaluate(ctx context.Context, res *Result, hist *recordedHistory, windowStart, windowEnd, runEnd time.Time, survivors map[string]bool) error {
	c, faults := res.Check, hist.faults
	for _, n := range c.Faults {
		res.FaultsInjected += n
	}
	execs, err := r.q.ChaosExecutions(ctx)
	if err != nil {
		return fmt.Errorf("chaos: read the executions: %w", err)
	}

	// Throughput.
	from, until := windowStart, windowEnd
	var injected []labdb.ChaosFault
	for _, f := range faults {
		if f.Kind != "self_exit" && f.Kind != "crash" {
			injected = append(injected, f)
		}
	}
	if len(injected) > 0 {
		from, until = injected[0].At, injected[0].At
		for _, f := range injected {
			end := f.At
			if f.EndedAt != nil {
				end = *f.EndedAt
			}
			if end.After(until) {
				until = end
			}
		}
		if until.Sub(from) < time.Second {
			// A burst (bad input) or a single fault: measure over the
			// second that follows it.
			until = from.Add(time.Second)
		}
	}
	during, err := r.completions(ctx, from, until)
	if err != nil {
		return err
	}
	overall, err := r.completions(ctx, windowStart, runEnd)
	if err != nil {
		return err
	}
	res.Throughput = Throughput{
		DuringFaultsPerSec: harness.Round3(float64(during) / until.Sub(from).Seconds()),
		FaultWindowSeconds: harness.Round3(until.Sub(from).Seconds()),
		OverallPerSec:      harness.Round3(float64(overall) / runEnd.Sub(windowStart).Seconds()),
	}

	// The invariants of every scenario.
	res.zero("lost", c.Lost)
	res.zero("unexpected", c.Unexpected)
	res.zero("stale accepted", c.StaleAccepted)
	res.zero("terminal changes", c.TerminalChanges)
	res.zero("premature reclaims", c.PrematureReclaims)
	res.zero("wrong outcome", c.WrongOutcome)
	res.zero("phantom jobs", c.Phantoms)
	res.zero("poison misbehaved", c.PoisonMisbehaved)
	var crashes Finding
	r.mu.Lock()
	for _, s := range r.details.crashes {
		crashes.add("%s", s)
	}
	details := r.details
	r.mu.Unlock()
	res.zero("worker crashes", crashes)
	var undrained Finding
	if !res.Drained {
		undrained.add("jobs still unfinished after %s", r.cfg.DrainTimeout)
	}
	res.zero("unfinished at the end", undrained)

	switch r.cfg.Scenario {
	case Kill:
		res.some("workers killed", int64(c.Faults["kill"]))
	case PgBouncer:
		res.some("workers with a session killed", int64(c.Faults["kill"]))
		res.some("workers without a session killed", int64(c.Faults["kill_lease_only"]))
	case BackendKill:
		res.some("backends terminated", int64(c.Faults["backend_kill"]+c.Faults["backend_kill_session"]))
		res.some("worker sessions terminated", int64(c.Faults["backend_kill_session"]))
	case Pause:
		if err := r.evaluatePause(ctx, res, details, faults, execs); err != nil {
			return err
		}
	case Partition:
		if err := r.evaluatePartition(ctx, res, details, survivors); err != nil {
			return err
		}
	case Restart:
		if err := r.evaluateRestart(ctx, res, details, survivors); err != nil {
			return err
		}
	case Poison:
		r.evaluatePoison(res, details, hist.poison)
	case Starvation:
		r.evaluateStarvation(res, execs)
	case BadInput:
		b := details.badInput
		if b == nil {
			return errors.New("chaos: the bad-input burst did not run")
		}
		res.BadInput = b
		var not4xx, leaks Finding
		for _, s := range b.Not4xx {
			not4xx.add("%s", s)
		}
		for _, s := range b.Leaks {
			leaks.add("%s", s)
		}
		res.zero("hostile requests not answered 4xx", not4xx)
		res.zero("error answers revealing internals", leaks)
		var replay Finding
		if b.ReplayStatus != 200 || !b.ReplaySameJob {
			replay.add("an exact replay under its Idempotency-Key got %d (same job: %v), want 200 and the original job", b.ReplayStatus, b.ReplaySameJob)
		}
		res.zero("idempotent replay not answered with the original job", replay)
		res.some("hostile requests sent", int64(b.Requests))
	}

	for _, inv := range res.Invariants {
		if !inv.OK {
			res.Failures = append(res.Failures, fmt.Sprintf("%s: %d, want %s", inv.Name, inv.Count, inv.Want))
		}
	}
	res.Passed = len(res.Failures) == 0
	return nil
}

// completions counts the jobs completed between two instants.
func (r *scenarioRun) completions(ctx context.Context, from, until time.Time) (int64, error) {
	rows, err := r.q.ChaosActionCounts(ctx, labdb.ChaosActionCountsParams{Since: from, Until: until})
	if err != nil {
		return 0, fmt.Errorf("chaos: count completions: %w", err)
	}
	for _, row := range rows {
		if row.Action == "complete" {
			return row.N, nil
		}
	}
	return 0, nil
}

// evaluatePause follows the executions each paused worker was running when
// it froze. An acknowledgement counts as accepted after the worker woke when
// the database applied it after then: one the worker sent just before it
// froze may be applied at once, within its lease, and reported to the
// worker only when it wakes.
func (r *scenarioRun) evaluatePause(ctx context.Context, res *Result, d faultLog, faults []labdb.ChaosFault, execs []labdb.ChaosExecution) error {
	applied, err := r.q.ChaosAppliedOutcomes(ctx)
	if err != nil {
		return fmt.Errorf("chaos: read the applied outcomes: %w", err)
	}
	type claim struct{ job, fence int64 }
	appliedAt := make(map[claim]time.Time, len(applied))
	for _, a := range applied {
		appliedAt[claim{a.JobID, a.Fence}] = a.At
	}
	p := &PauseResult{Pauses: len(d.pauses), PauseMs: harness.Millis(r.cfg.Lease * 7 / 4)}
	byID := map[int64]labdb.ChaosFault{}
	for _, f := range faults {
		byID[f.ID] = f
	}
	var latencies []float64
	counted := map[*harness.Proc]bool{}
	for _, pz := range d.pauses {
		f, ok := byID[pz.faultID]
		if !ok || f.EndedAt == nil {
			continue
		}
		p.LongJobsCaught += pz.longJobs
		cancelled := p.HandlersCancelled
		woke := *f.EndedAt
		onWaking := 0
		for _, e := range execs {
			if e.Worker != pz.worker {
				continue
			}
			lost := e.EndedAt != nil && strings.Contains(harness.ValueOf(e.Cause), "lease lost")
			if lost && !e.EndedAt.Before(woke) && e.EndedAt.Before(woke.Add(r.cfg.Lease)) {
				onWaking++
			}
			if !e.StartedAt.Before(f.At) || (e.EndedAt != nil && e.EndedAt.Before(f.At)) {
				continue // not running when the worker froze
			}
			p.InFlight++
			ack, accepted := harness.ValueOf(e.Ack), e.Accepted != nil && *e.Accepted
			switch {
			case e.Ack == nil:
				p.Unknown++
			case accepted && appliedAt[claim{e.JobID, e.Fence}].After(woke):
				at := appliedAt[claim{e.JobID, e.Fence}]
				p.AcceptedAfterWake.add("job %d (fence %d): %s applied %s after %s woke", e.JobID, e.Fence, ack, at.Sub(woke), pz.worker)
			case accepted:
				p.AcceptedBeforeFreeze++
			case ack == "completed" && !accepted:
				p.CompletionsRefused++
			case ack == "failed" && !accepted:
				p.FailuresRefused++
			case ack == "lease_lost":
				p.Dropped++
			}
			if lost {
				p.HandlersCancelled++
				latencies = append(latencies, harness.Millis(e.EndedAt.Sub(woke)))
			}
		}
		p.CancelledOnWaking += onWaking
		if pz.longJobs > 0 && onWaking == 0 {
			p.UncancelledPauses.add("%s, paused holding %d young long jobs: no handler cancelled on waking (%d of those running when it froze)",
				pz.worker, pz.longJobs, p.HandlersCancelled-cancelled)
		}
		if !counted[pz.proc] {
			counted[pz.proc] = true
			if lines, err := pz.proc.Logs(); err == nil {
				for _, l := range lines {
					if l.Msg == "lease lost; cancelling handler" && l.Str("why") == "heartbeat rejected" {
						p.HeartbeatsRefused++
					}
				}
			}
		}
	}
	p.CancelLatency = harness.PercentilesOf(latencies)
	res.Pause = p
	res.some("pauses", int64(p.Pauses))
	res.some("zombie executions (in flight when frozen)", int64(p.InFlight))
	res.zero("zombie acknowledgements accepted after waking", p.AcceptedAfterWake)
	// A pause that caught no long job, as when none ran before its
	// deadline on a loaded machine, may find every zombie handler done
	// by its own timers when the worker wakes: nothing is left to cancel.
	// One that caught some must cancel their handlers.
	res.zero("pauses that caught young long jobs and cancelled no handler on waking", p.UncancelledPauses)
	return nil
}

// evaluatePartition checks that every partitioned worker came back by
// itself (claimed again after the heal, with a new session or the one it
// kept), and that the cuts at commit hit commits.
func (r *scenarioRun) evaluatePartition(ctx context.Context, res *Result, d faultLog, survivors map[string]bool) error {
	sessions, err := r.q.ChaosSessions(ctx)
	if err != nil {
		return fmt.Errorf("chaos: read the sessions: %w", err)
	}
	p := &PartitionResult{CommitCuts: len(d.cuts), AmbiguousCompletions: res.Check.AmbiguousCompletions}
	var unrecovered Finding
	for _, h := range d.heals {
		rec := PartitionRecovery{Worker: h.worker, Kind: h.kind, ReregisteredAfterMs: -1, FirstClaimAfterMs: -1}
		for _, s := range sessions {
			if s.Worker == h.worker && s.At.After(h.at) {
				rec.ReregisteredAfterMs = harness.Millis(s.At.Sub(h.at))
				break
			}
		}
		claims, err := r.q.ChaosFirstClaims(ctx, h.at)
		if err != nil {
			return fmt.Errorf("chaos: read the claims: %w", err)
		}
		for _, c := range claims {
			if c.Worker == h.worker {
				rec.FirstClaimAfterMs = harness.Millis(c.At.Sub(h.at))
			}
		}
		// A worker comes back with a new session, or with the one it
		// had, which a blackhole shorter than the wait for a ping keeps:
		// claiming again after the heal needs a live session either way.
		if rec.ReregisteredAfterMs < 0 && rec.FirstClaimAfterMs < 0 {
			unrecovered.add("%s neither registered a new session nor claimed again after its %s was healed", h.worker, h.kind)
		}
		p.Partitions = append(p.Partitions, rec)
	}
	res.Partition = p
	res.zero("partitioned workers that did not recover by themselves", unrecovered)
	res.zero("processes that had to be restarted", notSurvived(survivors))
	res.some("partitions healed", int64(len(d.heals)))
	res.some("connections cut just after a completion committed", int64(p.CommitCuts))
	res.some("completions that landed while their worker was told they failed", p.AmbiguousCompletions)
	return nil
}

// notSurvived lists the processes that did not run to the end.
func notSurvived(survivors map[string]bool) Finding {
	var f Finding
	names := make([]string, 0, len(survivors))
	for name := range survivors {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !survivors[name] {
			f.add("%s exited during the run", name)
		}
	}
	return f
}

// workerNames lists the workers among survivors, every worker started
// whether it survived or not, sorted: the server is left out.
func workerNames(survivors map[string]bool) []string {
	workers := []string{}
	for name := range survivors {
		if name != "serve" {
			workers = append(workers, name)
		}
	}
	slices.Sort(workers)
	return workers
}

// sessionAfter returns when the first of worker's sessions registered
// after t was, or false if it registered none.
func sessionAfter(sessions []labdb.ChaosSession, worker string, t time.Time) (time.Time, bool) {
	for _, s := range sessions {
		if s.Worker == worker && s.At.After(t) {
			return s.At, true
		}
	}
	return time.Time{}, false
}

// evaluateRestart checks what the clients saw while the database was down,
// and that the server and every worker recovered without a restart.
func (r *scenarioRun) evaluateRestart(ctx context.Context, res *Result, d faultLog, survivors map[string]bool) error {
	sessions, err := r.q.ChaosSessions(ctx)
	if err != nil {
		return fmt.Errorf("chaos: read the sessions: %w", err)
	}
	out := &RestartResult{Answers: map[string]int{}, AnswersWhileDown: map[string]int{}, UnansweredEnqueues: res.Check.Unanswered}
	r.http.mu.Lock()
	events := slices.Clone(r.http.events)
	r.http.mu.Unlock()
	isDown := func(t time.Time) bool {
		for _, rs := range d.restarts {
			if !t.Before(rs.down) && t.Before(rs.up) {
				return true
			}
		}
		return false
	}
	var other5xx, leaks Finding
	var unavailableWhileDown int64
	for _, ev := range events {
		status := strconv.Itoa(ev.status)
		out.Answers[status]++
		if isDown(ev.at) {
			out.AnswersWhileDown[status]++
			if ev.status == 503 {
				unavailableWhileDown++
			}
		}
		// 503: the database could not be reached, nothing was stored; 504:
		// the enqueue was sent and its answer lost, so the job may have
		// been stored, and the client's retry under its Idempotency-Key
		// finds it.
		if ev.status >= 500 && ev.status != 503 && ev.status != 504 {
			other5xx.add("an enqueue was answered %d", ev.status)
		}
		if ev.leak != "" {
			leaks.add("%s", ev.leak)
			out.Leaks = append(out.Leaks, ev.leak)
		}
	}
	var notRecovered Finding
	workers := workerNames(survivors)
	for i, rs := range d.restarts {
		rec := RestartRecord{
			Mode: string(rs.mode), DowntimeMs: harness.Millis(rs.up.Sub(rs.down)), StopMs: harness.Millis(rs.stopTook), StartMs: harness.Millis(rs.up.Sub(rs.start)),
			ReadyzWhileDown: map[string]int{}, FirstEnqueueOKAfterMs: -1, WorkersReregisteredAfterMs: map[string]float64{},
			FirstClaimAfterMs: -1,
		}
		for status, n := range rs.readyzDown {
			rec.ReadyzWhileDown[strconv.Itoa(status)] += n
		}
		for _, ev := range events {
			if ev.at.After(rs.start) && (ev.status == 201 || ev.status == 200) {
				if rec.FirstEnqueueOKAfterMs < 0 || harness.Millis(ev.at.Sub(rs.start)) < rec.FirstEnqueueOKAfterMs {
					rec.FirstEnqueueOKAfterMs = harness.Millis(ev.at.Sub(rs.start))
				}
			}
		}
		if rec.FirstEnqueueOKAfterMs < 0 {
			notRecovered.add("the API acknowledged no enqueue after restart %d", i+1)
		}
		// The database's clock and the harness's are the same host's: the
		// server was down from the stop to the start command, so what the
		// database records after that command came after the restart.
		claims, err := r.q.ChaosFirstClaims(ctx, rs.start)
		if err != nil {
			return fmt.Errorf("chaos: read the claims: %w", err)
		}
		for _, c := range claims {
			if d := harness.Millis(c.At.Sub(rs.start)); rec.FirstClaimAfterMs < 0 || d < rec.FirstClaimAfterMs {
				rec.FirstClaimAfterMs = d
			}
		}
		for _, w := range workers {
			rec.WorkersReregisteredAfterMs[w] = -1
			if at, ok := sessionAfter(sessions, w, rs.start); ok {
				rec.WorkersReregisteredAfterMs[w] = harness.Millis(at.Sub(rs.start))
			} else {
				notRecovered.add("worker %s had no new session after restart %d", w, i+1)
			}
		}
		for status, n := range rs.readyzDown {
			if status != 503 {
				notRecovered.add("/readyz answered %d (%d times) while the database was down, want 503", status, n)
			}
		}
		out.Restarts = append(out.Restarts, rec)
	}
	res.Restart = out
	res.some("restarts", int64(len(d.restarts)))
	res.some("enqueues answered 503 while the database was down", unavailableWhileDown)
	res.zero("enqueues answered with a 5xx other than 503 and 504", other5xx)
	res.zero("error answers revealing internals", leaks)
	res.zero("server or workers not recovered", notRecovered)
	res.zero("processes that had to be restarted", notSurvived(survivors))
	return nil
}

// evaluatePoison counts how the poison jobs ended, and shows that the
// scenario exercised what it means to: the check judges each poison job
// (Check.PoisonMisbehaved, WrongOutcome and Lost).
func (r *scenarioRun) evaluatePoison(res *Result, d faultLog, rows []labdb.ChaosPoisonJobsRow) {
	p := &PoisonResult{Jobs: map[string]int{}, SelfExits: d.selfExits}
	first := true
	for _, row := range rows {
		p.Jobs[row.Kind]++
		if row.State == labdb.JobStateDead && row.Claims == int64(row.MaxAttempts) {
			p.DeadAfterMaxAttempts++
		}
		p.RetriesAfterFailure += int(row.RetriesAfterFailure)
		if row.RetriesAfterFailure > 0 && (first || row.MinBackoffSlackMs < p.MinBackoffSlackMs) {
			p.MinBackoffSlackMs, first = harness.Round3(row.MinBackoffSlackMs), false
		}
	}
	res.Poison = p
	res.some("poison jobs dead after exactly max_attempts claims", int64(p.DeadAfterMaxAttempts))
	res.some("workers killed by their own job", int64(p.SelfExits))
	res.some("retries after a failure checked against their backoff", int64(p.RetriesAfterFailure))
}

// evaluateStarvation checks that no lease was lost while handlers held
// every connection of their pool.
func (r *scenarioRun) evaluateStarvation(res *Result, execs []labdb.ChaosExecution) {
	s := &StarvationResult{
		HoldJobs: 2 * r.cfg.Workers, HoldMs: harness.Millis(r.cfg.Lease * 5 / 4), HandlerPoolSize: DefaultHandlerPoolSize,
		LeaseExpiredReclaims: res.Check.Reclaims["lease expired"],
	}
	var lost, reruns Finding
	for _, e := range execs {
		if harness.ValueOf(e.Ack) == "lease_lost" || strings.Contains(harness.ValueOf(e.Cause), "lease lost") {
			s.LeaseLost++
			lost.add("job %d (%s, fence %d) lost its lease on %s", e.JobID, e.Kind, e.Fence, e.Worker)
		}
		if e.Kind == KindHoldConns {
			s.HoldExecutions++
			if e.EndedAt != nil {
				s.LongestHoldRunMs = max(s.LongestHoldRunMs, harness.Millis(e.EndedAt.Sub(e.StartedAt)))
			}
		}
	}
	if s.HoldExecutions != s.HoldJobs {
		reruns.add("%d executions of %d connection-holding jobs, want one each", s.HoldExecutions, s.HoldJobs)
	}
	var expired Finding
	for range s.LeaseExpiredReclaims {
		expired.add("a lease expired")
	}
	res.Starvation = s
	res.zero("leases expired while handlers held the pool", expired)
	res.zero("executions that lost their lease", lost)
	res.zero("connection-holding jobs run other than once", reruns)
	longer := int64(0)
	if s.LongestHoldRunMs > harness.Millis(r.cfg.Lease) {
		longer = 1
	}
	res.some("connection-holding jobs that ran longer than the lease", longer)
}

// PrintSummary writes one line per result: the figures the issue asks
// for, and whether every invariant held.
func PrintSummary(w io.Writer, results []*Result) {
	fmt.Fprintf(w, "%-13s %7s %6s %5s %6s %6s %6s %6s %16s %12s %10s  %s\n",
		"scenario", "jobs", "faults", "lost", "unexp", "stale", "term", "prem", "duplicates", "worst redeliv", "jobs/s", "result")
	for _, r := range results {
		c := r.Check
		verdict := "PASS"
		if !r.Passed {
			verdict = "FAIL: " + strings.Join(r.Failures, "; ")
		}
		fmt.Fprintf(w, "%-13s %7d %6d %5d %6d %6d %6d %6d %16s %12s %10.0f  %s\n",
			r.Scenario, c.Enqueued, r.FaultsInjected, c.Lost.Count, c.Unexpected.Count, c.StaleAccepted.Count,
			c.TerminalChanges.Count, c.PrematureReclaims.Count,
			fmt.Sprintf("%d (%.2f%%)", c.Duplicates.Jobs, c.Duplicates.Percent),
			worstRedelivery(c), r.Throughput.DuringFaultsPerSec, verdict)
	}
}

// worstRedelivery is the longest wait, from a fault to the next claim, of
// a job its worker held, over every kind of fault, with that kind.
func worstRedelivery(c *Check) string {
	worst, kind := 0.0, ""
	for k, d := range c.ReclaimDelays {
		if d.Redelivered.Max > worst {
			worst, kind = d.Redelivered.Max, k
		}
	}
	if kind == "" {
		return "-"
	}
	return fmt.Sprintf("%.0f ms", worst)
}
