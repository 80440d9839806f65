package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/experiment/chaos/schema"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/faultproxy"
	"github.com/relayq/relay/internal/pgbouncer"
	"github.com/relayq/relay/internal/pgurl"
)

// Scenario names one fault scenario of `relay experiment chaos`.
type Scenario string

// The scenarios, each a workload run under one kind of fault.
const (
	// Kill SIGKILLs a random worker every few seconds and starts a
	// new one.
	Kill Scenario = "kill"
	// Pause SIGSTOPs the busiest worker for longer than its lease,
	// then SIGCONTs it: the zombie's heartbeats, completions and failures
	// must all be refused, and its handlers' contexts cancelled.
	Pause Scenario = "pause"
	// Partition cuts workers off PostgreSQL through fault proxies: a
	// reset cut, a silent blackhole, and cuts that land just as a
	// completion commits. The workers must recover by themselves.
	Partition Scenario = "partition"
	// BackendKill ends random worker connections with
	// pg_terminate_backend.
	BackendKill Scenario = "backend-kill"
	// Restart restarts PostgreSQL mid-run, on a private cluster,
	// while jobs are enqueued through the HTTP API.
	Restart Scenario = "restart"
	// Poison mixes in jobs that panic, always fail, or kill their own
	// worker process.
	Poison Scenario = "poison"
	// Starvation mixes in jobs that hold every connection of the
	// handlers' pool for longer than the lease.
	Starvation Scenario = "starvation"
	// BadInput fires a burst of malformed, oversized, duplicate-key
	// and hostile requests at the API during the run.
	BadInput Scenario = "bad-input"
	// PgBouncer runs the workers and the API through a PgBouncer in
	// transaction mode, enqueues through the API, and SIGKILLs workers as
	// the kill scenario does. Half the workers keep their session on
	// PostgreSQL itself (--session-database-url), so that their death is
	// seen at once; the others have no session and are governed by their
	// leases alone.
	PgBouncer Scenario = "pgbouncer"
)

// Scenarios returns every scenario, in the order the full programme
// runs them.
func Scenarios() []Scenario {
	return []Scenario{Kill, Pause, Partition, BackendKill,
		Restart, Poison, Starvation, BadInput, PgBouncer}
}

// ParseScenarios parses a comma-separated list of scenario names;
// "all" or "" means every scenario.
func ParseScenarios(s string) ([]Scenario, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "all" {
		return Scenarios(), nil
	}
	var out []Scenario
	for _, name := range strings.Split(s, ",") {
		sc := Scenario(strings.TrimSpace(name))
		if !slices.Contains(Scenarios(), sc) {
			var names []string
			for _, k := range Scenarios() {
				names = append(names, string(k))
			}
			return nil, fmt.Errorf("unknown scenario %q (want all, or some of %s)", name, strings.Join(names, ", "))
		}
		if !slices.Contains(out, sc) {
			out = append(out, sc)
		}
	}
	return out, nil
}

