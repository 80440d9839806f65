package harness

import (
	"testing"
	"time"
)

func TestParseCPULine(t *testing.T) {
	tick := time.Second / clockTicks
	tests := []struct {
		name string
		line string
		want CPUSample
		ok   bool
	}{
		{
			name: "steal is neither busy nor idle, guest is already in user",
			line: "cpu  9559 1 4071 19980 343 2 81 20 7 0",
			want: CPUSample{Busy: (9559 + 1 + 4071 + 2 + 81) * tick, Steal: 20 * tick, Total: (9559 + 1 + 4071 + 19980 + 343 + 2 + 81 + 20) * tick},
			ok:   true,
		},
		{
			name: "an old kernel without steal",
			line: "cpu  100 0 50 800 10",
			want: CPUSample{Busy: 150 * tick, Total: 960 * tick},
			ok:   true,
		},
		{name: "a per-CPU line", line: "cpu0 1 2 3 4 5", ok: false},
		{name: "a field that is not a number", line: "cpu  1 2 x 4 5", ok: false},
		{name: "too few fields", line: "cpu  1 2 3", ok: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := parseCPULine(tt.line)
			if ok != tt.ok || (ok && got != tt.want) {
				t.Errorf("parseCPULine(%q) = %+v, %v; want %+v, %v", tt.line, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestCPUTrace_OverReadsTheSamplesAroundTheSpan checks which samples a
// span is read between: the last at or before its start and the first at
// or after its end, and that a span the trace does not cover reads
// nothing.
func TestCPUTrace_OverReadsTheSamplesAroundTheSpan(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 14, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// Every 100 ms, 200 ms of CPU time over 2 CPUs: the first 100 ms idle,
	// then busy at 50%, then busy at 100% with 50 ms stolen each time.
	tr := &CPUTrace{&trace[CPUSample]{samples: []timed[CPUSample]{
		{at(0), CPUSample{Busy: 0, Steal: 0, Total: 0}},
		{at(100), CPUSample{Busy: 0, Steal: 0, Total: 200 * time.Millisecond}},
		{at(200), CPUSample{Busy: 100 * time.Millisecond, Steal: 0, Total: 400 * time.Millisecond}},
		{at(300), CPUSample{Busy: 250 * time.Millisecond, Steal: 50 * time.Millisecond, Total: 600 * time.Millisecond}},
	}}}
	tests := []struct {
		name      string
		from, to  time.Time
		wantBusy  float64
		wantSteal time.Duration
		wantOK    bool
	}{
		{"on the samples", at(100), at(200), 0.5, 0, true},
		{"between them, widened to the samples around", at(150), at(250), 250.0 / 400, 50 * time.Millisecond, true},
		{"the whole trace", at(0), at(300), 250.0 / 600, 50 * time.Millisecond, true},
		{"a moment", at(120), at(120), 0.5, 0, true},
		{"ends after the last sample", at(100), at(301), 0, 0, false},
		{"starts before the first sample", at(-1), at(200), 0, 0, false},
		{"ends before it starts", at(200), at(100), 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			busy, steal, ok := tr.Over(tt.from, tt.to)
			if ok != tt.wantOK || busy != tt.wantBusy || steal != tt.wantSteal {
				t.Errorf("Over = %v, %v, %v; want %v, %v, %v", busy, steal, ok, tt.wantBusy, tt.wantSteal, tt.wantOK)
			}
		})
	}
	if _, _, ok := (*CPUTrace)(nil).Over(at(0), at(100)); ok {
		t.Errorf("a nil trace read a span")
	}
}

// TestTraceCPU_SeesTheMachineBusy keeps a CPU busy while a trace runs and
// reads the span from the trace.
func TestTraceCPU_SeesTheMachineBusy(t *testing.T) {
	tr := TraceCPU(10 * time.Millisecond)
	if tr == nil {
		t.Skip("no /proc/stat here")
	}
	from := time.Now()
	for time.Since(from) < 200*time.Millisecond {
	}
	to := time.Now()
	tr.Stop()
	busy, steal, ok := tr.Over(from, to)
	if !ok || busy <= 0 || busy > 1 || steal < 0 {
		t.Errorf("Over = %v busy, %v stolen, %v; want a share above none and at most all, covered", busy, steal, ok)
	}
}
