package harness

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"
)

// TestStartCluster_RunsWithPostgreSQLDefaultsAndStopRemovesIt starts a
// private cluster and checks that it runs as a production server does,
// durable and vacuumed, unlike the throwaway cluster of relay dev, and
// that Stop leaves nothing behind.
func TestStartCluster_RunsWithPostgreSQLDefaultsAndStopRemovesIt(t *testing.T) {
	c, err := StartCluster(t.Context(), nil)
	if err != nil {
		t.Fatalf("StartCluster: %v\nthis test needs PostgreSQL's server binaries (initdb, pg_ctl)", err)
	}
	t.Cleanup(func() { _ = c.Stop(context.Background()) })

	info, err := serverInfoOf(t.Context(), c.URL())
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{
		"fsync": info.Fsync, "full_page_writes": info.FullPageWrites,
		"synchronous_commit": info.SynchronousCommit, "autovacuum": info.Autovacuum, "track_counts": info.TrackCounts,
		"jit": info.JIT,
	}
	for name, got := range settings {
		if got != "on" {
			t.Errorf("%s = %q, want on", name, got)
		}
	}
	if info.SharedPreloadLibraries != "" {
		t.Errorf("shared_preload_libraries = %q, want none, as PostgreSQL's defaults have it", info.SharedPreloadLibraries)
	}
	if info.SharedBuffers != "128MB" {
		t.Errorf("shared_buffers = %q, want PostgreSQL's default 128MB", info.SharedBuffers)
	}

	dir := c.Dir()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Stop, %s: %v; want it removed", dir, err)
	}
}
