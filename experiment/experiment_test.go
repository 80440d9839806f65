package experiment

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/internal/builtin"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/relaybin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	relaybin.Cleanup()
	os.Exit(code)
}

// adminURL returns a URL on the test server whose user may create
// databases: the experiments create their own from it.
func adminURL(t *testing.T) string {
	t.Helper()
	return dbtest.NewURL(t)
}

// TestCrashShort runs the crash experiment in short: one kill and the
// zombie case, with a one-second job and a one-second lease. It asserts the
// invariants, never the figures.
func TestCrashShort(t *testing.T) {
	bin := relaybin.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := t.TempDir()
	res, err := Crash(ctx, CrashConfig{
		AdminURL:        adminURL(t),
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
	if !(k.Claim1.Before(k.Kill) && !k.Reclaim.Before(k.Kill) && !k.Claim2.Before(k.Reclaim) && k.Completion.After(k.Claim2)) {
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
	checkFiles(t, res.Files, 2)
}

// TestBurstShort runs the burst experiment in short: a few jobs on two
// small configurations. It asserts that every job finished exactly once,
// never the figures.
func TestBurstShort(t *testing.T) {
	bin := relaybin.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const jobs = 60
	res, err := Burst(ctx, BurstConfig{
		AdminURL:     adminURL(t),
		RelayBin:     bin,
		OutDir:       t.TempDir(),
		Jobs:         jobs,
		Configs:      []ProcSlots{{1, 2}, {2, 2}},
		Workload:     &builtin.HashPayload{SleepMs: 5, Iterations: 100},
		BatchSize:    25,
		Submitters:   2,
		ProbeSamples: 10,
	})
	if err != nil {
		t.Fatalf("Burst: %v", err)
	}
	var summary strings.Builder
	if err := res.WriteSummary(&summary); err != nil {
		t.Fatal(err)
	}
	t.Logf("summary:\n%s", summary.String())
	if len(res.Runs) != 2 {
		t.Fatalf("%d runs recorded, want 2", len(res.Runs))
	}
	for _, run := range res.Runs {
		c := run.Check
		if !c.OK || c.Submitted != jobs || c.InDatabase != jobs || c.Lost+c.Running+c.NotSucceeded+c.NotOnce != 0 {
			t.Errorf("%s: check %+v, want all %d jobs succeeded exactly once", run.Config, c, jobs)
		}
		if len(run.JobTimings) != jobs {
			t.Errorf("%s: %d job timings, want %d", run.Config, len(run.JobTimings), jobs)
		}
		n := 0
		for id, k := range run.JobsPerWorker {
			if !strings.HasPrefix(id, "burst-"+run.Config+"-w") {
				t.Errorf("%s: job run by unexpected worker %q", run.Config, id)
			}
			n += k
		}
		if n != jobs {
			t.Errorf("%s: workers ran %d jobs, want %d", run.Config, n, jobs)
		}
		if run.FirstSubmit.IsZero() || run.LastFinish.Before(run.FirstSubmit) || run.Throughput <= 0 {
			t.Errorf("%s: first submit %s, last finish %s, throughput %v", run.Config, run.FirstSubmit, run.LastFinish, run.Throughput)
		}
	}
	checkFiles(t, res.Files, 3)
}

func checkFiles(t *testing.T, files []string, want int) {
	t.Helper()
	if len(files) != want {
		t.Errorf("files %v, want %d", files, want)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			t.Errorf("result file: %v", err)
		} else if st.Size() == 0 {
			t.Errorf("result file %s is empty", f)
		}
	}
}

// TestProcPauseResumeStop checks that Pause stops the process, Resume
// lets it run again, and StopAll ends a paused process by SIGTERM.
func TestProcPauseResumeStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	procs := NewProcs("sleep", t.TempDir())
	defer procs.KillAll()
	p, err := procs.Start(ctx, "sleeper", "30")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	waitStopped(ctx, t, p, true)
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	waitStopped(ctx, t, p, false)
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	waitStopped(ctx, t, p, true)
	// Stop must thaw a paused process for it to act on SIGTERM: one that
	// did not would be SIGKILLed after the grace, and StopAll would return
	// an error saying so.
	if err := procs.StopAll(ctx, 5*time.Second); err != nil {
		t.Fatalf("StopAll: %v", err)
	}
	if !p.Exited() {
		t.Error("process still running after StopAll")
	}
	if err := p.Kill(); err == nil {
		t.Error("Kill of an exited process succeeded")
	}
}

// waitStopped waits until the kernel reports p stopped by a signal (state
// T in /proc/PID/stat), or, when stopped is false, in any other state. The
// signals are delivered asynchronously, so it polls until ctx ends. It
// checks nothing where there is no /proc/PID/stat, off Linux.
func waitStopped(ctx context.Context, t *testing.T, p *Proc, stopped bool) {
	t.Helper()
	if runtime.GOOS != "linux" {
		return
	}
	for {
		state, err := procState(p.PID())
		if err != nil {
			t.Fatal(err)
		}
		if (state == 'T') == stopped {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s (pid %d) in state %c, want stopped %v", p.Name, p.PID(), state, stopped)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// procState returns the state letter of process pid from /proc/PID/stat.
func procState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read the state of pid %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: the state
	// follows its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("pid %d: malformed stat %q", pid, b)
	}
	return b[i+2], nil
}

func TestParseLogLine(t *testing.T) {
	l := ParseLogLine(`{"time":"2026-11-29T09:30:00.123456789Z","level":"WARN","msg":"completion rejected: the lease is no longer this worker's","worker":"w1","job":42,"attempt":1}`)
	if l.Level != "WARN" || !strings.HasPrefix(l.Msg, "completion rejected") || l.Str("worker") != "w1" {
		t.Errorf("parsed %+v", l)
	}
	if id, ok := l.Int("job"); !ok || id != 42 {
		t.Errorf("job = %d, %v; want 42", id, ok)
	}
	if !rejectionLine(l, 42) || rejectionLine(l, 43) {
		t.Error("rejectionLine does not pick the job's rejection")
	}
	if l.Time.IsZero() {
		t.Error("time not parsed")
	}
	plain := ParseLogLine("relay: cannot reach the database")
	if plain.Msg != "relay: cannot reach the database" || plain.Attrs != nil {
		t.Errorf("plain line parsed as %+v", plain)
	}
}

func TestParseConfigs(t *testing.T) {
	got, err := ParseConfigs("1x1, 1x4,3x4")
	if err != nil {
		t.Fatal(err)
	}
	want := []ProcSlots{{1, 1}, {1, 4}, {3, 4}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("got %v, want %v", got, want)
		}
	}
	if back := FormatConfigs(got); back != "1x1,1x4,3x4" {
		t.Errorf("FormatConfigs(%v) = %q, want %q", got, back, "1x1,1x4,3x4")
	}
	for _, bad := range []string{"", "1", "x4", "0x1", "1x0", "1x4,", "ax2"} {
		if _, err := ParseConfigs(bad); err == nil {
			t.Errorf("ParseConfigs(%q) succeeded", bad)
		}
	}
}

func TestPercentiles(t *testing.T) {
	var vals []float64
	for i := 100; i >= 1; i-- {
		vals = append(vals, float64(i))
	}
	p := percentiles(vals)
	if p.N != 100 || p.Min != 1 || p.P50 != 50 || p.P95 != 95 || p.P99 != 99 || p.Max != 100 || p.Mean != 50.5 {
		t.Errorf("percentiles = %+v", p)
	}
	if m, w := medianWorst([]float64{3, 1, 2, 10}); m != 2.5 || w != 10 {
		t.Errorf("medianWorst = %v, %v", m, w)
	}
}

func TestCompactFlatJSON(t *testing.T) {
	in := []byte("{\n  \"a\": [\n    1,\n    2.5\n  ],\n  \"b\": {\n    \"x\": \"s, {t}\",\n    \"y\": null\n  },\n  \"c\": [\n    [\n      1,\n      2\n    ]\n  ]\n}")
	want := "{\n  \"a\": [1, 2.5],\n  \"b\": {\"x\": \"s, {t}\", \"y\": null},\n  \"c\": [\n    [1, 2]\n  ]\n}"
	if got := string(compactFlat(in)); got != want {
		t.Errorf("compactFlat:\n%s\nwant:\n%s", got, want)
	}
	var tm JobTiming
	if err := tm.UnmarshalJSON([]byte(`[7, 0.5, 1.25, 11.5]`)); err != nil || tm != (JobTiming{7, 0.5, 1.25, 11.5}) {
		t.Errorf("JobTiming = %+v, %v", tm, err)
	}
	if b, err := tm.MarshalJSON(); err != nil || string(b) != `[7,0.5,1.25,11.5]` {
		t.Errorf("JobTiming marshals as %s, %v", b, err)
	}
}
