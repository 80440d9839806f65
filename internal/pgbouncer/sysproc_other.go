//go:build !linux

package pgbouncer

import "syscall"

// sysProcAttr runs PgBouncer as cred (when not nil), in a process group of
// its own, so that a Ctrl-C at the terminal reaches only the program that
// started it. Only Linux can also have the kernel kill it when that
// program dies: elsewhere a crashed test leaves it running.
func sysProcAttr(cred *syscall.Credential) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Credential: cred}
}
