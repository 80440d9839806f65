// Package dockertest gives tests that need a Docker engine the engine, or
// says why not. Such a test runs when the run asks for Docker: when CI is
// "true" (CI never skips them) or RELAY_TEST_DATABASE_URL is empty (the
// tests' database is then a container too: see package dbtest, and make
// test-containers). It then fails, saying why, if there is no engine.
// Otherwise it is skipped, saying how to run it: a run against a local
// PostgreSQL does not need Docker, nor the images these tests use, which
// may have to be built first on a machine that reaches no registry.
package dockertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
)

// EnvCLI names the environment variable that gives the docker command the
// tests run (docker on PATH if empty): its builds need BuildKit, which
// Debian's docker.io CLI has built in and newer CLIs get from buildx.
const EnvCLI = "DOCKER"

// pingTimeout bounds the check that the engine answers.
const pingTimeout = 10 * time.Second

// Asked reports whether the run asked for the tests that need Docker.
func Asked() bool {
	return os.Getenv("CI") == "true" || os.Getenv("RELAY_TEST_DATABASE_URL") == ""
}

// RequireEngine returns a client of the Docker engine that testcontainers
// finds, closed when the test ends. It skips the test unless the run asks
// for Docker, and fails it if there is no engine.
func RequireEngine(t testing.TB) *testcontainers.DockerClient {
	t.Helper()
	if !Asked() {
		t.Skip("skipped: needs a Docker engine; runs when CI=true or RELAY_TEST_DATABASE_URL is empty (make test-containers)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	cli, err := newClient(ctx)
	if err != nil {
		unavailable(t, "no Docker engine: %v", err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// newClient connects to the engine, turning the panic with which
// testcontainers reports a missing one into an error.
func newClient(ctx context.Context) (cli *testcontainers.DockerClient, err error) {
	defer func() {
		if r := recover(); r != nil {
			cli, err = nil, fmt.Errorf("testcontainers: %v", r)
		}
	}()
	cli, err = testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := cli.Ping(ctx, client.PingOptions{}); err != nil {
		cli.Close()
		return nil, err
	}
	return cli, nil
}

// RequireCLI returns the docker command (EnvCLI, else docker on PATH),
// after checking that it reaches the engine: it skips or fails the test
// as RequireEngine does.
func RequireCLI(t testing.TB) string {
	t.Helper()
	RequireEngine(t)
	cli := os.Getenv(EnvCLI)
	if cli == "" {
		cli = "docker"
	}
	path, err := exec.LookPath(cli)
	if err != nil {
		unavailable(t, "no docker command (%s=%q): %v", EnvCLI, os.Getenv(EnvCLI), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	if out, err := exec.CommandContext(ctx, path, "version", "--format", "{{.Server.Version}}").CombinedOutput(); err != nil {
		unavailable(t, "%s version: %v: %s", path, err, out)
	}
	return path
}

// Networks returns the names of the engine's networks, sorted.
func Networks(t testing.TB, cli *testcontainers.DockerClient) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
	defer cancel()
	list, err := cli.NetworkList(ctx, client.NetworkListOptions{})
	if err != nil {
		t.Fatalf("list Docker networks: %v", err)
	}
	var names []string
	for _, n := range list.Items {
		names = append(names, n.Name)
	}
	slices.Sort(names)
	return names
}

func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Fatalf("this test needs a Docker engine (the run asks for one: CI=true or RELAY_TEST_DATABASE_URL empty): "+format, args...)
}
