package burndown

import (
	"testing"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/relaybin"
)

func TestMain(m *testing.M) { relaybin.RunTests(m) }

// TestRun_Short burns down a few thousand jobs with two worker processes
// and checks the invariants and that every counter moved, never the
// figures.
func TestRun_Short(t *testing.T) {
	out := t.TempDir()
	res, err := Run(t.Context(), Config{
		AdminURL: dbtest.NewURL(t),
		RelayBin: relaybin.Path(t),
		OutDir:   out,
		Jobs:     2000,
		Configs:  []harness.ProcSlots{{Procs: 2, Slots: 20}},
		Timeout:  2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(res.Runs))
	}
	run := res.Runs[0]
	if !run.OK || run.Succeeded != 2000 || run.Retried != 0 {
		t.Errorf("succeeded %d, retried %d, ok %v; want 2000, 0, true", run.Succeeded, run.Retried, run.OK)
	}
	if !run.LastFinish.After(run.FirstClaim) || run.JobsPerSec <= 0 {
		t.Errorf("span %s to %s, %v jobs/s", run.FirstClaim, run.LastFinish, run.JobsPerSec)
	}
	// Each job is claimed and completed: at least two updates of jobs, and
	// some WAL and commits, per job.
	if run.UpdatesPerJob < 2 || run.WALBytesPerJob <= 0 || run.WALRecordsPerJob <= 0 || run.CommitsPerJob <= 0 || run.JobsIndexes < 1 {
		t.Errorf("counters did not move as a burn-down moves them: %+v", run)
	}
	if run.HOTUpdatesPerJob > run.UpdatesPerJob {
		t.Errorf("%v HOT updates per job, more than the %v updates", run.HOTUpdatesPerJob, run.UpdatesPerJob)
	}
	if err := harness.CheckFiles(res.Files, 1); err != nil {
		t.Error(err)
	}
}
