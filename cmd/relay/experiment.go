package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/relayq/relay/internal/cli"
)

// labCommand is the lab's command, which runs the recorded experiments. It
// is built from experiment/cmd/relaylab, apart from relay, so that relay
// carries none of the lab: `relay experiment NAME` runs `relaylab NAME`.
const labCommand = "relaylab"

// runExperiment replaces this process with the lab's command, given the
// same arguments, environment and terminal: its output, signals and exit
// status are the command's own.
func runExperiment(_ context.Context, env *environment, args []string) error {
	path, err := labBinary()
	if err != nil {
		return err
	}
	if err := syscall.Exec(path, append([]string{labCommand}, args...), os.Environ()); err != nil {
		return fmt.Errorf("experiment: run %s: %w", path, err)
	}
	return nil
}

// labBinary finds relaylab beside this binary, else on PATH.
func labBinary() (string, error) {
	if exe, err := os.Executable(); err == nil {
		beside := filepath.Join(filepath.Dir(exe), labCommand)
		if info, err := os.Stat(beside); err == nil && !info.IsDir() {
			return beside, nil
		}
	}
	if path, err := exec.LookPath(labCommand); err == nil {
		return path, nil
	}
	return "", cli.Usagef("experiment: the experiments are run by %s, found neither beside relay nor on PATH: build both with `make build`, or %s alone with `cd experiment && go build -o ../bin/%s ./cmd/%s`",
		labCommand, labCommand, labCommand, labCommand)
}
