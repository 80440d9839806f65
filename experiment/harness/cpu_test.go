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
