package burst

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/relayq/relay/experiment/harness"
)

// write writes the JSON record and the charts under outDir.
func (r *Result) write(outDir string) error {
	base, err := harness.ResultBase(outDir, "burst", r.Environment.Date)
	if err != nil {
		return err
	}
	tp, lat := base+"-throughput.svg", base+"-latency.svg"
	if err := throughputChart(r, tp); err != nil {
		return err
	}
	if err := latencyChart(r, lat); err != nil {
		return err
	}
	r.Files = []string{base + ".json", tp, lat}
	return harness.WriteJSON(base+".json", r)
}

// WriteSummary writes the run's figures as tables.
func (r *Result) WriteSummary(w io.Writer) error {
	fmt.Fprintf(w, "%d %s jobs per configuration (%s); %s\n\n", r.Settings.Jobs, r.Settings.JobKind,
		workloadString(r), r.Settings.Submission)
	tw := harness.NewTable(w)
	fmt.Fprintln(tw, "config\tslots\tsubmit\tdrain\tthroughput\tbound\tefficiency\treference\twait p50/p95/p99\tcompletion p50/p95/p99\tp95/floor\tall once")
	for _, run := range r.Runs {
		ref := "-"
		if run.Reference > 0 {
			ref = fmt.Sprintf("%.0f/s", run.Reference)
		}
		fmt.Fprintf(tw, "%s\t%d\t%.0f/s\t%.2f s\t%.1f/s\t%.0f/s\t%.3f\t%s\t%s\t%s\t%.3f\t%v\n",
			run.Config, run.TotalSlots, run.SubmitRate, run.DrainSeconds, run.Throughput, run.Bound, run.Efficiency, ref,
			pctString(run.QueueWait), pctString(run.Completion), run.P95OverFloor, run.Check.OK)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "\nTarget: efficiency ≥ %.2f everywhere, one-slot completion p95 within 5%% of its floor; reference one-slot p95 %.0f s.\n",
		r.TargetEfficiency, r.ReferenceOneSlotP95Ms/1000)

	fmt.Fprintln(w, "\nWhere the time went:")
	tw = harness.NewTable(w)
	fmt.Fprintln(tw, "config\tstartup\tservice/job/slot\toverhead/job\tjobs/stmt\tCPU busy\tsteal\tCPU ms/job: pg backends+server\tworkers\tserve\tnot ours\tcomplete+claim p50/p95\tpaced p50/p95\tWAL flush p50\tround trip p50 (paced)")
	for _, run := range r.Runs {
		stmt, paced, flush, rtt := "-", "-", "-", "-"
		if p := run.Probe; p != nil {
			stmt = fmt.Sprintf("%.2f/%.2f ms", p.CompleteAndClaim.P50, p.CompleteAndClaim.P95)
			paced = fmt.Sprintf("%.2f/%.2f ms", p.CompleteAndClaimPaced.P50, p.CompleteAndClaimPaced.P95)
			flush = fmt.Sprintf("%.2f ms", max(0, p.InTxSyncCommit.P50-p.InTxAsyncCommit.P50))
			rtt = fmt.Sprintf("%.2f ms (%.2f ms)", p.RoundTrip.P50, p.RoundTripPaced.P50)
		}
		perJob := func(sec float64) float64 { return 1000 * sec / float64(max(run.Jobs, 1)) }
		fmt.Fprintf(tw, "%s\t%.0f ms\t%.2f ms\t%.2f ms\t%.2f\t%.0f%%\t%.2f s\t%.2f+%.2f\t%.2f\t%.2f\t%.2f\t%s\t%s\t%s\t%s\n",
			run.Config, run.StartupMs, run.ServiceMsPerJob, run.OverheadMsPerJob, run.JobsPerCompletion,
			100*run.MachineCPUBusy, run.MachineStealSec, perJob(run.PostgresCPUSec), perJob(run.PostgresServerCPU), perJob(run.WorkersCPUSec),
			perJob(run.ServeCPUSec), perJob(run.OtherCPUSec), stmt, paced, flush, rtt)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p := r.Probe; p != nil {
		fmt.Fprintf(w, "hash handler alone (in-process): p50 %.2f ms, p95 %.2f ms; without its sleep: p50 %.2f ms\n",
			p.Handler.P50, p.Handler.P95, p.HashOnly.P50)
	}
	if t := r.WorkerTrace; t != nil {
		fmt.Fprintf(w, "one-slot worker traced in-process (%d jobs), p50/p95: handler %.2f/%.2f ms; handler end → next handler start %.2f/%.2f ms = end → completion accepted %.2f/%.2f ms + accepted → next start %.2f/%.2f ms (negative: the next job, claimed ahead, started first); cycle %.2f/%.2f ms\n",
			t.Jobs, t.Handler.P50, t.Handler.P95, t.EndToNextStart.P50, t.EndToNextStart.P95,
			t.EndToAck.P50, t.EndToAck.P95, t.AckToNextStart.P50, t.AckToNextStart.P95, t.Cycle.P50, t.Cycle.P95)
	}
	for _, run := range r.Runs {
		if p := run.Probe; p != nil && len(p.BackendCPUMs) > 0 {
			c := p.BackendCPUMs
			fmt.Fprintf(w, "%s backend CPU per statement (plan_cache_mode %s, jit %s): complete-and-claim %.2f ms (paced %.2f ms), round trip %.2f ms (paced %.2f ms)\n",
				run.Config, p.PlanCacheMode, p.JIT, c["complete_and_claim"], c["complete_and_claim_paced"], c["round_trip"], c["round_trip_paced"])
		}
	}
	for _, run := range r.Runs {
		si := run.ServiceInterval
		if si == nil || run.Probe == nil || r.Probe == nil {
			continue
		}
		handler, stmt := r.Probe.Handler.P50, run.Probe.CompleteAndClaimPaced.P50
		fmt.Fprintf(w, "%s cycle between two claims (database clock): p50 %.2f ms, p95 %.2f ms, p99 %.2f ms, max %.0f ms; p50 ≈ handler %.2f ms (sleep %d + timer and hash %.2f) + the rest %.2f ms, the complete-and-claim statement (paced %.2f ms, WAL flush %.2f) running beside the next job claimed ahead\n",
			run.Config, si.P50, si.P95, si.P99, si.Max, handler, r.Settings.Workload.SleepMs,
			handler-float64(r.Settings.Workload.SleepMs), si.P50-handler, stmt,
			max(0, run.Probe.InTxSyncCommit.P50-run.Probe.InTxAsyncCommit.P50))
	}
	for _, run := range r.Runs {
		if !run.Check.OK {
			c := run.Check
			fmt.Fprintf(w, "PROBLEM %s: submitted %d, in database %d, lost %d, running %d, not succeeded %d, not exactly once %d\n",
				run.Config, c.Submitted, c.InDatabase, c.Lost, c.Running, c.NotSucceeded, c.NotOnce)
		}
		var workers []string
		for id, n := range run.JobsPerWorker {
			workers = append(workers, fmt.Sprintf("%s %d", id, n))
		}
		sort.Strings(workers)
		if len(workers) > 1 {
			fmt.Fprintf(w, "%s jobs per worker: %s\n", run.Config, strings.Join(workers, ", "))
		}
	}
	for _, f := range r.Files {
		fmt.Fprintf(w, "wrote %s\n", f)
	}
	return nil
}

func workloadString(r *Result) string {
	return fmt.Sprintf("sleep_ms %d, iterations %d", r.Settings.Workload.SleepMs, r.Settings.Workload.Iterations)
}

func pctString(p harness.Percentiles) string {
	return fmt.Sprintf("%s/%s/%s", secs(p.P50), secs(p.P95), secs(p.P99))
}

// secs formats milliseconds as seconds, or as milliseconds below one second.
func secs(ms float64) string {
	if ms < 1000 {
		return fmt.Sprintf("%.0fms", ms)
	}
	return fmt.Sprintf("%.2fs", ms/1000)
}
