package server

import (
	"context"
	"fmt"
	"maps"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgplan"
)

// listPlanCases are the filters of a listing, each with the index over
// finished jobs its statement must read (the primary key for the listing
// without a filter), over a history of finished jobs (see
// listPlanHistories) with a few available jobs of queue q1 and kind k3, and
// none running. Every filtered listing reads the jobs not finished
// through jobs_active_state_idx too. Those that match nothing must cost a
// few index pages, however long the history.
var listPlanCases = []struct {
	query    string
	finished string
	empty    bool
}{
	{"", "jobs_pkey", false},
	{"state=succeeded", "jobs_finished_state_idx", false},
	{"state=running", "jobs_finished_state_idx", true},
	{"state=available", "jobs_finished_state_idx", false},
	{"queue=q1", "jobs_finished_queue_state_idx", false},
	{"queue=none", "jobs_finished_queue_state_idx", true},
	{"queue=q1&after=9000000000000000000", "jobs_finished_queue_state_idx", true},
	{"queue=q1&state=cancelled", "jobs_finished_queue_state_idx", false},
	{"queue=q1&state=running", "jobs_finished_queue_state_idx", true},
	{"queue=none&state=available", "jobs_finished_queue_state_idx", true},
	{"kind=k3", "jobs_finished_kind_state_idx", false},
	{"kind=none", "jobs_finished_kind_state_idx", true},
	{"kind=k3&state=cancelled", "jobs_finished_kind_state_idx", false},
	{"kind=k3&state=running", "jobs_finished_kind_state_idx", true},
	{"queue=q1&kind=k3", "jobs_finished_queue_kind_state_idx", false},
	{"queue=q1&kind=none", "jobs_finished_queue_kind_state_idx", true},
	{"queue=none&kind=k3", "jobs_finished_queue_kind_state_idx", true},
	{"queue=q1&kind=k3&state=succeeded", "jobs_finished_queue_kind_state_idx", false},
	{"queue=q1&kind=k3&state=running", "jobs_finished_queue_kind_state_idx", true},
}

// activeIndex is the index a listing reads the jobs not finished through.
const activeIndex = "jobs_active_state_idx"

// listPlanHistories are the histories the plans are checked over, by the
// queue and kind of job number i: several of each, and one of each, where
// the statistics say that a filter on the kind leaves every job.
var listPlanHistories = []struct{ name, queue, kind string }{
	{"4 queues and 7 kinds", "'q' || i % 4", "'k' || i % 7"},
	{"1 queue and 1 kind", "'q1'", "'k3'"},
}

// maxScanBuffers bounds the index pages a scan of a listing touches beyond
// the jobs it finds: a descent of its index, a few levels deep, and the
// leaf it ends on.
const maxScanBuffers = 5

// TestListJobs_EveryFilterReadsItsIndexWithoutScanningTheHistory explains
// the statement each filter runs, as the generated code sends it, both
// planned for its values (a custom plan) and for any values (the generic
// plan that pgx's prepared statements get after a few executions), over
// 10,000 and then 200,000 finished jobs of each of listPlanHistories.
// Every plan reads only its indexes, each in order, and sorts at most the
// rows its branches read, a page at most for each state; one that
// matches nothing touches a few pages, and no more over the longer history
// than one level more of the index in each range it reads.
func TestListJobs_EveryFilterReadsItsIndexWithoutScanningTheHistory(t *testing.T) {
	t.Parallel()
	for _, h := range listPlanHistories {
		t.Run(h.name, func(t *testing.T) {
			checkListPlans(t, h.queue, h.kind)
		})
	}
}

