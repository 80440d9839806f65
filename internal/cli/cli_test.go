package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/worker"
)

func TestParse_ABadFlagIsAUsageErrorNamingTheCommandsHelp(t *testing.T) {
	tests := []struct{ name, synopsis, want string }{
		{"serve", "relay serve [flags]", `run "relay serve -h" for usage`},
		{"enqueue", "relay enqueue KIND [flags]", `run "relay enqueue -h" for usage`},
		{"experiment chaos-worker", "relaylab chaos-worker --id ID [flags]", `run "relaylab chaos-worker -h" for usage`},
	}
	for _, tt := range tests {
		fs := NewFlagSet(tt.name, tt.synopsis, "")
		_, err := fs.Parse([]string{"--no-such-flag"}, io.Discard)
		var u *UsageError
		if !errors.As(err, &u) || !strings.Contains(err.Error(), tt.want) || ExitCode(err) != 2 {
			t.Errorf("%s: %v (exit %d), want a usage error with %q, exit 2", tt.synopsis, err, ExitCode(err), tt.want)
		}
	}
}

func TestParse_MixesFlagsAndArgumentsAndStopsAtDoubleDash(t *testing.T) {
	fs := NewFlagSet("enqueue", "relay enqueue KIND [flags]", "")
	queue := fs.String("queue", "default", "")
	pos, err := fs.Parse([]string{"hash", "--queue", "q", "--", "--payload"}, io.Discard)
	if err != nil || *queue != "q" || strings.Join(pos, " ") != "hash --payload" {
		t.Errorf("Parse = %v, %v with --queue %q; want [hash --payload], q", pos, err, *queue)
	}
}

// TestParse_TakesDoubleDashAsAFlagsValue: a "--" that a flag takes as its
// value ends nothing, and the flags after it are flags; one after a flag
// that takes no value, or after a flag's value, ends the flags.
func TestParse_TakesDoubleDashAsAFlagsValue(t *testing.T) {
	for _, tt := range []struct {
		args         []string
		wantPos      string
		wantQueue    string
		wantPriority int
		wantInsecure bool
	}{
		{[]string{"--queue", "--", "hash", "--priority", "5"}, "hash", "--", 5, false},
		{[]string{"-queue", "--", "--priority", "5", "hash"}, "hash", "--", 5, false},
		{[]string{"--queue", "--queue", "--", "hash", "--priority"}, "hash --priority", "--queue", 0, false},
		{[]string{"--queue=q", "--", "hash", "--priority"}, "hash --priority", "q", 0, false},
		{[]string{"--insecure", "--", "hash", "--priority"}, "hash --priority", "default", 0, true},
		{[]string{"hash", "--queue", "--", "--priority", "5"}, "hash", "--", 5, false},
	} {
		fs := NewFlagSet("enqueue", "relay enqueue KIND [flags]", "")
		queue := fs.String("queue", "default", "")
		priority := fs.Int("priority", 0, "")
		insecure := fs.Bool("insecure", false, "")
		pos, err := fs.Parse(tt.args, io.Discard)
		if err != nil || strings.Join(pos, " ") != tt.wantPos || *queue != tt.wantQueue || *priority != tt.wantPriority || *insecure != tt.wantInsecure {
			t.Errorf("Parse(%q) = %q, %v with --queue %q, --priority %d, --insecure %v; want %q, --queue %q, --priority %d, --insecure %v",
				tt.args, pos, err, *queue, *priority, *insecure, tt.wantPos, tt.wantQueue, tt.wantPriority, tt.wantInsecure)
		}
	}
}

// TestParse_ADurationTooLongSaysHowLongADurationMayBe gives --retain-dead
// values written with units as they should be, but longer than a
// time.Duration holds (about 292 years), as one who means to keep dead
// jobs for good might: the error says how long a duration may be, not
// that durations take units, which these have.
func TestParse_ADurationTooLongSaysHowLongADurationMayBe(t *testing.T) {
	for _, value := range []string{"3000000h", "2562047h47m16.854775808s", "99999999999999999999ns"} {
		fs := NewFlagSet("work", "relay work [flags]", "")
		var w WorkerFlags
		w.Register(fs, 1, "")
		_, err := fs.Parse([]string{"--retain-dead", value}, io.Discard)
		want := fmt.Sprintf(`invalid value %q for flag -retain-dead: longer than the longest duration, 2562047h47m16.854775807s (about 292 years)`, value)
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "durations take units") || ExitCode(err) != 2 {
			t.Errorf("--retain-dead %q: %v (exit %d), want a usage error with %q, exit 2", value, err, ExitCode(err), want)
		}
	}
}

