package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/relayq/relay/internal/cli"
)

// TestRunExperimentSoak_RejectsAMistakenCommandLineAsUsage checks that a
// soak whose settings cannot give a true result stops at its command line
// with a usage error (exit 2) naming the flag, before it starts a cluster.
func TestRunExperimentSoak_RejectsAMistakenCommandLineAsUsage(t *testing.T) {
	getenv := func(string) string { return "" }
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"--rate", "0"}, "--rate"},
		{[]string{"--retain-succeeded", "-1s"}, "--retain-succeeded"},
		// Sampled every 5 s, a job is read up to 6 s after it finished.
		{[]string{"--retain-succeeded", "11s"}, "--retain-succeeded"},
		{[]string{"--interval", "2s", "--retain-succeeded", "5s"}, "--retain-succeeded"},
		{[]string{"--system", "oban"}, "--system"},
		{[]string{"--readers-nice", "20"}, "--readers-nice"},
		{[]string{"--readers-nice", "-1"}, "--readers-nice"},
		{[]string{"--readers-nice", "5", "--database-url", "postgres://127.0.0.1/x"}, "--readers-nice"},
	} {
		args := append([]string{"--relay-bin", "/bin/true"}, tc.args...)
		var stderr bytes.Buffer
		err := runExperimentSoak(t.Context(), args, getenv, &bytes.Buffer{}, &stderr)
		if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.flag) {
			t.Errorf("experiment soak %s: %v (exit %d), want a usage error naming %s", strings.Join(tc.args, " "), err, cli.ExitCode(err), tc.flag)
		}
	}
}
