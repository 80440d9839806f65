package harness

import "syscall"

// sysProcAttr has the kernel SIGKILL the child if the experiment dies
// first, so that no relay process outlives a crashed experiment.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
