//go:build !unix

package harness

import "syscall"

// Without SIGSTOP and SIGCONT, Pause and Resume fail: the signal is
// refused by os.Process.Signal.
var (
	sigStop = syscall.Signal(19)
	sigCont = syscall.Signal(18)
)
