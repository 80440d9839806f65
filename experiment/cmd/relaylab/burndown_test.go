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

// TestRunExperiment_HelpOfThePrivateClusterExperimentsSaysDATABASE_URLIsNotUsed
// checks that the burn-down's and the soak's -h describe --database-url as
// they run: on a private cluster unless the flag names a server, never on
// $DATABASE_URL, which the other experiments default to.
func TestRunExperiment_HelpOfThePrivateClusterExperimentsSaysDATABASE_URLIsNotUsed(t *testing.T) {
	for _, name := range []string{"burndown", "soak"} {
		var stderr bytes.Buffer
		if err := run(t.Context(), []string{"relaylab", name, "-h"}, func(string) string { return "" }, &bytes.Buffer{}, &stderr); err != nil {
			t.Fatalf("relaylab %s -h: %v", name, err)
		}
		help := stderr.String()
		_, usage, ok := strings.Cut(help, "  -database-url string\n")
		if !ok {
			t.Fatalf("relaylab %s -h lists no -database-url:\n%s", name, help)
		}
		usage, _, _ = strings.Cut(usage, "\n")
		if strings.Contains(usage, "default $DATABASE_URL") || !strings.Contains(usage, "a private cluster") {
			t.Errorf("relaylab %s -h says of -database-url %q, want that it defaults to a private cluster and $DATABASE_URL is not used", name, strings.TrimSpace(usage))
		}
	}
}
