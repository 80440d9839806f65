package devdb

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func ping(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return conn.Ping(ctx)
}

// TestStart_StartsAThrowawayServerThatStopRemoves needs initdb and pg_ctl, or
// Docker: without either it fails, since `relay dev` would not work either.
func TestStart_StartsAThrowawayServerThatStopRemoves(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server; skipped with -short")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))

	c, err := Start(ctx, logger)
	if err != nil {
		t.Fatalf("Start: %v\nthis test needs PostgreSQL's server binaries (initdb, pg_ctl) or a Docker engine", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			c.Stop(context.Background())
		}
	})
	if err := ping(ctx, c.URL()); err != nil {
		t.Fatalf("connect to %s: %v", c.URL(), err)
	}

	if c.Dir() != "" {
		info, err := os.Stat(c.Dir())
		if err != nil {
			t.Fatalf("cluster directory: %v", err)
		}
		if os.Geteuid() == 0 && info.Sys() != nil {
			if uid := ownerUID(info); uid == 0 {
				t.Errorf("running as root, but the cluster directory belongs to root, not to an unprivileged user")
			}
		}

		t.Run("StopServer and StartServer restart it on the same URL", func(t *testing.T) {
			for _, mode := range []ShutdownMode{ShutdownFast, ShutdownImmediate} {
				if err := c.StopServer(ctx, mode); err != nil {
					t.Fatalf("StopServer(%s): %v", mode, err)
				}
				if err := ping(ctx, c.URL()); err == nil {
					t.Fatalf("connected while the server was stopped (%s)", mode)
				}
				if err := c.StartServer(ctx); err != nil {
					t.Fatalf("StartServer after %s: %v", mode, err)
				}
				if err := ping(ctx, c.URL()); err != nil {
					t.Fatalf("connect after restart from %s: %v", mode, err)
				}
			}
		})
	} else {
		t.Log("no local cluster could be started; ran on a container")
	}

	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	stopped = true
	if err := c.Stop(ctx); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := ping(ctx, c.URL()); err == nil {
		t.Errorf("connected after Stop")
	}
	if c.Dir() != "" {
		if _, err := os.Stat(c.Dir()); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cluster directory %s still there after Stop (stat: %v)", c.Dir(), err)
		}
		if err := c.StartServer(ctx); err == nil {
			t.Errorf("StartServer after Stop succeeded")
		}
	}
}

func ownerUID(info os.FileInfo) uint32 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Uid
	}
	return 0
}
