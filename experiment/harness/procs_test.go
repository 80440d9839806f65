package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestProcPauseResumeStop checks that Pause stops the process, Resume
// lets it run again, and StopAll ends a paused process by SIGTERM.
func TestProcPauseResumeStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	procs := NewProcs("sleep", t.TempDir())
	defer procs.KillAll()
	p, err := procs.Start(ctx, "sleeper", "30")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	waitStopped(ctx, t, p, true)
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	waitStopped(ctx, t, p, false)
	if err := p.Pause(); err != nil {
		t.Fatal(err)
	}
	waitStopped(ctx, t, p, true)
	// Stop must thaw a paused process for it to act on SIGTERM: one that
	// did not would be SIGKILLed after the grace, and StopAll would return
	// an error saying so.
	if err := procs.StopAll(ctx, 5*time.Second); err != nil {
		t.Fatalf("StopAll: %v", err)
	}
	if !p.Exited() {
		t.Error("process still running after StopAll")
	}
	if err := p.Kill(); err == nil {
		t.Error("Kill of an exited process succeeded")
	}
}

// waitStopped waits until the kernel reports p stopped by a signal (state
// T in /proc/PID/stat), or, when stopped is false, in any other state. The
// signals are delivered asynchronously, so it polls until ctx ends. It
// checks nothing where there is no /proc/PID/stat, off Linux.
func waitStopped(ctx context.Context, t *testing.T, p *Proc, stopped bool) {
	t.Helper()
	if runtime.GOOS != "linux" {
		return
	}
	for {
		state, err := procState(p.PID())
		if err != nil {
			t.Fatal(err)
		}
		if (state == 'T') == stopped {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s (pid %d) in state %c, want stopped %v", p.Name, p.PID(), state, stopped)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// procState returns the state letter of process pid from /proc/PID/stat.
func procState(pid int) (byte, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read the state of pid %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: the state
	// follows its closing parenthesis.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, fmt.Errorf("pid %d: malformed stat %q", pid, b)
	}
	return b[i+2], nil
}

func TestParseLogLine(t *testing.T) {
	l := ParseLogLine(`{"time":"2026-11-29T09:30:00.123456789Z","level":"WARN","msg":"completion rejected: the lease is no longer this worker's","worker":"w1","job":42,"attempt":1}`)
	if l.Level != "WARN" || !strings.HasPrefix(l.Msg, "completion rejected") || l.Str("worker") != "w1" {
		t.Errorf("parsed %+v", l)
	}
	if id, ok := l.Int("job"); !ok || id != 42 {
		t.Errorf("job = %d, %v; want 42", id, ok)
	}
	if l.Time.IsZero() {
		t.Error("time not parsed")
	}
	plain := ParseLogLine("relay: cannot reach the database")
	if plain.Msg != "relay: cannot reach the database" || plain.Attrs != nil {
		t.Errorf("plain line parsed as %+v", plain)
	}
}

func TestProcs_CheckRunningNamesTheProcessThatExitedWithItsLastLines(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	procs := NewProcs("sh", t.TempDir())
	defer procs.KillAll()
	if _, err := procs.Start(ctx, "sleeper", "-c", "sleep 30"); err != nil {
		t.Fatal(err)
	}
	if err := procs.CheckRunning("during the test"); err != nil {
		t.Fatalf("with every process running: %v", err)
	}
	quitter, err := procs.Start(ctx, "quitter", "-c", `echo '{"msg":"giving up"}'; exit 3`)
	if err != nil {
		t.Fatal(err)
	}
	if err := quitter.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	err = procs.CheckRunning("during the test")
	if err == nil || !strings.Contains(err.Error(), "quitter exited during the test: exit status 3") || !strings.Contains(err.Error(), "giving up") {
		t.Errorf("CheckRunning = %v, want the quitter, its status and its last line", err)
	}
}
