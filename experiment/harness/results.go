package harness

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/relayq/relay/experiment/labdb"
)

// Environment records where and with what a run was made.
type Environment struct {
	// Date is when the run started, in UTC.
	Date time.Time `json:"date"`
	// Host is the machine's host name.
	Host string `json:"host"`
	// OS and Arch are the experiment's runtime.GOOS and GOARCH.
	OS   string `json:"os"`
	Arch string `json:"arch"`
	// CPUs is the number of logical CPUs.
	CPUs int `json:"cpus"`
	// GoVersion is the Go release the relay binary was built with.
	GoVersion string `json:"go_version"`
	// RelayBinary is the relay binary the processes ran.
	RelayBinary string `json:"relay_binary"`
	// GitCommit is the commit the binary was built from, if known, with
	// GitDirty set when the working tree had changes.
	GitCommit string `json:"git_commit,omitempty"`
	GitDirty  bool   `json:"git_dirty,omitempty"`
	// PostgreSQL describes the database server.
	PostgreSQL ServerInfo `json:"postgresql"`
	// LoadAverage is the 1, 5 and 15 minute load average when the run
	// started, and LoadAverageEnd when it ended (Linux only).
	LoadAverage    []float64 `json:"load_average,omitempty"`
	LoadAverageEnd []float64 `json:"load_average_end,omitempty"`
}

// ServerInfo is what the experiments record of the PostgreSQL server: its
// version and the settings that bear on their figures.
type ServerInfo struct {
	Version           string `json:"version"`
	SynchronousCommit string `json:"synchronous_commit"`
	// CommitDelay and CommitSiblings lengthen each commit's flush when
	// set: a way to stand in for a slower disk.
	CommitDelay        string `json:"commit_delay,omitempty"`
	CommitSiblings     string `json:"commit_siblings,omitempty"`
	Fsync              string `json:"fsync"`
	FullPageWrites     string `json:"full_page_writes,omitempty"`
	SharedBuffers      string `json:"shared_buffers"`
	WorkMem            string `json:"work_mem,omitempty"`
	MaintenanceWorkMem string `json:"maintenance_work_mem,omitempty"`
	MaxConnections     string `json:"max_connections"`
	MaxWALSize         string `json:"max_wal_size,omitempty"`
	CheckpointTimeout  string `json:"checkpoint_timeout,omitempty"`
	// Autovacuum and its settings decide whether, and how soon, dead row
	// versions are reclaimed.
	Autovacuum                  string `json:"autovacuum,omitempty"`
	AutovacuumNaptime           string `json:"autovacuum_naptime,omitempty"`
	AutovacuumMaxWorkers        string `json:"autovacuum_max_workers,omitempty"`
	AutovacuumVacuumScaleFactor string `json:"autovacuum_vacuum_scale_factor,omitempty"`
	AutovacuumVacuumThreshold   string `json:"autovacuum_vacuum_threshold,omitempty"`
	AutovacuumVacuumCostDelay   string `json:"autovacuum_vacuum_cost_delay,omitempty"`
	AutovacuumVacuumCostLimit   string `json:"autovacuum_vacuum_cost_limit,omitempty"`
	TrackCounts                 string `json:"track_counts,omitempty"`
	// JIT compiles the plans whose cost passes jit_above_cost.
	JIT string `json:"jit,omitempty"`
	// SharedPreloadLibraries names the libraries loaded into every
	// backend, such as pg_stat_statements or auto_explain.
	SharedPreloadLibraries string `json:"shared_preload_libraries"`
}

