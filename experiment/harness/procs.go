package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrExited is returned when signalling a process that has already exited.
var ErrExited = errors.New("process already exited")

// ProcSpec describes a relay process to start.
type ProcSpec struct {
	// Name labels the process: its log file is LogDir/Name.log. Use a name
	// that is unique within LogDir and safe as a file name.
	Name string
	// Bin is the path of the relay binary.
	Bin string
	// Args follow the binary: {"work", "--slots", "4"}.
	Args []string
	// Env is added to this process's environment, as KEY=VALUE, after the
	// environment of the current process (so it wins).
	Env []string
	// LogDir receives the process's stderr, where relay logs, and its
	// stdout, both in LogDir/Name.log.
	LogDir string
	// Piped gives the process a standard input and output of pipes to the
	// caller, Proc.Stdin and Proc.Stdout, instead of none and the log: a
	// process that takes requests on its input and answers on its output.
	Piped bool
}

// Proc is a relay process started by StartProc. Its methods are safe for
// concurrent use. A Proc is meant to be killed, paused and resumed at will:
// it is the unit of the experiments and of fault-injection harnesses.
type Proc struct {
	// Name is ProcSpec.Name.
	Name string
	// LogPath is the file holding the process's stderr and stdout.
	LogPath string
	// Stdin and Stdout are the process's standard input and output when
	// it was started Piped; nil otherwise. Close Stdin to end its input.
	Stdin  io.WriteCloser
	Stdout io.ReadCloser

	cmd     *exec.Cmd
	logFile *os.File
	done    chan struct{}
	// Set before done is closed.
	waitErr error

	mu     sync.Mutex
	paused bool
}

