package adapter

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"
)

// The kinds of job the lab runs on River, named as Relay's built-in kinds
// of the same work are.
const (
	// KindNoop does nothing and succeeds: the burn-down's job.
	KindNoop = "noop"
	// KindSleep sleeps for its arguments' Ms and succeeds: a steady load's
	// job.
	KindSleep = "sleep"
)

// NoopArgs are the arguments of a KindNoop job: none.
type NoopArgs struct{}

// Kind is KindNoop.
func (NoopArgs) Kind() string { return KindNoop }

// SleepArgs are the arguments of a KindSleep job.
type SleepArgs struct {
	// Ms is how long the job sleeps, in milliseconds.
	Ms int `json:"ms"`
}

// Kind is KindSleep.
func (SleepArgs) Kind() string { return KindSleep }

// noopWorker works KindNoop jobs.
type noopWorker struct {
	river.WorkerDefaults[NoopArgs]
}

func (noopWorker) Work(context.Context, *river.Job[NoopArgs]) error { return nil }

// sleepWorker works KindSleep jobs; a job stopped mid-sleep fails with
// the context's error, as River expects of a cancelled job.
type sleepWorker struct {
	river.WorkerDefaults[SleepArgs]
}

func (sleepWorker) Work(ctx context.Context, job *river.Job[SleepArgs]) error {
	t := time.NewTimer(time.Duration(job.Args.Ms) * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sleep of %d ms: %w", job.Args.Ms, ctx.Err())
	}
}

// workers returns River's registry of the lab's kinds, the same for the
// clients that insert and those that work.
func workers() *river.Workers {
	w := river.NewWorkers()
	river.AddWorker(w, noopWorker{})
	river.AddWorker(w, sleepWorker{})
	return w
}

// ArgsOf returns the arguments of a job of kind, with sleepMs for
// KindSleep (ignored for KindNoop).
func ArgsOf(kind string, sleepMs int) (river.JobArgs, error) {
	switch kind {
	case KindNoop:
		return NoopArgs{}, nil
	case KindSleep:
		if sleepMs < 0 {
			return nil, fmt.Errorf("sleep of %d ms: want zero or more", sleepMs)
		}
		return SleepArgs{Ms: sleepMs}, nil
	default:
		return nil, fmt.Errorf("unknown kind %q: want %s or %s", kind, KindNoop, KindSleep)
	}
}
