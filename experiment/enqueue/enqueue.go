// Package enqueue is the enqueue experiment: clients post one job per
// request to relay serve, with no workers running, as fast as the API
// answers, and it measures how many jobs per second are accepted, the
// latency of each request, and what each job cost the server: commits, WAL
// and the CPU time of the database's backends. Run runs it; `relaylab
// enqueue` is its command.
package enqueue

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/builtin"
)

// Defaults of Config.
const (
	DefaultClients  = 8
	DefaultDuration = 20 * time.Second
	DefaultWarmup   = 2 * time.Second
)

// body is what every request posts: one no-op job.
var body = []byte(`{"kind":"` + builtin.KindNoop + `"}`)

// Config configures the experiment. Zero fields take the defaults named in
// their comments.
type Config struct {
	// AdminURL is the PostgreSQL server on which a database is created for
	// the run. Default harness.DefaultAdminURL.
	AdminURL string
	// RelayBin is the relay binary that runs `serve`. Required.
	RelayBin string
	// OutDir receives the JSON result. Empty: nothing is written.
	OutDir string
	// LogDir receives the server's log. Empty: a temporary directory,
	// removed at the end.
	LogDir string
	// Clients is how many clients post at once, each one request at a
	// time over a connection of its own. Default DefaultClients.
	Clients int
	// Duration is how long the measured part lasts, after Warmup, whose
	// requests are not counted. Defaults DefaultDuration, DefaultWarmup.
	Duration time.Duration
	Warmup   time.Duration
	// Fleet is how many idle relay work processes listen beside the
	// server, on a queue of their own that no job is posted to: what a
	// fleet of workers of other queues costs each enqueue. Zero: none.
	Fleet int
	// FleetPoolerSize, when positive, runs the fleet's pools through a
	// PgBouncer in transaction mode with that many server connections,
	// each fleet worker's session on the server itself.
	FleetPoolerSize int
	// AnnounceEvery, when not nil, is passed to relay serve as its
	// --announce-every (a build without that flag refuses it). Nil: the
	// server's default.
	AnnounceEvery *time.Duration
	// Progress receives progress lines. Nil: none.
	Progress io.Writer
}

