package worker_test

import (
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgplan"
)

// keptPlan is one of the worker's statements prepared on a connection of
// its own with a generic plan, made at its first execution and kept: the
// plan PostgreSQL comes to cache for it on a worker's connection.
type keptPlan struct {
	conn    *pgx.Conn
	execute string
}

// keepPlan prepares the statement that call sends, as name, makes its
// plan by running execute (EXECUTE name(...), with the arguments written
// out), and closes the connection when the test ends.
func keepPlan(t *testing.T, b *bundle, name string, call func(q *db.Queries) error, execute string) keptPlan {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(b.ctx) })
	var sql string
	var args []any
	if err := call(db.New(captureQuery(&sql, &args)(conn))); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`SET plan_cache_mode = force_generic_plan`,
		`PREPARE ` + name + ` AS ` + sql,
		execute,
	} {
		if _, err := conn.Exec(b.ctx, stmt); err != nil {
			t.Fatalf("%.40s: %v", stmt, err)
		}
	}
	return keptPlan{conn: conn, execute: execute}
}

// explain runs the statement again under EXPLAIN ANALYZE, which uses the
// plan kept unless the statistics of its tables changed since, and says
// whether it scanned the jobs table, how many buffers it read, and the
// plan.
func (k keptPlan) explain(t *testing.T, b *bundle) (scanned bool, buffers int64, plan string) {
	t.Helper()
	var out []byte
	if err := k.conn.QueryRow(b.ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+k.execute).Scan(&out); err != nil {
		t.Fatal(err)
	}
	root, err := pgplan.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	root.Walk(func(n pgplan.Node) {
		scanned = scanned || (n.NodeType == "Seq Scan" && n.RelationName == "jobs" && n.ActualLoops > 0)
	})
	return scanned, root.Buffers(), string(out)
}

// addFinishedJobs inserts n succeeded jobs, without gathering statistics.
func addFinishedJobs(t *testing.T, b *bundle, n int) {
	t.Helper()
	execReported(t, b, fmt.Sprintf(`
		INSERT INTO jobs (kind, state, attempt, fence, leased_by, started_at, finished_at)
		SELECT 'noop', 'succeeded', 1, 1, 'w', now(), now() FROM generate_series(1, %d)`, n))
}
