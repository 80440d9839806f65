package soak

import (
	"bufio"
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
)

// RiverConfig configures River, the reference system, under test.
type RiverConfig struct {
	// Bin is the relaylab-river binary: it migrates River's schema, feeds
	// the jobs with River's own client and runs River's workers.
	Bin string
	// Database is the run's database; River's tables are added to it.
	Database *harness.Database
	// LogDir receives the processes' logs.
	LogDir string
	// Workers is how many relaylab-river work processes run, with how many
	// of River's workers each.
	Workers harness.ProcSlots
	// JobMs is how long each job sleeps.
	JobMs int64
	// WorkArgs are added to every `relaylab-river work` command line
	// (River's fetch settings, say; none: the adapter's tuned defaults).
	WorkArgs []string
	// RetainCompleted is how long River keeps a completed job (its
	// CompletedJobRetentionPeriod). Zero: River's default.
	RetainCompleted time.Duration
}

// riverSystem is River under test: relaylab-river work processes, the jobs
// inserted by one relaylab-river feed process through River's client (so
// that River's own insert notifications wake its workers), and River's job
// rows read by the statements of queries/lab/river.sql.
type riverSystem struct {
	cfg   RiverConfig
	procs *harness.Procs

	// feedMu serializes the requests to feed, one line and its answer at
	// a time.
	feedMu  sync.Mutex
	feed    *harness.Proc
	answers *bufio.Reader

	// fromID is the lowest id the next window can concern; only the
	// sampler's goroutine reads windows.
	fromID int64
}

// workerStartTimeout bounds the wait for each of River's workers to start.
const workerStartTimeout = 30 * time.Second

// NewRiver returns River as the system under test.
func NewRiver(cfg RiverConfig) System {
	return &riverSystem{cfg: cfg}
}

func (s *riverSystem) Name() string { return "river" }

func (s *riverSystem) Start(ctx context.Context) error {
	env := "DATABASE_URL=" + s.cfg.Database.URL
	s.procs = harness.NewProcs(s.cfg.Bin, s.cfg.LogDir, env)
	if err := s.procs.Run(ctx, "river-migrate", "migrate", "--log-format", "json"); err != nil {
		return fmt.Errorf("migrate River's schema: %w", err)
	}
	for i := 1; i <= s.cfg.Workers.Procs; i++ {
		id := fmt.Sprintf("soak-river-w%d", i)
		args := []string{"work", "--id", id, "--queue", Queue,
			"--workers", strconv.Itoa(s.cfg.Workers.Slots), "--log-format", "json"}
		if s.cfg.RetainCompleted != 0 {
			args = append(args, "--completed-retention", s.cfg.RetainCompleted.String())
		}
		args = append(args, s.cfg.WorkArgs...)
		p, err := s.procs.Start(ctx, id, args...)
		if err == nil {
			waitCtx, cancel := context.WithTimeout(ctx, workerStartTimeout)
			_, err = p.WaitLog(waitCtx, func(l harness.LogLine) bool { return l.Msg == "River client started" })
			cancel()
		}
		if err != nil {
			s.procs.KillAll()
			return fmt.Errorf("start River's worker %s: %w", id, err)
		}
	}
	feed, err := harness.StartProc(ctx, harness.ProcSpec{
		Name: "soak-river-feed", Bin: s.cfg.Bin, Env: []string{env}, LogDir: s.cfg.LogDir, Piped: true,
		Args: []string{"feed", "--queue", Queue, "--kind", "sleep", "--sleep-ms", strconv.FormatInt(s.cfg.JobMs, 10), "--log-format", "json"},
	})
	if err != nil {
		s.procs.KillAll()
		return fmt.Errorf("start River's feed: %w", err)
	}
	s.feed, s.answers = feed, bufio.NewReader(feed.Stdout)
	return nil
}

// Enqueue asks the feed for n jobs and waits for its answer, or for ctx.
func (s *riverSystem) Enqueue(ctx context.Context, n int) error {
	s.feedMu.Lock()
	defer s.feedMu.Unlock()
	answer := make(chan error, 1)
	go func() {
		if _, err := fmt.Fprintf(s.feed.Stdin, "%d\n", n); err != nil {
			answer <- fmt.Errorf("ask River's feed for %d jobs: %w", n, err)
			return
		}
		line, err := s.answers.ReadString('\n')
		switch {
		case err != nil:
			answer <- fmt.Errorf("River's feed, asked for %d jobs: %w (log: %s)", n, err, s.feed.LogPath)
		case line != fmt.Sprintf("ok %d\n", n):
			answer <- fmt.Errorf("River's feed, asked for %d jobs, answered %q", n, strings.TrimSpace(line))
		default:
			answer <- nil
		}
	}()
	select {
	case err := <-answer:
		return err
	case <-ctx.Done():
		// The answer may never come: the feed goes, and the next request
		// fails rather than read this one's answer.
		s.feed.Kill()
		return ctx.Err()
	}
}

func (s *riverSystem) Window(ctx context.Context, since, until time.Time) (Window, error) {
	row, err := s.cfg.Database.Lab.SoakRiverJobWindow(ctx, labdb.SoakRiverJobWindowParams{Since: since, Until: until, FromID: s.fromID, Queue: Queue})
	if err != nil {
		return Window{}, fmt.Errorf("read River's jobs of a window: %w", err)
	}
	s.fromID = row.NextFromID
	return Window{Enqueued: row.Enqueued, Claimed: row.Claimed, Finished: row.Finished, Succeeded: row.Succeeded, PickupMs: row.PickupMs}, nil
}

func (s *riverSystem) Backlog(ctx context.Context) (Backlog, error) {
	row, err := s.cfg.Database.Lab.SoakRiverBacklog(ctx, Queue)
	if err != nil {
		return Backlog{}, fmt.Errorf("read River's backlog: %w", err)
	}
	return Backlog{Ready: row.Ready, Running: row.Running, OldestReadyMs: harness.Round3(row.OldestReadyMs)}, nil
}

func (s *riverSystem) CountJobs(ctx context.Context, q *labdb.Queries) (int64, error) {
	return q.SoakRiverReaderCount(ctx)
}

func (s *riverSystem) JobTable() string { return "river_job" }

func (s *riverSystem) CheckRunning() error {
	if s.procs == nil {
		return nil
	}
	if s.feed != nil && s.feed.Exited() {
		return fmt.Errorf("River's feed exited during the soak: %v (log: %s)", s.feed.ExitErr(), s.feed.LogPath)
	}
	return s.procs.CheckRunning("during the soak")
}

func (s *riverSystem) Stop(ctx context.Context) error {
	if s.procs == nil {
		return nil
	}
	defer s.procs.KillAll()
	ctx, cancel := context.WithTimeout(ctx, 2*stopGrace)
	defer cancel()
	if s.feed != nil {
		s.feed.Stdin.Close()
		if err := s.feed.Wait(ctx); err != nil {
			s.feed.Kill()
		}
		s.feed.Stdout.Close()
	}
	if err := s.procs.StopAll(ctx, stopGrace); err != nil {
		return fmt.Errorf("stop River's workers: %w", err)
	}
	return nil
}