func TestParse_ABadDurationSaysWhyAndWhatADurationIs(t *testing.T) {
	tests := []struct{ value, why string }{
		{"7d", `time: unknown unit "d" in duration "7d"`},
		{"10", `time: missing unit in duration "10"`},
		{"", `time: invalid duration ""`},
	}
	for _, tt := range tests {
		fs := NewFlagSet("work", "relay work [flags]", "")
		var w WorkerFlags
		w.Register(fs, 1, "")
		_, err := fs.Parse([]string{"--retain-dead", tt.value}, io.Discard)
		want := fmt.Sprintf(`invalid value %q for flag -retain-dead: %s: durations take units h, m, s, ms, us or ns, as in 168h (7 days)`, tt.value, tt.why)
		if err == nil || !strings.Contains(err.Error(), want) || ExitCode(err) != 2 {
			t.Errorf("--retain-dead %q: %v (exit %d), want a usage error with %q, exit 2", tt.value, err, ExitCode(err), want)
		}
	}
	fs := NewFlagSet("work", "relay work [flags]", "")
	fs.Int("slots", 1, "")
	_, err := fs.Parse([]string{"--slots", "7d"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `invalid value "7d" for flag -slots: parse error`) {
		t.Errorf("--slots 7d: %v, want the flag package's own error, as it is not a duration", err)
	}
}

func TestExitCode_TwoForUsageOneForOthersZeroForNone(t *testing.T) {
	for err, want := range map[error]int{
		nil:                                      0,
		Usagef("bad"):                            2,
		fmt.Errorf("wrapped: %w", Usagef("bad")): 2,
		errors.New("database unreachable"):       1,
	} {
		if got := ExitCode(err); got != want {
			t.Errorf("ExitCode(%v) = %d, want %d", err, got, want)
		}
	}
}

func TestWorkerFlags_RetentionZeroKeepsForeverNegativeIsAUsageError(t *testing.T) {
	tests := []struct {
		args    []string
		want    [3]time.Duration // succeeded, dead, cancelled
		wantErr string
	}{
		{nil, [3]time.Duration{worker.DefaultRetainSucceeded, worker.DefaultRetainDead, worker.DefaultRetainCancelled}, ""},
		{[]string{"--retain-succeeded", "1h", "--retain-dead", "0", "--retain-cancelled", "90m"},
			[3]time.Duration{time.Hour, worker.KeepForever, 90 * time.Minute}, ""},
		{[]string{"--retain-cancelled", "-1s"}, [3]time.Duration{}, "--retain-cancelled must be 0 (keep forever) or positive, got -1s"},
	}
	for _, tt := range tests {
		cfg, err := workerConfig(t, tt.args)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || ExitCode(err) != 2 {
				t.Errorf("%q: %v, want a usage error %q", tt.args, err, tt.wantErr)
			}
			continue
		}
		got := [3]time.Duration{cfg.RetainSucceeded, cfg.RetainDead, cfg.RetainCancelled}
		if err != nil || got != tt.want {
			t.Errorf("%q: retentions %v, %v; want %v", tt.args, got, err, tt.want)
		}
	}
}

func TestWorkerFlags_ShutdownGraceZeroReleasesAtOnce(t *testing.T) {
	tests := []struct {
		args     []string
		released bool // at once, as a negative worker.Config.ShutdownGrace does
		grace    time.Duration
	}{
		{nil, false, worker.DefaultShutdownGrace},
		{[]string{"--shutdown-grace", "3s"}, false, 3 * time.Second},
		{[]string{"--shutdown-grace", "0"}, true, 0},
		{[]string{"--shutdown-grace", "-1s"}, true, 0},
	}
	for _, tt := range tests {
		cfg, err := workerConfig(t, tt.args)
		if err != nil {
			t.Fatalf("%q: %v", tt.args, err)
		}
		if released := cfg.ShutdownGrace < 0; released != tt.released || !released && cfg.ShutdownGrace != tt.grace {
			t.Errorf("%q: ShutdownGrace %s, want release at once %t, else %s", tt.args, cfg.ShutdownGrace, tt.released, tt.grace)
		}
	}
}

// --prefetch given 0 claims no job ahead, as -1 does, rather than taking
// the worker's default, which claims as many as --slots, at least 32;
// without the flag, the worker's default holds. Below -1 is a usage error.
func TestWorkerFlags_PrefetchZeroClaimsNoneAhead(t *testing.T) {
	const none, byDefault = -1, 0 // worker.Config's Prefetch: negative, zero
	tests := []struct {
		args    []string
		want    int
		wantErr string
	}{
		{nil, byDefault, ""},
		{[]string{"--prefetch", "0"}, none, ""},
		{[]string{"--prefetch=0"}, none, ""},
		{[]string{"--prefetch", "-1"}, none, ""},
		{[]string{"--prefetch", "1"}, 1, ""},
		{[]string{"--prefetch", "64"}, 64, ""},
		{[]string{"--prefetch", "-2"}, 0, "--prefetch must be 0 or -1 (none) or positive, got -2"},
	}
	for _, tt := range tests {
		cfg, err := workerConfig(t, tt.args)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || ExitCode(err) != 2 {
				t.Errorf("%q: %v, want a usage error %q", tt.args, err, tt.wantErr)
			}
			continue
		}
		if err != nil || cfg.Prefetch != tt.want {
			t.Errorf("%q: Prefetch %d, %v; want %d", tt.args, cfg.Prefetch, err, tt.want)
		}
	}
}

// workerConfig parses args as relay work's worker flags and returns the
// configuration they describe.
func workerConfig(t *testing.T, args []string) (worker.Config, error) {
	t.Helper()
	var w WorkerFlags
	fs := NewFlagSet("work", "relay work [flags]", "")
	w.Register(fs, 1, "")
	if _, err := fs.Parse(args, io.Discard); err != nil {
		t.Fatal(err)
	}
	return w.Config(nil)
}
