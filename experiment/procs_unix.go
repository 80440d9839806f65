//go:build unix

package experiment

import "syscall"

// The signals that freeze and thaw a process.
var (
	sigStop = syscall.SIGSTOP
	sigCont = syscall.SIGCONT
)
