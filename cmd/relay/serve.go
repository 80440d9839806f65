package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/builtin"
	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/server"
	"github.com/relayq/relay/worker"
)

// defaultAddr is where the API listens without --addr or RELAY_ADDR.
const defaultAddr = "127.0.0.1:8080"

// announceTimeout bounds the API's last notifications at shutdown.
const announceTimeout = 5 * time.Second

// addrLookupTimeout bounds resolving the host name of --addr to find out
// whether it is a loopback address.
const addrLookupTimeout = 3 * time.Second

// serveFlags configure the API, and the worker slots that may run beside it.
type serveFlags struct {
	command         string // the command the flags belong to, for errors
	logs            cli.LogFlags
	db              cli.DBFlags
	worker          cli.WorkerFlags
	addr            string
	apiToken        string
	insecureNoAuth  bool
	maxBodyBytes    int64
	announceEvery   time.Duration
	shutdownTimeout time.Duration
}

func (s *serveFlags) register(fs *cli.FlagSet, defaultSlots int) {
	s.command = fs.Name()
	s.logs.Register(fs)
	s.db.Register(fs)
	fs.StringVar(&s.addr, "addr", "", "address to listen on (default $RELAY_ADDR, else "+defaultAddr+")")
	fs.StringVar(&s.apiToken, "api-token", "", "bearer token every /v1 request must present (default $RELAY_API_TOKEN; required on a non-loopback --addr unless --insecure-no-auth)")
	fs.BoolVar(&s.insecureNoAuth, "insecure-no-auth", false, "serve without a token on a non-loopback --addr: the API then accepts unauthenticated requests from the network")
	fs.Int64Var(&s.maxBodyBytes, "max-body-bytes", server.DefaultMaxBodyBytes, "largest request body accepted")
	fs.DurationVar(&s.announceEvery, "announce-every", client.DefaultAnnounceEvery, "space the notifications of jobs posted one per request, whatever their queues, this far apart, from one notifying statement's start to the next: those posted sooner are announced together, this long after the latest (0: each group at its commit)")
	fs.DurationVar(&s.shutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may finish at shutdown")
	s.worker.Register(fs, defaultSlots, "worker slots to run in this process with the built-in handlers (0: none)")
}

// resolve fills in what comes from the environment and checks the flags.
func (s *serveFlags) resolve(ctx context.Context, getenv func(string) string) error {
	if s.addr == "" {
		s.addr = getenv("RELAY_ADDR")
	}
	if s.addr == "" {
		s.addr = defaultAddr
	}
	if s.apiToken == "" {
		s.apiToken = getenv("RELAY_API_TOKEN")
	}
	if !server.PresentableToken(s.apiToken) {
		// Named without the token, which is a secret.
		return cli.Usagef("%s: --api-token (or RELAY_API_TOKEN) begins or ends with white space, or holds a control character: "+
			"no request can present it in its Authorization header", s.command)
	}
	s.worker.ResolveEnv(getenv)
	if s.maxBodyBytes <= 0 {
		return cli.Usagef("--max-body-bytes must be positive, got %d", s.maxBodyBytes)
	}
	if s.announceEvery < 0 {
		return cli.Usagef("--announce-every must not be negative, got %s", s.announceEvery)
	}
	if s.worker.Slots < 0 {
		return cli.Usagef("--slots must not be negative, got %d", s.worker.Slots)
	}
	// Checked with or without a worker to run, so that a flag given wrong
	// is never silently ignored.
	if _, err := s.worker.Config(nil); err != nil {
		return err
	}
	// Nor one given right that would do nothing.
	if given := s.worker.GivenBesidesSlots(); s.worker.Slots == 0 && len(given) > 0 {
		return cli.Usagef("%s: worker flags, which do nothing without worker slots: "+
			"give --slots N to run slots here, or give the flags to relay work", strings.Join(given, ", "))
	}
	if s.shutdownTimeout <= 0 {
		return cli.Usagef("--shutdown-timeout must be positive, got %s", s.shutdownTimeout)
	}
	return s.requireTokenOffLoopback(ctx, net.DefaultResolver.LookupHost)
}

// announceEveryConfig is --announce-every as server.Config takes it, where
// zero means the default and a negative value no spacing.
func (s *serveFlags) announceEveryConfig() time.Duration {
	if s.announceEvery == 0 {
		return -1
	}
	return s.announceEvery
}

// requireTokenOffLoopback refuses an address Listen would refuse, and to
// serve the API without a token on an address that other machines may
// reach, unless --insecure-no-auth allows it. lookupHost resolves a host
// name to its addresses.
func (s *serveFlags) requireTokenOffLoopback(ctx context.Context, lookupHost func(context.Context, string) ([]string, error)) error {
	if strings.TrimSpace(s.addr) != s.addr {
		// Listen would look the host up with the space and fail, after
		// the database was reached; unchecked, a lookup for the loopback
		// check fails the same way, blamed on the host.
		return cli.Usagef("%s: invalid address %q (--addr or RELAY_ADDR): begins or ends with white space", s.command, s.addr)
	}
	host, port, err := net.SplitHostPort(s.addr)
	if err == nil {
		// As Listen reads it: a number up to 65535 or a service name,
		// and empty for any free port. Checked here, before the
		// database, so that a port out of range is a usage error.
		_, err = net.LookupPort("tcp", port)
	}
	if err != nil {
		return cli.Usagef("%s: invalid address %q (--addr or RELAY_ADDR): %v", s.command, s.addr, err)
	}
	if s.apiToken != "" || s.insecureNoAuth {
		return nil
	}
	const fix = "set --api-token (or RELAY_API_TOKEN), listen on a loopback address, or pass --insecure-no-auth"
	loopback, err := isLoopbackHost(ctx, host, lookupHost)
	if err != nil {
		return cli.Usagef("%s: refusing to serve the API on %s without a token: %v; %s", s.command, s.addr, err, fix)
	}
	if !loopback {
		return cli.Usagef("%s: refusing to serve the API on %s without a token: %s", s.command, s.addr, fix)
	}
	return nil
}

// isLoopbackHost reports whether a listener on host is reachable from this
// machine only. An empty host and the unspecified addresses listen on every
// interface; "localhost" is loopback by definition; any other name is
// loopback only if every address it resolves to is.
func isLoopbackHost(ctx context.Context, host string, lookupHost func(context.Context, string) ([]string, error)) (bool, error) {
	if host == "" {
		return false, nil
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true, nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.IsLoopback(), nil
	}
	ctx, cancel := context.WithTimeout(ctx, addrLookupTimeout)
	defer cancel()
	addrs, err := lookupHost(ctx, host)
	if err != nil {
		return false, fmt.Errorf("cannot resolve %s to tell whether it is a loopback address: %w", host, err)
	}
	if len(addrs) == 0 {
		return false, fmt.Errorf("%s resolves to no address", host)
	}
	for _, a := range addrs {
		ip, err := netip.ParseAddr(a)
		if err != nil || !ip.IsLoopback() {
			return false, nil
		}
	}
	return true, nil
}

// isLoopbackListener reports whether ln accepts connections from this
// machine only.
func isLoopbackListener(ln net.Listener) bool {
	tcp, ok := ln.Addr().(*net.TCPAddr)
	return ok && tcp.IP.IsLoopback()
}

// newServeFlagSet returns the flag set of relay serve, which parses into
// opts.
func newServeFlagSet(opts *serveFlags) *cli.FlagSet {
	fs := cli.NewFlagSet("serve", "relay serve [flags]",
		`Serves the HTTP API. With --slots N it also runs N worker slots with the
built-in handlers on --queue, on a database pool of their own. The database
must be reachable and migrated. Without an API token (--api-token or
RELAY_API_TOKEN) it listens only on a loopback address, unless
--insecure-no-auth is given. On SIGINT, SIGTERM or SIGHUP, in-flight
requests finish (up to --shutdown-timeout) and running jobs drain (up to
--shutdown-grace) before the process exits.`)
	opts.register(fs, 0)
	return fs
}

func runServe(ctx context.Context, env *environment, args []string) error {
	var opts serveFlags
	fs := newServeFlagSet(&opts)
	pos, err := fs.Parse(args, env.stderr)
	if err != nil {
		return cli.Helped(err)
	}
	if len(pos) > 0 {
		return cli.Usagef("serve: unexpected argument %q", pos[0])
	}
	logger, err := opts.logs.Logger(env.stderr)
	if err != nil {
		return err
	}
	if err := opts.resolve(ctx, env.getenv); err != nil {
		return err
	}
	dsn, err := opts.db.Resolve(env.getenv)
	if err != nil {
		return err
	}
	return serve(ctx, logger, dsn, &opts, nil)
}

// serve runs the API, and the worker slots if any, until ctx is cancelled,
// then shuts both down gracefully. ready, if not nil, is called with the
// listening address once requests can be served.
func serve(ctx context.Context, logger *slog.Logger, dsn string, opts *serveFlags, ready func(addr net.Addr)) error {
	pool, err := connect(ctx, logger, dsn, "relay serve", servingMinConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := requireMigrated(ctx, logger, pool); err != nil {
		return err
	}

	var w *worker.Worker
	if opts.worker.Slots > 0 {
		cfg, err := opts.worker.Config(logger)
		if err != nil {
			return err
		}
		// The worker gets a pool of its own, so that a burst of API
		// requests can never starve its heartbeats.
		workerPool, err := connectWorker(ctx, logger, dsn, "relay serve worker", servingMinConns, cfg.Lease)
		if err != nil {
			return err
		}
		defer workerPool.Close()
		if err := reachSession(ctx, cfg.SessionDatabaseURL); err != nil {
			return err
		}
		if w, err = worker.New(workerPool, cfg); err != nil {
			return fmt.Errorf("create worker: %w", err)
		}
		builtin.Register(w)
	}

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", opts.addr)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	api := server.NewServer(logger, pool, server.Config{
		APIToken:      opts.apiToken,
		MaxBodyBytes:  opts.maxBodyBytes,
		AnnounceEvery: opts.announceEveryConfig(),
	})
	srv := server.NewHTTPServer(opts.addr, api)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	// workerDone stays nil, never ready, without worker slots.
	var workerDone chan error
	if w != nil {
		workerDone = make(chan error, 1)
		go func() { workerDone <- w.Run(ctx) }()
	}
	if opts.apiToken == "" && !isLoopbackListener(ln) {
		logger.Warn("the API accepts unauthenticated requests from the network (--insecure-no-auth)", "addr", ln.Addr().String())
	}
	logger.Info("serving the API", "addr", ln.Addr().String(), "auth", opts.apiToken != "",
		"announce_every", opts.announceEvery, "worker_slots", opts.worker.Slots, "queue", opts.worker.Queue)
	if ready != nil {
		ready(ln.Addr())
	}

	var errs []error
	workerStopped := false
	select {
	case <-ctx.Done():
		logger.Info("shutting down", "timeout", opts.shutdownTimeout)
	case err := <-serveErr:
		errs = append(errs, fmt.Errorf("serve HTTP: %w", err))
		cancel()
	case err := <-workerDone:
		// The worker stopped by itself: its id is another live worker's.
		workerStopped = true
		if err != nil {
			errs = append(errs, err)
		}
		cancel()
	}
	shutdownCtx, cancelShutdown := context.WithTimeout(context.WithoutCancel(ctx), opts.shutdownTimeout)
	defer cancelShutdown()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		logger.Warn("in-flight requests did not finish in time; closing their connections", "err", err)
		srv.Close()
	}
	// The jobs of the last requests may still be owed their notification.
	announceCtx, cancelAnnounce := context.WithTimeout(context.WithoutCancel(ctx), announceTimeout)
	api.Close(announceCtx)
	cancelAnnounce()
	if workerDone != nil && !workerStopped {
		if err := <-workerDone; err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	logger.Info("stopped")
	return nil
}
