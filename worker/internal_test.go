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

	"github.com/google/go-cmp/cmp"
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

// TestLockWait_AQuarterOfTheLeaseAndTwoSecondsAtMost: a completion, a
// failure or a release waits for a row another transaction holds for a
// quarter of the lease, and 2 s at most (docs/failure-semantics.md), so
// that a circle of waits breaks as a deadlock, after deadlock_timeout's
// second, only with a lease of 4 s or more.
func TestLockWait_AQuarterOfTheLeaseAndTwoSecondsAtMost(t *testing.T) {
	for _, tc := range []struct {
		lease time.Duration
		want  int32
	}{
		{DefaultLease, 2000},
		{8 * time.Second, 2000},
		{6 * time.Second, 1500},
		{4 * time.Second, 1000},
		{2 * time.Second, 500},
		{400 * time.Millisecond, 100},
	} {
		cfg, err := Config{Lease: tc.lease}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.lockWaitMs(); got != tc.want {
			t.Errorf("lease %s: lock wait %d ms, want %d ms", tc.lease, got, tc.want)
		}
	}
}

// TestRoundRetryMax_AQuarterOfTheHeartbeatIntervalFrom50MillisecondsTo2Seconds:
// a round that failed is sent again backing off to a quarter of the
// heartbeat interval, as a renewal is, so that the outcome of a handler
// that returned lands if the database is back before its lease runs out;
// 2 s at most, and never sooner than the first try again, 50 ms
// (docs/failure-semantics.md, "A network partition").
func TestRoundRetryMax_AQuarterOfTheHeartbeatIntervalFrom50MillisecondsTo2Seconds(t *testing.T) {
	for _, tc := range []struct {
		lease time.Duration
		want  time.Duration
	}{
		{DefaultLease, 2 * time.Second},
		{24 * time.Second, 2 * time.Second},
		{12 * time.Second, time.Second},
		{3 * time.Second, 250 * time.Millisecond},
		{300 * time.Millisecond, 50 * time.Millisecond},
	} {
		cfg, err := Config{Lease: tc.lease}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.roundRetryMax(); got != tc.want {
			t.Errorf("lease %s, heartbeat %s: rounds sent again at most %s apart, want %s", tc.lease, cfg.HeartbeatInterval, got, tc.want)
		}
	}
}

// TestEndWhenSilent_ALeaseOfSilenceInWholeSecondsUnlessTheURLSetsIt: the
// server is asked to probe a silent session after a third of the lease,
// every sixth of it, four times, and to give up on unacknowledged data
// after a lease, in whole seconds of at least one for the probes and
// within an int32 of milliseconds; a setting the session's connection
// string makes, as a parameter or among its options, is left to it.
func TestEndWhenSilent_ALeaseOfSilenceInWholeSecondsUnlessTheURLSetsIt(t *testing.T) {
	const unset = -1
	for _, tc := range []struct {
		lease                          time.Duration
		params                         map[string]string
		idle, interval, count, timeout int32
	}{
		{DefaultLease, nil, 10, 5, 4, 30000},
		{5 * time.Second, nil, 2, 1, 4, 5000},
		{100 * time.Millisecond, nil, 1, 1, 4, 100},
		{1000 * time.Hour, nil, 1200000, 600000, 4, math.MaxInt32},
		{DefaultLease, map[string]string{"tcp_keepalives_idle": "60"}, unset, 5, 4, 30000},
		{DefaultLease, map[string]string{"options": "-c tcp_user_timeout=9000 -c tcp_keepalives_count=9"}, 10, 5, unset, unset},
	} {
		got := endWhenSilent(tc.lease, tc.params)
		for _, s := range []struct {
			name string
			got  *int32
			want int32
		}{
			{"tcp_keepalives_idle", got.IdleSeconds, tc.idle},
			{"tcp_keepalives_interval", got.IntervalSeconds, tc.interval},
			{"tcp_keepalives_count", got.Count, tc.count},
			{"tcp_user_timeout", got.UserTimeoutMs, tc.timeout},
		} {
			switch {
			case s.want == unset && s.got != nil:
				t.Errorf("lease %s, params %v: %s = %d, want it left to the URL", tc.lease, tc.params, s.name, *s.got)
			case s.want != unset && s.got == nil:
				t.Errorf("lease %s, params %v: %s left to the URL, want %d", tc.lease, tc.params, s.name, s.want)
			case s.want != unset && *s.got != s.want:
				t.Errorf("lease %s, params %v: %s = %d, want %d", tc.lease, tc.params, s.name, *s.got, s.want)
			}
		}
	}
}

