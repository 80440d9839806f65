package chaos

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
)

// Check is what the checker found in the recorded history of a run:
// the invariants that hold in every scenario, and the costs of the faults.
type Check struct {
	// Enqueued is how many enqueues were acknowledged.
	Enqueued int64 `json:"enqueued"`
	// Executions is how many handler executions were recorded.
	Executions int64 `json:"executions"`
	// Faults counts the recorded faults by kind.
	Faults map[string]int `json:"faults"`

	// Lost: acknowledged jobs that did not end succeeded or dead. Must be 0.
	Lost Finding `json:"lost"`
	// WrongOutcome: acknowledged jobs that finished in another state than
	// their kind must (poison kinds dead, others succeeded). Must be 0.
	WrongOutcome Finding `json:"wrong_outcome"`
	// Unexpected: executions of jobs the harness never enqueued. Must be 0.
	Unexpected Finding `json:"unexpected"`
	// Phantoms: jobs in the table that nobody enqueued (no acknowledged
	// enqueue, no Idempotency-Key of the harness). Must be 0.
	Phantoms Finding `json:"phantoms"`
	// Unanswered counts jobs the harness sent whose acknowledgement never
	// arrived (a request cut by a restart) but which were stored: allowed,
	// and run like any other.
	Unanswered int64 `json:"unanswered_enqueues"`
	// StaleAccepted: acknowledgements (complete, fail, heartbeat, release)
	// accepted from a claim that was not the job's current one or after its
	// lease expired by the database's clock, and executions told they were
	// accepted with no matching transition. Must be 0.
	StaleAccepted Finding `json:"stale_accepted"`
	// TerminalChanges: updates of a job that had succeeded or died. Must
	// be 0.
	TerminalChanges Finding `json:"terminal_changes"`
	// PrematureReclaims: reclaims while the lease was valid and the worker
	// alive (its session not ended by a fault). Must be 0.
	PrematureReclaims Finding `json:"premature_reclaims"`
	// PoisonMisbehaved: poison jobs that ended dead after other than
	// max_attempts claims (or with another attempt), or that were claimed
	// again before the backoff of their last failure. Must be 0.
	PoisonMisbehaved Finding `json:"poison_misbehaved"`

	// Duplicates describes the jobs of healthy kinds that ran more than
	// once: allowed (at-least-once), explained by the faults.
	Duplicates Duplicates `json:"duplicates"`
	// AmbiguousCompletions counts completions that committed although
	// their worker was told they had not (the answer was lost, the retry
	// found the job already done): harmless, and the evidence that a cut
	// landed on a commit.
	AmbiguousCompletions int64 `json:"ambiguous_completions"`
	// Reclaims counts reclaims by reason.
	Reclaims map[string]int `json:"reclaims"`
	// ReclaimDelays times, per kind of fault, how long the jobs a faulted
	// worker held waited: until reclaimed (detected) and until claimed
	// again (redelivered), from the fault.
	ReclaimDelays map[string]Delays `json:"reclaim_delays"`
	// WorstRedeliveryAfterDeathMs is the longest any job waited, from the
	// death of its worker's process (kill, self_exit, crash) until it was
	// claimed again.
	WorstRedeliveryAfterDeathMs float64 `json:"worst_redelivery_after_death_ms"`
}

// Finding is a count of violations with a few examples.
type Finding struct {
	// Count is how many violations were found.
	Count int64 `json:"count"`
	// Examples describe the first few.
	Examples []string `json:"examples,omitempty"`
}

// maxExamples bounds the examples kept per finding.
const maxExamples = 5

func (f *Finding) add(format string, args ...any) {
	f.Count++
	if len(f.Examples) < maxExamples {
		f.Examples = append(f.Examples, fmt.Sprintf(format, args...))
	}
}

// Duplicates counts the jobs that ran more than once.
type Duplicates struct {
	// Jobs is how many jobs of healthy kinds ran more than once.
	Jobs int64 `json:"jobs"`
	// Percent is Jobs as a share of the acknowledged jobs.
	Percent float64 `json:"percent"`
	// ExtraExecutions is how many executions beyond the first they made.
	ExtraExecutions int64 `json:"extra_executions"`
	// MaxRuns is the most executions of one job.
	MaxRuns int64 `json:"max_runs"`
}

// Delays times the recovery of the jobs held at one kind of fault.
type Delays struct {
	// Detected: from the fault until the job was reclaimed.
	Detected harness.Percentiles `json:"detected"`
	// Redelivered: from the fault until the job was claimed again.
	Redelivered harness.Percentiles `json:"redelivered"`
}

// The kinds of fault that end a worker's database session, and so explain
// a reclaim for 'worker session ended'; and those that end its process.
var (
	sessionFaults = map[string]bool{
		"kill": true, "self_exit": true, "crash": true, "partition_cut": true,
		"blackhole": true, "backend_kill_session": true, "db_restart": true,
	}
	deathFaults = map[string]bool{"kill": true, "kill_lease_only": true, "self_exit": true, "crash": true}
)

