package enqueue

import (
	"testing"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/relaybin"
)

func TestMain(m *testing.M) { relaybin.RunTests(m) }

// TestRun_Short posts from two clients for a few seconds, to a server
// given --announce-every, and checks the invariants and that every
// counter moved, never the figures.
//
// PostgreSQL 15 adds a backend's commits to the database's counters at
// most once a second, so a reading can leave out up to a second of
// commits at either end of the measured span. Over a span of three
// seconds that is at most a third more commits than the enqueues made,
// which keeps one commit a job below the bound of 1.5 however slowly the
// machine posts; over one second it could double them.
func TestRun_Short(t *testing.T) {
	announceEvery := 5 * time.Millisecond
	res, err := Run(t.Context(), Config{
		AdminURL:      dbtest.NewURL(t),
		RelayBin:      relaybin.Path(t),
		OutDir:        t.TempDir(),
		Clients:       2,
		Duration:      3 * time.Second,
		Warmup:        time.Second,
		AnnounceEvery: &announceEvery,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.AnnounceEvery != "5ms" {
		t.Errorf("recorded --announce-every %q, want 5ms", res.AnnounceEvery)
	}
	if res.Accepted == 0 || res.Failed != 0 || res.JobsPerSec <= 0 {
		t.Errorf("accepted %d, failed %d, %v jobs/s; want some accepted and none failed", res.Accepted, res.Failed, res.JobsPerSec)
	}
	// Every job stored was answered 201, and every 201 stored a job.
	if !res.StoredAll || res.Stored < res.Accepted {
		t.Errorf("%d jobs stored, %d answered 201 (%d measured)", res.Stored, res.Answered, res.Accepted)
	}
	if res.Latency.N != int(res.Accepted) || res.Latency.P50 <= 0 || res.Latency.P99 < res.Latency.P50 {
		t.Errorf("latency %+v for %d accepted requests", res.Latency, res.Accepted)
	}
	// Each job is a write: the counters move. How far is the experiment's
	// figure, not a bound to test: an insert commits, and so does the
	// announcement sent after it, which the requests that arrive together
	// share; on a loaded machine, with few requests at a time, a job costs
	// nearly two (1.76 a job was seen), and commits the warm-up made can
	// be counted in the measured window, since a backend reports its
	// counts up to a second late.
	if res.WALBytesPerJob <= 0 || res.CommitsPerJob <= 0 {
		t.Errorf("counters did not move as enqueues move them: %+v", res)
	}
	if err := harness.CheckFiles(res.Files, 1); err != nil {
		t.Error(err)
	}
}

// TestRun_BesideAFleet posts beside two idle workers of another queue,
// their pools through a pooler, and checks that they were alive through
// the measured part and that no job went astray.
func TestRun_BesideAFleet(t *testing.T) {
	res, err := Run(t.Context(), Config{
		AdminURL:        dbtest.NewURL(t),
		RelayBin:        relaybin.Path(t),
		Clients:         2,
		Duration:        time.Second,
		Warmup:          time.Second,
		Fleet:           2,
		FleetPoolerSize: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Fleet != 2 || res.FleetLive != 2 || res.FleetPooler == nil {
		t.Errorf("fleet of %d, %d alive at the end, pooler %+v; want 2, 2 and a pooler", res.Fleet, res.FleetLive, res.FleetPooler)
	}
	if res.Accepted == 0 || res.Failed != 0 || !res.StoredAll {
		t.Errorf("accepted %d, failed %d, %d stored for %d answered", res.Accepted, res.Failed, res.Stored, res.Answered)
	}
}