// checkListPlans checks every case of listPlanCases over a history of its
// own, whose jobs' queue and kind are the SQL expressions given.
func checkListPlans(t *testing.T, queue, kind string) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())

	buffers := map[string]int64{} // by query and plan, over the shorter history
	for _, history := range []int{10_000, 200_000} {
		addHistory(t, ctx, e.pool, history, queue, kind)
		for _, tt := range listPlanCases {
			for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
				name := fmt.Sprintf("%d jobs/%s/%s", history, tt.query, strings.TrimSuffix(strings.TrimPrefix(mode, "force_"), "_plan"))
				t.Run(name, func(t *testing.T) {
					plan := explainList(t, ctx, conn, mode, tt.query)
					want := map[string]bool{tt.finished: true}
					if tt.query != "" {
						want[activeIndex] = true
					}
					read := map[string]bool{}
					scans, scanned := 0, 0.0
					plan.Walk(func(n pgplan.Node) {
						switch n.NodeType {
						case "Index Scan", "Index Only Scan":
							scans++
							scanned += n.ActualRows * max(n.ActualLoops, 1)
							read[n.IndexName] = true
							if !want[n.IndexName] {
								t.Errorf("reads %s, want only %v", n.IndexName, slices.Sorted(maps.Keys(want)))
							}
						case "Sort":
							// The page, sorted from what each state's
							// branch read, in index order.
							if len(n.Plans) != 1 || n.Plans[0].NodeType != "Append" {
								t.Errorf("sorts something other than the branches' rows")
							}
						case "Limit", "Merge Append", "Subquery Scan", "Append", "Result":
						default:
							t.Errorf("has a %s node", n.NodeType)
						}
					})
					for name := range want {
						if !read[name] {
							t.Errorf("does not read %s", name)
						}
					}
					got := plan.Buffers()
					t.Logf("%d index scans, %d rows, %d buffers", scans, int(plan.ActualRows), got)
					defer func() {
						if t.Failed() {
							t.Logf("plan:\n%s", explainText(t, ctx, conn, mode, tt.query))
						}
					}()
					if !tt.empty {
						// A page: the rows its scans read (at most a page
						// for each state), each on a page of its own at
						// worst, and a few index pages per scan.
						if plan.ActualRows == 0 {
							t.Errorf("found no jobs")
						}
						if limit := 2*int64(scanned) + maxScanBuffers*int64(scans); got > limit {
							t.Errorf("touched %d buffers for the %v jobs its scans read, want at most %d", got, scanned, limit)
						}
						return
					}
					if plan.ActualRows != 0 {
						t.Errorf("found %v jobs, want none", plan.ActualRows)
					}
					if limit := maxScanBuffers * int64(scans); got > limit {
						t.Errorf("touched %d buffers, want at most %d", got, limit)
					}
					key := tt.query + " " + mode
					if before, ok := buffers[key]; !ok {
						buffers[key] = got
					} else if got > before+int64(scans) {
						t.Errorf("touched %d buffers over %d jobs, %d over 10,000: more than one index level more per scan", got, history, before)
					}
				})
			}
		}
	}
}

// addHistory inserts finished jobs until the table holds n of them (see
// addFinished), and ten available jobs of q1 and k3, and refreshes the
// statistics (see analyzeWhole).
func addHistory(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int, queue, kind string) {
	t.Helper()
	addFinished(t, ctx, pool, n, queue, kind)
	if _, err := pool.Exec(ctx, `INSERT INTO jobs (queue, kind) SELECT 'q1', 'k3' FROM generate_series(1, 10)`); err != nil {
		t.Fatal(err)
	}
	analyzeWhole(t, ctx, pool)
}

