//go:build unix

package harness

import "syscall"

// The signals that freeze and thaw a process.
var (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)
