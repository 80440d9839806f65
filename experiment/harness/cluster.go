package harness

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/devdb"
	"github.com/relayq/relay/internal/pgurl"
)

// Cluster is a private PostgreSQL server that an experiment starts for
// itself: a devdb cluster in a temporary directory, on a free port of
// 127.0.0.1, run with PostgreSQL's own defaults (autovacuum on, 128 MB of
// shared buffers, durable commits), unlike the throwaway cluster of relay
// dev, which skips the disk flushes. Stop removes it. Experiments about
// the health of Relay's tables run on one, since the shared server of
// these machines runs with autovacuum off.
type Cluster struct {
	*devdb.Cluster
}

// ClusterTimeout bounds starting a private cluster and restoring its
// settings.
const ClusterTimeout = 2 * time.Minute

// StartCluster starts a private cluster with initdb and pg_ctl (never a
// container), and sets back to PostgreSQL's defaults what devdb relaxes:
// fsync, full_page_writes and synchronous_commit. The caller must call
// Stop.
func StartCluster(ctx context.Context, logger *slog.Logger) (_ *Cluster, err error) {
	ctx, cancel := context.WithTimeout(ctx, ClusterTimeout)
	defer cancel()
	dc, err := devdb.StartLocal(ctx, logger)
	if err != nil {
		return nil, fmt.Errorf("start a private PostgreSQL cluster (initdb, pg_ctl): %w", err)
	}
	c := &Cluster{Cluster: dc}
	defer func() {
		if err != nil {
			_ = c.Stop(context.WithoutCancel(ctx))
		}
	}()
	if err := restoreDefaults(ctx, c.URL()); err != nil {
		return nil, err
	}
	return c, nil
}

// restoreDefaults turns fsync, full_page_writes and synchronous_commit
// back on and waits until a new session sees them so.
func restoreDefaults(ctx context.Context, adminURL string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect to the private cluster %s: %w", pgurl.Redact(adminURL), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	q := labdb.New(conn)
	for name, restore := range map[string]func(context.Context) error{
		"fsync":              q.ExperimentRestoreFsync,
		"full_page_writes":   q.ExperimentRestoreFullPageWrites,
		"synchronous_commit": q.ExperimentRestoreSynchronousCommit,
	} {
		if err := restore(ctx); err != nil {
			return fmt.Errorf("private cluster: turn %s on: %w", name, err)
		}
	}
	if _, err := q.ExperimentReloadConfig(ctx); err != nil {
		return fmt.Errorf("private cluster: reload the configuration: %w", err)
	}
	// The postmaster rereads its configuration when it gets the signal,
	// and each session before its next statement: poll with new ones.
	for {
		info, err := serverInfoOf(ctx, adminURL)
		if err == nil && info.Fsync == "on" && info.FullPageWrites == "on" && info.SynchronousCommit == "on" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("private cluster: wait for fsync, full_page_writes and synchronous_commit to be on (%+v, %v): %w", info, err, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// serverInfoOf reads the settings of the server of url in a session of its
// own.
func serverInfoOf(ctx context.Context, url string) (ServerInfo, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return ServerInfo{}, fmt.Errorf("connect to %s: %w", pgurl.Redact(url), err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return ReadServerInfo(ctx, labdb.New(conn))
}

// StopAtEnd stops and removes the cluster, for a run to defer once it has
// started it: within ClusterTimeout, even after ctx is done, and with the
// error put in *err unless the run already failed.
func (c *Cluster) StopAtEnd(ctx context.Context, err *error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ClusterTimeout)
	defer cancel()
	if stopErr := c.Stop(ctx); stopErr != nil && *err == nil {
		*err = fmt.Errorf("remove the private cluster: %w", stopErr)
	}
}
