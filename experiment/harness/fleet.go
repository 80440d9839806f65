package harness

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/internal/builtin"
)

// FleetConfig describes a fleet: relay work processes beside an
// experiment's own, on a queue of their own, which show what many live
// workers cost the rest. The fleet idles, unless Rate puts a steady load
// of jobs on its queue.
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
	// Rate, when positive, keeps the fleet busy: that many jobs a second
	// are put on Queue from the fleet's start until Fleet.Load, each in a
	// transaction of its own, as one-job requests to relay serve would be.
	Rate float64
	// JobDuration is how long each of those jobs sleeps. Default
	// DefaultFleetJob.
	JobDuration time.Duration
}

// DefaultFleetJob is how long each job of a busy fleet sleeps, unless
// FleetConfig.JobDuration says otherwise.
const DefaultFleetJob = 10 * time.Millisecond

// Fleet start-up and shutdown bounds: each worker is given a quarter of a
// second on top of fleetStartup to register, and fleetStopGrace to stop.
const (
	fleetStartup   = 30 * time.Second
	fleetStopGrace = 5 * time.Second
)

// fleetSenders bounds the jobs being put on a busy fleet's queue at once:
// when the database takes longer than fleetSenders jobs' intervals to
// accept one, the load falls behind its schedule (FleetLoad.MaxLagMs).
const fleetSenders = 8

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

// CheckFleetLoad says what is wrong with a load of rate jobs a second,
// each sleeping job (zero: DefaultFleetJob), on a fleet of size workers,
// as an experiment's configuration gives them (a rate of zero: an idle
// fleet), or nil.
func CheckFleetLoad(size int, rate float64, job time.Duration) error {
	switch {
	case math.IsNaN(rate) || math.IsInf(rate, 0) || rate < 0 || job < 0:
		return fmt.Errorf("the fleet's rate and job must be finite and not negative, got %g/s and %s", rate, job)
	case rate > 0 && rate < minFleetRate:
		return fmt.Errorf("a fleet's rate must be at least %g jobs/s, got %g", minFleetRate, rate)
	case rate > 0 && size == 0:
		return fmt.Errorf("a load of %g jobs/s for no fleet: give the fleet's size too", rate)
	case job > 0 && rate == 0:
		return fmt.Errorf("a job of %s for an idle fleet: give the fleet's rate too", job)
	case job%time.Millisecond != 0 || job.Milliseconds() > builtin.MaxSleepMs:
		return fmt.Errorf("the fleet's job must be whole milliseconds, at most %d, got %s", builtin.MaxSleepMs, job)
	}
	return nil
}

// minFleetRate is the lowest rate of jobs a busy fleet is offered: one a
// hundred seconds.
const minFleetRate = 0.01

// Fleet is a running fleet (StartFleet).
type Fleet struct {
	// Pooler is the PgBouncer the fleet's pools go through, nil without
	// one.
	Pooler *PoolerInfo

	stop func()
	load *fleetLoad
}

// Stop stops the load, if any, the fleet and its pooler. It is to be
// deferred.
func (f *Fleet) Stop() {
	if f.load != nil {
		f.load.end()
	}
	f.stop()
}

// FleetLoad is what became of the jobs put on a busy fleet's queue.
type FleetLoad struct {
	// RatePerSec is the rate offered, and JobKind and JobMs the jobs.
	RatePerSec float64 `json:"rate_per_s"`
	JobKind    string  `json:"job_kind"`
	JobMs      float64 `json:"job_ms"`
	// Seconds is how long the load ran.
	Seconds float64 `json:"seconds"`
	// Enqueued counts the jobs the database accepted, EnqueueErrors the
	// inserts that failed, and FirstError says why the first did.
	Enqueued      int64  `json:"enqueued"`
	EnqueueErrors int64  `json:"enqueue_errors"`
	FirstError    string `json:"first_error,omitempty"`
	// MaxLagMs is how far behind its schedule an insert was sent at worst:
	// more than a few intervals means the database did not take the rate.
	MaxLagMs float64 `json:"max_send_lag_ms"`
	// Succeeded, Running, Available and Failed count the queue's jobs by
	// state when the load ended.
	Succeeded int64 `json:"succeeded"`
	Running   int64 `json:"running"`
	Available int64 `json:"available"`
	Failed    int64 `json:"failed"`
	// Pickup is how long the jobs that started waited, from their creation
	// to their start (database clock): 50th, 95th and 99th percentiles.
	PickupP50Ms float64 `json:"pickup_p50_ms"`
	PickupP95Ms float64 `json:"pickup_p95_ms"`
	PickupP99Ms float64 `json:"pickup_p99_ms"`
	// CPUBusy is the share of the machine's CPU that was busy while the
	// load ran (from /proc/stat; 0 where there is none).
	CPUBusy float64 `json:"cpu_busy"`
}

