package burndown

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/relaybin"
)

func TestMain(m *testing.M) { relaybin.RunTests(m) }

// riverBin builds relaylab-river from the River adapter's module, beside
// the lab's.
func riverBin(t *testing.T) string {
	t.Helper()
	return relaybin.BuildIn(t, "relaylab-river", "../river", "github.com/relayq/relay/experiment/river/cmd/relaylab-river")
}

// TestRun_Short burns down a few thousand jobs with two worker processes
// on Relay and then on River, and checks the invariants and that every
// counter moved on both, never the figures.
func TestRun_Short(t *testing.T) {
	const jobs = 2000
	out := t.TempDir()
	res := runBoth(t, Config{
		AdminURL: dbtest.NewURL(t),
		RelayBin: relaybin.Path(t),
		RiverBin: riverBin(t),
		OutDir:   out,
		Jobs:     jobs,
		Configs:  []harness.ProcSlots{{Procs: 2, Slots: 20}},
		Timeout:  2 * time.Minute,
	})
	for i, want := range []struct{ system, table string }{{SystemRelay, "jobs"}, {SystemRiver, "river_job"}} {
		run := res.Runs[i]
		t.Run(want.system, func(t *testing.T) {
			if run.System != want.system || run.Table != want.table || run.Config != "2x20" {
				t.Errorf("run %d is %s on %s at %s, want %s on %s at 2x20", i, run.System, run.Table, run.Config, want.system, want.table)
			}
			checkEveryJobOnce(t, run, jobs)
			// Each job is fetched and completed: at least two updates
			// of its row, and some WAL and commits, per job.
			if run.UpdatesPerJob < 2 || run.WALBytesPerJob <= 0 || run.WALRecordsPerJob <= 0 || run.CommitsPerJob <= 0 || run.Indexes < 1 {
				t.Errorf("counters did not move as a burn-down moves them: %+v", run)
			}
			// The progress counts' session, at least, is the harness's
			// own, and left out of the backends' CPU.
			if run.HarnessBackends < 1 {
				t.Errorf("found %d of the harness's own sessions to leave out of the backends' CPU, want at least 1", run.HarnessBackends)
			}
			// Read from the WAL where it can be read here (the test
			// server on this host), and said why not elsewhere (a
			// container's). Each job's two updates write at least its
			// primary key's entry each.
			switch e := run.IndexEntriesPerJob; {
			case e == nil && run.IndexEntriesNotMeasured == "":
				t.Errorf("index entries neither measured nor said why not")
			case e != nil && *e < 2:
				t.Errorf("%v index entries per job, want at least 2", *e)
			}
			// The workers ran the jobs, and their CPU was read while they
			// ran.
			if run.WorkerCPUMsPerJob <= 0 {
				t.Errorf("worker processes' CPU %v ms per job, want more than none", run.WorkerCPUMsPerJob)
			}
			// The machine's CPU was read over the same span.
			if run.MachineCPUBusy <= 0 || run.MachineCPUBusy > 1 || run.MachineStealSec < 0 {
				t.Errorf("machine %v busy, %v s stolen; want a share above none and at most all, and no negative steal", run.MachineCPUBusy, run.MachineStealSec)
			}
			// A second of the whole machine busy runs at least the jobs a
			// second of this run did, which kept it busy part of the time.
			if run.JobsPerBusySec < run.JobsPerSec {
				t.Errorf("%v jobs per busy second, fewer than the %v jobs/s at %v busy", run.JobsPerBusySec, run.JobsPerSec, run.MachineCPUBusy)
			}
			// The workers' sessions were sampled over the same span:
			// connected, and some of them busy.
			busy := func(a string) bool { return a != harness.ActivityIdle }
			if b := run.Backends; b == nil || b.Samples < 1 || b.Sessions <= 0 || b.Sum(busy) <= 0 {
				t.Errorf("the workers' sessions sampled as %+v; want samples of connected sessions, some busy", b)
			}
			if run.HOTUpdatesPerJob > run.UpdatesPerJob {
				t.Errorf("%v HOT updates per job, more than the %v updates", run.HOTUpdatesPerJob, run.UpdatesPerJob)
			}
		})
	}
	if len(res.Comparisons) != 1 || res.Comparisons[0].Config != "2x20" || res.Comparisons[0].Ratio <= 0 {
		t.Errorf("comparisons %+v, want one of 2x20 with a ratio", res.Comparisons)
	}
	// The River that ran says which it was and how it was set up: the
	// adapter's tuned defaults.
	if r := res.River; r == nil || r.Version == "" || r.FetchCooldown != "2ms" || r.FetchPollInterval != "20ms" || r.MaxConns < 1 {
		t.Errorf("River recorded as %+v, want its version and FetchCooldown 2ms, FetchPollInterval 20ms", r)
	}
	if err := harness.CheckFiles(res.Files, 1); err != nil {
		t.Error(err)
	}
}

