// Package relaybin builds the relay command once per test process, for the
// tests that run it as real operating-system processes.
package relaybin

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// buildTimeout bounds the build of the relay command.
const buildTimeout = 10 * time.Minute

var (
	once sync.Once
	dir  string
	path string
	err  error
)

// Path returns a relay binary built from this module's cmd/relay, building
// it on first use. A failed build fails the test.
func Path(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		dir, err = os.MkdirTemp("", "relay-test-bin-")
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		p := filepath.Join(dir, "relay")
		out, buildErr := exec.CommandContext(ctx, "go", "build", "-o", p, "github.com/relayq/relay/cmd/relay").CombinedOutput()
		if buildErr != nil {
			err = fmt.Errorf("go build: %w\n%s", buildErr, out)
			return
		}
		path = p
	})
	if err != nil {
		t.Fatalf("build relay: %v", err)
	}
	return path
}

// Cleanup removes the binary, if one was built. Call it from TestMain once
// the tests have run.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}
