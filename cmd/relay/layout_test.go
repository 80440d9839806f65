package main

import (
	"os/exec"
	"strings"
	"testing"
)

// labOnly names what belongs to the lab or to the build's tools: none of
// it may reach the relay binary, the packages a Go service imports, or the
// product's module graph. River, the lab's reference system, is required
// by the lab's River adapter alone (experiment/river).
var labOnly = []string{
	"github.com/relayq/relay/experiment",
	"github.com/relayq/relay/internal/faultproxy",
	"github.com/relayq/relay/internal/pgbouncer",
	"github.com/relayq/relay/internal/modelcheck",
	"gonum.org/",
	"github.com/sqlc-dev/",
	"github.com/riverqueue/",
	"riverqueue.com/",
}

func goList(t *testing.T, args ...string) []string {
	t.Helper()
	out, err := exec.CommandContext(t.Context(), "go", append([]string{"list"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list %s: %v", strings.Join(args, " "), err)
	}
	return strings.Fields(string(out))
}

func TestLayout_TheProductCarriesNoneOfTheLab(t *testing.T) {
	deps := goList(t, "-deps",
		"github.com/relayq/relay/cmd/relay", "github.com/relayq/relay/worker", "github.com/relayq/relay/client")
	modules := goList(t, "-m", "-f", "{{.Path}}", "all")
	for _, list := range []struct {
		what  string
		names []string
	}{{"a package relay, worker or client imports", deps}, {"a module of the product's graph", modules}} {
		for _, name := range list.names {
			for _, lab := range labOnly {
				if strings.HasPrefix(name, lab) {
					t.Errorf("%s is %s", name, list.what)
				}
			}
		}
	}
}