// Config configures one scenario run. Scenario, RelayBin and WorkerBin are
// required. Other zero fields take the defaults of DefaultConfig,
// except Heartbeat (a fifth of Lease), Seed (zero is a seed like any other)
// and the optional DatabaseURL, LogDir, OutDir, Progress and Logger, whose
// zero values each field's comment describes. Negative numbers and
// durations are refused.
type Config struct {
	// Scenario is the fault to inject.
	Scenario Scenario
	// RelayBin is the relay binary, whose `serve` runs the API.
	RelayBin string
	// WorkerBin is the binary of the chaos workers: the lab's command
	// (experiment/cmd/relaylab), which WorkerArgs make a chaos worker.
	WorkerBin string
	// WorkerArgs are the arguments that make WorkerBin a chaos worker,
	// before its flags. Default: chaos-worker.
	WorkerArgs []string
	// AdminURL is the server on which the run creates (and then drops) a
	// database of its own. Default: DefaultAdminURL. The restart scenario
	// never uses it: it starts a private cluster (harness.StartCluster) instead.
	AdminURL string
	// DatabaseURL, if set, is a fresh database migrated to Relay's schema
	// to use as is instead of creating one (tests give their own). Not for
	// the restart scenario.
	DatabaseURL string
	// Jobs is how many jobs to enqueue.
	Jobs int
	// Workers is how many worker processes run at once.
	Workers int
	// Slots is how many jobs each worker runs at once.
	Slots int
	// Lease is the workers' lease.
	Lease time.Duration
	// Heartbeat is the workers' heartbeat interval (default: a fifth of
	// the lease).
	Heartbeat time.Duration
	// BackoffBase is the workers' retry backoff after a first failure.
	BackoffBase time.Duration
	// Duration is how long jobs are enqueued (at an even pace) and faults
	// injected. The run then waits for every job to finish.
	Duration time.Duration
	// FaultEvery is the period of the repeated faults (kill, backend-kill).
	FaultEvery time.Duration
	// Downtime is how long the restart scenario keeps PostgreSQL down.
	Downtime time.Duration
	// Restarts is how many times the restart scenario restarts it.
	Restarts int
	// CommitCuts is how many cuts-at-commit the partition scenario makes.
	CommitCuts int
	// BadInputRounds is how many times the bad-input burst sends each of
	// its requests.
	BadInputRounds int
	// DrainTimeout bounds the wait for every job to finish after Duration.
	DrainTimeout time.Duration
	// Seed makes the workload and the choice of victims repeatable. Zero
	// is used as is, not replaced by DefaultConfig's.
	Seed uint64
	// LogDir keeps the processes' logs; default: a temporary directory,
	// removed at the end.
	LogDir string
	// OutDir, if set, receives the result as chaos-<scenario>-<stamp>.json.
	OutDir string
	// Progress, if not nil, shows a progress line.
	Progress io.Writer
	// Logger receives the harness's own logs. Default: discarded.
	Logger *slog.Logger
}

// DefaultConfig returns the configuration of `relay experiment chaos`
// for a scenario: 10,000 jobs, 4 workers of 10 slots, a 5 s lease.
func DefaultConfig(s Scenario) Config {
	return Config{
		Scenario:       s,
		WorkerArgs:     []string{"chaos-worker"},
		AdminURL:       harness.DefaultAdminURL,
		Jobs:           10_000,
		Workers:        4,
		Slots:          10,
		Lease:          5 * time.Second,
		Heartbeat:      time.Second,
		BackoffBase:    250 * time.Millisecond,
		Duration:       40 * time.Second,
		FaultEvery:     3 * time.Second,
		Downtime:       4 * time.Second,
		Restarts:       2,
		CommitCuts:     10,
		BadInputRounds: 5,
		DrainTimeout:   2 * time.Minute,
		Seed:           1,
	}
}

// ShortConfig returns the short form of a scenario that the test
// suite runs: a few hundred jobs in a few seconds, a 2 s lease.
func ShortConfig(s Scenario) Config {
	c := DefaultConfig(s)
	c.Jobs = 300
	c.Workers = 3
	c.Slots = 8
	c.Lease = 2 * time.Second
	c.Heartbeat = 500 * time.Millisecond
	c.BackoffBase = 100 * time.Millisecond
	c.Duration = 6 * time.Second
	c.FaultEvery = 1500 * time.Millisecond
	c.Downtime = 2 * time.Second
	c.Restarts = 1
	c.CommitCuts = 3
	c.BadInputRounds = 1
	c.DrainTimeout = 45 * time.Second
	if s == Pause {
		// Room for a pause of 1.75 leases that catches long jobs.
		c.Duration = 8 * time.Second
	}
	return c
}

