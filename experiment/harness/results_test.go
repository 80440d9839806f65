package harness

import (
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

func TestCompactFlatJSON(t *testing.T) {
	in := []byte("{\n  \"a\": [\n    1,\n    2.5\n  ],\n  \"b\": {\n    \"x\": \"s, {t}\",\n    \"y\": null\n  },\n  \"c\": [\n    [\n      1,\n      2\n    ]\n  ]\n}")
	want := "{\n  \"a\": [1, 2.5],\n  \"b\": {\"x\": \"s, {t}\", \"y\": null},\n  \"c\": [\n    [1, 2]\n  ]\n}"
	if got := string(CompactFlat(in)); got != want {
		t.Errorf("compactFlat:\n%s\nwant:\n%s", got, want)
	}
}
