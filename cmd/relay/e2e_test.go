package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/relaybin"
)

func TestMain(m *testing.M) {
	resetIgnoredStopSignals()
	relaybin.RunTests(m)
}

// resetIgnoredStopSignals has this process catch, and drop, SIGHUP and
// SIGINT if it started with them ignored, as under nohup or as a shell's
// background job. relay keeps a stop signal it started ignored ignored,
// and the processes the tests start would inherit it, though the tests
// stop them with those signals as a terminal does; a signal caught here
// is reset to its default action in them instead.
func resetIgnoredStopSignals() {
	dropped := make(chan os.Signal, 1)
	for _, sig := range []os.Signal{syscall.SIGHUP, os.Interrupt} {
		if signal.Ignored(sig) {
			signal.Notify(dropped, sig)
		}
	}
}

// proc is a relay process.
type proc struct {
	name           string
	cmd            *exec.Cmd
	stdout, stderr syncBuffer
	done           chan struct{}
	err            error // set when done is closed
}

func startProc(t *testing.T, ctx context.Context, name string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, ctx, name, nil, args...)
}

// startProcEnv starts relay with env as its environment (the test's own if
// nil).
func startProcEnv(t *testing.T, ctx context.Context, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.CommandContext(ctx, relaybin.Path(t), args...)
	cmd.Env = env
	return startCmd(t, name, cmd)
}

// startCmd starts cmd, a command that runs relay, as the process name.
func startCmd(t *testing.T, name string, cmd *exec.Cmd) *proc {
	t.Helper()
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	p.cmd.WaitDelay = 5 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s (pid %d) stderr:\n%s", p.name, p.cmd.Process.Pid, p.stderr.String())
		}
	})
	return p
}

// terminate sends SIGTERM and checks that the process exits 0 in time.
func (p *proc) terminate(t *testing.T, timeout time.Duration) {
	t.Helper()
	p.stop(t, syscall.SIGTERM, timeout)
}

// stop sends sig and checks that the process exits 0 in time.
func (p *proc) stop(t *testing.T, sig syscall.Signal, timeout time.Duration) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Errorf("signal %s: %v", p.name, err)
		return
	}
	select {
	case <-p.done:
		if p.err != nil {
			t.Errorf("%s exited with %v after %v, want status 0", p.name, p.err, sig)
		}
	case <-time.After(timeout):
		t.Errorf("%s still running %s after %v", p.name, timeout, sig)
	}
}

