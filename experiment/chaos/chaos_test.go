package chaos

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/relaybin"
)

// Each scenario of `relay experiment chaos` runs here in its short form
// (ShortConfig: 300 jobs over 6 s, 3 workers, a 2 s lease), against
// real relay worker processes, and fails if any invariant breaks.

// Environment variables the chaos tests read.
const (
	// EnvBinary names a relay binary to run instead of building one.
	EnvBinary = "RELAY_CHAOS_BIN"
	// EnvOut names a directory to keep the short runs' JSON results in.
	EnvOut = "RELAY_CHAOS_OUT"
)

// labBinary returns the relay binary the chaos tests run: the one named
// by EnvBinary, or one built from this module.
func labBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv(EnvBinary); bin != "" {
		return bin
	}
	return relaybin.Path(t)
}

// shortTest returns the short configuration of a scenario, on a fresh
// database of the test server (the restart scenario starts its own).
func shortTest(t *testing.T, s Scenario) Config {
	t.Helper()
	if testing.Short() {
		t.Skip("runs relay processes against PostgreSQL for several seconds; skipped with -short")
	}
	cfg := ShortConfig(s)
	cfg.RelayBin = labBinary(t)
	cfg.WorkerBin = relaybin.Build(t, "relaylab", "github.com/relayq/relay/experiment/cmd/relaylab")
	if s != Restart {
		cfg.DatabaseURL = dbtest.NewURL(t)
	}
	cfg.LogDir = t.TempDir()
	if dir := os.Getenv(EnvOut); dir != "" {
		cfg.OutDir = dir
	}
	cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
	return cfg
}

// runTest runs a scenario and fails the test for each broken invariant.
func runTest(t *testing.T, cfg Config) *Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatalf("Run(%s): %v", cfg.Scenario, err)
	}
	var summary strings.Builder
	PrintSummary(&summary, []*Result{res})
	t.Logf("\n%sfaults %v, reclaims %v, executions %d, wall %.1fs", summary.String(), res.Check.Faults, res.Check.Reclaims, res.Check.Executions, res.WallSeconds)
	for _, inv := range res.Invariants {
		if !inv.OK {
			t.Errorf("%s: %d, want %s; e.g. %v", inv.Name, inv.Count, inv.Want, inv.Examples)
		}
	}
	if t.Failed() {
		dumpLogs(t, cfg.LogDir)
	}
	return res
}

// dumpLogs shows the Tail of every process log.
func dumpLogs(t *testing.T, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		b, err := os.ReadFile(dir + "/" + e.Name())
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		t.Logf("%s (last lines):\n%s", e.Name(), strings.Join(lines, "\n"))
	}
}

func TestKill_LosesNothingAndAcceptsNoStaleAck(t *testing.T) {
	res := runTest(t, shortTest(t, Kill))
	if res.Check.WorstRedeliveryAfterDeathMs <= 0 {
		t.Errorf("no job held by a killed worker was timed back to a claim; reclaim delays: %+v", res.Check.ReclaimDelays)
	}
}

func TestPause_RefusesEveryZombieAcknowledgement(t *testing.T) {
	res := runTest(t, shortTest(t, Pause))
	p := res.Pause
	if p == nil {
		t.Fatal("no pause findings")
	}
	t.Logf("zombies: %d in flight, %d young long jobs caught; completions refused %d, failures refused %d, dropped %d, heartbeats refused %d, handlers cancelled %d (p95 %.0f ms after SIGCONT), %d on waking in all",
		p.InFlight, p.LongJobsCaught, p.CompletionsRefused, p.FailuresRefused, p.Dropped, p.HeartbeatsRefused, p.HandlersCancelled, p.CancelLatency.P95, p.CancelledOnWaking)
	// What the zombie does first after SIGCONT is a race: it sends an
	// acknowledgement and is refused (a heartbeat, or a completion whose
	// handler's timer fired first), or it finds by its own clock that its
	// leases have lapsed and drops every outcome unsent (seen in a short
	// run: 6 in flight, 6 dropped). Either way none may be accepted (the
	// run's check), and each must end refused or dropped.
	if p.Unknown > 0 {
		t.Errorf("%d zombie executions left no acknowledgement on record", p.Unknown)
	}
	if p.HeartbeatsRefused+p.CompletionsRefused+p.FailuresRefused+p.Dropped == 0 {
		t.Errorf("the paused worker's outcomes were neither refused nor dropped")
	}
	if limit := 4 * harness.Millis(ShortConfig(Pause).Heartbeat+time.Second); p.CancelLatency.Max > limit {
		t.Errorf("a zombie handler was cancelled %.0f ms after the worker woke, want within %.0f ms", p.CancelLatency.Max, limit)
	}
}

