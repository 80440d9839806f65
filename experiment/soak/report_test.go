package soak

import (
	"testing"
	"time"
)

// TestSummarise_LeavesTheGapBeforeAPhaseOut checks that what the soak
// does between two phases, while it readies what pins the horizon (the
// readers' table apart is filled there), counts in neither phase: a
// window whose middle falls in the gap adds no pickup and no job to the
// phase after it, and the phase's WAL counts from the last sample before
// its start, the gap's included.
func TestSummarise_LeavesTheGapBeforeAPhaseOut(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 20, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	sample := func(end, pickup float64, wal int64) Sample {
		return Sample{
			At: end + 1, WindowStart: end - 5, WindowEnd: end, SucceededPerSec: 100, EnqueuedPerSec: 100,
			WALBytes: wal, pickups: []float64{pickup}, at: at(end + 1), windowMid: at(end - 2.5),
		}
	}
	r := &Result{
		start: t0,
		Phases: []Phase{
			{Kind: string(PhaseClean)},
			{Kind: string(PhaseRepeatableRead)},
		},
		phaseAt: []phaseSpan{
			{kind: PhaseClean, start: at(0), end: at(10)},
			{kind: PhaseRepeatableRead, start: at(20), end: at(30)},
		},
		Samples: []Sample{
			sample(5, 1, 1_000),      // clean: window 0–5 s, read at 6 s
			sample(10, 1, 2_000),     // clean: window 5–10 s, read at 11 s, in the gap
			sample(15, 100, 500_000), // the gap: window 10–15 s, read at 16 s
			sample(25, 2, 501_000),   // readers: window 20–25 s, read at 26 s
			sample(29.5, 2, 502_000), // readers: window 24.5–29.5 s, read at 30.5 s
		},
	}
	r.summarise()
	clean, readers := r.Phases[0], r.Phases[1]
	if clean.Pickup.N != 2 || clean.Pickup.Max != 1 {
		t.Errorf("clean phase: %d pickups, the longest %v ms; want 2 of 1 ms", clean.Pickup.N, clean.Pickup.Max)
	}
	if readers.Pickup.N != 2 || readers.Pickup.Max != 2 {
		t.Errorf("readers phase: %d pickups, the longest %v ms; want the 2 of its own windows, of 2 ms, and none of the gap's", readers.Pickup.N, readers.Pickup.Max)
	}
	if readers.WALBytes != 1_000 {
		t.Errorf("readers phase: %d bytes of WAL; want 1000, counted from the gap's sample (at 16 s) to its own (at 26 s)", readers.WALBytes)
	}
	if readers.Samples != 1 {
		t.Errorf("readers phase: %d samples read in it; want 1 (at 26 s)", readers.Samples)
	}
}

// TestSummarise_CountsTheFirstPhasesAutovacuumsFromTheRunsStart checks
// that the autovacuum runs of the first phase count from the run's start,
// as its WAL does: a run that fell before the phase's first sample is the
// phase's, not lost.
func TestSummarise_CountsTheFirstPhasesAutovacuumsFromTheRunsStart(t *testing.T) {
	t0 := time.Date(2026, 12, 5, 20, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	sample := func(s float64, autovacuums int64) Sample {
		return Sample{At: s, at: at(s), Tables: []TableSample{{Name: "jobs", Autovacuums: autovacuums}, {Name: "workers"}}}
	}
	r := &Result{
		start:            t0,
		startAutovacuums: 0,
		Phases:           []Phase{{Kind: string(PhaseClean)}, {Kind: string(PhaseRecovery)}},
		phaseAt: []phaseSpan{
			{kind: PhaseClean, start: at(0), end: at(10)},
			{kind: PhaseRecovery, start: at(10), end: at(20)},
		},
		Samples: []Sample{
			sample(5, 1),  // an autovacuum ran in the first 5 s
			sample(9, 2),  // and another by 9 s
			sample(15, 2), // none in the second phase
			sample(19, 3), // then one
		},
	}
	r.summarise()
	if got := r.Phases[0].Autovacuums; got != 2 {
		t.Errorf("clean phase: %d autovacuums, want 2, counted from the run's start", got)
	}
	if got := r.Phases[1].Autovacuums; got != 1 {
		t.Errorf("recovery phase: %d autovacuums, want 1, counted from the sample before it", got)
	}
}
