package worker_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgplan"
	"github.com/relayq/relay/worker"
)

// TestStatements_GenericPlansLookJobsUpByIndex holds every statement of a
// worker's pool that reads jobs to the plan that a connection keeping
// generic plans (as KeepGenericPlans sets relay work's pool) makes for
// it, over a backlog of 100,000 jobs and 200 running: before the table
// was ever analyzed (a queue filled at once, before any worker gathered
// statistics), once analyzed, and with a history of 100,000 finished jobs
// too. Each plan reads jobs through an index and touches a bounded number
// of buffers for each job it takes or finds.
func TestStatements_GenericPlansLookJobsUpByIndex(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `INSERT INTO jobs (queue, kind) SELECT 'default', 'noop' FROM generate_series(1, 100200)`); err != nil {
		t.Fatal(err)
	}
	held := b.claim(t, "w", 200, time.Hour)

	ten := held[:10]
	ids := make([]int64, len(ten))
	tokens := make([]pgtype.UUID, len(ten))
	for i, r := range ten {
		ids[i], tokens[i] = *r.ID, r.LeaseToken
	}
	results := make([][]byte, len(ten))
	errs := make([]string, len(ten))
	permanent := make([]bool, len(ten))
	retry := make([]int64, len(ten))
	for i := range ten {
		results[i], errs[i], retry[i] = json.RawMessage(`{}`), "boom", 1000
	}
	day := int64(24 * time.Hour / time.Millisecond)
	window := time.Now().Add(-time.Second)
	claimAt := []int16{0}
	since := []time.Time{time.Now().Add(-time.Hour)}

	statements := []struct {
		name string
		call func(q *db.Queries) error
		// taken is how many jobs the statement takes or finds at most.
		taken int
	}{
		{"complete and claim", func(q *db.Queries) error {
			_, err := q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
				CompleteIDs: ids, CompleteTokens: tokens, CompleteResults: results,
				CursorPriorities: claimAt, CursorSince: since,
				Queue: "default", ClaimTokens: leaseTokens(10), LeaseMs: 60_000, WorkerID: "w"})
			return err
		}, 20},
		{"claim from the head", func(q *db.Queries) error {
			_, err := q.JobCompleteAndClaim(b.ctx, db.JobCompleteAndClaimParams{
				CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
				Queue: "default", ClaimTokens: leaseTokens(200), LeaseMs: 60_000, WorkerID: "w"})
			return err
		}, 200},
		{"complete", func(q *db.Queries) error {
			_, err := q.JobCompleteMany(b.ctx, db.JobCompleteManyParams{IDs: ids, Tokens: tokens, Results: results})
			return err
		}, 10},
		{"heartbeat", func(q *db.Queries) error {
			_, err := q.JobHeartbeatMany(b.ctx, db.JobHeartbeatManyParams{LeaseMs: 60_000, IDs: ids, Tokens: tokens})
			return err
		}, 10},
		{"fail", func(q *db.Queries) error {
			_, err := q.JobFailMany(b.ctx, db.JobFailManyParams{IDs: ids, Tokens: tokens, Errors: errs, Permanent: permanent, RetryInMs: retry})
			return err
		}, 10},
		{"release", func(q *db.Queries) error {
			_, err := q.JobReleaseMany(b.ctx, db.JobReleaseManyParams{IDs: ids, Tokens: tokens})
			return err
		}, 10},
		{"find a lost claim's jobs", func(q *db.Queries) error {
			_, err := q.JobGetClaimed(b.ctx, tokens)
			return err
		}, 200},
		{"reclaim, a full pass", func(q *db.Queries) error {
			_, err := q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 1000})
			return err
		}, 200},
		{"reclaim within a window", func(q *db.Queries) error {
			_, err := q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 1000, ExpiredSince: &window, RecheckIDs: []int64{}})
			return err
		}, 200},
		{"reclaim within a window, with jobs to look up again", func(q *db.Queries) error {
			_, err := q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 1000, ExpiredSince: &window, RecheckIDs: ids})
			return err
		}, 200},
		{"forget the sessions that ended", func(q *db.Queries) error {
			_, err := q.WorkerForgetEnded(b.ctx, []int32{1})
			return err
		}, 1},
		{"prune", func(q *db.Queries) error {
			_, err := q.JobPrune(b.ctx, db.JobPruneParams{RetainSucceededMs: &day, RetainDeadMs: &day, RetainCancelledMs: &day, MaxJobs: 1000})
			return err
		}, 3},
	}
	for _, state := range []struct{ name, sql string }{
		{"a backlog never analyzed", ``},
		{"the backlog analyzed", `ANALYZE jobs`},
		{"a history analyzed", `
			INSERT INTO jobs (kind, state, attempt, fence, leased_by, started_at, finished_at)
			SELECT 'noop', 'succeeded', 1, 1, 'w', now(), now() FROM generate_series(1, 100000);
			ANALYZE jobs`},
	} {
		if state.sql != "" {
			if _, err := b.pool.Exec(b.ctx, state.sql); err != nil {
				t.Fatal(err)
			}
		}
		for _, tc := range statements {
			t.Run(state.name+"/"+tc.name, func(t *testing.T) {
				root, plan := explainGeneric(t, b, tc.call)
				root.Walk(func(n pgplan.Node) {
					if n.RelationName == "jobs" && n.NodeType == "Seq Scan" {
						t.Errorf("reads jobs by a %s", n.NodeType)
					}
				})
				// A job a statement changes gets a new version in each of
				// jobs' indexes that its new state enters, a descent of a few
				// pages each, and rolled-back statements before it leave
				// entries to step over: about 25 pages a job, measured. A
				// sequential scan of these tables reads more than 2,000.
				if limit := int64(40*tc.taken + 200); root.Buffers() > limit {
					t.Errorf("touched %d buffers, want at most %d", root.Buffers(), limit)
				}
				if t.Failed() {
					t.Logf("plan:\n%s", plan)
				}
			})
		}
	}
}

// explainGeneric prepares the statement that call sends on a connection
// of its own with a worker's settings (KeepGenericPlans), and runs it under EXPLAIN (ANALYZE,
// BUFFERS) with call's arguments, in a transaction rolled back. It
// returns the root of the plan and the plan as JSON.
func explainGeneric(t *testing.T, b *bundle, call func(q *db.Queries) error) (pgplan.Node, string) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	worker.KeepGenericPlans(cfg)
	conn, err := pgx.ConnectConfig(b.ctx, cfg.ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	tx, err := conn.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	return explainJSON(t, b, tx, prepareGeneric(t, b, tx, "generic", call))
}
