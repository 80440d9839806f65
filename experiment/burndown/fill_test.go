package burndown

import (
	"context"
	"fmt"
	"testing"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/dbtest"
)

// TestSystems_FillIsCountedBeforeTheBurnDown checks that, once a system's
// fill has returned, the server's counters hold what it wrote: the
// counters read right after it are the burn-down's baseline, and a fill
// reported later (a session reports its counts as it goes idle, or up to
// 10 s later when it reported less than a second before) would count its
// inserts, its WAL and its commits in the burn-down's. Relay's fill
// reports its statistics itself before it returns; River's, a process of
// its own, is waited for (fillCounted), as the burn-down waits for both.
func TestSystems_FillIsCountedBeforeTheBurnDown(t *testing.T) {
	const jobs = 3 * 1000
	admin := dbtest.NewURL(t)
	for _, sys := range []system{relaySystem(""), riverSystem(riverBin(t), nil)} {
		for _, atOnce := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, at once %v", sys.name, atOnce), func(t *testing.T) {
				d, err := sys.newDatabase(t.Context(), admin)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = d.Drop(context.WithoutCancel(t.Context())) })
				procs := harness.NewProcs(sys.bin, t.TempDir(), "DATABASE_URL="+d.URL)
				defer procs.KillAll()
				if sys.prepare != nil {
					if err := sys.prepare(t.Context(), procs); err != nil {
						t.Fatal(err)
					}
				}
				// A statement on the pool shortly before the fill, as the
				// burn-down's own reads are: the fill's session reported
				// less than a second before it ends.
				if _, err := d.Lab.BurndownCounters(t.Context(), sys.table); err != nil {
					t.Fatal(err)
				}
				fill := func() error { return fillCounted(t.Context(), d, sys, procs, jobs, atOnce, jobs) }
				if sys.name == SystemRelay {
					fill = func() error { return sys.fill(t.Context(), d, procs, jobs, atOnce) }
				}
				if err := fill(); err != nil {
					t.Fatal(err)
				}
				c, err := d.Lab.BurndownCounters(t.Context(), sys.table)
				if err != nil {
					t.Fatal(err)
				}
				if c.TableInserted != jobs {
					t.Errorf("fill of %d jobs (at once: %v): %d inserts of %s counted as it returned, want all of them", jobs, atOnce, c.TableInserted, sys.table)
				}
			})
		}
	}
}