func (c Config) withDefaults() (Config, error) {
	d := DefaultConfig(c.Scenario)
	if !slices.Contains(Scenarios(), c.Scenario) {
		return c, fmt.Errorf("chaos: unknown scenario %q", c.Scenario)
	}
	if c.RelayBin == "" {
		return c, errors.New("chaos: the relay binary is required")
	}
	if c.WorkerBin == "" {
		return c, errors.New("chaos: the binary of the chaos workers (relaylab) is required")
	}
	if len(c.WorkerArgs) == 0 {
		c.WorkerArgs = d.WorkerArgs
	}
	if c.AdminURL == "" {
		c.AdminURL = d.AdminURL
	}
	c.Jobs = cmp.Or(c.Jobs, d.Jobs)
	c.Workers = cmp.Or(c.Workers, d.Workers)
	c.Slots = cmp.Or(c.Slots, d.Slots)
	c.Lease = cmp.Or(c.Lease, d.Lease)
	if c.Heartbeat == 0 {
		c.Heartbeat = c.Lease / 5
	}
	c.BackoffBase = cmp.Or(c.BackoffBase, d.BackoffBase)
	c.Duration = cmp.Or(c.Duration, d.Duration)
	c.FaultEvery = cmp.Or(c.FaultEvery, d.FaultEvery)
	c.Downtime = cmp.Or(c.Downtime, d.Downtime)
	c.Restarts = cmp.Or(c.Restarts, d.Restarts)
	c.CommitCuts = cmp.Or(c.CommitCuts, d.CommitCuts)
	c.BadInputRounds = cmp.Or(c.BadInputRounds, d.BadInputRounds)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, d.DrainTimeout)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case c.Jobs < 10:
		return c, fmt.Errorf("chaos: at least 10 jobs, got %d", c.Jobs)
	case c.Workers < 2:
		return c, fmt.Errorf("chaos: at least 2 workers, got %d", c.Workers)
	case c.Scenario == Partition && c.Workers < 3:
		return c, fmt.Errorf("chaos: the partition scenario needs at least 3 workers, got %d", c.Workers)
	case c.Slots < 1:
		return c, fmt.Errorf("chaos: at least 1 slot, got %d", c.Slots)
	case c.Lease < 500*time.Millisecond || c.Heartbeat <= 0 || c.Heartbeat >= c.Lease:
		return c, fmt.Errorf("chaos: want a lease of at least 500ms and a shorter, positive heartbeat; got %s and %s", c.Lease, c.Heartbeat)
	case c.Duration < 2*time.Second:
		return c, fmt.Errorf("chaos: a duration of at least 2s, got %s", c.Duration)
	case c.BackoffBase < 0 || c.FaultEvery < 0 || c.Downtime < 0 || c.DrainTimeout < 0:
		return c, fmt.Errorf("chaos: durations must not be negative; got a backoff base of %s, a fault period of %s, a downtime of %s and a drain timeout of %s",
			c.BackoffBase, c.FaultEvery, c.Downtime, c.DrainTimeout)
	case c.Restarts < 0 || c.CommitCuts < 0 || c.BadInputRounds < 0:
		return c, fmt.Errorf("chaos: counts must not be negative; got %d restarts, %d commit cuts and %d bad-input rounds",
			c.Restarts, c.CommitCuts, c.BadInputRounds)
	case c.Scenario == Restart && c.DatabaseURL != "":
		return c, errors.New("chaos: the restart scenario runs on a private cluster, not on DatabaseURL")
	}
	return c, nil
}

// scenarioRun is the state of one scenario run.
type scenarioRun struct {
	cfg Config
	log *slog.Logger

	rngMu sync.Mutex
	rng   *rand.Rand

	cluster *harness.Cluster  // the restart scenario's private server
	d       *harness.Database // the run's database and the harness's pool
	q       *labdb.Queries
	dbURL   string // the workers' direct URL
	ownsDB  bool
	// bouncer is the pgbouncer scenario's pooler, and pooledURL the run's
	// database through it.
	bouncer   *pgbouncer.Bouncer
	pooledURL string

	logDir  string
	procs   *harness.Procs
	server  *harness.Proc
	apiBase string
	token   string

	mu         sync.Mutex
	workers    []*workerProc // every worker started, in order
	nextWorker int
	runCtx     context.Context
	stopping   atomic.Bool

	ledger     *enqueueLedger
	faultCount atomic.Int64
	http       *httpStats
	progress   *harness.Progress

	details faultLog
}

// workerProc is one chaos worker process.
type workerProc struct {
	id    string
	proc  *harness.Proc
	proxy *faultproxy.Proxy // the partition scenario's, else nil
	// leaseOnly is set for a worker of the pgbouncer scenario without a
	// session: only its leases tell when it died.
	leaseOnly bool
	// killed is set before the harness kills the process on purpose.
	killed atomic.Bool
}

