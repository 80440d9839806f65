package harness

import (
	"context"
	"sync"
	"time"
)

// trace samples something at a fixed interval, in a goroutine of its own,
// and keeps each sample with the time it was taken, so that a span known
// only afterwards (a burn-down's first claim to its last finish, on the
// database's clock) can be read from the samples around or inside it.
// CPUTrace and SessionTrace are traces.
type trace[T any] struct {
	mu      sync.Mutex
	samples []timed[T]
	err     error
	cancel  context.CancelFunc
	done    chan struct{}
}

// timed is one sample of a trace and when it was taken.
type timed[T any] struct {
	at time.Time
	v  T
}

// startTrace takes a first sample at once, then one every interval, and a
// last one as stop is called, until stop. It returns the first sample's
// error, and no trace, when that one fails; a later sample that fails ends
// the trace, and stop returns its error.
func startTrace[T any](interval time.Duration, sample func(context.Context) (T, error)) (*trace[T], error) {
	ctx, cancel := context.WithCancel(context.Background())
	t := &trace[T]{cancel: cancel, done: make(chan struct{})}
	if !t.take(ctx, sample) {
		cancel()
		return nil, t.err
	}
	go func() {
		defer close(t.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
			case <-tick.C:
				if t.take(ctx, sample) {
					continue
				}
				if ctx.Err() == nil {
					return
				}
			}
			// Stopped, perhaps in the middle of a sample: the last one.
			t.take(context.WithoutCancel(ctx), sample)
			return
		}
	}()
	return t, nil
}

// take adds a sample, or reports false: after recording why it could not
// be taken, unless ctx ended first, which cut it short.
func (t *trace[T]) take(ctx context.Context, sample func(context.Context) (T, error)) bool {
	v, err := sample(ctx)
	at := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		if t.err == nil && ctx.Err() == nil {
			t.err = err
		}
		return false
	}
	t.samples = append(t.samples, timed[T]{at, v})
	return true
}

// stop ends the trace, once its last sample is taken, and returns the
// error that ended it early, if one did. It may be called again.
func (t *trace[T]) stop() error {
	t.cancel()
	<-t.done
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.err
}

// read calls f with the samples, in the order taken, so by time, while
// no other is added.
func (t *trace[T]) read(f func(samples []timed[T])) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f(t.samples)
}
