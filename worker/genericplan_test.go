package worker_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgplan"
)

// TestStatements_GenericPlansLookJobsUpByIndex holds every statement a
// worker sends to the plan that a connection keeping generic plans
// (PlanSettings, which KeepGenericPlans gives relay work's pool) makes
// for it, over a backlog of 100,000 jobs and 200 running: before the table was
// ever analyzed (a queue filled at once, before any worker gathered
// statistics), once analyzed, and with a history of 100,000 finished jobs
// too. Each plan reads jobs through an index, touches a few buffers for
// each job it takes or finds, and is not compiled (JIT), which would cost
// every call of the plan far more than it saves.
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
	results := make([]json.RawMessage, len(ten))
	errs := make([]string, len(ten))
	permanent := make([]bool, len(ten))
	retry := make([]int64, len(ten))
	for i := range ten {
		results[i], errs[i], retry[i] = json.RawMessage(`{}`), "boom", 1000
	}
	window, day := int64(1000), int64(24*time.Hour/time.Millisecond)
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
				CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: []json.RawMessage{},
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
			_, err := q.JobReclaim(b.ctx, db.JobReclaimParams{MaxJobs: 1000, ExpiredWithinMs: &window})
			return err
		}, 200},
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
				if strings.Contains(plan, `"JIT"`) {
					t.Errorf("is compiled (JIT) at every call")
				}
				if limit := int64(20*tc.taken + 100); root.Buffers() > limit {
					t.Errorf("touched %d buffers, want at most %d", root.Buffers(), limit)
				}
				if t.Failed() {
					t.Logf("plan:\n%s", plan)
				}
			})
		}
	}
}

// explainGeneric prepares the statement that call sends on a connection of
// its own that keeps generic plans, and runs it under EXPLAIN (ANALYZE,
// BUFFERS) with call's arguments, in a transaction rolled back. It
// returns the root of the plan and the plan as JSON.
func explainGeneric(t *testing.T, b *bundle, call func(q *db.Queries) error) (pgplan.Node, string) {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(b.ctx)
	var sql string
	var args []any
	if err := call(db.New(captureQuery(&sql, &args)(conn))); err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(b.ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(b.ctx)
	for _, stmt := range []string{`SET LOCAL plan_cache_mode = force_generic_plan`, `PREPARE generic AS ` + sql} {
		if _, err := tx.Exec(b.ctx, stmt); err != nil {
			t.Fatalf("%.40s: %v", stmt, err)
		}
	}
	literals := argLiterals(t, b, tx, args)
	var out []byte
	if err := tx.QueryRow(b.ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE generic(`+strings.Join(literals, ", ")+`)`).Scan(&out); err != nil {
		t.Fatal(err)
	}
	root, err := pgplan.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	return root, string(out)
}

// argLiterals writes out the arguments of the statement prepared as
// generic in tx, as SQL literals of the types PREPARE inferred for its
// parameters, in pgx's text encoding of each.
func argLiterals(t *testing.T, b *bundle, tx pgx.Tx, args []any) []string {
	t.Helper()
	rows, err := tx.Query(b.ctx, `
		SELECT p.oid::oid, p.oid::regtype::text
		FROM pg_prepared_statements AS s, unnest(s.parameter_types) WITH ORDINALITY AS p (oid, n)
		WHERE s.name = 'generic' ORDER BY p.n`)
	if err != nil {
		t.Fatal(err)
	}
	type param struct {
		OID  uint32
		Name string
	}
	params, err := pgx.CollectRows(rows, pgx.RowToStructByPos[param])
	if err != nil {
		t.Fatal(err)
	}
	if len(params) != len(args) {
		t.Fatalf("the statement takes %d parameters, and was sent %d arguments", len(params), len(args))
	}
	literals := make([]string, len(args))
	for i, arg := range args {
		text, err := tx.Conn().TypeMap().Encode(params[i].OID, pgtype.TextFormatCode, arg, nil)
		if err != nil {
			t.Fatalf("argument %d: %v", i+1, err)
		}
		if text == nil {
			literals[i] = fmt.Sprintf("NULL::%s", params[i].Name)
			continue
		}
		literals[i] = fmt.Sprintf("'%s'::%s", strings.ReplaceAll(string(text), "'", "''"), params[i].Name)
	}
	return literals
}
