package soak

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/relaybin"
)

func TestMain(m *testing.M) { relaybin.RunTests(m) }

// shortPhase is how long each phase of the tests' soaks runs.
const shortPhase = 6 * time.Second

// shortConfig is a soak of a few seconds a phase, sampled every 1.5 s,
// on a private cluster, with results written under the test's directory.
func shortConfig(t *testing.T) Config {
	t.Helper()
	phases := map[PhaseKind]time.Duration{}
	for _, k := range Kinds {
		phases[k] = shortPhase
	}
	return Config{
		RelayBin: relaybin.Path(t),
		OutDir:   outDir(t),
		Phases:   phases,
		Rate:     200,
		Interval: 1500 * time.Millisecond,
		Workers:  harness.ProcSlots{Procs: 1, Slots: 10},
	}
}

// TestRun_PhasesPinAndReleaseTheHorizon runs the short soak on a private
// cluster, as the command does by default, with the workers keeping a
// succeeded job as briefly as the soak allows, and checks that each phase
// did what it is for: every phase has samples; the clean phase keeps up
// with the offered load; the idle transaction's horizon grows older
// through its phase and is released after it; the readers' snapshot ages,
// their backends at the nice value given; the overload phase offers more;
// and the server's settings and the results were written; and the
// workers pruned succeeded jobs along the way. (On the
// test server, the soak's WAL would keep the burn-down's test, which waits
// for the server's counters to settle, from seeing them settle.)
func TestRun_PhasesPinAndReleaseTheHorizon(t *testing.T) {
	cfg := shortConfig(t)
	cfg.RetainSucceeded = MinRetainSucceeded(cfg.Interval)
	cfg.ReadersNice = 5
	cfg.LogDir = t.TempDir()
	res, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	var summary strings.Builder
	if err := res.WriteSummary(&summary); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + summary.String())
	if len(res.Phases) != len(Kinds) {
		t.Fatalf("%d phases, want %d", len(res.Phases), len(Kinds))
	}
	byKind := map[string][]Sample{}
	for _, s := range res.Samples {
		byKind[s.Phase] = append(byKind[s.Phase], s)
	}
	phase := map[PhaseKind]Phase{}
	for i, k := range Kinds {
		p := res.Phases[i]
		if p.Kind != string(k) {
			t.Fatalf("phase %d is %q, want %q", i, p.Kind, k)
		}
		phase[k] = p
		if n := len(byKind[string(k)]); n < 2 {
			t.Errorf("phase %s has %d samples, want at least 2", k, n)
		}
		if p.Pickup.N == 0 {
			t.Errorf("phase %s claimed no job", k)
		}
	}

	clean := phase[PhaseClean]
	if clean.KeptUp < 0.8 || clean.SucceededPerSec < 0.8*clean.RatePerSec {
		t.Errorf("clean phase: %.0f jobs/s succeeded of %.0f enqueued (%.0f offered), kept up %.3f; want at least 0.8",
			clean.SucceededPerSec, clean.EnqueuedPerSec, clean.RatePerSec, clean.KeptUp)
	}

	idle := byKind[string(PhaseIdleInTransaction)]
	if len(idle) >= 2 {
		// The phase's last sample may be taken as the transaction ends, so
		// the age it reached is the oldest any sample of the phase saw.
		first, peak := idle[0], idle[0]
		for _, s := range idle {
			if s.XidAge > peak.XidAge {
				peak = s
			}
		}
		if peak.XidAge <= first.XidAge || peak.XidAge < 50 {
			t.Errorf("idle-in-transaction: the oldest backend_xid aged from %d to at most %d transactions; want it to grow past 50", first.XidAge, peak.XidAge)
		}
		after := byKind[string(PhaseOverload)]
		if len(after) > 0 && after[0].XidAge >= peak.XidAge {
			t.Errorf("after the idle transaction ended, the oldest backend_xid is %d transactions old, not below the %d it reached", after[0].XidAge, peak.XidAge)
		}
	}
	if p := phase[PhaseIdleInTransaction]; p.IdleXID == 0 {
		t.Errorf("idle-in-transaction: no transaction id held")
	}

	readers := phase[PhaseRepeatableRead].Readers
	if readers == nil || readers.Readers != 4 || readers.Counts < 4 {
		t.Errorf("repeatable-read: readers %+v; want 4 readers that counted", readers)
	} else if want := []int{5, 5, 5, 5}; fmt.Sprint(readers.Nice) != fmt.Sprint(want) || res.Settings.ReadersNice != 5 {
		t.Errorf("repeatable-read: the readers' backends ran at nice %v, recorded as %d; want %v and 5", readers.Nice, res.Settings.ReadersNice, want)
	} else if rr := byKind[string(PhaseRepeatableRead)]; len(rr) > 0 {
		// As for the idle transaction, the phase's last sample may be
		// taken as the readers end: the age the snapshot reached is the
		// oldest any sample of the phase saw.
		peak := rr[0].XminAge
		for _, s := range rr {
			peak = max(peak, s.XminAge)
		}
		if peak <= rr[0].XminAge {
			t.Errorf("repeatable-read: the oldest backend_xmin aged from %d to at most %d; want it to grow", rr[0].XminAge, peak)
		}
	}

	if o := phase[PhaseOverload]; o.EnqueuedPerSec < 1.2*clean.EnqueuedPerSec {
		t.Errorf("overload: %.0f jobs/s enqueued against %.0f in the clean phase; want 1.5 times", o.EnqueuedPerSec, clean.EnqueuedPerSec)
	}
	last := res.Samples[len(res.Samples)-1]
	if len(last.Tables) == 0 || last.TableBytes == 0 || last.IndexBytes == 0 || last.WALBytes == 0 {
		t.Errorf("last sample: %d tables of %d bytes and %d of indexes, %d bytes of WAL; want them all", len(last.Tables), last.TableBytes, last.IndexBytes, last.WALBytes)
	}
	if pg := res.Environment.PostgreSQL; res.Server != "private cluster" || pg.Autovacuum != "on" || pg.Fsync != "on" || pg.SharedBuffers != "128MB" {
		t.Errorf("ran on a %s with autovacuum %q, fsync %q, shared_buffers %q; want a private cluster with PostgreSQL's defaults (on, on, 128MB)",
			res.Server, pg.Autovacuum, pg.Fsync, pg.SharedBuffers)
	}
	if err := harness.CheckFiles(res.Files, 2); err != nil {
		t.Error(err)
	}
	if got, want := res.Settings.RetainSucceededS, cfg.RetainSucceeded.Seconds(); got != want {
		t.Errorf("settings record succeeded jobs kept %vs, want %vs", got, want)
	}
	if pruned := prunedSucceeded(t, cfg.LogDir); pruned == 0 {
		t.Errorf("the workers, keeping succeeded jobs %s, logged no succeeded job pruned", cfg.RetainSucceeded)
	}
}

