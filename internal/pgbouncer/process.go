package pgbouncer

import (
	"errors"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// process is one run of PgBouncer.
type process struct {
	cmd  *exec.Cmd
	done chan struct{} // closed once it has exited
	err  error         // what Wait returned, once done is closed
}

// startProcess starts cmd and a goroutine that waits for it.
func startProcess(cmd *exec.Cmd) (*process, error) {
	p := &process{cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Linux sends the parent-death signal when the thread that
		// started the child ends, not the whole process: keep this
		// goroutine on its thread for as long as the child runs.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return p, nil
}

// exited returns nil while the process runs, and how it ended once it has.
func (p *process) exited() error {
	select {
	case <-p.done:
		if p.err == nil {
			return errors.New("exit status 0")
		}
		return p.err
	default:
		return nil
	}
}

// kill ends the process with SIGKILL and waits for it.
func (p *process) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop asks the process to shut down, kills it if it has not within
// stopTimeout, and waits for it. SIGTERM is PgBouncer's immediate
// shutdown; SIGINT would wait for every client to disconnect.
func (p *process) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
		p.kill()
	}
}
