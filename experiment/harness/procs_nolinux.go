//go:build !linux

package harness

import "syscall"

// sysProcAttr: only Linux can tie a child's life to its parent's; elsewhere
// the experiments rely on their own cleanup.
func sysProcAttr() *syscall.SysProcAttr { return nil }
