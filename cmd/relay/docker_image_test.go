package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/internal/dockertest"
)

// The Docker image, built by Docker and run: see docker_test.go for what is
// proven of it without Docker.

// EnvGoImage and EnvRuntimeImage name the variables that give the
// Dockerfile's base images to the tests that build it (the Dockerfile's
// defaults, the public golang and distroless images, when empty):
// scripts/local-build-images makes stand-ins for a machine that reaches no
// registry.
const (
	EnvGoImage      = "RELAY_TEST_GO_IMAGE"
	EnvRuntimeImage = "RELAY_TEST_RUNTIME_IMAGE"
)

// dockerImageTimeout bounds the build of the image, which compiles relay
// from a cold cache the first time, and its run.
const dockerImageTimeout = 10 * time.Minute

func TestDockerImage_MigratesServesAndWorksAJobOnTheHostNetwork(t *testing.T) {
	docker := dockertest.RequireCLI(t)
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Fatalf("this test enqueues its job with curl: %v", err)
	}
	ctx := testContext(t, dockerImageTimeout)
	image := buildImage(t, ctx, docker)
	dsn := emptyDatabaseURL(t)
	addr := freeAddr(t)
	token := randomHex(t)

	// Every container has the host's network: the database and the API
	// are on 127.0.0.1, and nothing listens anywhere else.
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.CommandContext(ctx, docker, append([]string{"run", "--network", "host", "-e", "DATABASE_URL=" + dsn}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("docker run %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	start := func(name string, args ...string) {
		t.Helper()
		id := run(append([]string{"-d"}, args...)...)
		t.Cleanup(func() {
			if t.Failed() {
				out, _ := exec.Command(docker, "logs", id).CombinedOutput()
				t.Logf("%s's log:\n%s", name, out)
			}
			exec.Command(docker, "rm", "-f", id).Run()
		})
	}

	if out := run("--rm", image, "migrate", "up"); !strings.Contains(out, "applied migration 1 ") {
		t.Fatalf("relay migrate up on an empty database applied nothing:\n%s", out)
	} else {
		t.Logf("relay migrate up:\n%s", out)
	}
	start("relay serve", "-e", "RELAY_API_TOKEN="+token, image, "serve", "--addr", addr)
	start("relay work", image, "work", "--slots", "2")

	base := "http://" + addr
	waitForHealthy(t, ctx, base)
	body := curlJSON(t, ctx, curl, "-H", "Authorization: Bearer "+token, base+"/v1/jobs",
		"-d", `{"kind":"hash","payload":{"sleep_ms":10,"iterations":100}}`)
	job := waitForCurledJob(t, ctx, curl, "Authorization: Bearer "+token, base, body)
	// relay serve runs no worker slots: relay work ran it, as the first
	// process of its container.
	if job.Result["worker"] == nil || job.Result["pid"] != float64(1) {
		t.Errorf("job %d: result %v; want it run by a worker whose pid is 1", job.ID, job.Result)
	}
	t.Logf("job %d succeeded, run by %v", job.ID, job.Result["worker"])

	// Without a token, the image's own command refuses to serve.
	cmd := exec.CommandContext(ctx, docker, "run", "--rm", "--network", "none", image)
	out2, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); err == nil || code != 2 || !strings.Contains(string(out2), "without a token") {
		t.Errorf("the image's command without RELAY_API_TOKEN: exit status %d (%v), output:\n%s\nwant status 2 and a refusal to serve without a token", code, err, out2)
	}
}

// buildImage builds the Dockerfile with Docker (BuildKit) and returns the
// image's name; the image is removed when the test ends, its layers stay in
// the build cache for the next build. The build fetches its modules from a
// module proxy on 127.0.0.1 that serves this machine's module cache (go mod
// download fills it first), so that it sends nothing beyond this machine
// and needs no module proxy of the build's own.
func buildImage(t *testing.T, ctx context.Context, docker string) string {
	t.Helper()
	if out, err := exec.CommandContext(ctx, "go", "mod", "download").CombinedOutput(); err != nil {
		t.Fatalf("go mod download: %v\n%s", err, out)
	}
	proxy := serveModuleCache(t)
	image := "relay-test:" + randomHex(t)[:12]
	args := []string{"build", "--network", "host", "--tag", image,
		"--build-arg", "GOPROXY=" + proxy, "--build-arg", "GOSUMDB=off"}
	for _, a := range []struct{ arg, env string }{{"GO_IMAGE", EnvGoImage}, {"RUNTIME_IMAGE", EnvRuntimeImage}} {
		if v := os.Getenv(a.env); v != "" {
			args = append(args, "--build-arg", a.arg+"="+v)
		}
	}
	cmd := exec.CommandContext(ctx, docker, append(args, repoRoot)...)
	cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	began := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("docker %s: %v\n%s\n(%s and %s give the base images; scripts/local-build-images makes them where no registry is reachable)",
			strings.Join(args, " "), err, out.String(), EnvGoImage, EnvRuntimeImage)
	}
	t.Cleanup(func() { exec.Command(docker, "rmi", image).Run() })
	size, err := exec.CommandContext(ctx, docker, "image", "inspect", "--format", "{{.Size}}", image).Output()
	if err != nil {
		t.Fatalf("docker image inspect %s: %v", image, err)
	}
	t.Logf("built %s in %s: %s bytes", image, time.Since(began).Round(time.Second), strings.TrimSpace(string(size)))
	return image
}

// serveModuleCache serves the download directory of this machine's module
// cache, which is laid out as a module proxy, on 127.0.0.1 until the test
// ends, and returns its URL.
func serveModuleCache(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "cache", "download")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.FileServer(http.Dir(dir)), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return "http://" + l.Addr().String()
}

// curlJSON runs curl with args and returns the body it printed, failing
// the test on a transport error or an HTTP status of 400 or more.
func curlJSON(t *testing.T, ctx context.Context, curl string, args ...string) []byte {
	t.Helper()
	out, err := exec.CommandContext(ctx, curl, append([]string{"-sS", "--fail-with-body", "--max-time", "10"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("curl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return out
}

// waitForHealthy polls /readyz until the API answers 200.
func waitForHealthy(t *testing.T, ctx context.Context, base string) {
	t.Helper()
	for {
		resp, _, err := apiRequest(ctx, http.MethodGet, base+"/readyz", "", "")
		if err == nil && resp.StatusCode == http.StatusOK {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s/readyz never answered 200: %v", base, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func randomHex(t *testing.T) string {
	t.Helper()
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}
