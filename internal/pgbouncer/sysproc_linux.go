package pgbouncer

import "syscall"

// sysProcAttr runs PgBouncer as cred (when not nil), in a process group of
// its own, so that a Ctrl-C at the terminal reaches only the program that
// started it, and has the kernel kill it if that program dies without
// stopping it.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred, Pdeathsig: syscall.SIGKILL}
}