// recordedHistory is what the checker read that a run's report uses too.
type recordedHistory struct {
	faults []labdb.ChaosFault
	poison []labdb.ChaosPoisonJobsRow
}

// CheckHistory checks the history recorded in a run's database (the
// tables of experiment/schema/chaos.sql) against the invariants of an
// at-least-once queue. It reads the database alone, so it can judge any
// history, including one made by hand.
func CheckHistory(ctx context.Context, q *labdb.Queries) (*Check, error) {
	c, _, err := checkHistory(ctx, q)
	return c, err
}

// checkHistory is CheckHistory, and returns the rows of the
// history that the report reads too.
func checkHistory(ctx context.Context, q *labdb.Queries) (*Check, *recordedHistory, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c := &Check{Faults: map[string]int{}, Reclaims: map[string]int{}, ReclaimDelays: map[string]Delays{}}

	progress, err := q.ChaosProgress(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: progress: %w", err)
	}
	c.Enqueued = progress.Enqueued

	lost, err := q.ChaosLost(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: lost jobs: %w", err)
	}
	for _, l := range lost {
		c.Lost.add("job %d (enqueued via %s) is %s", l.JobID, l.Via, l.State)
	}

	wrong, err := q.ChaosWrongOutcome(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: outcomes: %w", err)
	}
	for _, w := range wrong {
		c.WrongOutcome.add("job %d (%s) ended %s after %d of %d attempts", w.ID, w.Kind, w.State, w.Attempt, w.MaxAttempts)
	}

	unexpected, err := q.ChaosUnexpected(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: unexpected executions: %w", err)
	}
	for _, u := range unexpected {
		c.Unexpected.add("job %d (fence %d) ran on %s but was never enqueued", u.JobID, u.Fence, u.Worker)
	}

	unacked, err := q.ChaosUnacknowledgedJobs(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: unacknowledged jobs: %w", err)
	}
	for _, u := range unacked {
		if u.SentByHarness {
			c.Unanswered++
		} else {
			c.Phantoms.add("job %d (%s) was stored but never enqueued", u.ID, u.Kind)
		}
	}

	staleT, err := q.ChaosStaleTransitions(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: stale transitions: %w", err)
	}
	for _, s := range staleT {
		expires := "no lease"
		if s.OldLeaseExpiresAt != nil {
			expires = fmt.Sprintf("lease expired %s before", s.TxAt.Sub(*s.OldLeaseExpiresAt))
		}
		c.StaleAccepted.add("job %d: %s accepted at fence %d (%s; %s)", s.JobID, s.Action, s.OldFence, s.Reason, expires)
	}
	staleX, err := q.ChaosStaleAcceptedExecutions(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: stale executions: %w", err)
	}
	for _, s := range staleX {
		c.StaleAccepted.add("job %d: %s of fence %d on %s reported accepted, but no such transition exists", s.JobID, harness.ValueOf(s.Ack), s.Fence, s.Worker)
	}

	terminal, err := q.ChaosTerminalChanges(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: terminal changes: %w", err)
	}
	for _, t := range terminal {
		c.TerminalChanges.add("job %d left %s for %s (%s) at %s", t.JobID, t.OldState, t.NewState, t.Action, t.At.Format(time.RFC3339Nano))
	}

	faults, err := q.ChaosFaults(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: faults: %w", err)
	}
	for _, f := range faults {
		c.Faults[f.Kind]++
	}
	reclaims, err := q.ChaosReclaims(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: reclaims: %w", err)
	}
	c.judgeReclaims(reclaims, faults)

	dups, err := q.ChaosDuplicates(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: duplicates: %w", err)
	}
	c.Executions = dups.Executions
	c.Duplicates = Duplicates{Jobs: dups.DuplicatedJobs, ExtraExecutions: dups.ExtraExecutions, MaxRuns: dups.MaxRuns}
	if c.Enqueued > 0 {
		c.Duplicates.Percent = harness.Round3(100 * float64(dups.DuplicatedJobs) / float64(c.Enqueued))
	}

	ambiguous, err := q.ChaosAmbiguousCompletions(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: ambiguous completions: %w", err)
	}
	c.AmbiguousCompletions = int64(len(ambiguous))

	poison, err := q.ChaosPoisonJobs(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos check: poison jobs: %w", err)
	}
	for _, p := range poison {
		switch {
		case p.State == labdb.JobStateDead && (p.Claims != int64(p.MaxAttempts) || p.Attempt != p.MaxAttempts):
			c.PoisonMisbehaved.add("job %d (%s) ended dead after %d claims (attempt %d), not max_attempts %d", p.ID, p.Kind, p.Claims, p.Attempt, p.MaxAttempts)
		case p.EarlyClaims > 0:
			c.PoisonMisbehaved.add("job %d (%s) was claimed %d times before its backoff was over (by as much as %.0f ms)", p.ID, p.Kind, p.EarlyClaims, -p.MinBackoffSlackMs)
		}
	}
	return c, &recordedHistory{faults: faults, poison: poison}, nil
}

