// Package soak is the soak experiment: a steady offered load of short
// jobs, enqueued at a set rate, through phases that a production queue
// meets: clean; a session idle in a transaction; REPEATABLE READ readers
// that count the jobs table in long transactions; 1.5 times the load; and
// recovery. The two middle phases pin PostgreSQL's xmin horizon, so that
// vacuum can reclaim no row version that died after they began. Every
// Config.Interval it samples the completion rate, the pickup latency
// (ready to claimed), the backlog, the size and dead rows of every table
// and index, the WAL written and the horizon's age. Run runs it on a
// private PostgreSQL cluster with PostgreSQL's defaults (autovacuum on),
// or on a given server; `relaylab soak` is its command.
//
// The queue under test is a System: Relay's (NewRelay) runs relay work
// processes of the shipped binary and reads its job rows with the
// statements of queries/lab/soak.sql; another queue can be soaked the same
// way by implementing System.
package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/builtin"
)

// PhaseKind is what a phase does beside the steady load.
type PhaseKind string

// The phases of a soak, in the order they run.
const (
	// PhaseClean is the steady load alone.
	PhaseClean PhaseKind = "clean"
	// PhaseIdleInTransaction adds a session that began a transaction, took
	// a transaction id and stays idle until the phase ends.
	PhaseIdleInTransaction PhaseKind = "idle-in-transaction"
	// PhaseRepeatableRead adds Config.Readers sessions, each in one
	// REPEATABLE READ transaction for the whole phase, counting the jobs
	// table every Config.ReaderInterval.
	PhaseRepeatableRead PhaseKind = "repeatable-read"
	// PhaseOverload offers Config.OverloadFactor times the load.
	PhaseOverload PhaseKind = "overload"
	// PhaseRecovery is the steady load alone again.
	PhaseRecovery PhaseKind = "recovery"
)

// Kinds lists the phases in the order they run.
var Kinds = []PhaseKind{PhaseClean, PhaseIdleInTransaction, PhaseRepeatableRead, PhaseOverload, PhaseRecovery}

// Defaults: five phases of five minutes, 25 minutes in all.
const (
	DefaultPhaseDuration  = 5 * time.Minute
	DefaultRate           = 500
	DefaultOverloadFactor = 1.5
	DefaultReaders        = 4
	DefaultReaderInterval = 100 * time.Millisecond
	DefaultInterval       = 5 * time.Second
	DefaultJobMs          = 1
)

// MaxNice is the highest nice value, the lowest CPU priority, that
// Config.ReadersNice can give.
const MaxNice = 19

// DefaultWorkers is two relay work processes of 10 slots each.
var DefaultWorkers = harness.ProcSlots{Procs: 2, Slots: 10}

// Config configures a soak. Zero fields take the defaults named in their
// comments.
type Config struct {
	// AdminURL is the PostgreSQL server on which the run's database is
	// created. Empty: a private cluster that the run starts, with
	// PostgreSQL's defaults, and removes at the end.
	AdminURL string
	// RelayBin is the relay binary that runs `work`. Required.
	RelayBin string
	// OutDir receives the JSON result and the chart. Empty: nothing is
	// written.
	OutDir string
	// LogDir receives the processes' logs. Empty: a temporary directory,
	// removed at the end.
	LogDir string
	// Phases is how long each phase runs, by kind; a kind left out, or
	// given zero, runs DefaultPhaseDuration, and a negative duration leaves
	// the phase out.
	Phases map[PhaseKind]time.Duration
	// Rate is the offered load, in jobs per second. Default DefaultRate.
	Rate float64
	// OverloadFactor multiplies Rate in the overload phase. Default
	// DefaultOverloadFactor.
	OverloadFactor float64
	// Readers is how many REPEATABLE READ readers run in their phase.
	// Default DefaultReaders.
	Readers int
	// ReaderInterval is how often each reader counts the jobs. Default
	// DefaultReaderInterval.
	ReaderInterval time.Duration
	// ReadersNice, from 1 to 19, is the nice value each reader gives its
	// backend's process for the phase, so that the readers yield the CPU
	// to everything else: which shows how much of what they cost the queue
	// is their share of the CPU. It needs the private cluster, which runs
	// on this host: not an AdminURL. Zero leaves the backends as they are.
	ReadersNice int
	// ReadersApart has the readers count a table of their own in place of
	// the queue's: the jobs table of a database of their own on the same
	// server, filled as the phase starts with waiting jobs until a count
	// of it takes as long as a count of the queue's job table then. Their
	// snapshots then hold back no horizon of the queue's database, and no
	// page they read is one the queue writes: what they still cost the
	// queue is the load of their scans on the server and the machine.
	ReadersApart bool
	// Interval is how often the soak samples. Default DefaultInterval.
	Interval time.Duration
	// Workers is the relay work processes and their slots. Default
	// DefaultWorkers.
	Workers harness.ProcSlots
	// JobMs is how long each job runs (a builtin sleep job). Default
	// DefaultJobMs.
	JobMs int64
	// RetainSucceeded is how long the workers keep a succeeded job before
	// they delete it, as the result records it. Zero: the system's default
	// (a day for Relay and River). The default system, Relay, passes it to
	// relay work's --retain-succeeded; a NewSystem given must give its own
	// workers the same (RiverConfig.RetainCompleted). It must leave every
	// job in the table until the sample that counts it has read it: at
	// least MinRetainSucceeded(Interval).
	RetainSucceeded time.Duration
	// NewSystem returns the queue under test on the run's database.
	// Default: Relay (NewRelay).
	NewSystem func(d *harness.Database, logDir string) System
	// Progress receives progress lines. Nil: none.
	Progress io.Writer
	// Logger receives the private cluster's log lines. Nil: discarded.
	Logger *slog.Logger
}

