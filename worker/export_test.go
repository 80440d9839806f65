package worker

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// FleetSize returns how many live workers w last counted, zero before it
// has.
func (w *Worker) FleetSize() int32 { return w.fleet.Load() }

// QueueFleetSize returns how many live workers on its queue w last
// counted, zero before it has.
func (w *Worker) QueueFleetSize() int32 { return w.queueFleet.Load() }

// Told reports whether w is told of its queue's new jobs: whether its
// session listens for them.
func (w *Worker) Told() bool { return w.session.told() }

// ForgetEnded forgets the sessions that ended and hold no running job, as
// a worker's reclaims do now and then, and returns how many it forgot.
func ForgetEnded(ctx context.Context, pool *pgxpool.Pool) (int64, error) {
	return forgetEnded(ctx, pool)
}

// SetHostname makes workers take name as their host's name until the
// test ends.
func SetHostname(t testing.TB, name string) {
	old := osHostname
	osHostname = func() (string, error) { return name, nil }
	t.Cleanup(func() { osHostname = old })
}

// SetMaxStatementResults has one statement carry at most n bytes of
// results until the test ends, as if pgx's limit on a message were that.
func SetMaxStatementResults(t testing.TB, n int) {
	old := maxStatementResults
	maxStatementResults = n
	t.Cleanup(func() { maxStatementResults = old })
}
