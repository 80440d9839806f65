package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
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