// TestRun_RoundsAlternateTheSystemsAndSumUpTheRatios runs two rounds of
// one configuration on both systems, and checks that the second round
// runs them in the other order, that each round is compared on its own,
// and that the summary is the median of the rounds' ratios.
func TestRun_RoundsAlternateTheSystemsAndSumUpTheRatios(t *testing.T) {
	const jobs = 300
	res := runSummarized(t, Config{
		AdminURL: dbtest.NewURL(t),
		RelayBin: relaybin.Path(t),
		RiverBin: riverBin(t),
		Jobs:     jobs,
		Configs:  []harness.ProcSlots{{Procs: 1, Slots: 10}},
		Timeout:  2 * time.Minute,
		Rounds:   2,
	})
	var order []string
	for _, run := range res.Runs {
		order = append(order, fmt.Sprintf("%d %s", run.Round, run.System))
		checkEveryJobOnce(t, run, jobs)
	}
	if got, want := strings.Join(order, ", "), "1 relay, 1 river, 2 river, 2 relay"; got != want || res.Rounds != 2 {
		t.Errorf("ran %s over %d rounds, want %s over 2", got, res.Rounds, want)
	}
	if len(res.Comparisons) != 2 || res.Comparisons[0].Round != 1 || res.Comparisons[1].Round != 2 {
		t.Fatalf("comparisons %+v, want one for each round", res.Comparisons)
	}
	for _, c := range res.Comparisons {
		relay, river := res.Runs[2*c.Round-2], res.Runs[2*c.Round-1]
		if c.Round == 2 {
			relay, river = river, relay
		}
		if c.RelayJobsPerSec != relay.JobsPerSec || c.RiverJobsPerSec != river.JobsPerSec {
			t.Errorf("round %d compares %v with %v jobs/s, want its own runs' %v and %v", c.Round, c.RelayJobsPerSec, c.RiverJobsPerSec, relay.JobsPerSec, river.JobsPerSec)
		}
		// The same per second of busy machine, where both runs read the
		// machine busy.
		var busy float64
		if relay.JobsPerBusySec > 0 && river.JobsPerBusySec > 0 {
			busy = harness.Round2(relay.JobsPerBusySec / river.JobsPerBusySec)
		}
		if c.RelayJobsPerBusySec != relay.JobsPerBusySec || c.RiverJobsPerBusySec != river.JobsPerBusySec || c.BusyRatio != busy {
			t.Errorf("round %d compares %v with %v jobs per busy second (%v), want its own runs' %v and %v (%v)",
				c.Round, c.RelayJobsPerBusySec, c.RiverJobsPerBusySec, c.BusyRatio, relay.JobsPerBusySec, river.JobsPerBusySec, busy)
		}
	}
	r1, r2 := res.Comparisons[0].Ratio, res.Comparisons[1].Ratio
	want := RatioSummary{Config: "1x10", Rounds: 2, Median: harness.Round2((r1 + r2) / 2), Min: min(r1, r2), Max: max(r1, r2)}
	if b1, b2 := res.Comparisons[0].BusyRatio, res.Comparisons[1].BusyRatio; b1 > 0 && b2 > 0 {
		want.BusyMedian = harness.Round2((b1 + b2) / 2)
	}
	if len(res.Ratios) != 1 || res.Ratios[0] != want {
		t.Errorf("ratios summed up as %+v, want [%+v]", res.Ratios, want)
	}
}

