package pgbouncer

import (
	"context"
	"testing"
)

// ForTest starts a Bouncer for the test, in front of the server of
// serverURL, and closes it when the test ends. It fails the test when
// PgBouncer cannot start, missing included: a test meant to run through a
// pooler must not pass without one. For it the package imports testing:
// keep the package out of the relay command.
func ForTest(t testing.TB, serverURL string, opts Options) *Bouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	b, err := Start(ctx, serverURL, opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgbouncer log:\n%s", b.logTail())
		}
		if err := b.Close(); err != nil {
			t.Errorf("%v", err)
		}
	})
	return b
}
