// Package relaybin builds the relay command (and the lab's commands) once
// per test process, for the tests that run them as real operating-system
// processes.
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

// buildTimeout bounds the build of a command.
const buildTimeout = 10 * time.Minute

// binary is one command, built on first use, in dir if not empty.
type binary struct {
	name, pkg, dir string
	once           sync.Once
	path           string
	err            error
}

var (
	dirOnce sync.Once
	dir     string
	dirErr  error

	relay = &binary{name: "relay", pkg: "github.com/relayq/relay/cmd/relay"}

	othersMu sync.Mutex
	others   = map[string]*binary{}
)

// Path returns a relay binary built from this module's cmd/relay, building
// it on first use. A failed build fails the test.
func Path(t testing.TB) string {
	t.Helper()
	return relay.build(t)
}

// Build returns the command of package pkg, built as name in the same
// directory as Path's relay on first use, for a module that builds more
// commands than relay (the lab's relaylab). pkg is resolved in the module
// of the test's directory. A failed build fails the test.
func Build(t testing.TB, name, pkg string) string {
	t.Helper()
	return BuildIn(t, name, "", pkg)
}

// BuildIn is Build for a package of another module of the tree, resolved
// in the module of directory dir (relative to the test's directory): the
// lab's River adapter, say, whose module is apart from the lab's.
func BuildIn(t testing.TB, name, dir, pkg string) string {
	t.Helper()
	othersMu.Lock()
	b, ok := others[dir+"\x00"+pkg]
	if !ok {
		b = &binary{name: name, pkg: pkg, dir: dir}
		others[dir+"\x00"+pkg] = b
	}
	othersMu.Unlock()
	return b.build(t)
}

func (b *binary) build(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		dirOnce.Do(func() { dir, dirErr = os.MkdirTemp("", "relay-test-bin-") })
		if dirErr != nil {
			b.err = dirErr
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
		defer cancel()
		p := filepath.Join(dir, b.name)
		cmd := exec.CommandContext(ctx, "go", "build", "-o", p, b.pkg)
		cmd.Dir = b.dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			b.err = fmt.Errorf("go build: %w\n%s", err, out)
			return
		}
		b.path = p
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", b.name, b.err)
	}
	return b.path
}

// Cleanup removes the binaries, if any were built.
func Cleanup() {
	if dir != "" {
		os.RemoveAll(dir)
	}
}

// RunTests is the TestMain of a package whose tests build binaries: it
// runs the tests, removes the binaries and exits with the tests' status.
//
//	func TestMain(m *testing.M) { relaybin.RunTests(m) }
func RunTests(m *testing.M) {
	code := m.Run()
	Cleanup()
	os.Exit(code)
}
