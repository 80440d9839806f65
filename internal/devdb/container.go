package devdb

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
	"github.com/testcontainers/testcontainers-go/wait"

	"github.com/relayq/relay/internal/pgurl"
)

// ContainerImage is the image of the fallback container: the official one,
// which Docker pulls the first time.
const ContainerImage = "postgres:15-alpine"

// HostNetworkProvider names the testcontainers-go runtime provider that
// this package registers, for a Docker engine with no bridge network
// (dockerd --bridge=none), on which a container has only the host's
// network. Select it with TESTCONTAINERS_PROVIDER=relay-host-network, and
// turn testcontainers' reaper (Ryuk), which needs a network and an image of
// its own, off with TESTCONTAINERS_RYUK_DISABLED=true. testcontainers then
// creates no network (by default it makes one, reaper_default, when the
// engine has no bridge network, and attaches every container to it), and
// StartContainer runs PostgreSQL in the host's network namespace,
// listening on 127.0.0.1 alone, on a free port.
const HostNetworkProvider = "relay-host-network"

// containerStartTimeout bounds the wait for a container's server to be
// ready, its initialisation included.
const containerStartTimeout = 2 * time.Minute

// containerUser, containerPassword and containerDatabase are those of the
// container's server.
const (
	containerUser     = "postgres"
	containerPassword = "postgres"
	containerDatabase = "postgres"
)

// Labels of every container StartContainer starts: the host it was started
// from, and the lock file its owner holds for the container's whole life.
const (
	labelHost      = "io.relayq.devdb.host"
	labelOwnerLock = "io.relayq.devdb.owner-lock"
)

// containerLockPrefix begins the name of the lock file of each container,
// in the temporary directory.
const containerLockPrefix = "relay-container-"

// registerErr is why HostNetworkProvider could not be registered, if it
// could not.
var registerErr error

func init() {
	registerErr = testcontainers.RegisterProvider(HostNetworkProvider, func() testcontainers.RuntimeProvider {
		return hostNetworkRuntime{}
	})
}

// hostNetworkRuntime is the engine testcontainers finds as usual, whose
// default network is the host's: a container there needs no network
// created for it, nor attached to it.
type hostNetworkRuntime struct{}

// Initialize keeps testcontainers' discovery of the engine, and names the
// host's network as the engine's default one.
func (hostNetworkRuntime) Initialize(context.Context) (testcontainers.RuntimeConfig, error) {
	return testcontainers.RuntimeConfig{DefaultBridgeNetwork: string(container.NetworkMode("host"))}, nil
}

// hostNetworkSelected reports whether TESTCONTAINERS_PROVIDER selects
// HostNetworkProvider.
func hostNetworkSelected() bool {
	return strings.EqualFold(strings.TrimSpace(os.Getenv("TESTCONTAINERS_PROVIDER")), HostNetworkProvider)
}

// ContainerConfig says how StartContainer runs PostgreSQL. The zero value
// runs ContainerImage.
type ContainerConfig struct {
	// Image is the image to run, the official postgres image or one that
	// behaves as it does (the POSTGRES_USER, POSTGRES_PASSWORD and
	// POSTGRES_DB variables; "database system is ready to accept
	// connections" logged once by the server that initialises the cluster
	// and once by the one that serves it): ContainerImage if empty.
	Image string
}

func (cfg ContainerConfig) image() string {
	if cfg.Image == "" {
		return ContainerImage
	}
	return cfg.Image
}

