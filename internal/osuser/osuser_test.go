package osuser_test

import (
	"os"
	"testing"

	"github.com/relayq/relay/internal/osuser"
)

func TestUnprivileged_IsNeverRoot(t *testing.T) {
	cred, err := osuser.Unprivileged()
	if err != nil {
		t.Fatalf("Unprivileged: %v", err)
	}
	switch {
	case os.Geteuid() != 0 && cred != nil:
		t.Errorf("Unprivileged() = uid %d for a process that is not root, want nil", cred.Uid)
	case os.Geteuid() == 0 && (cred == nil || cred.Uid == 0 || cred.Gid == 0 || len(cred.Groups) != 0):
		t.Errorf("Unprivileged() = %+v for root, want a user other than root, without supplementary groups", cred)
	}
}
