// Package osuser picks the operating-system user that a server program is
// run as when this process is root, which PostgreSQL and PgBouncer refuse.
package osuser

import (
	"errors"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// Unprivileged returns the user to run a server as when this process is
// root: postgres, or else nobody. It returns nil when the process is not
// root.
func Unprivileged() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil || uid == 0 {
			continue
		}
		// No supplementary groups: root's would come along otherwise.
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	}
	return nil, errors.New("running as root, and there is neither a postgres nor a nobody user to run the server as")
}
