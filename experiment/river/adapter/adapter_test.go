package adapter

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"

	"github.com/relayq/relay/internal/dbtest"
)

// setup returns a pool on a fresh database that River has migrated.
func setup(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool := dbtest.New(t)
	if _, err := Migrate(t.Context(), pool, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	return pool
}

// jobsOf lists every job of queue, through River's own API.
func jobsOf(t *testing.T, pool *pgxpool.Pool, queue string) []*rivertype.JobRow {
	t.Helper()
	c, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.JobList(t.Context(), river.NewJobListParams().Queues(queue).First(10_000))
	if err != nil {
		t.Fatal(err)
	}
	return res.Jobs
}

func TestMigrate_AppliesRiversMigrationsOnce(t *testing.T) {
	pool := setup(t)
	n, err := Migrate(t.Context(), pool, slog.New(slog.DiscardHandler))
	if err != nil || n != 0 {
		t.Errorf("second migration applied %d, err %v; want 0, nil", n, err)
	}
}

func TestInsert_WritesEveryJobInBatches(t *testing.T) {
	pool := setup(t)
	// 250 jobs, 100 at a time: two full batches and a partial one.
	if err := Insert(t.Context(), pool, nil, SleepArgs{Ms: 3}, "q", 250, 100); err != nil {
		t.Fatal(err)
	}
	jobs := jobsOf(t, pool, "q")
	if len(jobs) != 250 {
		t.Fatalf("%d jobs, want 250", len(jobs))
	}
	for _, j := range jobs {
		var args SleepArgs
		if err := json.Unmarshal(j.EncodedArgs, &args); err != nil {
			t.Fatalf("job %d's arguments %s: %v", j.ID, j.EncodedArgs, err)
		}
		if j.Kind != KindSleep || args.Ms != 3 || j.State != rivertype.JobStateAvailable {
			t.Fatalf("job %d is %s %s, %s; want an available sleep of 3 ms", j.ID, j.Kind, j.EncodedArgs, j.State)
		}
	}
}

func TestWork_RunsEveryJobOnceThenStopsCleanly(t *testing.T) {
	pool := setup(t)
	if err := Insert(t.Context(), pool, nil, NoopArgs{}, "q", 300, 0); err != nil {
		t.Fatal(err)
	}
	if err := Insert(t.Context(), pool, nil, SleepArgs{Ms: 1}, "q", 30, 0); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- Work(ctx, pool, WorkConfig{Queue: "q", Workers: 10}) }()

	deadline := time.Now().Add(time.Minute)
	for {
		completed := 0
		for _, j := range jobsOf(t, pool, "q") {
			if j.State == rivertype.JobStateCompleted {
				completed++
			}
		}
		if completed == 330 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of 330 jobs completed after a minute", completed)
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Work after its context ended: %v, want nil", err)
	}
	for _, j := range jobsOf(t, pool, "q") {
		if j.Attempt != 1 {
			t.Errorf("job %d (%s) took %d attempts, want 1", j.ID, j.Kind, j.Attempt)
		}
	}
}

func TestWork_RejectsAConfigWithoutQueueOrWorkers(t *testing.T) {
	for _, cfg := range []WorkConfig{{Workers: 1}, {Queue: "q"}} {
		if err := Work(t.Context(), nil, cfg); err == nil {
			t.Errorf("Work(%+v) = nil, want an error", cfg)
		}
	}
}

func TestArgsOf(t *testing.T) {
	for _, tc := range []struct {
		kind    string
		sleepMs int
		want    river.JobArgs
	}{
		{KindNoop, 5, NoopArgs{}},
		{KindSleep, 5, SleepArgs{Ms: 5}},
		{KindSleep, -1, nil},
		{"hash", 0, nil},
	} {
		got, err := ArgsOf(tc.kind, tc.sleepMs)
		if got != tc.want || (err == nil) != (tc.want != nil) {
			t.Errorf("ArgsOf(%q, %d) = %v, %v; want %v", tc.kind, tc.sleepMs, got, err, tc.want)
		}
	}
}