// StartContainer starts a PostgreSQL server in a container with
// testcontainers-go, which needs a Docker engine: the fallback of Start.
// With HostNetworkProvider selected, the container has the host's network
// and the server listens on 127.0.0.1; otherwise Docker publishes its port
// as testcontainers does by default. Stop removes the container; so does
// testcontainers' reaper, when it runs, once the process exits. Without the
// reaper, the next StartContainer on this host removes it once its process
// is gone (see removeAbandonedContainers).
func StartContainer(ctx context.Context, logger *slog.Logger, cfg ContainerConfig) (c *Cluster, err error) {
	if logger == nil {
		logger = slog.Default()
	}
	defer func() {
		// testcontainers panics when it finds no Docker engine.
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers: %v", r)
		}
	}()
	image := cfg.image()
	removeAbandonedContainers(ctx, logger)
	lock, err := lockContainerOwner()
	if err != nil {
		return nil, err
	}
	defer func() {
		if c == nil {
			closeOwnerLock(lock)
		}
	}()
	host, _ := os.Hostname()
	opts := []testcontainers.ContainerCustomizer{
		testcontainers.WithLabels(map[string]string{labelHost: host, labelOwnerLock: lock.Name()}),
		tcpostgres.WithDatabase(containerDatabase),
		tcpostgres.WithUsername(containerUser),
		tcpostgres.WithPassword(containerPassword),
		testcontainers.WithWaitStrategy(
			wait.ForLog("database system is ready to accept connections").
				WithOccurrence(2).
				WithStartupTimeout(containerStartTimeout)),
	}
	if !hostNetworkSelected() {
		ctr, err := tcpostgres.Run(ctx, image, opts...)
		if err != nil {
			terminate(ctx, ctr)
			return nil, fmt.Errorf("start container of %s: %w", image, err)
		}
		dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
		if err != nil {
			terminate(ctx, ctr)
			return nil, fmt.Errorf("container address: %w", err)
		}
		logger.Info("started a throwaway PostgreSQL container", "image", image, "url", pgurl.Redact(dsn))
		return &Cluster{log: logger, url: dsn, container: ctr, lock: lock}, nil
	}

	if registerErr != nil {
		return nil, fmt.Errorf("devdb: %s: %w", HostNetworkProvider, registerErr)
	}
	// A free port can be taken between finding it and the server binding
	// it: try a few.
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		ctr, err := tcpostgres.Run(ctx, image, append(opts,
			testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
				hc.NetworkMode = "host"
			}),
			testcontainers.WithCmdArgs("-c", "listen_addresses=127.0.0.1", "-c", "port="+strconv.Itoa(port)),
		)...)
		if err != nil {
			terminate(ctx, ctr)
			if try < 3 && ctx.Err() == nil {
				logger.Debug("devdb: container failed to start; trying another port", "err", err)
				continue
			}
			return nil, fmt.Errorf("start container of %s on the host's network: %w", image, err)
		}
		dsn := (&url.URL{
			Scheme:   "postgres",
			User:     url.UserPassword(containerUser, containerPassword),
			Host:     "127.0.0.1:" + strconv.Itoa(port),
			Path:     "/" + containerDatabase,
			RawQuery: "sslmode=disable",
		}).String()
		logger.Info("started a throwaway PostgreSQL container", "image", image, "network", "host", "url", pgurl.Redact(dsn))
		return &Cluster{log: logger, url: dsn, container: ctr, lock: lock}, nil
	}
}

// terminate removes a container that failed to start, if there is one.
func terminate(ctx context.Context, ctr *tcpostgres.PostgresContainer) {
	if ctr != nil {
		_ = ctr.Terminate(context.WithoutCancel(ctx))
	}
}

// lockContainerOwner creates a lock file for a new container in the
// temporary directory and takes its lock, which the returned file holds
// until it is closed: while it is held, the container's owner lives.
func lockContainerOwner() (*os.File, error) {
	f, err := os.CreateTemp("", containerLockPrefix+"*.lock")
	if err != nil {
		return nil, fmt.Errorf("devdb: create lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		closeOwnerLock(f)
		return nil, fmt.Errorf("devdb: lock %s: %w", f.Name(), err)
	}
	if _, err := fmt.Fprintf(f, "%d\n", os.Getpid()); err != nil {
		closeOwnerLock(f)
		return nil, fmt.Errorf("devdb: write lock file: %w", err)
	}
	return f, nil
}

// closeOwnerLock removes a container's lock file and lets go of its lock.
func closeOwnerLock(f *os.File) {
	os.Remove(f.Name())
	f.Close()
}

// ownerDead reports whether the process that held the lock file at path
// is gone: the file is missing, or its lock can be taken.
func ownerDead(path string) bool {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return true
	}
	if err != nil {
		return false
	}
	defer f.Close()
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil
}

// removeAbandonedContainers removes the containers that StartContainer
// started from this host for processes that have died since: without
// testcontainers' reaper, nothing else would. It logs one line for each,
// and never touches a container whose owner lives, nor one started from
// another host.
func removeAbandonedContainers(ctx context.Context, logger *slog.Logger) {
	host, err := os.Hostname()
	if err != nil {
		return
	}
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		logger.Debug("devdb: docker client", "err", err)
		return
	}
	defer cli.Close()
	list, err := cli.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: make(client.Filters).Add("label", labelHost+"="+host).Add("label", labelOwnerLock),
	})
	if err != nil {
		logger.Debug("devdb: list containers", "err", err)
		return
	}
	for _, ctr := range list.Items {
		lock := ctr.Labels[labelOwnerLock]
		if filepath.Dir(lock) != filepath.Clean(os.TempDir()) || !strings.HasPrefix(filepath.Base(lock), containerLockPrefix) || !ownerDead(lock) {
			continue
		}
		if _, err := cli.ContainerRemove(ctx, ctr.ID, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true}); err != nil {
			logger.Warn("devdb: cannot remove a throwaway PostgreSQL container that a dead process left behind",
				"container", ctr.ID, "err", err, "remove it with", "docker rm -f -v "+ctr.ID)
			continue
		}
		os.Remove(lock)
		logger.Info("removed a throwaway PostgreSQL container that a dead process left behind", "container", ctr.ID)
	}
}
