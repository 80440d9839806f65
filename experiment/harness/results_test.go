package harness

import (
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestPercentiles(t *testing.T) {
	var vals []float64
	for i := 100; i >= 1; i-- {
		vals = append(vals, float64(i))
	}
	p := PercentilesOf(vals)
	if p.N != 100 || p.Min != 1 || p.P50 != 50 || p.P95 != 95 || p.P99 != 99 || p.Max != 100 || p.Mean != 50.5 {
		t.Errorf("percentiles = %+v", p)
	}
	if m, w := MedianWorst([]float64{3, 1, 2, 10}); m != 2.5 || w != 10 {
		t.Errorf("medianWorst = %v, %v", m, w)
	}
}

func TestMedian(t *testing.T) {
	for _, tt := range []struct {
		vals []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 7},
		{[]float64{3, 1, 2}, 2},
		{[]float64{1.5, 1.25}, 1.375},
		{[]float64{3, 1, 2, 10}, 2.5},
	} {
		in := append([]float64(nil), tt.vals...)
		if got := Median(tt.vals); got != tt.want {
			t.Errorf("Median(%v) = %v, want %v", tt.vals, got, tt.want)
		}
		if !slices.Equal(in, tt.vals) {
			t.Errorf("Median reordered its input to %v", tt.vals)
		}
	}
}

func TestCompactFlatJSON(t *testing.T) {
	in := []byte("{\n  \"a\": [\n    1,\n    2.5\n  ],\n  \"b\": {\n    \"x\": \"s, {t}\",\n    \"y\": null\n  },\n  \"c\": [\n    [\n      1,\n      2\n    ]\n  ]\n}")
	want := "{\n  \"a\": [1, 2.5],\n  \"b\": {\"x\": \"s, {t}\", \"y\": null},\n  \"c\": [\n    [1, 2]\n  ]\n}"
	if got := string(CompactFlat(in)); got != want {
		t.Errorf("compactFlat:\n%s\nwant:\n%s", got, want)
	}
}

// TestCheckoutCommit_OnlyForABinaryInsideTheCheckout asks for the commit of
// a binary kept in this checkout, and of one kept outside it, which could
// have been built from any commit.
func TestCheckoutCommit_OnlyForABinaryInsideTheCheckout(t *testing.T) {
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	if got, want := checkoutCommit(t.Context(), "results.go"), strings.TrimSpace(string(head)); got != want {
		t.Errorf("inside the checkout: %q, want HEAD %q", got, want)
	}
	if got := checkoutCommit(t.Context(), filepath.Join(t.TempDir(), "relay")); got != "" {
		t.Errorf("outside the checkout: %q, want none", got)
	}
}
