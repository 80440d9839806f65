package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/relayq/relay/internal/cli"
)

// TestRunExperimentBurndown_RejectsAMistakenCommandLineAsUsage checks that
// a burn-down whose settings cannot run stops at its command line with a
// usage error (exit 2) naming the flag, before it starts a cluster.
func TestRunExperimentBurndown_RejectsAMistakenCommandLineAsUsage(t *testing.T) {
	getenv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--rounds", "0"}, "--rounds"},
		{[]string{"--rounds", "-2"}, "--rounds"},
		{[]string{"--jobs", "0"}, "--jobs"},
		{[]string{"--configs", "2y100"}, "--configs"},
		{[]string{"--timeout", "-1s"}, "--timeout"},
	} {
		args := append([]string{"--relay-bin", "/bin/true", "--systems", "relay"}, tc.args...)
		var stderr bytes.Buffer
		err := runExperimentBurndown(t.Context(), args, getenv, &bytes.Buffer{}, &stderr)
		if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("experiment burndown %s: %v (exit %d), want a usage error naming %s", strings.Join(tc.args, " "), err, cli.ExitCode(err), tc.flag)
		}
	}
}
