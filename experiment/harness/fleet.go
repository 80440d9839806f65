package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// FleetConfig describes a fleet: idle relay work processes beside an
// experiment's own, on a queue that no job is put on, which show what
// many live workers cost the rest.
type FleetConfig struct {
	// RelayBin is the relay binary the fleet runs. Required.
	RelayBin string
	// LogDir receives the fleet's logs.
	LogDir string
	// Size is how many relay work processes run, each of one slot.
	Size int
	// PoolerSize, when positive, runs the fleet's pools through a PgBouncer
	// in transaction mode with that many server connections, each
	// worker's session on the server itself.
	PoolerSize int
	// Queue is the queue the fleet's workers wait on.
	Queue string
}

// Fleet start-up and shutdown bounds: each worker is given a quarter of a
// second on top of fleetStartup to register, and fleetStopGrace to stop.
const (
	fleetStartup   = 30 * time.Second
	fleetStopGrace = 5 * time.Second
)

// CheckFleet says what is wrong with a fleet of size workers behind a
// pooler of poolerSize connections, as an experiment's configuration
// gives them (zero: none), or nil.
func CheckFleet(size, poolerSize int) error {
	switch {
	case size < 0 || poolerSize < 0:
		return fmt.Errorf("the fleet and its pooler's size must not be negative, got %d and %d", size, poolerSize)
	case poolerSize > 0 && size == 0:
		return fmt.Errorf("a pooler of %d connections for no fleet: give the fleet's size too", poolerSize)
	}
	return nil
}

// StartFleet starts cfg.Size idle relay work processes on d, on cfg.Queue,
// through a pooler if cfg.PoolerSize says so, and waits until every one
// has registered. It returns what the pooler was, if there is one, and the
// function that stops the fleet and the pooler, to be deferred.
func StartFleet(ctx context.Context, cfg FleetConfig, d *Database, prog *Progress) (_ *PoolerInfo, stop func(), err error) {
	if cfg.RelayBin == "" || cfg.Queue == "" || cfg.Size < 1 {
		return nil, nil, errors.New("fleet: a relay binary, a queue and at least one worker are required")
	}
	if err := CheckFleet(cfg.Size, cfg.PoolerSize); err != nil {
		return nil, nil, fmt.Errorf("fleet: %w", err)
	}
	env := []string{"DATABASE_URL=" + d.URL}
	var pooler *Pooler
	if cfg.PoolerSize > 0 {
		if pooler, err = StartPooler(ctx, d, cfg.PoolerSize, cfg.Size); err != nil {
			return nil, nil, err
		}
		env = pooler.Env
	}
	procs := NewProcs(cfg.RelayBin, cfg.LogDir, env...)
	stop = func() {
		defer func() {
			if pooler != nil {
				if err := pooler.Close(); err != nil {
					prog.Note("fleet: %v", err)
				}
			}
		}()
		defer procs.KillAll()
		stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*fleetStopGrace)
		defer cancel()
		if err := procs.StopAll(stopCtx, fleetStopGrace); err != nil {
			prog.Note("fleet: stopping workers: %v", err)
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	prog.Note("starting a fleet of %d idle workers", cfg.Size)
	names := make([]string, cfg.Size)
	for i := range names {
		names[i] = fmt.Sprintf("fleet%d", i+1)
		if _, err := procs.Start(ctx, names[i], "work", "--id", names[i], "--queue", cfg.Queue, "--slots", "1", "--log-format", "json"); err != nil {
			return nil, nil, err
		}
	}
	waitCtx, cancel := context.WithTimeout(ctx, fleetStartup+time.Duration(cfg.Size)*time.Second/4)
	defer cancel()
	if err := WaitWorkers(waitCtx, d.Q, procs, names...); err != nil {
		return nil, nil, err
	}
	if pooler == nil {
		return nil, stop, nil
	}
	return &pooler.Info, stop, nil
}

// WriteFleetNote says, for a summary, beside what fleet of size workers an
// experiment ran, and through which pooler, if any. It writes nothing for
// no fleet.
func WriteFleetNote(w io.Writer, size int, p *PoolerInfo) {
	if size == 0 {
		return
	}
	fmt.Fprintf(w, "Beside a fleet of %d idle workers on a queue of their own", size)
	if p != nil {
		fmt.Fprintf(w, ", their pools through PgBouncer %s in %s mode with %d server connections", p.Version, p.PoolMode, p.PoolSize)
	}
	fmt.Fprintln(w, ".")
}