// StartProc starts the process described by spec. ctx bounds only the start
// itself: the process runs until it exits or is stopped, killed or
// signalled. On Linux the process is also killed if the process that
// started it dies, so that even a crashed experiment leaves no orphan.
func StartProc(ctx context.Context, spec ProcSpec) (*Proc, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	if spec.Name == "" || strings.ContainsAny(spec.Name, `/\`) {
		return nil, fmt.Errorf("start: invalid process name %q", spec.Name)
	}
	if err := os.MkdirAll(spec.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("start %s: log directory: %w", spec.Name, err)
	}
	logPath := filepath.Join(spec.LogDir, spec.Name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: open log: %w", spec.Name, err)
	}
	cmd := exec.Command(spec.Bin, spec.Args...)
	cmd.Env = append(os.Environ(), spec.Env...)
	// An *os.File is handed to the child as is: no copying goroutine, and
	// nothing is lost when the child is killed.
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr()
	// The pipes are the child's files, not exec's: Wait, which runs at
	// once below, then never closes them under a reader.
	var childEnds []*os.File
	var stdin, stdout *os.File
	if spec.Piped {
		inR, inW, err := os.Pipe()
		if err != nil {
			logFile.Close()
			return nil, fmt.Errorf("start %s: pipe: %w", spec.Name, err)
		}
		outR, outW, err := os.Pipe()
		if err != nil {
			logFile.Close()
			inR.Close()
			inW.Close()
			return nil, fmt.Errorf("start %s: pipe: %w", spec.Name, err)
		}
		cmd.Stdin, cmd.Stdout = inR, outW
		childEnds = []*os.File{inR, outW}
		stdin, stdout = inW, outR
	}
	err = cmd.Start()
	for _, f := range childEnds {
		f.Close()
	}
	if err != nil {
		logFile.Close()
		if spec.Piped {
			stdin.Close()
			stdout.Close()
		}
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	p := &Proc{Name: spec.Name, LogPath: logPath, cmd: cmd, logFile: logFile, done: make(chan struct{})}
	if spec.Piped {
		p.Stdin, p.Stdout = stdin, stdout
	}
	go func() {
		err := cmd.Wait()
		p.waitErr = err
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// PID returns the process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited and been reaped.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// ExitErr returns how the process ended (nil for status 0), once it has
// exited; nil before.
func (p *Proc) ExitErr() error {
	if !p.Exited() {
		return nil
	}
	return p.waitErr
}

// Signal sends sig to the process, or returns ErrExited.
func (p *Proc) Signal(sig os.Signal) error {
	if p.Exited() {
		return fmt.Errorf("signal %s (pid %d): %w", p.Name, p.PID(), ErrExited)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		if errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("signal %s (pid %d): %w", p.Name, p.PID(), ErrExited)
		}
		return fmt.Errorf("signal %s (pid %d) with %v: %w", p.Name, p.PID(), sig, err)
	}
	return nil
}

// Kill sends SIGKILL: the process dies at once, without any chance to
// release its jobs or close its connections (the kernel closes them).
func (p *Proc) Kill() error { return p.Signal(syscall.SIGKILL) }

// Pause sends SIGSTOP: the process freezes, holding its connections and
// its database session, as in a long GC pause or a frozen VM.
func (p *Proc) Pause() error {
	if err := p.Signal(sigStop); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	return nil
}

// Resume sends SIGCONT to a paused process.
func (p *Proc) Resume() error {
	if err := p.Signal(sigCont); err != nil {
		return err
	}
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	return nil
}

// Wait waits for the process to exit, or for ctx.
func (p *Proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("wait for %s (pid %d) to exit: %w", p.Name, p.PID(), ctx.Err())
	}
}

// Stop shuts the process down gracefully: SIGTERM (and SIGCONT, should it
// be paused, so that it can act on the SIGTERM), then SIGKILL if it has not
// exited within grace. It returns once the process has exited, or when ctx
// ends, after a SIGKILL.
func (p *Proc) Stop(ctx context.Context, grace time.Duration) error {
	if p.Exited() {
		return nil
	}
	_ = p.Signal(syscall.SIGTERM)
	p.mu.Lock()
	paused := p.paused
	p.mu.Unlock()
	if paused {
		_ = p.Resume()
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = p.Kill()
	// A SIGKILLed process is reaped promptly; bound the wait all the same.
	waitCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := p.Wait(waitCtx); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("stop %s: killed: %w", p.Name, ctx.Err())
	}
	return fmt.Errorf("stop %s: still running %s after SIGTERM; killed", p.Name, grace)
}

// LogLine is one line a relay process wrote to its log. Lines of relay's
// JSON logs (--log-format json) are parsed; any other line keeps only Raw
// and Msg.
type LogLine struct {
	// Time is the line's "time", by the clock of the process's host.
	Time time.Time `json:"time"`
	// Level is "DEBUG", "INFO", "WARN" or "ERROR".
	Level string `json:"level,omitempty"`
	// Msg is the message.
	Msg string `json:"msg"`
	// Attrs holds the other fields; numbers are json.Number.
	Attrs map[string]any `json:"attrs,omitempty"`
	// Raw is the line as written.
	Raw string `json:"-"`
}

// Int returns the attribute key as an integer.
func (l LogLine) Int(key string) (int64, bool) {
	n, ok := l.Attrs[key].(json.Number)
	if !ok {
		return 0, false
	}
	i, err := n.Int64()
	return i, err == nil
}

// Str returns the attribute key as a string, or "".
func (l LogLine) Str(key string) string {
	s, _ := l.Attrs[key].(string)
	return s
}

// ParseLogLine parses one line of a relay log.
func ParseLogLine(raw string) LogLine {
	line := LogLine{Raw: raw, Msg: raw}
	if !strings.HasPrefix(raw, "{") {
		return line
	}
	dec := json.NewDecoder(strings.NewReader(raw))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		return line
	}
	if s, ok := m["time"].(string); ok {
		line.Time, _ = time.Parse(time.RFC3339Nano, s)
	}
	line.Level, _ = m["level"].(string)
	line.Msg, _ = m["msg"].(string)
	delete(m, "time")
	delete(m, "level")
	delete(m, "msg")
	line.Attrs = m
	return line
}

// Logs reads and parses everything the process has logged so far.
func (p *Proc) Logs() ([]LogLine, error) {
	b, err := os.ReadFile(p.LogPath)
	if err != nil {
		return nil, fmt.Errorf("read log of %s: %w", p.Name, err)
	}
	var lines []LogLine
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64*1024), 4*1024*1024)
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			lines = append(lines, ParseLogLine(t))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read log of %s: %w", p.Name, err)
	}
	return lines, nil
}

// logPollInterval is how often WaitLog rereads a log.
const logPollInterval = 20 * time.Millisecond

// WaitLog waits until the process logs a line for which match is true,
// and returns it. It fails if ctx ends first, or if the process exits
// without logging such a line.
func (p *Proc) WaitLog(ctx context.Context, match func(LogLine) bool) (LogLine, error) {
	for {
		exited := p.Exited()
		lines, err := p.Logs()
		if err != nil {
			return LogLine{}, err
		}
		for _, l := range lines {
			if match(l) {
				return l, nil
			}
		}
		if exited {
			return LogLine{}, fmt.Errorf("%s exited (%v) without logging the line awaited; last lines:\n%s", p.Name, p.waitErr, Tail(lines, 5))
		}
		select {
		case <-ctx.Done():
			return LogLine{}, fmt.Errorf("wait for a log line of %s: %w", p.Name, ctx.Err())
		case <-p.done:
		case <-time.After(logPollInterval):
		}
	}
}

func Tail(lines []LogLine, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("  " + l.Raw + "\n")
	}
	return b.String()
}

// Procs is a set of relay processes that share a binary, an environment
// and a log directory, and are stopped together: defer StopAll (or KillAll)
// right after NewProcs, and no process outlives the function that started
// it. Its methods are safe for concurrent use.
type Procs struct {
	bin    string
	logDir string
	env    []string

	mu    sync.Mutex
	procs []*Proc
}

// NewProcs returns an empty set of processes of the relay binary bin, each
// with env added to its environment and its log in logDir.
func NewProcs(bin, logDir string, env ...string) *Procs {
	return &Procs{bin: bin, logDir: logDir, env: env}
}

// Start starts a relay process named name with args, and adds it to the set.
func (g *Procs) Start(ctx context.Context, name string, args ...string) (*Proc, error) {
	return g.StartBin(ctx, g.bin, name, args...)
}

// StartBin starts a process of another binary than the set's (the lab's
// own command, say), named name with args, and adds it to the set.
func (g *Procs) StartBin(ctx context.Context, bin, name string, args ...string) (*Proc, error) {
	p, err := StartProc(ctx, ProcSpec{Name: name, Bin: bin, Args: args, Env: g.env, LogDir: g.logDir})
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	g.procs = append(g.procs, p)
	g.mu.Unlock()
	return p, nil
}

// Run runs a process of the set's binary named name with args to its end,
// as a step of a setup (a migration, an insert), and returns an error with
// the last lines of its log unless it exits with status 0. ctx bounds the
// wait; the process is killed if ctx ends first. The process shares the
// set's environment and log directory but is not one of its members: it
// is over when Run returns.
func (g *Procs) Run(ctx context.Context, name string, args ...string) error {
	p, err := StartProc(ctx, ProcSpec{Name: name, Bin: g.bin, Args: args, Env: g.env, LogDir: g.logDir})
	if err != nil {
		return err
	}
	if err := p.Wait(ctx); err != nil {
		_ = p.Kill()
		return err
	}
	if err := p.ExitErr(); err != nil {
		lines, _ := p.Logs()
		return fmt.Errorf("%s: %w; last lines:\n%s", name, err, Tail(lines, 5))
	}
	return nil
}

// List returns the processes started so far, in order.
func (g *Procs) List() []*Proc {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]*Proc(nil), g.procs...)
}

// Exited returns the processes of the set that have exited.
func (g *Procs) Exited() []*Proc {
	var out []*Proc
	for _, p := range g.List() {
		if p.Exited() {
			out = append(out, p)
		}
	}
	return out
}

// CheckRunning returns nil while every process of the set runs, and
// otherwise an error naming the first that exited, while doing what, with
// how it exited and the last lines of its log.
func (g *Procs) CheckRunning(doing string) error {
	gone := g.Exited()
	if len(gone) == 0 {
		return nil
	}
	lines, _ := gone[0].Logs()
	return fmt.Errorf("%s exited %s: %v; last lines:\n%s", gone[0].Name, doing, gone[0].ExitErr(), Tail(lines, 5))
}

// StopAll stops every process still running, all at once, each as
// Proc.Stop does, and returns when all have exited.
func (g *Procs) StopAll(ctx context.Context, grace time.Duration) error {
	procs := g.List()
	errs := make([]error, len(procs))
	var wg sync.WaitGroup
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.Stop(ctx, grace)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// KillAll SIGKILLs every process still running and waits, briefly, for
// each to be reaped. It is the last-resort cleanup, safe to defer along
// with StopAll.
func (g *Procs) KillAll() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, p := range g.List() {
		if !p.Exited() {
			_ = p.Kill()
		}
	}
	for _, p := range g.List() {
		_ = p.Wait(ctx)
	}
}
