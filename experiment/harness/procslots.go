package harness

import (
	"fmt"
	"strconv"
	"strings"
)

// ProcSlots is one configuration of worker processes: Procs processes of
// Slots execution slots each.
type ProcSlots struct {
	Procs int `json:"procs"`
	Slots int `json:"slots"`
}

// String returns the configuration as PROCSxSLOTS, e.g. "3x4".
func (c ProcSlots) String() string { return fmt.Sprintf("%dx%d", c.Procs, c.Slots) }

// TotalSlots is Procs·Slots.
func (c ProcSlots) TotalSlots() int { return c.Procs * c.Slots }

// FormatConfigs writes configurations as ParseConfigs reads them, e.g.
// "1x1,1x4,3x4".
func FormatConfigs(cs []ProcSlots) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = c.String()
	}
	return strings.Join(parts, ",")
}

// MaxProcs and MaxSlots bound a configuration's processes and each one's
// slots: a mistyped figure should not start thousands of processes. Past
// about 38 processes the server's connections run out unless the pools go
// through a pooler (burn-down's --pooler).
const (
	MaxProcs = 500
	MaxSlots = 1000
)

// ParseConfigs parses a comma-separated list of PROCSxSLOTS, such as
// "1x1,1x4,3x4".
func ParseConfigs(s string) ([]ProcSlots, error) {
	var out []ProcSlots
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		p, sl, ok := strings.Cut(part, "x")
		procs, err1 := strconv.Atoi(p)
		slots, err2 := strconv.Atoi(sl)
		if !ok || err1 != nil || err2 != nil || procs < 1 || slots < 1 || procs > MaxProcs || slots > MaxSlots {
			return nil, fmt.Errorf("invalid configuration %q: want PROCSxSLOTS such as 3x4, of 1 to %d processes of 1 to %d slots", part, MaxProcs, MaxSlots)
		}
		out = append(out, ProcSlots{Procs: procs, Slots: slots})
	}
	return out, nil
}