// ReadServerInfo reads the server's version and settings through q.
func ReadServerInfo(ctx context.Context, q *labdb.Queries) (ServerInfo, error) {
	info, err := q.ExperimentServerInfo(ctx)
	if err != nil {
		return ServerInfo{}, fmt.Errorf("read the server's settings: %w", err)
	}
	return ServerInfo{
		Version:                     info.ServerVersion,
		SynchronousCommit:           info.SynchronousCommit,
		CommitDelay:                 info.CommitDelay,
		CommitSiblings:              info.CommitSiblings,
		Fsync:                       info.Fsync,
		FullPageWrites:              info.FullPageWrites,
		SharedBuffers:               info.SharedBuffers,
		WorkMem:                     info.WorkMem,
		MaintenanceWorkMem:          info.MaintenanceWorkMem,
		MaxConnections:              info.MaxConnections,
		MaxWALSize:                  info.MaxWalSize,
		CheckpointTimeout:           info.CheckpointTimeout,
		Autovacuum:                  info.Autovacuum,
		AutovacuumNaptime:           info.AutovacuumNaptime,
		AutovacuumMaxWorkers:        info.AutovacuumMaxWorkers,
		AutovacuumVacuumScaleFactor: info.AutovacuumVacuumScaleFactor,
		AutovacuumVacuumThreshold:   info.AutovacuumVacuumThreshold,
		AutovacuumVacuumCostDelay:   info.AutovacuumVacuumCostDelay,
		AutovacuumVacuumCostLimit:   info.AutovacuumVacuumCostLimit,
		TrackCounts:                 info.TrackCounts,
		JIT:                         info.Jit,
		SharedPreloadLibraries:      info.SharedPreloadLibraries,
	}, nil
}

// CollectEnvironment records the environment of a run on database d.
func CollectEnvironment(ctx context.Context, d *Database, relayBin string) Environment {
	env := Environment{
		Date:        time.Now().UTC().Truncate(time.Second),
		OS:          runtime.GOOS,
		Arch:        runtime.GOARCH,
		CPUs:        runtime.NumCPU(),
		GoVersion:   runtime.Version(),
		RelayBinary: relayBin,
		LoadAverage: LoadAverage(),
	}
	env.Host, _ = os.Hostname()
	if bi, err := buildinfo.ReadFile(relayBin); err == nil {
		env.GoVersion = bi.GoVersion
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				env.GitCommit = s.Value
			case "vcs.modified":
				env.GitDirty = s.Value == "true"
			}
		}
	}
	if env.GitCommit == "" {
		env.GitCommit = checkoutCommit(ctx, relayBin)
	}
	infoCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if info, err := ReadServerInfo(infoCtx, d.Lab); err == nil {
		env.PostgreSQL = info
	}
	return env
}

// LoadAverage returns the 1, 5 and 15 minute load averages from
// /proc/loadavg, or nil where there is none.
func LoadAverage() []float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return nil
	}
	out := make([]float64, 3)
	for i := range out {
		if out[i], err = strconv.ParseFloat(f[i], 64); err != nil {
			return nil
		}
	}
	return out
}

// Percentiles summarises a distribution of durations, in milliseconds.
type Percentiles struct {
	N    int     `json:"n"`
	Min  float64 `json:"min_ms"`
	P50  float64 `json:"p50_ms"`
	P95  float64 `json:"p95_ms"`
	P99  float64 `json:"p99_ms"`
	Max  float64 `json:"max_ms"`
	Mean float64 `json:"mean_ms"`
}

// PercentilesOf summarises Millis (which it sorts), with the nearest-rank method.
func PercentilesOf(ms []float64) Percentiles {
	if len(ms) == 0 {
		return Percentiles{}
	}
	sort.Float64s(ms)
	sum := 0.0
	for _, v := range ms {
		sum += v
	}
	return Percentiles{
		N:    len(ms),
		Min:  Round3(ms[0]),
		P50:  Round3(nearestRank(ms, 0.50)),
		P95:  Round3(nearestRank(ms, 0.95)),
		P99:  Round3(nearestRank(ms, 0.99)),
		Max:  Round3(ms[len(ms)-1]),
		Mean: Round3(sum / float64(len(ms))),
	}
}

