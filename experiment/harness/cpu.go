package harness

import (
	"context"
	"errors"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
)

// clockTicks is the kernel's USER_HZ, the unit of the CPU times in /proc:
// 100 on every common Linux platform.
const clockTicks = 100

// CPUSample is the machine's cumulative CPU time, from /proc/stat.
type CPUSample struct {
	// Busy is the time spent on anything but idle, I/O wait and steal.
	Busy time.Duration
	// Steal is the time a virtual machine's CPUs were ready to run but the
	// hypervisor ran something else: load from outside the machine.
	Steal time.Duration
	// Total is all CPU time, across every CPU.
	Total time.Duration
}

// ReadCPU samples /proc/stat; ok is false where there is none.
func ReadCPU() (s CPUSample, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return parseCPULine(line)
}

// parseCPULine reads the first line of /proc/stat: "cpu" and the times
// user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice.
func parseCPULine(line string) (s CPUSample, ok bool) {
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return s, false
	}
	var total, idle, steal int64
	for i, v := range f[1:] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return s, false
		}
		// guest and guest_nice (fields 9 and 10) are already counted in
		// user and nice.
		if i >= 8 {
			break
		}
		total += n
		switch i {
		case 3, 4: // idle, iowait
			idle += n
		case 7:
			steal = n
		}
	}
	tick := time.Second / clockTicks
	return CPUSample{
		Busy:  time.Duration(total-idle-steal) * tick,
		Steal: time.Duration(steal) * tick,
		Total: time.Duration(total) * tick,
	}, true
}

// Utilization is the share of the machine's CPU time that was busy
// between s and a later sample.
func (s CPUSample) Utilization(later CPUSample) float64 {
	total := later.Total - s.Total
	if total <= 0 {
		return 0
	}
	return float64(later.Busy-s.Busy) / float64(total)
}

// ProcCPU returns the CPU time (user and system) a live process has used,
// from /proc/PID/stat.
func ProcCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: count fields from
	// the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(utime+stime) * (time.Second / clockTicks), true
}

// CommCPU returns, for every live process whose command name is comm
// (such as "postgres"), the CPU time it has used, by pid.
func CommCPU(comm string) map[int]time.Duration {
	out := map[int]time.Duration{}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return out
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil || strings.TrimSpace(string(b)) != comm {
			continue
		}
		if d, ok := ProcCPU(pid); ok {
			out[pid] = d
		}
	}
	return out
}

// CPUSince sums, over the processes of later, the CPU time used since
// earlier (a process absent from earlier started in between).
func CPUSince(earlier, later map[int]time.Duration) time.Duration {
	var sum time.Duration
	for pid, d := range later {
		sum += d - earlier[pid]
	}
	return sum
}

// PostgresCPU is the CPU time of the PostgreSQL server's processes on this
// host, by pid, in three groups: DB, the backends connected to one database
// (found by its name in their process titles, "postgres: 15/main: user
// DATABASE host(port) state"), Server, the server's own background
// processes, and Other, everything else (other databases' backends: other
// people's load).
type PostgresCPU struct {
	DB, Server, Other map[int]time.Duration
}

// SamplePostgresCPU samples PostgresCPU for the database dbName.
func SamplePostgresCPU(dbName string) PostgresCPU {
	s := PostgresCPU{DB: map[int]time.Duration{}, Server: map[int]time.Duration{}, Other: map[int]time.Duration{}}
	for pid, d := range CommCPU("postgres") {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if err != nil {
			continue
		}
		title := strings.ReplaceAll(string(b), "\x00", " ")
		switch {
		case strings.Contains(title, " "+dbName+" "):
			s.DB[pid] = d
		case !strings.HasPrefix(title, "postgres: ") || strings.Contains(title, "walwriter") ||
			strings.Contains(title, "checkpointer") || strings.Contains(title, "background writer") ||
			strings.Contains(title, "autovacuum launcher") || strings.Contains(title, "logical replication") ||
			strings.Contains(title, "stats collector") || strings.Contains(title, "archiver"):
			s.Server[pid] = d
		default:
			s.Other[pid] = d
		}
	}
	return s
}

// IsPostgres reports whether pid is a PostgreSQL process on this host.
func IsPostgres(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return err == nil && strings.TrimSpace(string(b)) == "postgres"
}

// CPUTrace samples the machine's CPU time (ReadCPU) at a fixed interval,
// so that how busy the machine was over a span known only afterwards can
// be read from it.
type CPUTrace struct {
	t *trace[CPUSample]
}

// errNoProcStat says /proc/stat could not be read.
var errNoProcStat = errors.New("read /proc/stat")

// TraceCPU samples the machine's CPU time every interval until Stop. It
// returns nil where /proc/stat cannot be read.
func TraceCPU(interval time.Duration) *CPUTrace {
	t, err := startTrace(interval, func(context.Context) (CPUSample, error) {
		s, ok := ReadCPU()
		if !ok {
			return s, errNoProcStat
		}
		return s, nil
	})
	if err != nil {
		return nil
	}
	return &CPUTrace{t}
}

// Stop takes a last sample and ends the trace. A nil trace does nothing.
func (c *CPUTrace) Stop() {
	if c != nil {
		_ = c.t.stop()
	}
}

// Over returns the share of the machine's CPU time that was busy, and the
// time stolen from it, between the last sample taken at or before from
// and the first taken at or after to: the span and at most a sampling
// interval on either side. ok is false where the trace does not cover the
// span, or is nil.
func (c *CPUTrace) Over(from, to time.Time) (busy float64, steal time.Duration, ok bool) {
	if c == nil || to.Before(from) {
		return 0, 0, false
	}
	c.t.read(func(samples []timed[CPUSample]) {
		i := sort.Search(len(samples), func(i int) bool { return samples[i].at.After(from) }) - 1
		j := sort.Search(len(samples), func(i int) bool { return !samples[i].at.Before(to) })
		if i < 0 || j == len(samples) {
			return
		}
		a, b := samples[i].v, samples[j].v
		busy, steal, ok = a.Utilization(b), b.Steal-a.Steal, true
	})
	return busy, steal, ok
}