func (c Config) withDefaults() (Config, error) {
	if c.RelayBin == "" {
		return c, errors.New("enqueue: no relay binary given")
	}
	if c.AdminURL == "" {
		c.AdminURL = harness.DefaultAdminURL
	}
	if c.Clients == 0 {
		c.Clients = DefaultClients
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Warmup == 0 {
		c.Warmup = DefaultWarmup
	}
	if c.Clients < 1 || c.Duration < 0 || c.Warmup < 0 {
		return c, fmt.Errorf("enqueue: clients must be at least 1 and the durations positive, got %d, %s, %s", c.Clients, c.Duration, c.Warmup)
	}
	if err := harness.CheckFleet(c.Fleet, c.FleetPoolerSize); err != nil {
		return c, fmt.Errorf("enqueue: %w", err)
	}
	return c, nil
}

// Result is the record of one run.
type Result struct {
	Experiment  string              `json:"experiment"`
	Environment harness.Environment `json:"environment"`
	Clients     int                 `json:"clients"`
	// Fleet counts the idle workers that listened beside the server
	// (Config.Fleet), and FleetPooler is the PgBouncer their pools went
	// through, if any.
	Fleet       int                 `json:"fleet,omitempty"`
	FleetPooler *harness.PoolerInfo `json:"fleet_pooler,omitempty"`
	// FleetLive counts the fleet's workers whose sessions were alive when
	// the measured part ended.
	FleetLive int `json:"fleet_live,omitempty"`
	// AnnounceEvery is the --announce-every given to relay serve
	// (Config.AnnounceEvery), empty if none was.
	AnnounceEvery string  `json:"announce_every,omitempty"`
	Seconds       float64 `json:"seconds"`
	WarmupSecs    float64 `json:"warmup_seconds"`
	// Accepted counts the requests answered 201 in the measured part, and
	// Failed the others (any other status, or no answer).
	Accepted   int64   `json:"accepted"`
	Failed     int64   `json:"failed"`
	JobsPerSec float64 `json:"accepted_jobs_per_sec"`
	// Latency is that of the accepted requests, from sending to the whole
	// answer read.
	Latency harness.Percentiles `json:"latency"`
	// Stored is how many jobs the database holds at the end: every request
	// answered 201, warm-up included, and no more.
	Stored    int64 `json:"stored"`
	Answered  int64 `json:"answered_201_in_all"`
	StoredAll bool  `json:"stored_matches_answered"`
	// Per accepted job in the measured part: this database's commits, the
	// server's WAL (other databases' writes count too), and the CPU time
	// of this database's backends.
	CommitsPerJob       float64 `json:"commits_per_job"`
	WALBytesPerJob      float64 `json:"wal_bytes_per_job"`
	WALRecordsPerJob    float64 `json:"wal_records_per_job"`
	PostgresCPUMsPerJob float64 `json:"postgres_cpu_ms_per_job"`
	// The CPU time of relay serve, and of this process, whose clients
	// share the machine with the server: zero where /proc is not.
	ServeCPUMsPerJob   float64  `json:"serve_cpu_ms_per_job"`
	ClientsCPUMsPerJob float64  `json:"clients_cpu_ms_per_job"`
	Files              []string `json:"files,omitempty"`
}

// Run starts relay serve on a database of its own and posts from
// cfg.Clients clients for cfg.Warmup and then cfg.Duration, and writes the
// result under cfg.OutDir.
func Run(ctx context.Context, cfg Config) (_ *Result, err error) {
	cfg, err = cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	logDir, cleanLogs, err := harness.LogDirFor(cfg.LogDir, "relay-enqueue-logs-")
	if err != nil {
		return nil, err
	}
	defer cleanLogs()
	prog := harness.NewProgress(cfg.Progress, "enqueue", 0)
	prog.Note("creating and migrating a database")
	d, err := harness.CreateDatabase(ctx, cfg.AdminURL, "relay_exp_enqueue_")
	if err != nil {
		return nil, err
	}
	defer d.DropAtEnd(ctx, &err)
	res := &Result{Experiment: "enqueue", Clients: cfg.Clients,
		Seconds: cfg.Duration.Seconds(), WarmupSecs: cfg.Warmup.Seconds()}
	res.Environment = harness.CollectEnvironment(ctx, d, cfg.RelayBin)

	procs := harness.NewProcs(cfg.RelayBin, logDir, "DATABASE_URL="+d.URL)
	defer procs.KillAll()
	prog.Note("starting relay serve, with no worker slots")
	serveArgs := []string{"--slots", "0"}
	if cfg.AnnounceEvery != nil {
		res.AnnounceEvery = cfg.AnnounceEvery.String()
		serveArgs = append(serveArgs, "--announce-every", res.AnnounceEvery)
	}
	serve, base, err := harness.StartServe(ctx, procs, "serve", serveArgs...)
	if err != nil {
		return nil, err
	}

	if cfg.Fleet > 0 {
		fleet, err := harness.StartFleet(ctx, harness.FleetConfig{
			RelayBin: cfg.RelayBin, LogDir: logDir, Size: cfg.Fleet, PoolerSize: cfg.FleetPoolerSize, Queue: fleetQueue,
		}, d, prog)
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		defer fleet.Stop()
		res.Fleet = cfg.Fleet
		res.FleetPooler = fleet.Pooler
	}

	prog.Note("%d clients posting one job per request: %s warm-up, %s measured", cfg.Clients, cfg.Warmup, cfg.Duration)
	load := newLoad(base+"/v1/jobs", cfg.Clients)
	// The clients finish the request they are sending when told to stop,
	// so that every job stored was answered.
	stop := load.start(ctx)
	if err := sleep(ctx, cfg.Warmup); err != nil {
		stop()
		return nil, err
	}
	before, err := d.Lab.BurndownCounters(ctx, "jobs")
	if err != nil {
		stop()
		return nil, fmt.Errorf("read the counters: %w", err)
	}
	cpuBefore := harness.SamplePostgresCPU(d.Name)
	serveBefore, _ := harness.ProcCPU(serve.PID())
	clientsBefore, _ := harness.ProcCPU(os.Getpid())
	load.measure(true)
	err = sleep(ctx, cfg.Duration)
	load.measure(false)
	cpuAfter := harness.SamplePostgresCPU(d.Name)
	serveAfter, _ := harness.ProcCPU(serve.PID())
	clientsAfter, _ := harness.ProcCPU(os.Getpid())
	after, cerr := d.Lab.BurndownCounters(ctx, "jobs")
	stop()
	if err != nil {
		return nil, err
	}
	if cerr != nil {
		return nil, fmt.Errorf("read the counters: %w", cerr)
	}
	if err := procs.CheckRunning("while clients posted"); err != nil {
		return nil, err
	}
	if cfg.Fleet > 0 {
		n, err := d.Lab.ExperimentFleetCount(ctx, fleetQueue)
		if err != nil {
			return nil, fmt.Errorf("count the fleet's live workers: %w", err)
		}
		res.FleetLive = int(n.LiveInQueue)
	}
	prog.Finish("done")

	res.Accepted, res.Failed, res.Answered = load.accepted, load.failed, load.answered
	res.Latency = harness.PercentilesOf(load.latencies)
	stored, err := d.Lab.ExperimentQueueProgress(ctx, client.DefaultQueue)
	if err != nil {
		return nil, fmt.Errorf("count the jobs stored: %w", err)
	}
	res.Stored = stored.Total
	res.StoredAll = res.Stored == res.Answered
	if n := float64(res.Accepted); n > 0 {
		res.JobsPerSec = harness.Round2(n / cfg.Duration.Seconds())
		res.CommitsPerJob = harness.Round3(float64(after.Commits-before.Commits) / n)
		res.WALBytesPerJob = harness.Round3(float64(after.WalBytes-before.WalBytes) / n)
		res.WALRecordsPerJob = harness.Round3(float64(after.WalRecords-before.WalRecords) / n)
		res.PostgresCPUMsPerJob = harness.Round3(harness.Millis(harness.CPUSince(cpuBefore.DB, cpuAfter.DB)) / n)
		res.ServeCPUMsPerJob = harness.Round3(harness.Millis(serveAfter-serveBefore) / n)
		res.ClientsCPUMsPerJob = harness.Round3(harness.Millis(clientsAfter-clientsBefore) / n)
	}
	res.Environment.LoadAverageEnd = harness.LoadAverage()
	if cfg.OutDir != "" {
		base, err := harness.ResultBase(cfg.OutDir, "enqueue", res.Environment.Date)
		if err != nil {
			return res, err
		}
		res.Files = []string{base + ".json"}
		if err := harness.WriteJSON(base+".json", res); err != nil {
			return res, err
		}
	}
	return res, nil
}

// fleetQueue is the queue the fleet's workers wait on, which no job is
// ever posted to.
const fleetQueue = "enqueue-fleet"

// sleep waits for d, or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// load is the clients posting, and what they counted while measuring.
type load struct {
	url     string
	clients int
	http    *http.Client

	mu        sync.Mutex
	measuring bool
	accepted  int64
	failed    int64
	answered  int64 // 201s in all, warm-up included
	latencies []float64
}

func newLoad(url string, clients int) *load {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = clients
	return &load{url: url, clients: clients, http: &http.Client{Transport: transport, Timeout: 30 * time.Second}}
}

// measure starts or stops counting.
func (l *load) measure(on bool) {
	l.mu.Lock()
	l.measuring = on
	l.mu.Unlock()
}

// start runs the clients until ctx ends or the function it returns is
// called, which waits for each client to finish its request.
func (l *load) start(ctx context.Context) (stop func()) {
	var stopped atomic.Bool
	var wg sync.WaitGroup
	for range l.clients {
		wg.Go(func() {
			for !stopped.Load() && ctx.Err() == nil {
				l.post(ctx)
			}
		})
	}
	return func() {
		stopped.Store(true)
		wg.Wait()
	}
}

// post sends one request and counts its answer.
func (l *load) post(ctx context.Context) {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.url, bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.http.Do(req)
	status := 0
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		status = resp.StatusCode
	}
	took := time.Since(start)
	if ctx.Err() != nil && status == 0 {
		return // stopped, not failed
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if status == http.StatusCreated {
		l.answered++
	}
	if !l.measuring {
		return
	}
	if status != http.StatusCreated {
		l.failed++
		return
	}
	l.accepted++
	l.latencies = append(l.latencies, harness.Millis(took))
}

// WriteSummary prints the result as a table.
func (r *Result) WriteSummary(w io.Writer) error {
	tw := harness.NewTable(w)
	fmt.Fprintf(tw, "clients\tseconds\taccepted\tfailed\tjobs/s\tp50 ms\tp99 ms\tcommits/job\tWAL bytes/job\tCPU ms/job: PG\tserve\tclients\tstored = answered\n")
	fmt.Fprintf(tw, "%d\t%.0f\t%d\t%d\t%.0f\t%.2f\t%.2f\t%.3f\t%.0f\t%.3f\t%.3f\t%.3f\t%v\n",
		r.Clients, r.Seconds, r.Accepted, r.Failed, r.JobsPerSec, r.Latency.P50, r.Latency.P99,
		r.CommitsPerJob, r.WALBytesPerJob, r.PostgresCPUMsPerJob, r.ServeCPUMsPerJob, r.ClientsCPUMsPerJob, r.StoredAll)
	if err := tw.Flush(); err != nil {
		return err
	}
	harness.WriteFleetNote(w, r.Fleet, r.FleetPooler, nil)
	if r.AnnounceEvery != "" {
		fmt.Fprintf(w, "relay serve ran with --announce-every %s.\n", r.AnnounceEvery)
	}
	for _, f := range r.Files {
		fmt.Fprintf(w, "wrote %s\n", f)
	}
	return nil
}