// nearestRank is the nearest-rank percentile q of sorted.
func nearestRank(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Millis converts a duration to milliseconds.
func Millis(d time.Duration) float64 { return Round3(float64(d) / float64(time.Millisecond)) }

// Round3 keeps three decimals, enough for microseconds in milliseconds.
func Round3(v float64) float64 { return math.Round(v*1000) / 1000 }

// Round2 keeps two decimals.
func Round2(v float64) float64 { return math.Round(v*100) / 100 }

// Median is the median of vals, the mean of the middle two where they
// are even in number, unrounded; 0 for none. vals is left as it was.
func Median(vals []float64) float64 {
	if len(vals) == 0 {
		return 0
	}
	s := append([]float64(nil), vals...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// MedianWorst returns the median of a list of milliseconds, to the
// microsecond, and the largest.
func MedianWorst(vals []float64) (median, worst float64) {
	if len(vals) == 0 {
		return 0, 0
	}
	return Round3(Median(vals)), slices.Max(vals)
}

// RunStamp names the files of a run started at t.
func RunStamp(t time.Time) string { return t.UTC().Format("20060102T1504Z") }

// ResultBase returns outDir/kind-RunStamp(t), with a numeric suffix if a run of
// the same minute already left files there.
func ResultBase(outDir, kind string, t time.Time) (string, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", fmt.Errorf("results directory: %w", err)
	}
	base := filepath.Join(outDir, kind+"-"+RunStamp(t))
	for i := 2; ; i++ {
		if _, err := os.Stat(base + ".json"); errors.Is(err, os.ErrNotExist) {
			return base, nil
		}
		base = filepath.Join(outDir, fmt.Sprintf("%s-%s-%d", kind, RunStamp(t), i))
	}
}

// flatJSON matches, in indented JSON, an array or an object that holds
// only scalars, spread over several lines.
var flatJSON = regexp.MustCompile(`\[\n(?:[ \t]+(?:-?[0-9][-+0-9.eE]*|true|false|null),?\n)+[ \t]*\]|` +
	`\{\n(?:[ \t]+"[^"\\\n]*": (?:"(?:[^"\\\n]|\\.)*"|-?[0-9][-+0-9.eE]*|true|false|null),?\n)+[ \t]*\}`)

// CompactFlat puts every array or object of scalars in indented JSON on
// one line, so that long lists of numbers stay readable and short.
func CompactFlat(b []byte) []byte {
	return flatJSON.ReplaceAllFunc(b, func(m []byte) []byte {
		lines := strings.Split(string(m), "\n")
		for i := range lines {
			lines[i] = strings.TrimSpace(lines[i])
		}
		open, closing := lines[0], lines[len(lines)-1]
		return []byte(open + strings.Join(lines[1:len(lines)-1], " ") + closing)
	})
}

// WriteJSON writes v, indented, to path.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	b = CompactFlat(b)
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write results: %w", err)
	}
	return nil
}

// LogDirFor returns the directory for the processes' logs: dir if given,
// else a new temporary directory that cleanup removes.
func LogDirFor(dir, pattern string) (string, func(), error) {
	if dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", nil, fmt.Errorf("log directory: %w", err)
		}
		return dir, func() {}, nil
	}
	tmp, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, fmt.Errorf("log directory: %w", err)
	}
	return tmp, func() { os.RemoveAll(tmp) }, nil
}

// NewTable returns a tabwriter for the summary tables.
func NewTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}

// ValueOf returns *p, or the zero value for nil.
func ValueOf[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// CheckFiles checks that files names want result files, none of them
// empty.
func CheckFiles(files []string, want int) error {
	if len(files) != want {
		return fmt.Errorf("files %v, want %d", files, want)
	}
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			return fmt.Errorf("result file: %w", err)
		}
		if st.Size() == 0 {
			return fmt.Errorf("result file %s is empty", f)
		}
	}
	return nil
}

// checkoutCommit is, for a binary built without VCS stamping, the commit
// of the git checkout it lies in, asked of git read-only: a binary kept
// outside the checkout (an older build, say) may have been built from any
// commit, and gets none.
func checkoutCommit(ctx context.Context, bin string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	abs, err := filepath.Abs(bin)
	if err != nil {
		return ""
	}
	top, err := exec.CommandContext(ctx, "git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return ""
	}
	if rel, err := filepath.Rel(strings.TrimSpace(string(top)), abs); err != nil || !filepath.IsLocal(rel) {
		return ""
	}
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "HEAD").Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}
