package soak

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/builtin"
)

// System is the queue under test: all the soak needs of it, so that
// another queue (River, say) can be soaked beside Relay by implementing
// it. The soak calls Start once, then Enqueue, Window and Backlog from
// different goroutines, then Stop.
type System interface {
	// Name labels the system in the results: "relay".
	Name() string
	// Start starts the workers and returns once they are ready to claim.
	Start(ctx context.Context) error
	// Enqueue enqueues n jobs of the soak's kind, ready at once.
	Enqueue(ctx context.Context, n int) error
	// Window reads what happened to the jobs in the window (since, until]
	// of the database clock. Windows are read in order, each starting
	// where the last ended.
	Window(ctx context.Context, since, until time.Time) (Window, error)
	// Backlog reads the jobs waiting now.
	Backlog(ctx context.Context) (Backlog, error)
	// CountJobs counts every row of the system's job table through q, as
	// each REPEATABLE READ reader of the readers phase does, in its own
	// transaction: a report over the whole table.
	CountJobs(ctx context.Context, q *labdb.Queries) (int64, error)
	// JobTable names the system's job table, which CountJobs counts.
	JobTable() string
	// CheckRunning returns an error once a worker has died.
	CheckRunning() error
	// Stop stops the workers.
	Stop(ctx context.Context) error
}

// Window is what happened to the jobs in one sampling window.
type Window struct {
	// Enqueued, Claimed, Finished and Succeeded count the jobs enqueued,
	// claimed, finished (in any terminal state) and succeeded in the window.
	Enqueued, Claimed, Finished, Succeeded int64
	// PickupMs holds, for each job claimed in the window, the time from
	// the moment it was ready to its claim, in milliseconds.
	PickupMs []float64
}

// Backlog is the jobs waiting at one moment.
type Backlog struct {
	// Ready counts the jobs ready to run and not claimed.
	Ready int64 `json:"ready"`
	// Running counts the jobs claimed and not finished.
	Running int64 `json:"running"`
	// OldestReadyMs is how long the oldest ready job has waited.
	OldestReadyMs float64 `json:"oldest_ready_ms"`
}

// RelayConfig configures the Relay system under test.
type RelayConfig struct {
	// Bin is the relay binary that runs `work`.
	Bin string
	// Database is the migrated database the workers run on; the jobs are
	// inserted through its pool, with package client.
	Database *harness.Database
	// LogDir receives the workers' logs.
	LogDir string
	// Workers is how many relay work processes run, with how many slots.
	Workers harness.ProcSlots
	// JobMs is how long each job runs: a builtin sleep job of that many
	// milliseconds.
	JobMs int64
	// RetainSucceeded is each worker's --retain-succeeded. Zero: relay
	// work's default.
	RetainSucceeded time.Duration
}

// Queue is the queue the soak's jobs are put on.
const Queue = "soak"

// stopGrace bounds a worker's shutdown at the end of the run.
const stopGrace = 10 * time.Second

// relaySystem is Relay under test: relay work processes of the shipped
// binary, jobs inserted with client.InsertMany, and the job rows read by
// the statements of queries/lab/soak.sql.
type relaySystem struct {
	cfg   RelayConfig
	procs *harness.Procs
	job   client.Job
	// fromID is the lowest id the next window can concern; only the
	// sampler's goroutine reads windows.
	fromID int64
}

// NewRelay returns Relay as the system under test.
func NewRelay(cfg RelayConfig) System {
	payload, _ := json.Marshal(builtin.SleepPayload{Ms: cfg.JobMs})
	return &relaySystem{
		cfg: cfg,
		job: harness.Job(Queue, builtin.KindSleep, payload, 25),
	}
}

func (s *relaySystem) Name() string { return "relay" }

func (s *relaySystem) Start(ctx context.Context) error {
	s.procs = harness.NewProcs(s.cfg.Bin, s.cfg.LogDir, "DATABASE_URL="+s.cfg.Database.URL)
	var ids []string
	for i := 1; i <= s.cfg.Workers.Procs; i++ {
		id := fmt.Sprintf("soak-w%d", i)
		ids = append(ids, id)
		args := []string{"work", "--id", id, "--queue", Queue,
			"--slots", strconv.Itoa(s.cfg.Workers.Slots), "--log-format", "json"}
		if s.cfg.RetainSucceeded != 0 {
			args = append(args, "--retain-succeeded", s.cfg.RetainSucceeded.String())
		}
		if _, err := s.procs.Start(ctx, id, args...); err != nil {
			s.procs.KillAll()
			return err
		}
	}
	if err := harness.WaitWorkers(ctx, s.cfg.Database.Q, s.procs, ids...); err != nil {
		s.procs.KillAll()
		return err
	}
	return nil
}

func (s *relaySystem) Enqueue(ctx context.Context, n int) error {
	return harness.InsertJobs(ctx, s.cfg.Database.Pool, s.job, n)
}

func (s *relaySystem) Window(ctx context.Context, since, until time.Time) (Window, error) {
	row, err := s.cfg.Database.Lab.SoakJobWindow(ctx, labdb.SoakJobWindowParams{Since: since, Until: until, FromID: s.fromID, Queue: Queue})
	if err != nil {
		return Window{}, fmt.Errorf("read the jobs of a window: %w", err)
	}
	s.fromID = row.NextFromID
	return Window{Enqueued: row.Enqueued, Claimed: row.Claimed, Finished: row.Finished, Succeeded: row.Succeeded, PickupMs: row.PickupMs}, nil
}

func (s *relaySystem) Backlog(ctx context.Context) (Backlog, error) {
	row, err := s.cfg.Database.Lab.SoakBacklog(ctx, Queue)
	if err != nil {
		return Backlog{}, fmt.Errorf("read the backlog: %w", err)
	}
	return Backlog{Ready: row.Ready, Running: row.Running, OldestReadyMs: harness.Round3(row.OldestReadyMs)}, nil
}

func (s *relaySystem) CountJobs(ctx context.Context, q *labdb.Queries) (int64, error) {
	return countRelayJobs(ctx, q)
}

// countRelayJobs counts every row of Relay's jobs table through q, as a
// reader does: the queue's table, or the readers' table apart.
func countRelayJobs(ctx context.Context, q *labdb.Queries) (int64, error) {
	return q.SoakReaderCount(ctx)
}

func (s *relaySystem) JobTable() string { return "jobs" }

func (s *relaySystem) CheckRunning() error {
	if s.procs == nil {
		return nil
	}
	return s.procs.CheckRunning("during the soak")
}

func (s *relaySystem) Stop(ctx context.Context) error {
	if s.procs == nil {
		return nil
	}
	defer s.procs.KillAll()
	ctx, cancel := context.WithTimeout(ctx, 2*stopGrace)
	defer cancel()
	if err := s.procs.StopAll(ctx, stopGrace); err != nil {
		return fmt.Errorf("stop the workers: %w", err)
	}
	return nil
}
