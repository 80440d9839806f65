package crash

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/relaybin"
)

// TestRun_Short runs the crash experiment in short: one kill and the
// zombie case, with a one-second job and a one-second lease. It asserts the
// invariants, never the figures.
func TestRun_Short(t *testing.T) {
	bin := relaybin.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := t.TempDir()
	res, err := Run(ctx, Config{
		AdminURL:        dbtest.NewURL(t),
		RelayBin:        bin,
		OutDir:          out,
		Trials:          1,
		JobDuration:     time.Second,
		KillAfter:       300 * time.Millisecond,
		ZombieLease:     time.Second,
		ZombieHeartbeat: 250 * time.Millisecond,
		PauseAfter:      200 * time.Millisecond,
	})
	if err != nil {
		t.Fatalf("Crash: %v", err)
	}
	var summary strings.Builder
	if err := res.WriteSummary(&summary); err != nil {
		t.Fatal(err)
	}
	t.Logf("summary:\n%s", summary.String())

	if len(res.Trials) != 1 {
		t.Fatalf("%d kill trials recorded, want 1", len(res.Trials))
	}
	k := res.Trials[0]
	if !k.OK {
		t.Errorf("kill trial not OK: %v", k.Problems)
	}
	if k.Victim.ID == k.Replacement.ID || k.Victim.PID == k.Replacement.PID {
		t.Errorf("victim %+v and replacement %+v are the same worker", k.Victim, k.Replacement)
	}
	if k.State != "succeeded" || k.Attempts != 2 || k.ResultAttempt != 2 || k.ResultWorker != k.Replacement.ID || k.ResultPID != k.Replacement.PID {
		t.Errorf("killed worker's job: state %s, attempts %d, result of attempt %d by %s (pid %d); want succeeded on attempt 2 by %s (pid %d)",
			k.State, k.Attempts, k.ResultAttempt, k.ResultWorker, k.ResultPID, k.Replacement.ID, k.Replacement.PID)
	}
	// A killed worker's session ends with it: the job must not have waited
	// for the (30 s) lease.
	if k.ReclaimReason != "worker session ended" {
		t.Errorf("killed worker's job reclaimed for %q, want %q", k.ReclaimReason, "worker session ended")
	}
	// The reclaim is not ordered with the kill: its time is its
	// transaction's start, and a reclaim that began just before the kill
	// can still find the session ended.
	if !(k.Claim1.Before(k.Kill) && k.Claim1.Before(k.Reclaim) && !k.Claim2.Before(k.Reclaim) && k.Completion.After(k.Claim2)) {
		t.Errorf("timeline out of order: claim1 %s, kill %s, reclaim %s, claim2 %s, completion %s",
			k.Claim1, k.Kill, k.Reclaim, k.Claim2, k.Completion)
	}

	z := res.Zombie
	if z == nil {
		t.Fatal("no zombie case recorded")
	}
	if !z.OK || !z.StaleAckRejected {
		t.Errorf("zombie case not OK (stale ack rejected %v): %v", z.StaleAckRejected, z.Problems)
	}
	if z.ReclaimReason != "lease expired" {
		t.Errorf("frozen worker's job reclaimed for %q, want %q: its session was alive", z.ReclaimReason, "lease expired")
	}
	if z.State != "succeeded" || z.Attempts != 2 || z.ResultAttempt != 2 || z.ResultWorker != z.Replacement.ID || !z.ResultUnchanged {
		t.Errorf("zombie's job: state %s, attempts %d, result of attempt %d by %s, unchanged %v; want attempt 2's result by %s, unchanged",
			z.State, z.Attempts, z.ResultAttempt, z.ResultWorker, z.ResultUnchanged, z.Replacement.ID)
	}
	// The evidence is the zombie's own log.
	rejected := false
	for _, l := range z.ZombieLog {
		if rejectionLine(l, z.JobID) || l.Str("why") == "heartbeat rejected" {
			rejected = true
		}
	}
	if !rejected {
		t.Errorf("the zombie's log has no rejection for job %d: %+v", z.JobID, z.ZombieLog)
	}
	if !z.Resume.After(z.Completion) {
		t.Errorf("zombie thawed at %s, before the replacement completed at %s", z.Resume, z.Completion)
	}
	if err := harness.CheckFiles(res.Files, 2); err != nil {
		t.Error(err)
	}
}