func TestPartition_WorkersRecoverAndCommitCutsStayCorrect(t *testing.T) {
	res := runTest(t, shortTest(t, Partition))
	t.Logf("commit cuts %d, ambiguous completions %d, reclaims %v", res.Partition.CommitCuts, res.Partition.AmbiguousCompletions, res.Check.Reclaims)
	for _, p := range res.Partition.Partitions {
		t.Logf("%s after its %s: new session after %.0f ms, first claim after %.0f ms", p.Worker, p.Kind, p.ReregisteredAfterMs, p.FirstClaimAfterMs)
	}
}

func TestBackendKill_LosesNothing(t *testing.T) {
	runTest(t, shortTest(t, BackendKill))
}

func TestRestart_KeepsEveryAcknowledgedEnqueueAndRecovers(t *testing.T) {
	res := runTest(t, shortTest(t, Restart))
	t.Logf("answers: %v; while down: %v", res.Restart.Answers, res.Restart.AnswersWhileDown)
}

func TestPoison_EndsDeadAfterMaxAttemptsWhileHealthyJobsFlow(t *testing.T) {
	res := runTest(t, shortTest(t, Poison))
	t.Logf("poison: %+v", *res.Poison)
	if res.Throughput.DuringFaultsPerSec <= 0 {
		t.Errorf("no healthy job completed while the poison ran")
	}
}

func TestPoolStarvation_LosesNoLease(t *testing.T) {
	res := runTest(t, shortTest(t, Starvation))
	t.Logf("starvation: %+v", *res.Starvation)
}

func TestBadInput_RefusesEveryHostileRequestWithA4xx(t *testing.T) {
	res := runTest(t, shortTest(t, BadInput))
	t.Logf("bad input: %d requests, answers %v", res.BadInput.Requests, res.BadInput.ByStatus)
}

func TestPgBouncer_LosesNothingThroughATransactionModePooler(t *testing.T) {
	res := runTest(t, shortTest(t, PgBouncer))
	t.Logf("reclaims %v, delays %+v", res.Check.Reclaims, res.Check.ReclaimDelays)
	if d, ok := res.Check.ReclaimDelays["kill"]; !ok || d.Redelivered.Max <= 0 {
		t.Errorf("no job of a killed worker with a session was timed back to a claim: %+v", res.Check.ReclaimDelays)
	}
	if d, ok := res.Check.ReclaimDelays["kill_lease_only"]; !ok || d.Redelivered.Max <= 0 {
		t.Errorf("no job of a killed worker without a session was timed back to a claim: %+v", res.Check.ReclaimDelays)
	}
}

func TestParseScenarios(t *testing.T) {
	all, err := ParseScenarios("all")
	if err != nil || len(all) != 9 {
		t.Fatalf("ParseScenarios(all) = %v, %v; want the 9 scenarios", all, err)
	}
	got, err := ParseScenarios("kill, pause,kill")
	if err != nil || len(got) != 2 || got[0] != Kill || got[1] != Pause {
		t.Errorf("ParseScenarios(kill, pause,kill) = %v, %v; want [kill pause]", got, err)
	}
	if _, err := ParseScenarios("kill,flood"); err == nil {
		t.Errorf("ParseScenarios accepted an unknown scenario")
	}
}

func TestConfig_RefusesNegativeValues(t *testing.T) {
	for name, set := range map[string]func(*Config){
		"FaultEvery":     func(c *Config) { c.FaultEvery = -time.Second },
		"Downtime":       func(c *Config) { c.Downtime = -time.Second },
		"BackoffBase":    func(c *Config) { c.BackoffBase = -time.Second },
		"DrainTimeout":   func(c *Config) { c.DrainTimeout = -time.Second },
		"Restarts":       func(c *Config) { c.Restarts = -1 },
		"CommitCuts":     func(c *Config) { c.CommitCuts = -1 },
		"BadInputRounds": func(c *Config) { c.BadInputRounds = -1 },
	} {
		c := Config{Scenario: Kill, RelayBin: "relay", WorkerBin: "relaylab"}
		set(&c)
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("a negative %s was accepted", name)
		}
	}
	if _, err := (Config{Scenario: Kill, RelayBin: "relay", WorkerBin: "relaylab"}).withDefaults(); err != nil {
		t.Errorf("the zero configuration was refused: %v", err)
	}
}