// countsApart reports whether the readers run, and count a table apart.
func (c Config) countsApart() bool {
	return c.ReadersApart && c.Phases[PhaseRepeatableRead] >= 0
}

func (c Config) withDefaults() (Config, error) {
	if c.RelayBin == "" && c.NewSystem == nil {
		return c, errors.New("soak: no relay binary given")
	}
	phases := make(map[PhaseKind]time.Duration, len(Kinds))
	for _, k := range Kinds {
		d := c.Phases[k]
		if d == 0 {
			d = DefaultPhaseDuration
		}
		phases[k] = d
	}
	for k := range c.Phases {
		if _, ok := phases[k]; !ok {
			return c, fmt.Errorf("soak: unknown phase %q", k)
		}
	}
	c.Phases = phases
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.OverloadFactor == 0 {
		c.OverloadFactor = DefaultOverloadFactor
	}
	if c.Readers == 0 {
		c.Readers = DefaultReaders
	}
	if c.ReaderInterval == 0 {
		c.ReaderInterval = DefaultReaderInterval
	}
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Workers == (harness.ProcSlots{}) {
		c.Workers = DefaultWorkers
	}
	if c.JobMs == 0 {
		c.JobMs = DefaultJobMs
	}
	switch {
	case c.Rate <= 0 || math.IsInf(c.Rate, 0) || math.IsNaN(c.Rate):
		return c, fmt.Errorf("soak: the rate must be positive, got %v", c.Rate)
	case c.OverloadFactor <= 0:
		return c, fmt.Errorf("soak: the overload factor must be positive, got %v", c.OverloadFactor)
	case c.ReadersNice < 0 || c.ReadersNice > MaxNice:
		return c, fmt.Errorf("soak: the readers' nice value must be from 0 to %d, got %d", MaxNice, c.ReadersNice)
	case c.ReadersNice > 0 && c.AdminURL != "":
		return c, errors.New("soak: the readers' nice value needs the private cluster, on this host, not a server given by its URL")
	case c.Readers < 1 || c.ReaderInterval <= 0:
		return c, fmt.Errorf("soak: want at least one reader and a positive reader interval, got %d and %s", c.Readers, c.ReaderInterval)
	case c.Interval <= windowLag:
		return c, fmt.Errorf("soak: the sampling interval must be longer than %s, got %s", windowLag, c.Interval)
	case c.Workers.Procs < 1 || c.Workers.Slots < 1:
		return c, fmt.Errorf("soak: want at least one worker of one slot, got %s", c.Workers)
	case c.JobMs < 0 || c.JobMs > builtin.MaxSleepMs:
		return c, fmt.Errorf("soak: the job duration must be from 0 to %d ms, got %d", builtin.MaxSleepMs, c.JobMs)
	case c.RetainSucceeded != 0 && c.RetainSucceeded < MinRetainSucceeded(c.Interval):
		return c, fmt.Errorf("soak: a succeeded job must be kept at least %s, twice the sampling interval and the window's lag, "+
			"or it may be deleted before the sample that counts it; got %s", MinRetainSucceeded(c.Interval), c.RetainSucceeded)
	}
	if c.NewSystem == nil {
		rc := RelayConfig{Bin: c.RelayBin, Workers: c.Workers, JobMs: c.JobMs, RetainSucceeded: c.RetainSucceeded}
		c.NewSystem = func(d *harness.Database, logDir string) System {
			rc := rc
			rc.Database, rc.LogDir = d, logDir
			return NewRelay(rc)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

// MinRetainSucceeded is the shortest retention of succeeded jobs a soak
// sampling every interval accepts: a job finished just after a window
// began is read interval plus the window's lag later, and twice that
// leaves the workers' prune, which runs on a schedule of its own, room to
// be late without deleting a job too soon.
func MinRetainSucceeded(interval time.Duration) time.Duration {
	return 2 * (interval + windowLag)
}

// rate is the offered load of a phase of kind k.
func (c Config) rate(k PhaseKind) float64 {
	if k == PhaseOverload {
		return c.Rate * c.OverloadFactor
	}
	return c.Rate
}

// Result is the record of one soak: its settings, the environment, each
// phase's summary and every sample.
type Result struct {
	Experiment  string              `json:"experiment"`
	Environment harness.Environment `json:"environment"`
	// Server says where the run's database was: "private cluster" or
	// "given server".
	Server   string    `json:"server"`
	System   string    `json:"system"`
	Settings Settings  `json:"settings"`
	Phases   []Phase   `json:"phases"`
	Samples  []Sample  `json:"samples"`
	Files    []string  `json:"files,omitempty"`
	start    time.Time // the run's start, database clock
	// startAutovacuums is the autovacuum runs of every table at the
	// run's start, from which the first phase counts its own.
	startAutovacuums int64
	phaseAt          []phaseSpan
}

// Settings are the run's settings as given, defaults applied.
type Settings struct {
	RatePerSec       float64            `json:"rate_per_s"`
	OverloadFactor   float64            `json:"overload_factor"`
	Readers          int                `json:"readers"`
	ReaderIntervalMs float64            `json:"reader_interval_ms"`
	IntervalS        float64            `json:"interval_s"`
	WindowLagS       float64            `json:"window_lag_s"`
	Workers          string             `json:"workers"`
	JobKind          string             `json:"job_kind"`
	JobMs            int64              `json:"job_ms"`
	PhaseSeconds     map[string]float64 `json:"phase_s"`
	// RetainSucceededS is how long the workers kept a succeeded job, in
	// seconds; absent, the system's default.
	RetainSucceededS float64 `json:"retain_succeeded_s,omitempty"`
	// ReadersNice is the nice value the readers gave their backends
	// (Config.ReadersNice); absent, none.
	ReadersNice int `json:"readers_nice,omitempty"`
	// ReadersApart is whether the readers counted a table apart
	// (Config.ReadersApart); the table's size is in the phase's readers.
	ReadersApart bool `json:"readers_apart,omitempty"`
}

// phaseSpan places a phase on the database clock.
type phaseSpan struct {
	kind       PhaseKind
	start, end time.Time
}

// producerTick is how often the producer enqueues what is due.
const producerTick = 10 * time.Millisecond

// Run runs a soak and writes its result and chart under cfg.OutDir.
func Run(ctx context.Context, cfg Config) (_ *Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	logDir, cleanLogs, err := harness.LogDirFor(cfg.LogDir, "relay-soak-logs-")
	if err != nil {
		return nil, err
	}
	defer cleanLogs()
	prog := harness.NewProgress(cfg.Progress, "soak", 0)

	res := &Result{Experiment: "soak", Server: "given server", Settings: settingsOf(cfg)}
	admin := cfg.AdminURL
	if admin == "" {
		prog.Note("starting a private PostgreSQL cluster")
		cluster, err := harness.StartCluster(ctx, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("soak: %w", err)
		}
		defer cluster.StopAtEnd(ctx, &err)
		admin, res.Server = cluster.URL(), "private cluster"
	}
	prog.Note("creating and migrating a database")
	d, err := harness.CreateDatabase(ctx, admin, "relay_exp_soak_")
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	defer d.DropAtEnd(ctx, &err)
	res.Environment = harness.CollectEnvironment(ctx, d, cfg.RelayBin)

	sys := cfg.NewSystem(d, logDir)
	res.System = sys.Name()
	prog.Note("starting %s workers (%s)", sys.Name(), cfg.Workers)
	if err := sys.Start(ctx); err != nil {
		return nil, fmt.Errorf("soak: start the workers: %w", err)
	}
	defer func() {
		if stopErr := sys.Stop(context.WithoutCancel(ctx)); stopErr != nil && err == nil {
			err = fmt.Errorf("soak: %w", stopErr)
		}
	}()
	// The sessions that pin the horizon have a pool of their own, so that
	// they never wait for one of the sampler's or the producer's.
	pinPool, err := harness.OpenPool(ctx, d.URL, pinApplicationName, int32(cfg.Readers+1), 0)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	defer pinPool.Close()
	var apart *apartTable
	if cfg.countsApart() {
		prog.Note("creating the readers' database apart")
		if apart, err = openApart(ctx, admin, cfg.Readers); err != nil {
			return nil, fmt.Errorf("soak: %w", err)
		}
		defer apart.closeAtEnd(ctx, &err)
	}

	if res.start, err = d.Now(ctx); err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	smp, err := newSampler(ctx, sys, d.Lab, res.start)
	if err != nil {
		return nil, fmt.Errorf("soak: %w", err)
	}
	res.startAutovacuums = smp.startAutovacuums
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var (
		sampleErr error
		samplesMu sync.Mutex
		sampled   = make(chan struct{})
		current   = string(PhaseClean)
	)
	go func() {
		defer close(sampled)
		tick := time.NewTicker(cfg.Interval)
		defer tick.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
			s, err := smp.take(sampleCtx)
			if err == nil {
				err = sys.CheckRunning()
			}
			if err != nil {
				if sampleCtx.Err() == nil {
					sampleErr = err
					stopSampling()
				}
				return
			}
			samplesMu.Lock()
			s.Phase = current
			res.Samples = append(res.Samples, s)
			samplesMu.Unlock()
			prog.Note("%6.0fs %-20s offered %6.0f/s done %6.0f/s pickup p95 %8.1f ms backlog %6d dead %8d horizon %7d xids",
				s.At, s.Phase, s.EnqueuedPerSec, s.SucceededPerSec, s.Pickup.P95, s.Backlog.Ready, s.DeadTuples, s.HorizonAge)
		}
	}()

	phaseErr := func() error {
		for _, kind := range Kinds {
			dur := cfg.Phases[kind]
			if dur < 0 {
				continue
			}
			samplesMu.Lock()
			current = string(kind)
			samplesMu.Unlock()
			span, stats, err := runPhase(sampleCtx, cfg, kind, dur, sys, d, pinPool, apart)
			if err != nil {
				return fmt.Errorf("phase %s: %w", kind, err)
			}
			res.phaseAt = append(res.phaseAt, span)
			res.Phases = append(res.Phases, Phase{Kind: string(kind), RatePerSec: cfg.rate(kind),
				Readers: stats.readers, IdleXID: stats.idleXID, EnqueueOwedMax: stats.owedMax})
		}
		return nil
	}()
	stopSampling()
	<-sampled
	// A failed sample stops the phases through sampleCtx: its error is
	// the cause.
	if sampleErr != nil {
		return nil, fmt.Errorf("soak: sample: %w", sampleErr)
	}
	if phaseErr != nil {
		return nil, fmt.Errorf("soak: %w", phaseErr)
	}
	res.Environment.LoadAverageEnd = harness.LoadAverage()
	res.summarise()
	prog.Finish("done")

	if cfg.OutDir != "" {
		if err := res.write(cfg.OutDir); err != nil {
			return res, err
		}
	}
	return res, nil
}

// phaseStats is what a phase's own goroutines report of it.
type phaseStats struct {
	readers *ReaderStats
	idleXID int64
	owedMax int
}

// runPhase runs one phase: the load at its rate for dur, and beside it
// whatever pins the horizon, in place before the phase's clock starts and
// ended when it stops. With apart, the readers count its table in place
// of the system's, filled first until a count of it takes as long as one
// of the system's (apartTable.fill).
func runPhase(ctx context.Context, cfg Config, kind PhaseKind, dur time.Duration, sys System, d *harness.Database, pinPool *pgxpool.Pool, apart *apartTable) (span phaseSpan, stats phaseStats, err error) {
	span.kind = kind
	pinCtx, unpin := context.WithCancel(ctx)
	defer unpin()
	var (
		pinned  = make(chan struct{})
		pinDone = make(chan error, 1)
		// Set by the readers' goroutine before it sends on pinDone.
		readers *ReaderStats
	)
	switch kind {
	case PhaseIdleInTransaction:
		xid := make(chan int64, 1)
		go func() { pinDone <- holdIdleTransaction(pinCtx, pinPool, xid) }()
		select {
		case stats.idleXID = <-xid:
		case err := <-pinDone:
			return span, stats, err
		}
	case PhaseRepeatableRead:
		pool, count := pinPool, sys.CountJobs
		var filled *ApartStats
		if apart != nil {
			if filled, err = apart.fill(ctx, d.Lab, sys.CountJobs, sys.JobTable()); err != nil {
				return span, stats, err
			}
			// The fill writes tens of megabytes of WAL, which its session
			// reports as it ends. Waiting a sampling interval before the
			// phase starts leaves them to a sample of the gap, and the
			// phase's summary leaves the gap's windows out (Result.within).
			select {
			case <-ctx.Done():
				return span, stats, ctx.Err()
			case <-time.After(cfg.Interval):
			}
			pool, count = apart.pool, countRelayJobs
		}
		go func() {
			rs, err := runReaders(pinCtx, pool, count, cfg.Readers, cfg.ReaderInterval, cfg.ReadersNice, pinned)
			rs.Apart = filled
			readers = &rs
			pinDone <- err
		}()
		select {
		case <-pinned:
		case err := <-pinDone:
			return span, stats, err
		}
	default:
		pinDone <- nil
	}
	// The pinning goroutine ends with the phase, on every path.
	defer func() {
		unpin()
		if pinErr := <-pinDone; pinErr != nil && err == nil {
			err = pinErr
		}
		stats.readers = readers
	}()
	if span.start, err = d.Now(ctx); err != nil {
		return span, stats, err
	}
	stats.owedMax, err = produce(ctx, sys, cfg.rate(kind), dur)
	if err != nil {
		return span, stats, err
	}
	span.end, err = d.Now(ctx)
	return span, stats, err
}

// produce enqueues jobs at rate for dur, every producerTick what has come
// due since the last, and returns the most it owed at once: a producer
// that cannot keep up owes more than a tick's worth.
func produce(ctx context.Context, sys System, rate float64, dur time.Duration) (owedMax int, err error) {
	start := time.Now()
	tick := time.NewTicker(producerTick)
	defer tick.Stop()
	for done := 0; ; {
		elapsed := min(time.Since(start), dur)
		if n := int(rate*elapsed.Seconds()) - done; n > 0 {
			owedMax = max(owedMax, n)
			if err := sys.Enqueue(ctx, n); err != nil {
				return owedMax, fmt.Errorf("enqueue %d jobs: %w", n, err)
			}
			done += n
		}
		if elapsed >= dur {
			return owedMax, nil
		}
		select {
		case <-ctx.Done():
			return owedMax, ctx.Err()
		case <-tick.C:
		}
	}
}

func settingsOf(cfg Config) Settings {
	s := Settings{
		RatePerSec: cfg.Rate, OverloadFactor: cfg.OverloadFactor, Readers: cfg.Readers, ReadersNice: cfg.ReadersNice,
		ReadersApart:     cfg.countsApart(),
		ReaderIntervalMs: harness.Millis(cfg.ReaderInterval), IntervalS: cfg.Interval.Seconds(),
		WindowLagS: windowLag.Seconds(), Workers: cfg.Workers.String(),
		JobKind: builtin.KindSleep, JobMs: cfg.JobMs, PhaseSeconds: map[string]float64{},
		RetainSucceededS: cfg.RetainSucceeded.Seconds(),
	}
	for k, d := range cfg.Phases {
		if d >= 0 {
			s.PhaseSeconds[string(k)] = d.Seconds()
		}
	}
	return s
}