// TestAheadLimit_WhatTheSlotsStartWithinHalfThePrefetchWait: a worker
// claims ahead only once a handler has returned and while its handlers
// take less than half of PrefetchWait, and no more than its slots start
// within that half at their mean: 4 for one slot and jobs of 12 ms at the
// default wait (docs/failure-semantics.md, "Claiming ahead").
func TestAheadLimit_WhatTheSlotsStartWithinHalfThePrefetchWait(t *testing.T) {
	for _, tc := range []struct {
		name     string
		slots    int
		measured bool
		meanRun  time.Duration
		want     int
	}{
		{"one slot, jobs of 12 ms", 1, true, 12 * time.Millisecond, 4},
		{"two slots, jobs of 12 ms", 2, true, 12 * time.Millisecond, 8},
		{"ten slots, jobs of 1 ms: the default Prefetch", 10, true, time.Millisecond, DefaultMinPrefetch},
		{"jobs of half the wait", 1, true, DefaultPrefetchWait / 2, 0},
		{"no handler returned yet", 1, false, 0, 0},
	} {
		cfg, err := Config{Slots: tc.slots}.withDefaults()
		if err != nil {
			t.Fatal(err)
		}
		d := &dispatcher{w: &Worker{cfg: cfg}, measured: tc.measured, meanRun: tc.meanRun}
		if got := d.aheadLimit(); got != tc.want {
			t.Errorf("%s: ahead limit %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestRecheckReturned_50And100MillisecondsAfterAShortClaim: once a job has
// come back to available, a claim that comes back short is followed by a
// claim from the head 50 ms later and once more 100 ms after that, and no
// more until another job comes back (docs/failure-semantics.md, "The order
// of claims").
func TestRecheckReturned_50And100MillisecondsAfterAShortClaim(t *testing.T) {
	w := &Worker{}
	d := &dispatcher{w: w}
	short := func() *round { return &round{claim: 4, sentAt: time.Now()} }
	type answer struct {
		delay time.Duration
		ok    bool
	}
	ask := func() answer {
		delay, ok := d.recheckReturned(short())
		return answer{delay, ok}
	}
	if got := ask(); got.ok {
		t.Errorf("no job came back: recheck after %s, want none", got.delay)
	}
	w.returned.Store(time.Now().Add(-time.Millisecond).UnixNano())
	for i, want := range []answer{{50 * time.Millisecond, true}, {100 * time.Millisecond, true}, {0, false}} {
		if got := ask(); got != want {
			t.Errorf("short claim %d after a job came back: recheck %+v, want %+v", i+1, got, want)
		}
	}
	if delay, ok := d.recheckReturned(&round{claim: 0, sentAt: time.Now()}); ok {
		t.Errorf("a round that claimed nothing: recheck after %s, want none", delay)
	}
	w.returned.Store(time.Now().Add(-time.Millisecond).UnixNano())
	if got, want := ask(), (answer{50 * time.Millisecond, true}); got != want {
		t.Errorf("short claim after another job came back: recheck %+v, want %+v", got, want)
	}
}

// TestClaimCursors_ASecondBehindTheNewestClaimedOfUpToEightPriorities: a
// worker starts its claims of a priority one second behind the newest
// run_at it claimed there, keeps a cursor for 8 priorities at most, and
// claims from the head of every priority once a second, and at once when
// told to (docs/failure-semantics.md, "The order of claims").
func TestClaimCursors_ASecondBehindTheNewestClaimedOfUpToEightPriorities(t *testing.T) {
	var c claimCursors
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	if p, _ := c.params(now); p != nil {
		t.Fatalf("first claim: cursors for priorities %v, want a claim from the head", p)
	}
	var rows []db.JobCompleteAndClaimRow
	for prio := range int16(10) {
		for _, at := range []time.Time{now.Add(time.Duration(prio) * time.Minute), now} {
			rows = append(rows, db.JobCompleteAndClaimRow{Priority: &prio, RunAt: &at})
		}
	}
	c.claimed(rows, true, false)
	p, since := c.params(now.Add(999 * time.Millisecond))
	if len(p) != maxClaimCursors || maxClaimCursors != 8 {
		t.Fatalf("cursors for priorities %v, want for 8", p)
	}
	for i, prio := range p {
		if want := int16(i); prio != want {
			t.Errorf("cursor %d: priority %d, want %d", i, prio, want)
		}
		if want := now.Add(time.Duration(prio)*time.Minute - time.Second); !since[i].Equal(want) {
			t.Errorf("priority %d: claims start at %s, want %s, a second behind the newest claimed", prio, since[i], want)
		}
	}
	if p, _ := c.params(now.Add(time.Second)); p != nil {
		t.Errorf("a second after the last claim from the head: cursors for priorities %v, want a claim from the head", p)
	}
	if p, _ := c.params(now.Add(1500 * time.Millisecond)); p == nil {
		t.Error("half a second after a claim from the head: another from the head, want the cursors")
	}
	c.fromHead()
	if p, _ := c.params(now.Add(1600 * time.Millisecond)); p != nil {
		t.Errorf("told to claim from the head: cursors for priorities %v, want a claim from the head", p)
	}
}

// TestClaimCursors_AFullClaimFromTheHeadMovesItsLastPriorityBack: a claim
// from the head that came back full with jobs far behind the cursor of the
// last priority it took moves that cursor back to the last of them, for the
// claims that follow to take the rest; the cursors of the priorities before
// it, which it emptied, and those of any other claim only move ahead.
func TestClaimCursors_AFullClaimFromTheHeadMovesItsLastPriorityBack(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	row := func(prio int16, at time.Time) db.JobCompleteAndClaimRow {
		return db.JobCompleteAndClaimRow{Priority: &prio, RunAt: &at}
	}
	hourAgo := now.Add(-time.Hour)
	backlog := []db.JobCompleteAndClaimRow{row(0, hourAgo), row(1, hourAgo), row(1, hourAgo.Add(time.Second))}
	for _, tc := range []struct {
		name           string
		fromHead, full bool
		want           map[int16]time.Time
	}{
		{"a full claim from the head", true, true, map[int16]time.Time{0: now, 1: hourAgo.Add(time.Second)}},
		{"a claim from the head that came back short", true, false, map[int16]time.Time{0: now, 1: now}},
		{"a full claim from the cursors", false, true, map[int16]time.Time{0: now, 1: now}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c claimCursors
			c.claimed([]db.JobCompleteAndClaimRow{row(0, now), row(1, now)}, true, false)
			c.claimed(backlog, tc.fromHead, tc.full)
			if diff := cmp.Diff(tc.want, c.newest); diff != "" {
				t.Errorf("newest claimed per priority (-want +got):\n%s", diff)
			}
		})
	}
}
