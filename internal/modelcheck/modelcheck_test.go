package modelcheck_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/modelcheck"
)

// The environment variables that choose what TestModel runs.
const (
	// EnvSeed replays one seed.
	envSeed = "RELAY_MODELCHECK_SEED"
	// EnvDuration runs seed after seed for this long (the long form).
	envDuration = "RELAY_MODELCHECK_DURATION"
	// EnvSteps sets how many steps each seed runs.
	envSteps = "RELAY_MODELCHECK_STEPS"
)

// defaultSteps is how many steps a seed runs unless EnvSteps says.
const defaultSteps = 500

// shortSeeds is how many seeds the normal suite runs.
const shortSeeds = 3

// TestModel drives simulated workers through random interleavings of
// every transition and checks each against the reference model. By
// default it runs a few fresh seeds; RELAY_MODELCHECK_SEED replays one,
// RELAY_MODELCHECK_DURATION runs seeds for that long.
func TestModel(t *testing.T) {
	steps := defaultSteps
	if s := os.Getenv(envSteps); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number of steps", envSteps, s)
		}
		steps = n
	}
	if s := os.Getenv(envSeed); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: want a seed, a number", envSeed, s)
		}
		runSeed(t, seed, steps)
		return
	}
	base := uint64(time.Now().UnixNano())
	if s := os.Getenv(envDuration); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", envDuration, s, err)
		}
		runFor(t, base, d, steps)
		return
	}
	for i := range uint64(shortSeeds) {
		seed := base + i
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			runSeed(t, seed, steps)
		})
	}
}

// runFor runs seeds from base on, two at a time, until d has passed, and
// reports how many steps and operations were checked.
func runFor(t *testing.T, base uint64, d time.Duration, steps int) {
	start := time.Now()
	deadline := start.Add(d)
	var (
		mu     sync.Mutex
		next   = base
		seeds  int
		total  int
		counts = map[string]int{}
		wg     sync.WaitGroup
	)
	for range 2 {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				mu.Lock()
				seed := next
				next++
				mu.Unlock()
				var done int
				var c map[string]int
				if !t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { done, c = runSeed(t, seed, steps) }) {
					return
				}
				mu.Lock()
				seeds++
				total += done
				for k, v := range c {
					counts[k] += v
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var b strings.Builder
	fmt.Fprintf(&b, "%d seeds, %d steps checked in %s; operations and outcomes:\n", seeds, total, time.Since(start).Round(time.Second))
	for _, k := range slices.Sorted(maps.Keys(counts)) {
		fmt.Fprintf(&b, "  %-32s %9d\n", k, counts[k])
	}
	t.Log(b.String())
}

// runSeed runs steps steps of seed on a fresh database, and returns how
// many it ran and what they did.
func runSeed(t *testing.T, seed uint64, steps int) (int, map[string]int) {
	t.Helper()
	ctx := context.Background()
	pool := dbtest.New(t)
	start := time.Now()
	d, err := modelcheck.NewDriver(ctx, pool, seed)
	if err != nil {
		fatal(t, seed, steps, err)
	}
	defer d.Close()
	if err := d.Run(ctx, steps); err != nil {
		fatal(t, seed, steps, err)
	}
	t.Logf("seed %d: %d steps in %s", seed, d.Steps(), time.Since(start).Round(time.Millisecond))
	return d.Steps(), d.Counts()
}

// fatal reports a violation with the operations that led to it and how
// to replay it.
func fatal(t *testing.T, seed uint64, steps int, err error) {
	t.Helper()
	replay := fmt.Sprintf("%s=%d", envSeed, seed)
	if steps != defaultSteps {
		replay += fmt.Sprintf(" %s=%d", envSteps, steps)
	}
	replay += " go test -race -run 'TestModel$' ./internal/modelcheck"
	var v *modelcheck.Violation
	if errors.As(err, &v) {
		t.Fatalf("%v\n\nlast operations:\n  %s\n\nreplay: %s", v, strings.Join(v.Log, "\n  "), replay)
	}
	t.Fatalf("seed %d: %v\nreplay: %s", seed, err, replay)
}

// TestConcurrent runs workers at once, claiming, renewing, acknowledging,
// abandoning, reclaiming, crashing and acknowledging as zombies, with an
// operator cancelling and retrying jobs among them, and then checks what
// must hold whatever the interleaving. RELAY_MODELCHECK_SEED replays a
// seed's choices, though not its interleaving.
func TestConcurrent(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv(envSeed); s != "" {
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: want a seed, a number", envSeed, s)
		}
	}
	duration := 2 * time.Second
	if s := os.Getenv(envDuration); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%s=%q: %v", envDuration, s, err)
		}
		duration = d / 10
	}
	pool := dbtest.New(t)
	c := modelcheck.NewConcurrent(pool, seed)
	if err := c.Run(context.Background(), 300, 6, duration); err != nil {
		t.Fatalf("seed %d: %v\nreplay (the same choices, another interleaving): %s=%d go test -race -run 'TestConcurrent$' ./internal/modelcheck", seed, err, envSeed, seed)
	}
	t.Logf("seed %d, %s: %v", seed, duration, c.Counts())
}
