package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLayout_TheLabsModuleCarriesNoRiver checks that River stays in the
// module of the lab's River adapter (experiment/river), which the lab
// drives as a separate binary: the lab's own module graph holds none of it.
func TestLayout_TheLabsModuleCarriesNoRiver(t *testing.T) {
	out, err := exec.CommandContext(t.Context(), "go", "list", "-m", "-f", "{{.Path}}", "all").Output()
	if err != nil {
		t.Fatalf("go list -m all: %v", err)
	}
	for _, m := range strings.Fields(string(out)) {
		if strings.HasPrefix(m, "github.com/riverqueue/") || strings.HasPrefix(m, "riverqueue.com/") ||
			m == "github.com/relayq/relay/experiment/river" {
			t.Errorf("%s is a module of the lab's graph", m)
		}
	}
}
