package worker

import (
	"testing"
	"time"
)

func TestReclaimInterval_StretchesWithTheFleetSoTheFleetReclaimsAtAConstantRate(t *testing.T) {
	const base = 250 * time.Millisecond
	tests := []struct {
		live int
		want time.Duration
	}{
		{0, base}, {1, base}, {16, base},
		{32, 2 * base}, {200, base * 200 / 16}, {1000, base * 1000 / 16},
	}
	for _, tt := range tests {
		got := reclaimInterval(base, tt.live)
		if got != tt.want {
			t.Errorf("reclaimInterval(%s, %d) = %s, want %s", base, tt.live, got, tt.want)
		}
		// The fleet's reclaims per base interval.
		if perBase := float64(max(tt.live, 1)) * float64(base) / float64(got); tt.live > 16 && perBase != 16 {
			t.Errorf("with %d workers the fleet reclaims %.1f times per interval, want 16", tt.live, perBase)
		}
	}
}