// StartFleet starts cfg.Size relay work processes on d, on cfg.Queue,
// through a pooler if cfg.PoolerSize says so, and waits until every one
// has registered; then, if cfg.Rate says so, starts putting jobs on their
// queue. The caller stops it all with Fleet.Stop.
func StartFleet(ctx context.Context, cfg FleetConfig, d *Database, prog *Progress) (_ *Fleet, err error) {
	if cfg.RelayBin == "" || cfg.Queue == "" || cfg.Size < 1 {
		return nil, errors.New("fleet: a relay binary, a queue and at least one worker are required")
	}
	if err := CheckFleet(cfg.Size, cfg.PoolerSize); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	if err := CheckFleetLoad(cfg.Size, cfg.Rate, cfg.JobDuration); err != nil {
		return nil, fmt.Errorf("fleet: %w", err)
	}
	env := []string{"DATABASE_URL=" + d.URL}
	var pooler *Pooler
	if cfg.PoolerSize > 0 {
		if pooler, err = StartPooler(ctx, d, cfg.PoolerSize, cfg.Size); err != nil {
			return nil, err
		}
		env = pooler.Env
	}
	procs := NewProcs(cfg.RelayBin, cfg.LogDir, env...)
	f := &Fleet{stop: func() {
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
	}}
	defer func() {
		if err != nil {
			f.Stop()
		}
	}()
	state := "idle"
	if cfg.Rate > 0 {
		state = "busy"
	}
	prog.Note("starting a fleet of %d %s workers, %d at a time", cfg.Size, state, fleetWave)
	for first := 0; first < cfg.Size; first += fleetWave {
		if err := startFleetWave(ctx, cfg, d, procs, first, min(first+fleetWave, cfg.Size)); err != nil {
			return nil, err
		}
	}
	if pooler != nil {
		f.Pooler = &pooler.Info
	}
	if cfg.Rate > 0 {
		if f.load, err = startFleetLoad(ctx, cfg, d); err != nil {
			return nil, err
		}
		prog.Note("putting %g jobs/s of %s on the fleet's queue", cfg.Rate, cmp.Or(cfg.JobDuration, DefaultFleetJob))
	}
	return f, nil
}

// fleetWave is how many of a fleet's workers start at once: each wave
// registers before the next starts. A fleet of 400 on 2 cores started all
// at once left some of its processes without a database connection within
// their start-up check, where waves of 25 all started.
const fleetWave = 25

// startFleetWave starts the fleet's workers first+1 to last and waits
// until each has registered.
func startFleetWave(ctx context.Context, cfg FleetConfig, d *Database, procs *Procs, first, last int) error {
	names := make([]string, 0, last-first)
	for i := first; i < last; i++ {
		name := fmt.Sprintf("fleet%d", i+1)
		if _, err := procs.Start(ctx, name, "work", "--id", name, "--queue", cfg.Queue, "--slots", "1", "--log-format", "json"); err != nil {
			return err
		}
		names = append(names, name)
	}
	waitCtx, cancel := context.WithTimeout(ctx, fleetStartup+time.Duration(len(names))*time.Second/4)
	defer cancel()
	if err := WaitWorkers(waitCtx, d.Q, procs, names...); err != nil {
		return fmt.Errorf("fleet workers %d to %d: %w", first+1, last, err)
	}
	return nil
}

// Load stops putting jobs on the fleet's queue, waits for the inserts
// under way, and says what became of the jobs: nil for an idle fleet.
func (f *Fleet) Load(ctx context.Context, d *Database) (*FleetLoad, error) {
	if f.load == nil {
		return nil, nil
	}
	return f.load.finish(ctx, d)
}

// fleetLoad puts jobs on a busy fleet's queue at a steady rate.
type fleetLoad struct {
	cfg   FleetConfig
	pool  *pgxpool.Pool
	start time.Time
	cpu   CPUSample
	cpuOK bool

	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
	ended    time.Time

	enqueued, failed atomic.Int64
	mu               sync.Mutex
	firstErr         error
	// maxLag is written by run alone, and read once it has returned.
	maxLag time.Duration
}

func startFleetLoad(ctx context.Context, cfg FleetConfig, d *Database) (*fleetLoad, error) {
	pool, err := OpenPool(ctx, d.URL, ApplicationName+" fleet load", fleetSenders, 10*time.Second)
	if err != nil {
		return nil, fmt.Errorf("fleet load: %w", err)
	}
	cfg.JobDuration = cmp.Or(cfg.JobDuration, DefaultFleetJob)
	payload, err := json.Marshal(builtin.SleepPayload{Ms: cfg.JobDuration.Milliseconds()})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("fleet load: %w", err)
	}
	l := &fleetLoad{cfg: cfg, pool: pool, stop: make(chan struct{}), done: make(chan struct{})}
	l.cpu, l.cpuOK = ReadCPU()
	l.start = time.Now()
	go l.run(context.WithoutCancel(ctx), Job(cfg.Queue, builtin.KindSleep, payload, client.DefaultMaxAttempts))
	return l, nil
}

