package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
)

// recordingWorker makes a worker "w" of slots on pool, and returns it with
// a function that returns what it reported of each job so far, as
// "<outcome> accepted=<bool>".
func recordingWorker(t *testing.T, pool *pgxpool.Pool, slots int) (*Worker, func() map[int64][]string) {
	t.Helper()
	var mu sync.Mutex
	acks := map[int64][]string{}
	w, err := New(pool, Config{ID: "w", Slots: slots, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), OnAck: func(a Ack) {
		mu.Lock()
		defer mu.Unlock()
		acks[a.Job.ID] = append(acks[a.Job.ID], fmt.Sprintf("%s accepted=%t", a.Outcome, a.Accepted))
	}})
	if err != nil {
		t.Fatal(err)
	}
	return w, func() map[int64][]string {
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(acks)
	}
}

// insertAndClaim stores n noop jobs of maxAttempts on queue and claims them
// for worker "w", leased for a minute, as its claim would.
func insertAndClaim(t *testing.T, pool *pgxpool.Pool, queue string, n int, maxAttempts int32) []db.JobCompleteAndClaimRow {
	t.Helper()
	ctx := context.Background()
	q := db.New(pool)
	tokens := make([]pgtype.UUID, n)
	for i := range tokens {
		if _, err := q.JobInsert(ctx, db.JobInsertParams{Queue: queue, Kind: "noop", Payload: json.RawMessage(`{}`), MaxAttempts: maxAttempts}); err != nil {
			t.Fatal(err)
		}
		tokens[i] = pgtype.UUID{Bytes: uuid.New(), Valid: true}
	}
	rows, err := q.JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
		Queue: queue, ClaimTokens: tokens, LeaseMs: time.Minute.Milliseconds(), WorkerID: "w",
	})
	if err != nil || len(rows) != n {
		t.Fatalf("claim: %d rows, %v; want %d", len(rows), err, n)
	}
	return rows
}

// TestAheadLimit_AHugePrefetchWaitStillClaimsAhead: with a lease and a
// prefetch wait of years, slots·PrefetchWait/2 passes the largest int64;
// the limit must stay Prefetch, not wrap negative and keep the worker
// from claiming even for its free slots.
func TestAheadLimit_AHugePrefetchWaitStillClaimsAhead(t *testing.T) {
	for _, tc := range []struct {
		slots        int
		prefetchWait time.Duration
	}{
		{10, 100 * 365 * 24 * time.Hour},
		{MaxSlots, 30 * 24 * time.Hour},
		{MaxSlots, math.MaxInt64 - 1},
		{4, 100 * time.Millisecond},
	} {
		cfg, err := Config{Slots: tc.slots, Lease: math.MaxInt64, PrefetchWait: tc.prefetchWait}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		d := &dispatcher{w: &Worker{cfg: cfg}, measured: true, meanRun: time.Millisecond}
		if got := d.aheadLimit(); got != cfg.Prefetch {
			t.Errorf("slots %d, prefetch wait %s: ahead limit %d, want Prefetch %d", tc.slots, tc.prefetchWait, got, cfg.Prefetch)
		}
	}
}