// TestRun_RiverWorkArgsReachRiver runs River alone with its fetch settings
// given, and checks that its workers ran with them.
func TestRun_RiverWorkArgsReachRiver(t *testing.T) {
	res, err := Run(t.Context(), Config{
		AdminURL:      dbtest.NewURL(t),
		Systems:       []string{SystemRiver},
		RiverBin:      riverBin(t),
		RiverWorkArgs: []string{"--fetch-cooldown", "5ms", "--fetch-poll-interval", "50ms", "--max-conns", "6"},
		Jobs:          200,
		Configs:       []harness.ProcSlots{{Procs: 1, Slots: 10}},
		Timeout:       time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 1 || !res.Runs[0].OK || len(res.Comparisons) != 0 {
		t.Errorf("runs %+v, comparisons %+v; want one River run, every job once, and nothing to compare", res.Runs, res.Comparisons)
	}
	if got, want := fmt.Sprintf("%s %s %d", res.River.FetchCooldown, res.River.FetchPollInterval, res.River.MaxConns), "5ms 50ms 6"; got != want {
		t.Errorf("River ran with %s, want %s", got, want)
	}
}

// TestRun_OnAPrivateClusterRecordsItsSettings burns down a few jobs with
// Relay alone on a private cluster, which runs autovacuum, and checks that
// the result says where it ran and under which settings.
func TestRun_OnAPrivateClusterRecordsItsSettings(t *testing.T) {
	res, err := Run(t.Context(), Config{
		PrivateCluster: true,
		Systems:        []string{SystemRelay},
		RelayBin:       relaybin.Path(t),
		Jobs:           500,
		Configs:        []harness.ProcSlots{{Procs: 1, Slots: 10}},
		Timeout:        2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Server != "private cluster" || res.Environment.PostgreSQL.Autovacuum != "on" {
		t.Errorf("ran on %q with autovacuum %q; want a private cluster with autovacuum on", res.Server, res.Environment.PostgreSQL.Autovacuum)
	}
	if len(res.Runs) != 1 || !res.Runs[0].OK {
		t.Errorf("runs %+v, want one with every job once", res.Runs)
	}
}

// TestRun_ThroughAPoolerTheServerSeesItsPoolAndASessionPerProcess burns
// down jobs with worker processes whose pools go through a PgBouncer in
// transaction mode, and checks that every job ran once, and that the
// server saw no more than the pooler's connections and each process's
// session, and each process's check at start that its session database
// can be reached, a connection it closes at once, which a sample can catch
// beside the others: connected straight, each process keeps four or five.
func TestRun_ThroughAPoolerTheServerSeesItsPoolAndASessionPerProcess(t *testing.T) {
	const jobs, procs, poolSize = 1000, 4, 2
	res := runSummarized(t, Config{
		AdminURL:   dbtest.NewURL(t),
		Systems:    []string{SystemRelay},
		RelayBin:   relaybin.Path(t),
		Jobs:       jobs,
		Configs:    []harness.ProcSlots{{Procs: procs, Slots: 8}},
		Timeout:    2 * time.Minute,
		PoolerSize: poolSize,
	})
	if len(res.Runs) != 1 {
		t.Fatalf("%d runs, want 1", len(res.Runs))
	}
	run := res.Runs[0]
	checkEveryJobOnce(t, run, jobs)
	if p := run.Pooler; p == nil || p.Version == "" || p.PoolMode != "transaction" || p.PoolSize != poolSize || p.MaxClientConn < procs*4 {
		t.Errorf("pooler recorded as %+v, want PgBouncer's version, transaction mode, %d server connections and room for %d pools", p, poolSize, procs)
	}
	// Each process's session shows it alive: with the sessions through the
	// pooler too, or none, the server would see fewer than one a process.
	if b := run.Backends; b == nil || b.MaxSessions < procs || b.MaxSessions > poolSize+2*procs {
		t.Errorf("the workers' sessions sampled as %+v; want at most %d connected at once (the pooler's %d, and a session and a check at start a process), at least %d",
			b, poolSize+2*procs, poolSize, procs)
	}
}

// TestRun_RefusesAPoolerForRiver checks that a pooler, which the burn-down
// puts in front of Relay's workers alone, is refused with River.
func TestRun_RefusesAPoolerForRiver(t *testing.T) {
	_, err := Run(t.Context(), Config{AdminURL: "postgres://unused", Systems: []string{SystemRiver}, RiverBin: "relaylab-river", PoolerSize: 2})
	if err == nil || !strings.Contains(err.Error(), "pooler") {
		t.Errorf("Run with a pooler and River: error %v, want one that names the pooler", err)
	}
}

// TestRun_WorkersFirstBurnsDownOnlyTheFilledJobs starts the workers on
// the empty queue, on Relay and then on River, and checks that each
// burn-down counts the jobs of the fill alone, every one once, after the
// warm-up's.
func TestRun_WorkersFirstBurnsDownOnlyTheFilledJobs(t *testing.T) {
	const jobs = 1000
	res := runBoth(t, Config{
		AdminURL:     dbtest.NewURL(t),
		RelayBin:     relaybin.Path(t),
		RiverBin:     riverBin(t),
		Jobs:         jobs,
		Configs:      []harness.ProcSlots{{Procs: 1, Slots: 10}},
		Timeout:      2 * time.Minute,
		WorkersFirst: true,
	})
	for _, run := range res.Runs {
		t.Run(run.System, func(t *testing.T) {
			if !run.WorkersFirst {
				t.Errorf("run not recorded as workers first")
			}
			checkEveryJobOnce(t, run, jobs)
		})
	}
}

// runSummarized runs cfg and prints its summary.
func runSummarized(t *testing.T, cfg Config) *Result {
	t.Helper()
	res, err := Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.WriteSummary(t.Output()); err != nil {
		t.Fatal(err)
	}
	return res
}

// runBoth runs cfg, prints its summary, and checks that it ran on Relay
// and on River.
func runBoth(t *testing.T, cfg Config) *Result {
	t.Helper()
	res := runSummarized(t, cfg)
	if len(res.Runs) != 2 {
		t.Fatalf("%d runs, want 2: Relay's and River's", len(res.Runs))
	}
	return res
}

// checkEveryJobOnce checks that every one of jobs succeeded on its first
// attempt, over a span of some time.
func checkEveryJobOnce(t *testing.T, run ConfigRun, jobs int) {
	t.Helper()
	if !run.OK || run.Succeeded != int64(jobs) || run.Retried != 0 {
		t.Errorf("succeeded %d, retried %d, ok %v; want %d, 0, true", run.Succeeded, run.Retried, run.OK, jobs)
	}
	if !run.LastFinish.After(run.FirstClaim) || run.JobsPerSec <= 0 {
		t.Errorf("span %s to %s, %v jobs/s", run.FirstClaim, run.LastFinish, run.JobsPerSec)
	}
}