// analyzeWhole refreshes the statistics of jobs from every row, not from
// a sample. A sample of 30,000 rows out of 200,000 finished jobs draws a
// few of the 30 waiting or running ones, or none, and the planner's choice
// of index for them then differs from run to run. The plans under test are
// the ones the planner makes when it knows the table; the targets are
// raised on the test's own database only.
func analyzeWhole(t *testing.T, ctx context.Context, pool *pgxpool.Pool) {
	t.Helper()
	// ANALYZE samples 300 rows per unit of the largest column target.
	if _, err := pool.Exec(ctx, `
		ALTER TABLE jobs ALTER COLUMN state SET STATISTICS 1000;
		ANALYZE jobs`); err != nil {
		t.Fatal(err)
	}
	var rows int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM jobs`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows > 300_000 {
		t.Fatalf("jobs holds %d rows, more than ANALYZE reads whole at a target of 1000", rows)
	}
}

// addFinished inserts finished jobs until the table holds n of them:
// mostly succeeded, some dead or cancelled, job number i in the queue and
// of the kind that the SQL expressions queue and kind make of i.
func addFinished(t *testing.T, ctx context.Context, pool *pgxpool.Pool, n int, queue, kind string) {
	t.Helper()
	if _, err := pool.Exec(ctx, fmt.Sprintf(`
		INSERT INTO jobs (queue, kind, state, attempt, fence, leased_by, started_at, finished_at, last_error, error_count)
		SELECT %s, %s,
		       (CASE WHEN i %% 10 = 0 THEN 'dead' WHEN i %% 17 = 0 THEN 'cancelled' ELSE 'succeeded' END)::job_state,
		       1, 1, 'w', now(), now(),
		       CASE WHEN i %% 10 = 0 THEN 'boom' END, CASE WHEN i %% 10 = 0 THEN 1 ELSE 0 END
		FROM generate_series((SELECT count(*) + 1 FROM jobs WHERE finished_at IS NOT NULL), %d) AS i`, queue, kind, n)); err != nil {
		t.Fatal(err)
	}
}

// explainList runs EXPLAIN (ANALYZE, BUFFERS) on the statement that
// listJobs sends for the listing query, with its arguments, prepared on conn
// and planned as plan_cache_mode says.
func explainList(t *testing.T, ctx context.Context, conn *pgx.Conn, mode, query string) pgplan.Node {
	t.Helper()
	plan, err := pgplan.Parse([]byte(explain(t, ctx, conn, mode, query, "ANALYZE, BUFFERS, FORMAT JSON")))
	if err != nil {
		t.Fatal(err)
	}
	return plan
}

func explainText(t *testing.T, ctx context.Context, conn *pgx.Conn, mode, query string) string {
	t.Helper()
	return explain(t, ctx, conn, mode, query, "ANALYZE, BUFFERS, COSTS OFF, TIMING OFF")
}

func explain(t *testing.T, ctx context.Context, conn *pgx.Conn, mode, query, options string) string {
	t.Helper()
	sql, args := listStatement(t, ctx, conn, query)
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "PREPARE list AS "+sql); err != nil {
		t.Fatalf("prepare: %v\n%s", err, sql)
	}
	defer conn.Exec(context.Background(), "DEALLOCATE list") //nolint:errcheck
	// EXPLAIN EXECUTE takes no bind parameters: the arguments are written
	// out, as literals of the types PREPARE inferred.
	var types []string
	if err := conn.QueryRow(ctx, "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'list'").Scan(&types); err != nil {
		t.Fatal(err)
	}
	if len(types) != len(args) {
		t.Fatalf("the statement takes %d parameters, and was sent %d arguments", len(types), len(args))
	}
	params := make([]string, len(args))
	for i, arg := range args {
		params[i] = "'" + strings.ReplaceAll(fmt.Sprint(arg), "'", "''") + "'::" + types[i]
	}
	rows, err := conn.Query(ctx, fmt.Sprintf("EXPLAIN (%s) EXECUTE list(%s)", options, strings.Join(params, ", ")))
	if err != nil {
		t.Fatal(err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// listStatement returns the SQL and arguments that the listing query has
// listJobs send, as GET /v1/jobs would with the default page size.
func listStatement(t *testing.T, ctx context.Context, conn *pgx.Conn, query string) (string, []any) {
	t.Helper()
	filter, _, err := listParams(httptest.NewRequest("GET", "/v1/jobs?"+query, nil))
	if err != nil {
		t.Fatalf("%s: %v", query, err)
	}
	rec := &statementRecorder{DBTX: conn}
	if _, err := listJobs(ctx, db.New(rec), filter); err != nil {
		t.Fatal(err)
	}
	return rec.sql, rec.args
}

// statementRecorder is a db.DBTX that keeps the SQL and arguments of the
// last query sent through it.
type statementRecorder struct {
	db.DBTX
	sql  string
	args []any
}

func (r *statementRecorder) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.sql, r.args = sql, args
	return r.DBTX.Query(ctx, sql, args...)
}