// judgeReclaims finds the premature reclaims and times the recovery of the
// jobs held at each fault.
//
// A reclaim for 'lease expired' is premature if the lease had not expired
// at the reclaim's statement time. A reclaim for 'worker session ended' is
// premature unless a fault that ends sessions hit that worker (or all
// workers) after the session under which the job was claimed registered,
// and before the reclaim: a worker whose session was never touched was
// alive. (An unexpected crash is recorded when noticed, after the fact,
// and is a failure of its own; it explains its reclaims at any time.)
func (c *Check) judgeReclaims(reclaims []labdb.ChaosReclaimsRow, faults []labdb.ChaosFault) {
	delays := map[string]*struct{ detected, redelivered []float64 }{}
	for _, rc := range reclaims {
		c.Reclaims[rc.Reason]++
		switch rc.Reason {
		case "lease expired":
			if rc.OldLeaseExpiresAt == nil || rc.OldLeaseExpiresAt.After(rc.TxAt) {
				c.PrematureReclaims.add("job %d reclaimed from %s for an expired lease %s before it expired", rc.JobID, rc.Worker, leaseLeft(rc))
			}
		case "worker session ended":
			if !sessionEndedByFault(rc, faults) {
				c.PrematureReclaims.add("job %d reclaimed from %s at %s for an ended session (%s), but no fault ended that session (lease still valid for %s)",
					rc.JobID, rc.Worker, rc.At.Format(time.RFC3339Nano), sessionOf(rc), leaseLeft(rc))
			}
		default:
			c.PrematureReclaims.add("job %d reclaimed from %s for an unknown reason %q", rc.JobID, rc.Worker, rc.Reason)
		}
		f := attributeReclaim(rc, faults)
		if f == nil {
			continue
		}
		d := delays[f.Kind]
		if d == nil {
			d = &struct{ detected, redelivered []float64 }{}
			delays[f.Kind] = d
		}
		d.detected = append(d.detected, harness.Millis(rc.At.Sub(f.At)))
		if !rc.NextClaimAt.IsZero() {
			redelivered := harness.Millis(rc.NextClaimAt.Sub(f.At))
			d.redelivered = append(d.redelivered, redelivered)
			if deathFaults[f.Kind] && redelivered > c.WorstRedeliveryAfterDeathMs {
				c.WorstRedeliveryAfterDeathMs = redelivered
			}
		}
	}
	kinds := make([]string, 0, len(delays))
	for k := range delays {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		c.ReclaimDelays[k] = Delays{Detected: harness.PercentilesOf(delays[k].detected), Redelivered: harness.PercentilesOf(delays[k].redelivered)}
	}
}

// sessionOf names the session a reclaimed claim was made under, and when
// that session registered.
func sessionOf(rc labdb.ChaosReclaimsRow) string {
	if rc.OldLeaseSession == nil {
		return "claimed without a session"
	}
	return fmt.Sprintf("session %d, registered at %s", *rc.OldLeaseSession, rc.SessionAt.Format(time.RFC3339Nano))
}

// sessionEndedByFault reports whether a fault explains a reclaim for an
// ended session.
func sessionEndedByFault(rc labdb.ChaosReclaimsRow, faults []labdb.ChaosFault) bool {
	for _, f := range faults {
		if !sessionFaults[f.Kind] || (f.Target != rc.Worker && f.Target != "*") {
			continue
		}
		if f.Kind == "crash" {
			return true
		}
		if f.At.After(rc.At) {
			continue
		}
		if !rc.SessionAt.IsZero() && f.At.Before(rc.SessionAt) {
			continue // that session registered after the fault
		}
		return true
	}
	return false
}

// attributeReclaim returns the fault that took the reclaimed job from its
// worker: the latest fault on that worker (or all) between the claim's
// session and the reclaim, among those that end sessions, stall a worker
// or kill one that has no session; or nil.
func attributeReclaim(rc labdb.ChaosReclaimsRow, faults []labdb.ChaosFault) *labdb.ChaosFault {
	var found *labdb.ChaosFault
	for i := range faults {
		f := &faults[i]
		if !sessionFaults[f.Kind] && f.Kind != "pause" && f.Kind != "kill_lease_only" {
			continue
		}
		if (f.Target != rc.Worker && f.Target != "*") || f.At.After(rc.At) {
			continue
		}
		if rc.ClaimedAt != nil && f.At.Before(*rc.ClaimedAt) && !rc.SessionAt.IsZero() && f.At.Before(rc.SessionAt) {
			continue
		}
		if rc.ClaimedAt != nil && rc.ClaimedAt.After(f.At) && f.Kind == "pause" {
			continue // claimed after the pause began: not held by the zombie
		}
		if found == nil || f.At.After(found.At) {
			found = f
		}
	}
	return found
}

// leaseLeft describes how much of the lease was left at a reclaim.
func leaseLeft(rc labdb.ChaosReclaimsRow) string {
	if rc.OldLeaseExpiresAt == nil {
		return "(no lease)"
	}
	return rc.OldLeaseExpiresAt.Sub(rc.TxAt).String()
}
