package devdb

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/moby/moby/client"

	"github.com/relayq/relay/internal/dockertest"
)

// TestStart_FallsBackToAContainerThatStopRemoves runs `relay dev`'s
// fallback: with no local cluster to be had, Start starts PostgreSQL in a
// container (of RELAY_TEST_POSTGRES_IMAGE, else ContainerImage) through
// testcontainers-go, the server answers on the URL it gives, no Docker
// network appears, and Stop removes the container.
func TestStart_FallsBackToAContainerThatStopRemoves(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL container; skipped with -short")
	}
	docker := dockertest.RequireEngine(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	networks := dockertest.Networks(t, docker)

	noLocal := func(context.Context, *slog.Logger) (*Cluster, error) {
		return nil, errors.New("no initdb here")
	}
	c, err := start(ctx, logger, noLocal, ContainerConfig{Image: os.Getenv("RELAY_TEST_POSTGRES_IMAGE")})
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			c.Stop(context.Background())
		}
	})
	if c.container == nil || c.Dir() != "" {
		t.Fatalf("start gave a local cluster (dir %q), not a container", c.Dir())
	}
	if err := ping(ctx, c.URL()); err != nil {
		t.Fatalf("connect to %s: %v", c.URL(), err)
	}
	if hostNetworkSelected() {
		u, err := url.Parse(c.URL())
		if err != nil {
			t.Fatal(err)
		}
		if u.Hostname() != "127.0.0.1" {
			t.Errorf("URL %s: on the host's network, want the server on 127.0.0.1", c.URL())
		}
		inspect, err := c.container.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if mode := inspect.HostConfig.NetworkMode; mode != "host" {
			t.Errorf("the container's network mode is %q, want host", mode)
		}
	}
	if got := dockertest.Networks(t, docker); !slices.Equal(got, networks) {
		t.Errorf("Docker networks: %v before the container, %v with it; want none created", networks, got)
	}
	if err := c.StopServer(ctx, ShutdownFast); !errors.Is(err, ErrNotLocal) {
		t.Errorf("StopServer on a container: %v, want ErrNotLocal", err)
	}

	id := c.container.GetContainerID()
	if err := c.Stop(ctx); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	stopped = true
	if _, err := docker.ContainerInspect(ctx, id, client.ContainerInspectOptions{}); err == nil {
		t.Errorf("container %s still exists after Stop", id)
	}
	if _, err := os.Stat(c.lock.Name()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the container's lock file %s: %v after Stop, want it removed", c.lock.Name(), err)
	}
}

// TestStartContainer_RemovesTheContainersOfDeadOwnersOnly: without
// testcontainers' reaper, the container of a process that died stays; the
// next StartContainer removes it, and leaves alone that of a live one.
func TestStartContainer_RemovesTheContainersOfDeadOwnersOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL containers; skipped with -short")
	}
	docker := dockertest.RequireEngine(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	logger := slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := ContainerConfig{Image: os.Getenv("RELAY_TEST_POSTGRES_IMAGE")}

	exists := func(c *Cluster) bool {
		_, err := docker.ContainerInspect(ctx, c.container.GetContainerID(), client.ContainerInspectOptions{})
		return err == nil
	}
	var clusters []*Cluster
	for range 2 {
		c, err := StartContainer(ctx, logger, cfg)
		if err != nil {
			t.Fatalf("StartContainer: %v", err)
		}
		t.Cleanup(func() { c.Stop(context.Background()) })
		clusters = append(clusters, c)
	}
	dead, live := clusters[0], clusters[1]
	// As when its process dies: the kernel lets go of the lock; the file
	// stays.
	dead.lock.Close()

	removeAbandonedContainers(ctx, logger)
	if exists(dead) {
		t.Errorf("the container of a dead owner is still there")
	}
	if _, err := os.Stat(dead.lock.Name()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the lock file of a dead owner: %v, want it removed", err)
	}
	if !exists(live) {
		t.Errorf("the container of a live owner was removed")
	}
	if err := ping(ctx, live.URL()); err != nil {
		t.Errorf("the container of a live owner no longer serves: %v", err)
	}
}
