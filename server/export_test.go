package server

import "testing"

// setTransitionDone makes every cancel and retry call fn once its
// statement has returned, until the test ends. fn is the package's: a
// test that sets it must not run in parallel.
func setTransitionDone(t testing.TB, fn func(id int64)) {
	t.Helper()
	old := transitionDone
	transitionDone = fn
	t.Cleanup(func() { transitionDone = old })
}
