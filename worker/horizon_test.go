package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgplan"
)

// The tests of this file hold a REPEATABLE READ snapshot open while
// thousands of jobs run, as a report, a pg_dump or a session idle in a
// transaction would: no row version those jobs leave can be removed, nor
// can their index entries be marked dead. Each statement of a job's life
// must then read no more than it does on a clean table.

// pinSnapshot takes a REPEATABLE READ snapshot on a connection of its
// own and holds it open until the test ends, as a report or a session idle
// in a transaction would, so that no row version deleted or updated after
// it can be removed, nor its index entries marked dead. It returns how
// many jobs the snapshot sees.
func pinSnapshot(t *testing.T, b *bundle) int64 {
	t.Helper()
	reader, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reader.Close(context.Background()) })
	pin, err := reader.BeginTx(b.ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	var seen int64
	if err := pin.QueryRow(b.ctx, "SELECT count(*) FROM jobs").Scan(&seen); err != nil {
		t.Fatal(err)
	}
	return seen
}

// pinnedHistory runs n jobs, their run_at 10 ms apart, through claim and
// completion while a snapshot taken before is held open until the test
// ends, then refreshes the statistics, as autovacuum's analyze would, to
// show few running jobs. Each claim's lease lasts lease, so the running
// versions left behind expire that long after their claim. It returns the
// newest run_at claimed.
func pinnedHistory(t *testing.T, b *bundle, n int, lease time.Duration) time.Time {
	t.Helper()
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO jobs (queue, kind, run_at)
		SELECT 'default', 'noop', now() - interval '1 hour' + i * interval '10 milliseconds'
		FROM generate_series(1, $1) AS i`, n); err != nil {
		t.Fatal(err)
	}
	pinSnapshot(t, b)
	var newest time.Time
	for done := 0; done < n; {
		rows := b.claim(t, "w", 500, lease)
		if len(rows) == 0 {
			t.Fatalf("claimed %d jobs, want %d", done, n)
		}
		p := db.JobCompleteAndClaimParams{Queue: "default", LeaseMs: lease.Milliseconds(), WorkerID: "w"}
		for _, r := range rows {
			if r.RunAt.After(newest) {
				newest = *r.RunAt
			}
			p.CompleteIDs = append(p.CompleteIDs, *r.ID)
			p.CompleteTokens = append(p.CompleteTokens, r.LeaseToken)
			p.CompleteResults = append(p.CompleteResults, nil)
		}
		got, err := b.q.JobCompleteAndClaim(b.ctx, p)
		if err != nil || len(got[0].CompletedIDs) != len(rows) {
			t.Fatalf("complete %d jobs: %v, %v", len(rows), got, err)
		}
		done += len(rows)
	}
	if _, err := b.pool.Exec(b.ctx, "ANALYZE jobs"); err != nil {
		t.Fatal(err)
	}
	return newest
}

// explained is what EXPLAIN ANALYZE says of one statement: the buffers it
// read, its plan, and the plan as JSON.
type explained struct {
	buffers int64
	root    pgplan.Node
	plan    string
}

// explain explains the one statement that call sends through the queries
// given, with its arguments, running it once under EXPLAIN ANALYZE in a
// transaction rolled back; check, if not nil, then runs in that
// transaction and sees what the statement did.
func explain(t *testing.T, b *bundle, call func(q *db.Queries) error, check func(tx pgx.Tx)) explained {
	t.Helper()
	tx, err := b.pool.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	sql, args := statementOf(t, call)
	root, plan := explainJSON(t, b, tx, sql, args...)
	if check != nil {
		check(tx)
	}
	return explained{buffers: root.Buffers(), root: root, plan: plan}
}

func TestClaim_FromACursorStepsOverTheJobsClaimedUnderAPinnedHorizon(t *testing.T) {
	t.Parallel()
	b := setup(t)
	newest := pinnedHistory(t, b, 5000, time.Hour)
	fresh := b.enqueue(t, "noop", `{}`, 1)
	claim := func(priorities []int16, since []time.Time) explained {
		return explain(t, b, func(q *db.Queries) error {
			_, err := q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
				CursorPriorities: priorities, CursorSince: since,
				Queue: "default", ClaimTokens: leaseTokens(1), LeaseMs: 30_000, WorkerID: "explain",
			})
			return err
		}, func(tx pgx.Tx) {
			var id int64
			if err := tx.QueryRow(b.ctx, "SELECT id FROM jobs WHERE leased_by = 'explain'").Scan(&id); err != nil || id != fresh.ID {
				t.Fatalf("the claim took %d (%v), want the fresh job %d", id, err, fresh.ID)
			}
		})
	}
	fromHead := claim(nil, nil).buffers
	// A worker's cursor: a second behind the newest job it claimed.
	fromCursor := claim([]int16{0}, []time.Time{newest.Add(-time.Second)}).buffers
	t.Logf("buffers read by a claim: %d from the head, %d from the cursor", fromHead, fromCursor)
	if fromHead < 100 {
		t.Fatalf("a claim from the head read %d buffers: the fixture did not pin the claim index's entries", fromHead)
	}
	if fromCursor*4 > fromHead {
		t.Errorf("a claim from its cursor read %d buffers, not much fewer than the %d from the head", fromCursor, fromHead)
	}
}

func TestAcknowledgements_UnderAPinnedHorizonLookTheirJobsUpByID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pinnedHistory(t, b, 5000, time.Hour)
	b.enqueue(t, "noop", `{}`, 3)
	id, token := b.claimOne(t, "w", time.Hour)
	ids, tokens := []int64{id}, []pgtype.UUID{token}
	for _, tc := range []struct {
		name string
		call func(q *db.Queries) error
	}{
		{"complete", func(q *db.Queries) error {
			_, err := q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
				CompleteIDs: ids, CompleteTokens: tokens, CompleteResults: [][]byte{nil},
				Queue: "default", LeaseMs: 30_000, WorkerID: "w",
			})
			return err
		}},
		{"heartbeat", func(q *db.Queries) error {
			_, err := q.JobHeartbeatMany(b.ctx, db.JobHeartbeatManyParams{IDs: ids, Tokens: tokens, LeaseMs: 30_000})
			return err
		}},
		{"fail", func(q *db.Queries) error {
			_, err := q.JobFailMany(b.ctx, db.JobFailManyParams{
				IDs: ids, Tokens: tokens, Errors: []string{"boom"}, Permanent: []bool{false}, RetryInMs: []int64{1000},
			})
			return err
		}},
		{"release", func(q *db.Queries) error {
			_, err := q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{IDs: ids, Tokens: tokens})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := explain(t, b, tc.call, nil)
			t.Logf("%s read %d buffers", tc.name, got.buffers)
			if got.buffers > 40 {
				t.Errorf("%s of one job read %d buffers, want at most 40; plan:\n%s", tc.name, got.buffers, got.plan)
			}
			if strings.Contains(got.plan, "jobs_active_state_idx") {
				t.Errorf("%s reads jobs_active_state_idx:\n%s", tc.name, got.plan)
			}
		})
	}
}

func TestReclaim_UnderAPinnedHorizonReadsOnlyItsWindowOfLeases(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Every running version the history leaves expired a little after its
	// claim; a full pass steps over each.
	pinnedHistory(t, b, 5000, 2*time.Second)
	time.Sleep(2100 * time.Millisecond)
	reclaim := func(since *time.Time, recheck []int64) explained {
		return explain(t, b, func(q *db.Queries) error {
			_, err := q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 1000, ExpiredSince: since, RecheckIDs: recheck})
			return err
		}, nil)
	}
	full := reclaim(nil, nil)
	now, err := b.q.DatabaseNow(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	tenMsAgo := now.Add(-10 * time.Millisecond)
	windowed := reclaim(&tenMsAgo, []int64{})
	// Jobs a previous reclaim left, as a worker gives them back: looked up
	// by id, not by reading the expired leases.
	rechecking := reclaim(&tenMsAgo, []int64{1, 2, 3})
	t.Logf("buffers read by a reclaim: %d in a full pass, %d within a window of 10 ms, %d with 3 jobs to look up again",
		full.buffers, windowed.buffers, rechecking.buffers)
	if full.buffers < 50 {
		t.Fatalf("a full pass read %d buffers: the fixture did not pin the lease index's entries", full.buffers)
	}
	for _, r := range []struct {
		name string
		explained
	}{{"within its window", windowed}, {"within its window, with jobs to look up again", rechecking}} {
		if r.buffers*4 > full.buffers {
			t.Errorf("a reclaim %s read %d buffers, not much fewer than a full pass's %d; plan:\n%s", r.name, r.buffers, full.buffers, r.plan)
		}
	}
	for _, r := range []explained{full, windowed, rechecking} {
		if strings.Contains(r.plan, "jobs_active_state_idx") {
			t.Errorf("the reclaim reads jobs_active_state_idx:\n%s", r.plan)
		}
	}
}

// TestClaim_UnderAPinnedHorizonKeepsToTheClaimIndexWhenFewJobsAreAvailable
// analyzes the table as autovacuum would during a pin: 10,000 jobs claimed
// and completed since the snapshot, 5 waiting. The statistics then say
// that almost no job is available, and the planner may read the queue's
// available entries of another index, which keeps an entry for every
// version claimed since the pin, instead of starting at the claim's
// cursor in jobs_claim_idx.
func TestClaim_UnderAPinnedHorizonKeepsToTheClaimIndexWhenFewJobsAreAvailable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	newest := pinnedHistory(t, b, 10_000, time.Hour)
	for range 5 {
		b.enqueue(t, "noop", `{}`, 1)
	}
	if _, err := b.pool.Exec(b.ctx, "ANALYZE jobs"); err != nil {
		t.Fatal(err)
	}
	got := explain(t, b, func(q *db.Queries) error {
		_, err := q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
			CursorPriorities: []int16{0}, CursorSince: []time.Time{newest.Add(-time.Second)},
			Queue: "default", ClaimTokens: leaseTokens(10), LeaseMs: 30_000, WorkerID: "explain",
		})
		return err
	}, nil)
	got.root.Walk(func(n pgplan.Node) {
		scan := strings.HasSuffix(n.NodeType, "Scan")
		if scan && n.RelationName == "jobs" && n.IndexName != "jobs_claim_idx" && n.IndexName != "jobs_pkey" && n.ActualLoops > 0 {
			t.Errorf("the claim reads jobs through %s (%s):\n%s", n.IndexName, n.NodeType, got.plan)
		}
	})
	if got.buffers > 100 {
		t.Errorf("the claim read %d buffers, want at most 100:\n%s", got.buffers, got.plan)
	}
}
