package adapter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// The fetch settings of River tuned for throughput, as the lab runs it by
// default: River's own defaults are 100 ms and 1 s.
const (
	// DefaultFetchCooldown is the least time between two fetches of a
	// queue's jobs.
	DefaultFetchCooldown = 2 * time.Millisecond
	// DefaultFetchPollInterval is how often a queue is fetched from when
	// no notification says there are jobs.
	DefaultFetchPollInterval = 20 * time.Millisecond
)

// DefaultStopGrace is how long Work lets running jobs finish once told to
// stop, before it cancels them.
const DefaultStopGrace = 10 * time.Second

// WorkConfig configures Work.
type WorkConfig struct {
	// ID names the client in River's tables and logs. Empty: River's own
	// (host name and time).
	ID string
	// Queue is the queue worked. Required.
	Queue string
	// Workers is how many jobs run at once (River's MaxWorkers). Required.
	Workers int
	// FetchCooldown and FetchPollInterval are River's fetch settings.
	// Zero: DefaultFetchCooldown and DefaultFetchPollInterval.
	FetchCooldown     time.Duration
	FetchPollInterval time.Duration
	// StopGrace bounds the stop. Zero: DefaultStopGrace.
	StopGrace time.Duration
	// CompletedRetention is how long River keeps a completed job before
	// its cleaner deletes it (River's CompletedJobRetentionPeriod). Zero:
	// River's default, a day.
	CompletedRetention time.Duration
	// Logger receives River's logs. Nil: none.
	Logger *slog.Logger
}

// Work runs a River client with the lab's kinds on pool until ctx ends,
// then stops it: the jobs still running get cfg.StopGrace to finish, and
// are cancelled after that. It returns nil after a clean stop.
func Work(ctx context.Context, pool *pgxpool.Pool, cfg WorkConfig) error {
	if cfg.Queue == "" || cfg.Workers < 1 {
		return fmt.Errorf("work queue %q with %d workers: want a queue and at least one worker", cfg.Queue, cfg.Workers)
	}
	if cfg.FetchCooldown == 0 {
		cfg.FetchCooldown = DefaultFetchCooldown
	}
	if cfg.FetchPollInterval == 0 {
		cfg.FetchPollInterval = DefaultFetchPollInterval
	}
	if cfg.StopGrace == 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), &river.Config{
		ID:                          cfg.ID,
		Logger:                      cfg.Logger,
		Workers:                     workers(),
		Queues:                      map[string]river.QueueConfig{cfg.Queue: {MaxWorkers: cfg.Workers}},
		FetchCooldown:               cfg.FetchCooldown,
		FetchPollInterval:           cfg.FetchPollInterval,
		CompletedJobRetentionPeriod: cfg.CompletedRetention,
	})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	// The client runs on a context of its own: ctx's end is the signal to
	// stop, and the stop itself needs a live context.
	if err := c.Start(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("start the river client: %w", err)
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.StopGrace)
	defer cancel()
	err = c.Stop(stopCtx)
	if errors.Is(err, context.DeadlineExceeded) {
		cancelCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.StopGrace)
		defer cancel()
		if err := c.StopAndCancel(cancelCtx); err != nil {
			return fmt.Errorf("stop the river client, cancelling its jobs: %w", err)
		}
		return fmt.Errorf("stop the river client: jobs still ran after %s, and were cancelled", cfg.StopGrace)
	}
	if err != nil {
		return fmt.Errorf("stop the river client: %w", err)
	}
	return nil
}