// TestRun_AKillIsFoundInABusyFleetBehindAPooler kills a worker beside a
// fleet larger than the one in which every worker looks for dead workers'
// jobs at the base interval, the fleet's pools through a pooler and jobs
// put on its queue all along, and checks that the job came back for its
// worker's session, not its lease, that the fleet was live at the kill,
// and that every job put on the fleet's queue is accounted for.
func TestRun_AKillIsFoundInABusyFleetBehindAPooler(t *testing.T) {
	const (
		fleet = 20
		rate  = 50
		job   = 5 * time.Millisecond
	)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, Config{
		AdminURL:        dbtest.NewURL(t),
		RelayBin:        relaybin.Path(t),
		Trials:          1,
		JobDuration:     time.Second,
		KillAfter:       300 * time.Millisecond,
		SkipZombie:      true,
		Fleet:           fleet,
		FleetPoolerSize: 2,
		FleetRate:       rate,
		FleetJob:        job,
	})
	if err != nil {
		t.Fatalf("Crash: %v", err)
	}
	if len(res.Trials) != 1 {
		t.Fatalf("%d kill trials recorded, want 1", len(res.Trials))
	}
	k := res.Trials[0]
	if !k.OK || k.ReclaimReason != "worker session ended" {
		t.Errorf("kill trial OK %v, reclaimed for %q (problems %v); want OK, for the session", k.OK, k.ReclaimReason, k.Problems)
	}
	if k.LiveWorkers != fleet+2 {
		t.Errorf("%d live workers at the kill, want the fleet's %d and the trial's 2", k.LiveWorkers, fleet)
	}
	if s := res.Settings; s.Fleet != fleet || s.FleetPooler == nil || s.FleetPooler.PoolSize != 2 || s.FleetPooler.PoolMode != "transaction" {
		t.Errorf("settings record a fleet of %d behind %+v, want %d behind a transaction-mode pooler of 2", s.Fleet, s.FleetPooler, fleet)
	}
	l := res.FleetLoad
	if l == nil {
		t.Fatal("no record of the fleet's load")
	}
	if l.RatePerSec != rate || l.JobMs != 5 || l.Seconds <= 0 {
		t.Errorf("load recorded as %g jobs/s of %g ms for %g s, want %d of 5 ms for some time", l.RatePerSec, l.JobMs, l.Seconds, rate)
	}
	if l.Enqueued == 0 || l.EnqueueErrors != 0 {
		t.Errorf("%d jobs put on the fleet's queue, %d refused (first: %s); want some, none refused", l.Enqueued, l.EnqueueErrors, l.FirstError)
	}
	if counted := l.Succeeded + l.Running + l.Available + l.Failed; counted != l.Enqueued || l.Succeeded == 0 || l.Failed != 0 {
		t.Errorf("the fleet's queue holds %d succeeded, %d running, %d waiting and %d failed jobs; want the %d accepted, some succeeded, none failed",
			l.Succeeded, l.Running, l.Available, l.Failed, l.Enqueued)
	}
	if l.PickupP50Ms <= 0 || l.PickupP95Ms < l.PickupP50Ms || l.PickupP99Ms < l.PickupP95Ms {
		t.Errorf("pickup p50 %g, p95 %g, p99 %g ms; want positive and in order", l.PickupP50Ms, l.PickupP95Ms, l.PickupP99Ms)
	}
	var summary strings.Builder
	if err := res.WriteSummary(&summary); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(summary.String(), fmt.Sprintf("Its load: %d jobs/s of sleep (5 ms)", rate)) {
		t.Errorf("the summary does not describe the fleet's load:\n%s", summary.String())
	}
}

func TestRejectionLine_PicksTheZombiesRejectionOfItsJob(t *testing.T) {
	l := harness.ParseLogLine(`{"time":"2026-11-29T09:30:00.123456789Z","level":"WARN","msg":"completion rejected: the lease is no longer this worker's","worker":"w1","job":42,"attempt":1}`)
	if !rejectionLine(l, 42) || rejectionLine(l, 43) {
		t.Error("rejectionLine does not pick the job's rejection")
	}
}

// TestSummarize_LeavesOutAReclaimTheHistoryDoesNotHold checks that a kill
// trial whose job's history holds no reclaim of attempt 1 (a failed
// trial, which says so) adds nothing to the kill-to-reclaim figures: its
// reclaim time is unknown, not the zero time, and the median and the worst
// are those of the trials that have one.
func TestSummarize_LeavesOutAReclaimTheHistoryDoesNotHold(t *testing.T) {
	kill := time.Date(2026, 12, 7, 5, 0, 0, 0, time.UTC)
	ms := func(v int) time.Time { return kill.Add(time.Duration(v) * time.Millisecond) }
	var trials []KillTrial
	for i, reclaim := range []int{100, 150, 160, 200, 0} {
		tr := KillTrial{Trial: i + 1, Kill: kill}
		tr.Claim2, tr.Completion = ms(reclaim+5), ms(reclaim+2005)
		if reclaim > 0 {
			tr.Reclaim = ms(reclaim)
		} else {
			tr.Claim2, tr.Completion = ms(300), ms(2300)
			tr.Problems = []string{"no reclaim entry for attempt 1 in the error history"}
		}
		tr.measure()
		tr.OK = len(tr.Problems) == 0
		trials = append(trials, tr)
	}
	s := summarize(&Result{Trials: trials})
	if s.KillToReclaimMedianMs != 155 || s.KillToReclaimWorstMs != 200 {
		t.Errorf("kill to reclaim: median %v ms, worst %v; want 155 and 200, from the four trials with a reclaim", s.KillToReclaimMedianMs, s.KillToReclaimWorstMs)
	}
	if s.KillToClaim2MedianMs != 165 || s.KillToClaim2WorstMs != 300 {
		t.Errorf("kill to claim 2: median %v ms, worst %v; want 165 and 300, from every trial", s.KillToClaim2MedianMs, s.KillToClaim2WorstMs)
	}
	if s.CompletedOnAttempt2 != 4 || s.TargetMet {
		t.Errorf("%d trials completed on attempt 2, target met %v; want 4, and not met", s.CompletedOnAttempt2, s.TargetMet)
	}
}
