package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/dockertest"
)

// TestDockerCompose_RunsAJobOnTheHostNetwork runs docker-compose.yml with
// Debian's docker-compose: its services, dependencies, health check,
// commands and environment as the file gives them, with two changes that
// an engine without a bridge network needs. docker-compose.yml's services
// talk over the network Compose creates for them, which such an engine
// cannot give, and Compose refuses the host's network for a service that
// publishes a port ("host" network_mode is incompatible with
// port_bindings), which an override file cannot take away (Compose adds
// the ports of every file together). So the test runs what `docker-compose
// config` makes of the file, each service moved to the host's network:
// PostgreSQL and the API on 127.0.0.1 and free ports, the database URLs
// pointed there, no port published, and the images of this test.
func TestDockerCompose_RunsAJobOnTheHostNetwork(t *testing.T) {
	docker := dockertest.RequireCLI(t)
	engine := dockertest.RequireEngine(t)
	compose, err := exec.LookPath("docker-compose")
	if err != nil {
		t.Fatalf("this test runs docker-compose (Debian's docker-compose package): %v", err)
	}
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("this test enqueues its job with curl: %v", err)
	}
	ctx := testContext(t, dockerImageTimeout)
	token := randomHex(t)
	env := append(os.Environ(), "RELAY_API_TOKEN="+token)
	composeFile, err := filepath.Abs(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}

	cmd := exec.CommandContext(ctx, compose, "-f", composeFile, "config", "-q")
	cmd.Env = append(os.Environ(), "RELAY_API_TOKEN=")
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "set RELAY_API_TOKEN") {
		t.Errorf("docker-compose config without RELAY_API_TOKEN: %v, %s; want a refusal that says to set it", err, out)
	}
	cmd = exec.CommandContext(ctx, compose, "-f", composeFile, "config")
	cmd.Env = env
	resolved, err := cmd.Output()
	if err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, stderrOf(err))
	}
	var cfg map[string]any
	if err := yaml.Unmarshal(resolved, &cfg); err != nil {
		t.Fatalf("docker-compose config printed what is not YAML: %v", err)
	}

	image := buildImage(t, ctx, docker)
	postgresPort := freePort(t)
	apiAddr := freeAddr(t)
	onHostNetwork(t, cfg, image, os.Getenv(dbtest.EnvImage), postgresPort, apiAddr)
	hostFile := filepath.Join(t.TempDir(), "docker-compose.yml")
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(hostFile, b, 0o644); err != nil {
		t.Fatal(err)
	}

	networks := dockertest.Networks(t, engine)
	project := "relaytest" + randomHex(t)[:8]
	composeCmd := func(ctx context.Context, args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, compose, append([]string{"-f", hostFile, "-p", project}, args...)...)
		cmd.Env = env
		return cmd.CombinedOutput()
	}
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		if t.Failed() {
			out, _ := composeCmd(ctx, "logs", "--no-color")
			t.Logf("docker-compose logs:\n%s", out)
		}
		if out, err := composeCmd(ctx, "down", "--volumes", "--timeout", "20"); err != nil {
			t.Errorf("docker-compose down: %v\n%s", err, out)
		}
	})
	// --compatibility: deploy.replicas (three workers), which Compose
	// otherwise leaves to Swarm.
	if out, err := composeCmd(ctx, "--compatibility", "up", "--detach", "--no-build"); err != nil {
		t.Fatalf("docker-compose up: %v\n%s", err, out)
	}
	if out, err := composeCmd(ctx, "ps", "-q", "worker"); err != nil || len(strings.Fields(string(out))) != 3 {
		t.Errorf("docker-compose ps -q worker: %v, %q; want three workers", err, out)
	}

	base := "http://" + apiAddr
	waitForHealthy(t, ctx, base)
	auth := "Authorization: Bearer " + token
	body := curlJSON(t, ctx, curl, "-H", auth, base+"/v1/jobs", "-d", `{"kind":"hash","payload":{"sleep_ms":10,"iterations":100}}`)
	job := waitForCurledJob(t, ctx, curl, auth, base, body)
	if job.Result["pid"] != float64(1) {
		t.Errorf("job %d: result %v; want it run by a worker whose pid is 1, in a container", job.ID, job.Result)
	}
	t.Logf("job %d succeeded, run by %v", job.ID, job.Result["worker"])
	if got := dockertest.Networks(t, engine); !slices.Equal(got, networks) {
		t.Errorf("Docker networks: %v before docker-compose up, %v after; want none created", networks, got)
	}
}

