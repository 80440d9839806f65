package burst

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/builtin"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/relaybin"
)

// TestRun_Short runs a short burst with jobs submitted in batches, and with
// each job a request of its own, and checks that every job ran once.
func TestRun_Short(t *testing.T) {
	for _, batch := range []int{25, 1} {
		t.Run(fmt.Sprintf("batches of %d", batch), func(t *testing.T) { checkShortRun(t, batch) })
	}
}

// workersPlans are the plan settings of relay work's connections
// (worker.KeepGenericPlans).
var workersPlans = PlanSettings{PlanCacheMode: "force_generic_plan", JIT: "off"}

func checkShortRun(t *testing.T, batch int) {
	bin := relaybin.Path(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const jobs = 60
	res, err := Run(ctx, Config{
		AdminURL:     dbtest.NewURL(t),
		RelayBin:     bin,
		OutDir:       t.TempDir(),
		Jobs:         jobs,
		Configs:      []harness.ProcSlots{{Procs: 1, Slots: 2}, {Procs: 2, Slots: 2}},
		Workload:     &builtin.HashPayload{SleepMs: 5, Iterations: 100},
		BatchSize:    batch,
		Submitters:   2,
		ProbeSamples: 10,
	})
	if err != nil {
		t.Fatalf("Burst: %v", err)
	}
	if want := map[bool]string{true: "POST /v1/jobs of one job each", false: "POST /v1/jobs/batch of 25 jobs"}[batch == 1]; !strings.HasPrefix(res.Settings.Submission, want) {
		t.Errorf("submission %q, want %q...", res.Settings.Submission, want)
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
		// The probe times the worker's statement as relay work runs it.
		if p := run.Probe; p == nil {
			t.Errorf("%s: no statement probe recorded", run.Config)
		} else if p.PlanSettings != workersPlans {
			t.Errorf("%s: the statement probe ran with %+v, want a worker's %+v", run.Config, p.PlanSettings, workersPlans)
		}
	}
	// So does the traced worker.
	if tr := res.WorkerTrace; tr == nil {
		t.Error("no worker trace recorded")
	} else if tr.PlanSettings != workersPlans {
		t.Errorf("the traced worker ran with %+v, want a worker's %+v", tr.PlanSettings, workersPlans)
	}
	if err := harness.CheckFiles(res.Files, 3); err != nil {
		t.Error(err)
	}
}

func TestJobTiming_IsAFlatJSONArray(t *testing.T) {
	var tm JobTiming
	if err := tm.UnmarshalJSON([]byte(`[7, 0.5, 1.25, 11.5]`)); err != nil || tm != (JobTiming{7, 0.5, 1.25, 11.5}) {
		t.Errorf("JobTiming = %+v, %v", tm, err)
	}
	if b, err := tm.MarshalJSON(); err != nil || string(b) != `[7,0.5,1.25,11.5]` {
		t.Errorf("JobTiming marshals as %s, %v", b, err)
	}
}