// Run runs one scenario: it sets up a database (a private cluster for
// the restart scenario), starts the workers (and the API where the
// scenario needs it), enqueues the workload while injecting the faults,
// waits for every job to finish, stops everything, checks the recorded
// history and returns the result. It writes the result to cfg.OutDir if
// set. The error reports a failure of the harness itself; a broken
// invariant is in the result (Result.Passed).
func Run(ctx context.Context, cfg Config) (_ *Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	r := &scenarioRun{
		cfg:    cfg,
		log:    cfg.Logger.With("scenario", string(cfg.Scenario)),
		rng:    rand.New(rand.NewPCG(cfg.Seed, uint64(len(cfg.Scenario)))),
		http:   &httpStats{},
		runCtx: ctx,
	}
	started := time.Now()
	defer func() {
		if cerr := r.cleanup(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	if err := r.setupDatabase(ctx); err != nil {
		return nil, err
	}
	env := harness.CollectEnvironment(ctx, r.d, cfg.RelayBin)
	var cleanLogs func()
	if r.logDir, cleanLogs, err = harness.LogDirFor(cfg.LogDir, "relay-chaos-"); err != nil {
		return nil, err
	}
	defer cleanLogs()
	r.procs = harness.NewProcs(cfg.RelayBin, r.logDir)
	r.ledger = newLedger(r.q)

	if err := r.startProcesses(ctx); err != nil {
		return nil, err
	}
	res, err := r.run(ctx, started)
	if err != nil {
		return nil, err
	}
	res.Environment = env
	res.Environment.LoadAverageEnd = harness.LoadAverage()
	if cfg.OutDir != "" {
		base, err := harness.ResultBase(cfg.OutDir, "chaos-"+string(cfg.Scenario), started)
		if err != nil {
			return nil, err
		}
		res.File = base + ".json"
		if err := harness.WriteJSON(res.File, res); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// setupDatabase creates the run's database and adds the chaos schema.
func (r *scenarioRun) setupDatabase(ctx context.Context) error {
	admin := r.cfg.AdminURL
	if r.cfg.Scenario == Restart {
		// A private cluster with PostgreSQL's defaults: durable commits,
		// since the scenario checks that acknowledged enqueues survive a
		// crash of the server.
		cluster, err := harness.StartCluster(ctx, r.log)
		if err != nil {
			return fmt.Errorf("chaos: the restart scenario needs a private PostgreSQL cluster: %w", err)
		}
		r.cluster = cluster
		admin = cluster.URL()
	}
	if r.cfg.DatabaseURL != "" {
		d, err := openDatabase(ctx, r.cfg.DatabaseURL)
		if err != nil {
			return err
		}
		r.d = d
	} else {
		d, err := harness.CreateDatabase(ctx, admin, "relay_chaos_")
		if err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
		r.d, r.ownsDB = d, true
	}
	r.q = r.d.Lab
	r.dbURL = r.d.URL
	if r.cfg.Scenario == PgBouncer {
		b, err := pgbouncer.Start(ctx, r.dbURL, pgbouncer.Options{PoolMode: pgbouncer.PoolModeTransaction, PoolSize: pgBouncerPoolSize})
		if err != nil {
			return fmt.Errorf("chaos: the pgbouncer scenario needs PgBouncer: %w", err)
		}
		r.bouncer = b
		r.pooledURL = b.URL(r.d.Name)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if _, err := r.d.Pool.Exec(sctx, schema.Chaos); err != nil {
		return fmt.Errorf("chaos: add the chaos schema: %w", err)
	}
	return nil
}

// openDatabase opens a pool on an existing database, for DatabaseURL.
func openDatabase(ctx context.Context, dsn string) (*harness.Database, error) {
	pool, err := harness.OpenPool(ctx, dsn, "relay experiment chaos", harness.PoolSize, 0)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	name := ""
	if u, err := url.Parse(dsn); err == nil {
		name = strings.TrimPrefix(u.Path, "/")
	}
	return &harness.Database{Name: name, URL: dsn, Pool: pool, Q: db.New(pool), Lab: labdb.New(pool)}, nil
}

// pgBouncerPoolSize is the number of server connections the
// pgbouncer scenario's pooler keeps for the run's database.
const pgBouncerPoolSize = 20

// needsServer reports whether the scenario talks to the HTTP API.
func (r *scenarioRun) needsServer() bool {
	return r.cfg.Scenario == Restart || r.cfg.Scenario == BadInput || r.cfg.Scenario == PgBouncer
}

// statementURL is where the workers and the API send their statements:
// through the pooler in the pgbouncer scenario, else to the database.
func (r *scenarioRun) statementURL() string {
	if r.pooledURL != "" {
		return r.pooledURL
	}
	return r.dbURL
}

// startProcesses starts the workers, and the API if the scenario needs it,
// and waits until they are ready.
func (r *scenarioRun) startProcesses(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var ids []string
	var leaseOnly []*workerProc
	for range r.cfg.Workers {
		w, err := r.startWorker(ctx)
		if err != nil {
			return err
		}
		if w.leaseOnly {
			leaseOnly = append(leaseOnly, w)
			continue
		}
		ids = append(ids, w.id)
	}
	if err := harness.WaitWorkers(ctx, r.d.Q, r.procs, ids...); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	// A worker without a session registers none: it is ready once it has
	// found out that it runs on leases alone.
	for _, w := range leaseOnly {
		if _, err := w.proc.WaitLog(ctx, func(l harness.LogLine) bool {
			return strings.Contains(l.Msg, "goes through a connection pooler")
		}); err != nil {
			return fmt.Errorf("chaos: wait for %s to start without a session: %w", w.id, err)
		}
	}
	if r.needsServer() {
		args := []string{"--database-url", r.statementURL(), "--shutdown-timeout", "5s"}
		if r.cfg.Scenario == BadInput {
			r.token = fmt.Sprintf("chaos-token-%d", r.randN(1<<30))
			args = append(args, "--api-token", r.token)
		}
		p, base, err := harness.StartServe(ctx, r.procs, "serve", args...)
		if err != nil {
			return fmt.Errorf("chaos: start relay serve: %w", err)
		}
		r.server, r.apiBase = p, base
	}
	return nil
}

// startWorker starts a new chaos worker process with a fresh id, and
// watches it: a worker killed by a chaos_exit job, or one that dies
// unexpectedly, is replaced.
func (r *scenarioRun) startWorker(ctx context.Context) (*workerProc, error) {
	r.mu.Lock()
	r.nextWorker++
	n := r.nextWorker
	r.mu.Unlock()
	id := fmt.Sprintf("w%d", n)

	w := &workerProc{id: id}
	workerURL := r.statementURL()
	var extra []string
	if r.cfg.Scenario == PgBouncer {
		// Odd workers keep a session on PostgreSQL itself.
		if n%2 == 1 {
			extra = append(extra, "--session-database-url", r.dbURL)
		} else {
			w.leaseOnly = true
		}
	}
	if r.cfg.Scenario == Partition {
		target, err := pgurl.HostPort(r.dbURL)
		if err != nil {
			return nil, fmt.Errorf("chaos: the partition scenario needs the server's TCP host and port in %s: %w", pgurl.Redact(r.dbURL), err)
		}
		if w.proxy, err = faultproxy.Start(target); err != nil {
			return nil, fmt.Errorf("chaos: start the fault proxy of %s: %w", id, err)
		}
		if workerURL, err = pgurl.WithHostPort(r.dbURL, w.proxy.Addr()); err != nil {
			w.proxy.Close()
			return nil, fmt.Errorf("chaos: point worker %s at its fault proxy: %w", id, err)
		}
	}
	args := append(slices.Clone(r.cfg.WorkerArgs),
		"--database-url", workerURL,
		"--record-database-url", r.dbURL,
		"--id", id,
		"--slots", strconv.Itoa(r.cfg.Slots),
		"--lease", r.cfg.Lease.String(),
		"--heartbeat", r.cfg.Heartbeat.String(),
		"--backoff-base", r.cfg.BackoffBase.String(),
		"--shutdown-grace", "3s",
		"--handler-pool-size", strconv.Itoa(DefaultHandlerPoolSize),
		"--log-format", "json",
	)
	args = append(args, extra...)
	// Started under the lock, and not at all once cleanup began, so that
	// cleanup, which sets stopping under the same lock, stops every worker.
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping.Load() {
		if w.proxy != nil {
			w.proxy.Close()
		}
		return nil, errors.New("chaos: not starting a worker: the run is stopping")
	}
	p, err := r.procs.StartBin(ctx, r.cfg.WorkerBin, id, args...)
	if err != nil {
		if w.proxy != nil {
			w.proxy.Close()
		}
		return nil, fmt.Errorf("chaos: start worker %s: %w", id, err)
	}
	w.proc = p
	r.workers = append(r.workers, w)
	go r.watch(w)
	return w, nil
}

// watch replaces a worker that exits without the harness asking it to.
func (r *scenarioRun) watch(w *workerProc) {
	<-w.proc.Done()
	if r.stopping.Load() || w.killed.Load() {
		return
	}
	code := -1
	var exitErr *exec.ExitError
	if err := w.proc.ExitErr(); err == nil {
		code = 0
	} else if errors.As(err, &exitErr) {
		code = exitErr.ExitCode()
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.runCtx), 30*time.Second)
	defer cancel()
	if code != ExitCode {
		lines, _ := w.proc.Logs()
		r.log.Error("worker died unexpectedly", "worker", w.id, "status", code, "log", harness.Tail(lines, 5))
		r.mu.Lock()
		r.details.crashes = append(r.details.crashes, fmt.Sprintf("%s exited with status %d", w.id, code))
		r.mu.Unlock()
		r.recordFault(ctx, "crash", w.id, w.proc.PID(), fmt.Sprintf("exited with status %d", code))
	} else {
		r.mu.Lock()
		r.details.selfExits++
		r.mu.Unlock()
	}
	if r.runCtx.Err() != nil || r.stopping.Load() {
		return
	}
	if _, err := r.startWorker(ctx); err != nil {
		r.log.Error("replace a worker", "err", err)
	}
}

// worker returns the worker with id, or nil.
func (r *scenarioRun) worker(id string) *workerProc {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range r.workers {
		if w.id == id {
			return w
		}
	}
	return nil
}

// liveWorkers returns the workers whose process runs, not killed.
func (r *scenarioRun) liveWorkers() []*workerProc {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*workerProc
	for _, w := range r.workers {
		if !w.proc.Exited() && !w.killed.Load() {
			out = append(out, w)
		}
	}
	return out
}

// recordFault records a fault in chaos_faults, at the database's clock,
// and returns its id, for endFault. A failure is logged, not returned, and
// the id is then 0: the fault happens anyway (the restart scenario records
// faults while the database is coming back).
func (r *scenarioRun) recordFault(ctx context.Context, kind, target string, pid int, detail string) int64 {
	for attempt := 0; ; attempt++ {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		id, err := r.q.ChaosFaultRecord(fctx, labdb.ChaosFaultRecordParams{Kind: kind, Target: target, PID: int32(pid), Detail: detail})
		cancel()
		if err == nil {
			r.faultCount.Add(1)
			r.log.Info("fault", "kind", kind, "target", target, "detail", detail)
			return id
		}
		if attempt == 2 || ctx.Err() != nil {
			r.log.Error("record a fault", "kind", kind, "target", target, "err", err)
			return 0
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// endFault records that a lasting fault was healed.
func (r *scenarioRun) endFault(ctx context.Context, id int64) {
	if id == 0 {
		return
	}
	for attempt := 0; attempt < 50; attempt++ {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := r.q.ChaosFaultEnd(fctx, id)
		cancel()
		if err == nil || ctx.Err() != nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// randN returns a random number in [0, n).
func (r *scenarioRun) randN(n int) int {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return r.rng.IntN(n)
}

// jitter spreads d by ±20%.
func (r *scenarioRun) jitter(d time.Duration) time.Duration {
	spread := int(d / 5)
	if spread <= 0 {
		return d
	}
	return d - time.Duration(spread) + time.Duration(r.randN(2*spread))
}

// cleanup stops every process and proxy and removes what the run created.
func (r *scenarioRun) cleanup() error {
	r.mu.Lock()
	r.stopping.Store(true)
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var errs []error
	if r.procs != nil {
		_ = r.procs.StopAll(ctx, 5*time.Second)
		r.procs.KillAll()
	}
	r.mu.Lock()
	workers := slices.Clone(r.workers)
	r.mu.Unlock()
	for _, w := range workers {
		if w.proxy != nil {
			w.proxy.Close()
		}
	}
	if r.cluster != nil {
		// Make sure the server runs, so that the database can be dropped
		// (Stop removes it all anyway).
		_ = r.cluster.StartServer(ctx)
	}
	if r.d != nil {
		if r.ownsDB {
			if err := r.d.Drop(ctx); err != nil && r.cluster == nil {
				errs = append(errs, err)
			}
		} else {
			r.d.Pool.Close()
		}
	}
	if r.bouncer != nil {
		if err := r.bouncer.Close(); err != nil {
			errs = append(errs, fmt.Errorf("chaos: stop PgBouncer: %w", err))
		}
	}
	if r.cluster != nil {
		if err := r.cluster.Stop(ctx); err != nil {
			errs = append(errs, fmt.Errorf("chaos: remove the private cluster: %w", err))
		}
	}
	return errors.Join(errs...)
}