// prunedSucceeded adds up the succeeded jobs that the workers whose logs
// are in dir said they pruned.
func prunedSucceeded(t *testing.T, dir string) int64 {
	t.Helper()
	logs, err := filepath.Glob(filepath.Join(dir, "soak-w*"))
	if err != nil || len(logs) == 0 {
		t.Fatalf("no worker logs in %s: %v", dir, err)
	}
	var n int64
	for _, name := range logs {
		data, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(string(data)) {
			var l struct {
				Msg       string `json:"msg"`
				Succeeded int64  `json:"succeeded"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "pruned finished jobs" {
				n += l.Succeeded
			}
		}
	}
	return n
}

// TestRun_RefusesARetentionShorterThanItsSamplesNeed checks that a soak
// whose workers would delete succeeded jobs before a sample counted them
// stops before it starts anything.
func TestRun_RefusesARetentionShorterThanItsSamplesNeed(t *testing.T) {
	cfg := Config{RelayBin: "/bin/true", Interval: 2 * time.Second, RetainSucceeded: 5 * time.Second}
	_, err := Run(t.Context(), cfg)
	if err == nil || !strings.Contains(err.Error(), "must be kept at least 6s") {
		t.Errorf("soak sampling every 2s with succeeded jobs kept 5s: %v, want a refusal naming 6s", err)
	}
}

// outDir is where a test's soak writes: RELAY_SOAK_TEST_OUT if set, to
// look at the chart, else the test's temporary directory.
func outDir(t *testing.T) string {
	if dir := os.Getenv("RELAY_SOAK_TEST_OUT"); dir != "" {
		return dir
	}
	return t.TempDir()
}

// TestRun_ReadersApartHoldBackNoHorizonOfTheQueue runs a short clean
// phase and a readers phase whose readers count a table apart: a jobs
// table of their own database, filled before the phase until a count of
// it takes as long as one of the queue's. Each count sees every job of
// the fill, and the queue's database sees no old snapshot of theirs,
// which PostgreSQL leaves out of that database's tables' horizon.
func TestRun_ReadersApartHoldBackNoHorizonOfTheQueue(t *testing.T) {
	cfg := shortConfig(t)
	for _, k := range Kinds {
		if k != PhaseClean && k != PhaseRepeatableRead {
			cfg.Phases[k] = -1
		}
	}
	cfg.ReadersApart = true
	res, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Phases) != 2 || !res.Settings.ReadersApart {
		t.Fatalf("%d phases, readers apart recorded %t; want 2 and true", len(res.Phases), res.Settings.ReadersApart)
	}
	r := res.Phases[1].Readers
	if r == nil || r.Apart == nil || r.Counts < 4 {
		t.Fatalf("readers %+v; want counts of a table apart", r)
	}
	a := r.Apart
	if a.JobTableCountMs <= 0 || a.CountMs <= 0 || a.Rows == 0 || a.TableBytes == 0 || a.JobTableBytes == 0 || r.Rows != a.Rows {
		t.Errorf("table apart %+v, counted %d rows; want it filled, both counts timed, both tables measured, and every row of the fill counted", *a, r.Rows)
	}
	// Transactions; in this short soak a snapshot held through the phase
	// ages by hundreds (548 at its first sample, with the readers counting
	// in the queue's database).
	const young = 200
	for _, s := range res.Samples {
		if s.XminAge >= young {
			t.Errorf("%s sample at %.1f s: the queue's database saw a snapshot %d transactions old; want under %d with the readers apart", s.Phase, s.At, s.XminAge, young)
		}
	}
}

// TestRun_RiverIsSoakedTheSameWay runs a short clean phase and a readers
// phase on River, the reference system: River's workers claim and finish
// its jobs, which its own client inserted; the readers count River's job
// table; and the results are named for River.
func TestRun_RiverIsSoakedTheSameWay(t *testing.T) {
	cfg := shortConfig(t)
	for _, k := range Kinds {
		if k != PhaseClean && k != PhaseRepeatableRead {
			cfg.Phases[k] = -1
		}
	}
	bin := relaybin.BuildIn(t, "relaylab-river", "../river", "github.com/relayq/relay/experiment/river/cmd/relaylab-river")
	cfg.NewSystem = func(d *harness.Database, logDir string) System {
		return NewRiver(RiverConfig{Bin: bin, Database: d, LogDir: logDir, Workers: cfg.Workers, JobMs: 1})
	}
	res, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.System != "river" || len(res.Phases) != 2 {
		t.Fatalf("soaked %q through %d phases, want river through 2", res.System, len(res.Phases))
	}
	clean := res.Phases[0]
	if clean.Pickup.N == 0 || clean.KeptUp < 0.8 || clean.SucceededPerSec < 0.8*clean.RatePerSec {
		t.Errorf("clean phase on River: %d claims, %.0f jobs/s succeeded of %.0f offered, kept up %.3f; want at least 0.8",
			clean.Pickup.N, clean.SucceededPerSec, clean.RatePerSec, clean.KeptUp)
	}
	if r := res.Phases[1].Readers; r == nil || r.Counts < 4 || r.Rows == 0 {
		t.Errorf("readers on River: %+v; want counts of River's jobs", r)
	}
	for _, f := range res.Files {
		if !strings.Contains(f, "soak-river-") {
			t.Errorf("result file %s is not named for River", f)
		}
	}
}
