package worker

import (
	"math"
	"testing"
	"time"
)

func TestFleetInterval_StretchesWithTheFleetSoTheFleetRunsADutyAtAConstantRate(t *testing.T) {
	const base = 250 * time.Millisecond
	tests := []struct {
		live int32
		want time.Duration
	}{
		{0, base}, {1, base}, {16, base},
		{32, 2 * base}, {200, base * 200 / 16}, {1000, base * 1000 / 16},
	}
	for _, tt := range tests {
		got := fleetInterval(base, tt.live)
		if got != tt.want {
			t.Errorf("fleetInterval(%s, %d) = %s, want %s", base, tt.live, got, tt.want)
		}
		// The fleet's reclaims per base interval.
		if perBase := float64(max(tt.live, 1)) * float64(base) / float64(got); tt.live > 16 && perBase != 16 {
			t.Errorf("with %d workers the fleet reclaims %.1f times per interval, want 16", tt.live, perBase)
		}
	}
}

func TestReclaimWindow_ReachesBackToTheLastCompleteReclaimAndOtherwiseReadsEverything(t *testing.T) {
	// Times by the database's clock, as the reclaims return them.
	t0 := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	w := newReclaimWindow()
	steps := []struct {
		name     string
		do       func()
		wantFull bool
		want     time.Time
	}{
		{name: "at start", wantFull: true},
		{name: "after a complete reclaim", do: func() { w.record(t0, true) },
			want: t0.Add(-reclaimWindowMargin)},
		{name: "after a second one, from when the second ran", do: func() { w.record(t0.Add(250*time.Millisecond), true) },
			want: t0.Add(250*time.Millisecond - reclaimWindowMargin)},
		{name: "after a failed or full one", do: func() { w.record(t0.Add(600*time.Millisecond), false) },
			wantFull: true},
		{name: "after a complete one again", do: func() { w.record(t0.Add(time.Second), true) },
			want: t0.Add(time.Second - reclaimWindowMargin)},
		{name: "when a full pass is due", do: w.forget, wantFull: true},
	}
	for _, s := range steps {
		if s.do != nil {
			s.do()
		}
		got := w.since()
		switch {
		case s.wantFull && got != nil:
			t.Errorf("%s: window from %s, want a full pass", s.name, got)
		case !s.wantFull && (got == nil || !got.Equal(s.want)):
			t.Errorf("%s: window from %v, want from %s", s.name, got, s.want)
		}
	}
}

func TestPollEvery_SharesTheQueuesPollsOnlyWhileNotificationsTellTheWorker(t *testing.T) {
	tests := []struct {
		name       string
		told       bool
		queueFleet int32
		want       time.Duration
	}{
		{"told, alone", true, 1, time.Second},
		{"told, not counted yet", true, 0, time.Second},
		{"told, 16 on the queue", true, 16, time.Second},
		{"told, 160 on the queue", true, 160, 10 * time.Second},
		{"not told, 160 on the queue", false, 160, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &Worker{cfg: Config{PollInterval: time.Second}}
			w.session.listening.Store(tt.told)
			w.queueFleet.Store(tt.queueFleet)
			if got := w.pollEvery(); got != tt.want {
				t.Errorf("pollEvery() = %s, want %s", got, tt.want)
			}
		})
	}
}

// TestFleetInterval_NeverShorterThanItsBase: an interval long enough to
// mean "hardly ever" must not wrap around, when stretched for a large
// fleet, to a short or negative one that runs the duty without pause.
func TestFleetInterval_NeverShorterThanItsBase(t *testing.T) {
	for _, base := range []time.Duration{math.MaxInt64, 1 << 62, 100 * 365 * 24 * time.Hour, 30 * 24 * time.Hour} {
		for _, live := range []int32{17, 18, 100, 1000, math.MaxInt32} {
			if got := fleetInterval(base, live); got < base {
				t.Errorf("fleetInterval(%d, %d) = %d, shorter than its base", base, live, got)
			}
		}
	}
}

// TestJitter_KeepsTheLongestDurationsPositive: jitter adds up to a fifth,
// which must not wrap a duration near the largest to a negative one, which
// a timer takes as none at all.
func TestJitter_KeepsTheLongestDurationsPositive(t *testing.T) {
	for _, d := range []time.Duration{math.MaxInt64, math.MaxInt64 - 1, 1 << 62 * 3 / 2} {
		for range 1000 {
			if got := jitter(d); got < d-d/5 {
				t.Fatalf("jitter(%d) = %d, below %d", d, got, d-d/5)
			}
		}
	}
}