// run sends one insert of job at each tick of the schedule, fleetSenders
// at most at once, until stop is closed, and then waits for those under
// way.
func (l *fleetLoad) run(ctx context.Context, job client.Job) {
	defer close(l.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	senders := make(chan struct{}, fleetSenders)
	interval := time.Duration(float64(time.Second) / l.cfg.Rate)
	tick := time.NewTimer(0)
	defer tick.Stop()
	for i := 0; ; i++ {
		at := l.start.Add(time.Duration(i) * interval)
		tick.Reset(time.Until(at))
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		select {
		case <-l.stop:
			return
		case senders <- struct{}{}:
		}
		l.maxLag = max(l.maxLag, time.Since(at))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-senders }()
			// As a producer that stores one job per call does: through
			// a pool, announced after its commit.
			if _, _, err := client.Insert(ctx, l.pool, job); err != nil {
				l.failed.Add(1)
				l.mu.Lock()
				if l.firstErr == nil {
					l.firstErr = err
				}
				l.mu.Unlock()
				return
			}
			l.enqueued.Add(1)
		}()
	}
}

// end stops the load and waits for the inserts under way; it may be
// called more than once.
func (l *fleetLoad) end() {
	l.stopOnce.Do(func() {
		close(l.stop)
		<-l.done
		l.ended = time.Now()
		l.pool.Close()
	})
}

// finish ends the load and reads what became of its jobs.
func (l *fleetLoad) finish(ctx context.Context, d *Database) (*FleetLoad, error) {
	l.end()
	out := &FleetLoad{
		RatePerSec:    l.cfg.Rate,
		JobKind:       builtin.KindSleep,
		JobMs:         Millis(l.cfg.JobDuration),
		Seconds:       Round3(l.ended.Sub(l.start).Seconds()),
		Enqueued:      l.enqueued.Load(),
		EnqueueErrors: l.failed.Load(),
		MaxLagMs:      Millis(l.maxLag),
	}
	if l.firstErr != nil {
		out.FirstError = l.firstErr.Error()
	}
	if cpu, ok := ReadCPU(); ok && l.cpuOK {
		out.CPUBusy = Round3(l.cpu.Utilization(cpu))
	}
	row, err := d.Lab.ExperimentFleetLoad(ctx, l.cfg.Queue)
	if err != nil {
		return out, fmt.Errorf("fleet load: read its jobs: %w", err)
	}
	out.Succeeded, out.Running, out.Available, out.Failed = row.Succeeded, row.Running, row.Available, row.Failed
	if len(row.PickupMs) == 3 {
		out.PickupP50Ms, out.PickupP95Ms, out.PickupP99Ms = Round3(row.PickupMs[0]), Round3(row.PickupMs[1]), Round3(row.PickupMs[2])
	}
	return out, nil
}

// WriteFleetNote says, for a summary, beside what fleet of size workers an
// experiment ran, through which pooler, if any, and what became of its
// load, if it had one. It writes nothing for no fleet.
func WriteFleetNote(w io.Writer, size int, p *PoolerInfo, load *FleetLoad) {
	if size == 0 {
		return
	}
	state := "idle"
	if load != nil {
		state = "busy"
	}
	fmt.Fprintf(w, "Beside a fleet of %d %s workers on a queue of their own", size, state)
	if p != nil {
		fmt.Fprintf(w, ", their pools through PgBouncer %s in %s mode with %d server connections", p.Version, p.PoolMode, p.PoolSize)
	}
	fmt.Fprintln(w, ".")
	if load == nil {
		return
	}
	fmt.Fprintf(w, "Its load: %g jobs/s of %s (%.0f ms) for %.1f s, %d accepted (%d refused, sent up to %.0f ms late); "+
		"then %d succeeded, %d running, %d waiting, %d failed; pickup p50 %.1f ms, p95 %.1f ms, p99 %.1f ms; machine %.0f%% busy.\n",
		load.RatePerSec, load.JobKind, load.JobMs, load.Seconds, load.Enqueued, load.EnqueueErrors, load.MaxLagMs,
		load.Succeeded, load.Running, load.Available, load.Failed, load.PickupP50Ms, load.PickupP95Ms, load.PickupP99Ms, 100*load.CPUBusy)
	if load.FirstError != "" {
		fmt.Fprintf(w, "The first refused insert: %s\n", load.FirstError)
	}
}