// onHostNetwork moves every service of a resolved compose configuration to
// the host's network, as TestDockerCompose_RunsAJobOnTheHostNetwork says.
func onHostNetwork(t *testing.T, cfg map[string]any, relayImage, postgresImage string, postgresPort int, apiAddr string) {
	t.Helper()
	services, _ := cfg["services"].(map[string]any)
	if services["postgres"] == nil || services["api"] == nil {
		t.Fatalf("docker-compose config: want services postgres and api, have %v", sortedKeys(services))
	}
	for name, v := range services {
		svc := v.(map[string]any)
		svc["network_mode"] = "host"
		delete(svc, "ports")
		delete(svc, "networks")
		if _, ok := svc["build"]; ok {
			delete(svc, "build")
			svc["image"] = relayImage
		}
		env, _ := svc["environment"].(map[string]any)
		if dsn, ok := env["DATABASE_URL"].(string); ok {
			u, err := url.Parse(dsn)
			if err != nil {
				t.Fatalf("service %s: DATABASE_URL: %v", name, err)
			}
			u.Host = fmt.Sprintf("127.0.0.1:%d", postgresPort)
			env["DATABASE_URL"] = u.String()
		}
	}
	pg := services["postgres"].(map[string]any)
	if postgresImage != "" {
		pg["image"] = postgresImage
	}
	port := fmt.Sprint(postgresPort)
	pg["command"] = []string{"postgres", "-c", "listen_addresses=127.0.0.1", "-c", "port=" + port}
	hc, _ := pg["healthcheck"].(map[string]any)
	test, _ := hc["test"].([]any)
	if len(test) != 2 || test[0] != "CMD-SHELL" || !strings.HasPrefix(fmt.Sprint(test[1]), "pg_isready ") {
		t.Fatalf("postgres's health check is %v; want [CMD-SHELL, pg_isready ...]", hc["test"])
	}
	hc["test"] = []string{"CMD-SHELL", strings.Replace(fmt.Sprint(test[1]), "pg_isready ", "pg_isready -h 127.0.0.1 -p "+port+" ", 1)}

	api := services["api"].(map[string]any)
	command, _ := api["command"].([]any)
	i := slices.Index(command, any("--addr"))
	if i < 0 || i+1 >= len(command) {
		t.Fatalf("api's command %v has no --addr", command)
	}
	command[i+1] = apiAddr
}

// waitForCurledJob polls, with curl, the job whose creation printed body
// until it succeeds, failing the test if it ends otherwise.
func waitForCurledJob(t *testing.T, ctx context.Context, curl, auth, base string, body []byte) apiJob {
	t.Helper()
	var job apiJob
	if err := json.Unmarshal(body, &job); err != nil || job.ID == 0 {
		t.Fatalf("curl POST /v1/jobs: %v: %s", err, body)
	}
	for job.State != "succeeded" {
		if job.State == "dead" || job.State == "cancelled" {
			t.Fatalf("job %d ended %s: %s", job.ID, job.State, body)
		}
		select {
		case <-ctx.Done():
			t.Fatalf("job %d still %s: %v", job.ID, job.State, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		body = curlJSON(t, ctx, curl, "-H", auth, fmt.Sprintf("%s/v1/jobs/%d", base, job.ID))
		job = apiJob{}
		if err := json.Unmarshal(body, &job); err != nil {
			t.Fatalf("curl GET job: %v: %s", err, body)
		}
	}
	if job.Attempt != 1 {
		t.Errorf("job %d succeeded at attempt %d, want 1", job.ID, job.Attempt)
	}
	return job
}

// freePort returns a TCP port of 127.0.0.1 that nothing listens on now.
func freePort(t *testing.T) int {
	t.Helper()
	addr, err := net.ResolveTCPAddr("tcp", freeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return addr.Port
}

// stderrOf returns what a failed command printed on stderr, if known.
func stderrOf(err error) string {
	if exit, ok := err.(*exec.ExitError); ok {
		return string(exit.Stderr)
	}
	return ""
}
