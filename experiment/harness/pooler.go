package harness

import (
	"context"
	"fmt"
	"runtime"

	"github.com/relayq/relay/internal/pgbouncer"
)

// Pooler is a PgBouncer in transaction mode between relay processes'
// pools and a database, as a fleet of many worker processes is meant to
// run (docs/scaling.md): the pools go through it, and each worker's
// session, which shows it alive, goes to the server itself.
type Pooler struct {
	*pgbouncer.Bouncer
	// Info is what a result records of it.
	Info PoolerInfo
	// Env is the environment of a relay process whose pool goes through
	// the pooler and whose session goes to the database itself.
	Env []string
}

// PoolerInfo describes a Pooler for a result.
type PoolerInfo struct {
	Version  string `json:"version"`
	PoolMode string `json:"pool_mode"`
	// PoolSize is its server connections for the database
	// (default_pool_size), MaxClientConn the client connections it
	// accepts: room for every process's whole pool.
	PoolSize      int `json:"pool_size"`
	MaxClientConn int `json:"max_client_conn"`
}

// processPoolMax is the most connections the pool of a relay process
// opens: pgxpool's default, the larger of 4 and the machine's CPUs.
func processPoolMax() int { return max(4, runtime.NumCPU()) }

// StartPooler starts a Pooler in front of d with size server connections
// and room for the pools of procs relay processes. The caller must Close
// it.
func StartPooler(ctx context.Context, d *Database, size, procs int) (*Pooler, error) {
	info := PoolerInfo{PoolMode: string(pgbouncer.PoolModeTransaction), PoolSize: size, MaxClientConn: procs*processPoolMax() + 10}
	b, err := pgbouncer.Start(ctx, d.URL, pgbouncer.Options{
		PoolMode: pgbouncer.PoolModeTransaction, PoolSize: info.PoolSize, MaxClientConn: info.MaxClientConn,
	})
	if err != nil {
		return nil, fmt.Errorf("start the pooler: %w", err)
	}
	info.Version = b.Version()
	return &Pooler{
		Bouncer: b,
		Info:    info,
		Env:     []string{"DATABASE_URL=" + b.URL(d.Name), "RELAY_SESSION_DATABASE_URL=" + d.URL},
	}, nil
}