// runBinary runs relay to completion and returns its output and exit code.
func runBinary(t *testing.T, ctx context.Context, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.CommandContext(ctx, relaybin.Path(t), args...)
	var out, errOut syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatalf("run relay %s: %v", strings.Join(args, " "), err)
	}
	return out.String(), errOut.String(), code
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestBinary_FailuresAreOneLineOnStderrWithANonZeroStatus(t *testing.T) {
	t.Setenv("RELAY_API_TOKEN", "") // so that the refused start below has no token
	unmigrated := emptyDatabaseURL(t)
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantLine string // stderr, exactly
	}{
		{"unknown command", []string{"frobnicate"}, 2,
			`relay: unknown command "frobnicate" (run "relay -h" for the list)`},
		{"bad flag", []string{"serve", "--bogus"}, 2,
			`relay: serve: flag provided but not defined: -bogus (run "relay serve -h" for usage)`},
		{"invalid payload", []string{"enqueue", "hash", "--payload", "{x"}, 2,
			`relay: --payload is not valid JSON: invalid character 'x' looking for beginning of object key string`},
		{"non-loopback address without a token", []string{"serve", "--addr", "0.0.0.0:8080", "--database-url", "postgres://127.0.0.1:1/x"}, 2,
			`relay: serve: refusing to serve the API on 0.0.0.0:8080 without a token: set --api-token (or RELAY_API_TOKEN), listen on a loopback address, or pass --insecure-no-auth`},
		{"unreachable database", []string{"work", "--database-url", "postgres://127.0.0.1:1/x"}, 1,
			`relay: cannot reach the database postgres://127.0.0.1:1/x: 127.0.0.1:1 (127.0.0.1): dial error: dial tcp 127.0.0.1:1: connect: connection refused`},
		{"unmigrated database", []string{"serve", "--addr", "127.0.0.1:0", "--database-url", unmigrated}, 1,
			`relay: database not migrated: run "relay migrate up"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, stderr, code := runBinary(t, testContext(t, 30*time.Second), tt.args...)
			if code != tt.wantCode {
				t.Errorf("exit status %d, want %d", code, tt.wantCode)
			}
			if stderr != tt.wantLine+"\n" {
				t.Errorf("stderr = %q, want the one line %q", stderr, tt.wantLine)
			}
			if stdout != "" {
				t.Errorf("stdout = %q, want nothing", stdout)
			}
		})
	}
}

// TestServe_UnderNohupOutlivesItsTerminal runs `nohup relay serve`, which
// starts relay with SIGHUP ignored: the SIGHUP of its terminal closing
// leaves it serving, as nohup promises, and SIGTERM still stops it
// gracefully.
func TestServe_UnderNohupOutlivesItsTerminal(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	addr := freeAddr(t)
	base := "http://" + addr
	serve := startCmd(t, "nohup relay serve", exec.CommandContext(ctx, "nohup", relaybin.Path(t),
		"serve", "--addr", addr, "--database-url", dbtest.NewURL(t)))
	waitHealthy(t, ctx, serve, base)

	if err := serve.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatalf("SIGHUP: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	select {
	case <-serve.done:
		t.Fatalf("nohup relay serve exited after SIGHUP (%v):\n%s", serve.err, serve.stderr.String())
	default:
	}
	if resp, _, err := apiRequest(ctx, http.MethodGet, base+"/healthz", "", ""); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("GET /healthz after SIGHUP: %v, %v; want 200", resp, err)
	}
	serve.terminate(t, 15*time.Second)
}

// TestEndToEnd_ServeAndWorkersRunJobs runs relay as separate processes, as
// in production: a migration, the API, and two workers, then stops them.
func TestEndToEnd_ServeAndWorkersRunJobs(t *testing.T) {
	relaybin.Path(t) // build before the clock starts
	ctx := testContext(t, 90*time.Second)
	dsn := emptyDatabaseURL(t)

	stdout, stderr, code := runBinary(t, ctx, "migrate", "--database-url", dsn)
	if code != 0 || !strings.Contains(stdout, "applied migration 2") {
		t.Fatalf("relay migrate: status %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}

	const token = "e2e-secret"
	addr := freeAddr(t)
	base := "http://" + addr
	serve := startProc(t, ctx, "serve", "serve", "--addr", addr, "--database-url", dsn, "--api-token", token)
	workers := map[string]*proc{}
	for i := 1; i <= 2; i++ {
		id := fmt.Sprintf("e2e-worker-%d", i)
		workers[id] = startProc(t, ctx, id, "work", "--database-url", dsn, "--id", id, "--slots", "4",
			"--backoff-base", "50ms", "--poll", "100ms", "--log-format", "json")
	}

	waitHealthy(t, ctx, serve, base)
	if resp, _, err := apiRequest(ctx, http.MethodGet, base+"/v1/jobs/1", "", ""); err != nil {
		t.Errorf("request without the API token: %v", err)
	} else if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("request without the API token: %s, want 401", resp.Status)
	}

	// Jobs over HTTP, and one through relay enqueue.
	type tc struct {
		name        string
		id          int64
		wantAttempt int
	}
	var jobs []tc
	for i := range 6 {
		j := postJob(t, ctx, base, token, `{"kind":"hash","payload":{"iterations":1000,"sleep_ms":5}}`)
		jobs = append(jobs, tc{fmt.Sprintf("hash %d", i), j.ID, 1})
	}
	j := postJob(t, ctx, base, token, `{"kind":"fail","payload":{"times":2},"max_attempts":5}`)
	jobs = append(jobs, tc{"fail times 2", j.ID, 3})
	out, errOut, code := runBinary(t, ctx, "enqueue", "noop", "--database-url", dsn)
	var enq struct{ ID int64 }
	if err := json.Unmarshal([]byte(out), &enq); code != 0 || err != nil {
		t.Fatalf("relay enqueue: status %d, %v\nstdout:\n%s\nstderr:\n%s", code, err, out, errOut)
	}
	jobs = append(jobs, tc{"noop from relay enqueue", enq.ID, 1})

	waitCtx, cancelWait := context.WithTimeout(ctx, 30*time.Second)
	defer cancelWait()
	for _, want := range jobs {
		job := waitForState(t, waitCtx, base, token, want.id, "succeeded")
		if job.Attempt != want.wantAttempt {
			t.Errorf("%s: succeeded on attempt %d, want %d", want.name, job.Attempt, want.wantAttempt)
		}
		// The result says which process ran the job.
		wid, _ := job.Result["worker"].(string)
		w, ok := workers[wid]
		if !ok {
			t.Errorf("%s: result names worker %q, not one of the two started: %v", want.name, wid, job.Result)
			continue
		}
		if pid, _ := job.Result["pid"].(float64); int(pid) != w.cmd.Process.Pid {
			t.Errorf("%s: result pid %v, but %s is pid %d", want.name, job.Result["pid"], wid, w.cmd.Process.Pid)
		}
		if attempt, _ := job.Result["attempt"].(float64); int(attempt) != want.wantAttempt {
			t.Errorf("%s: result attempt %v, want %d", want.name, job.Result["attempt"], want.wantAttempt)
		}
		if strings.HasPrefix(want.name, "hash") && job.Result["digest"] == nil {
			t.Errorf("%s: no digest in result %v", want.name, job.Result)
		}
	}

	// SIGTERM, and the SIGHUP of a closing terminal, stop every process
	// cleanly.
	var wg sync.WaitGroup
	for p, sig := range map[*proc]syscall.Signal{
		serve:                   syscall.SIGHUP,
		workers["e2e-worker-1"]: syscall.SIGTERM,
		workers["e2e-worker-2"]: syscall.SIGHUP,
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.stop(t, sig, 20*time.Second)
		}()
	}
	wg.Wait()
	for id, w := range workers {
		if !strings.Contains(w.stderr.String(), `"msg":"worker stopped"`) {
			t.Errorf("%s did not log that it stopped:\n%s", id, w.stderr.String())
		}
	}
	if !strings.Contains(serve.stderr.String(), "msg=stopped") {
		t.Errorf("relay serve did not log that it stopped:\n%s", serve.stderr.String())
	}
}
