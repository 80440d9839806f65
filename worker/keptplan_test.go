package worker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

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
// plan by running it once with call's arguments, and closes the
// connection when the test ends.
func keepPlan(t *testing.T, b *bundle, name string, call func(q *db.Queries) error) keptPlan {
	t.Helper()
	conn, err := pgx.Connect(b.ctx, b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(b.ctx) })
	execute := prepareGeneric(t, b, conn, name, call)
	if _, err := conn.Exec(b.ctx, execute); err != nil {
		t.Fatalf("%.40s: %v", execute, err)
	}
	return keptPlan{conn: conn, execute: execute}
}

// explain runs the statement again under EXPLAIN ANALYZE, which uses the
// plan kept unless the statistics of its tables changed since, and says
// whether it scanned the jobs table, how many buffers it read, and the
// plan.
func (k keptPlan) explain(t *testing.T, b *bundle) (scanned bool, buffers int64, plan string) {
	t.Helper()
	root, plan := explainJSON(t, b, k.conn, k.execute)
	root.Walk(func(n pgplan.Node) {
		scanned = scanned || (n.NodeType == "Seq Scan" && n.RelationName == "jobs" && n.ActualLoops > 0)
	})
	return scanned, root.Buffers(), plan
}

// prepareGeneric prepares, as name on q (a connection of the test's own,
// or a transaction on one), the statement that call sends, without
// sending it, under plan_cache_mode = force_generic_plan, as a worker's
// connections keep their plans. It returns the EXECUTE that runs the
// statement with call's arguments, written out as literals of the types
// PREPARE inferred (EXECUTE takes no bind parameters).
func prepareGeneric(t *testing.T, b *bundle, q db.DBTX, name string, call func(q *db.Queries) error) string {
	t.Helper()
	sql, args := statementOf(t, call)
	for _, stmt := range []string{`SET plan_cache_mode = force_generic_plan`, `PREPARE ` + name + ` AS ` + sql} {
		if _, err := q.Exec(b.ctx, stmt); err != nil {
			t.Fatalf("%.40s: %v", stmt, err)
		}
	}
	rows, err := q.Query(b.ctx, `
		SELECT p.oid::oid, p.oid::regtype::text
		FROM pg_prepared_statements AS s, unnest(s.parameter_types) WITH ORDINALITY AS p (oid, n)
		WHERE s.name = $1 ORDER BY p.n`, name)
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
	types := pgtype.NewMap()
	literals := make([]string, len(args))
	for i, arg := range args {
		text, err := types.Encode(params[i].OID, pgtype.TextFormatCode, arg, nil)
		if err != nil {
			t.Fatalf("argument %d: %v", i+1, err)
		}
		if text == nil {
			literals[i] = "NULL::" + params[i].Name
			continue
		}
		literals[i] = fmt.Sprintf("'%s'::%s", strings.ReplaceAll(string(text), "'", "''"), params[i].Name)
	}
	if len(literals) == 0 {
		return `EXECUTE ` + name
	}
	return `EXECUTE ` + name + `(` + strings.Join(literals, ", ") + `)`
}

// explainJSON runs stmt with args on q under EXPLAIN (ANALYZE, BUFFERS)
// and returns the root of its plan and the plan as JSON.
func explainJSON(t *testing.T, b *bundle, q db.DBTX, stmt string, args ...any) (pgplan.Node, string) {
	t.Helper()
	var out []byte
	if err := q.QueryRow(b.ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+stmt, args...).Scan(&out); err != nil {
		t.Fatalf("%.60s: %v", stmt, err)
	}
	root, err := pgplan.Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	return root, string(out)
}

// errNotSent is what statementOf's stand-in for the database answers.
var errNotSent = errors.New("statement recorded, not sent")

// statementOf returns the SQL and the arguments of the one statement that
// call sends through the queries given, without sending it.
func statementOf(t *testing.T, call func(q *db.Queries) error) (string, []any) {
	t.Helper()
	var r notSent
	if err := call(db.New(&r)); !errors.Is(err, errNotSent) {
		t.Fatalf("the statement was not recorded: %v", err)
	}
	return r.sql, r.args
}

// notSent is a db.DBTX that records the statement sent through it and
// answers errNotSent.
type notSent struct {
	sql  string
	args []any
}

func (r *notSent) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.sql, r.args = sql, args
	return pgconn.CommandTag{}, errNotSent
}

func (r *notSent) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.sql, r.args = sql, args
	return nil, errNotSent
}

func (r *notSent) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.sql, r.args = sql, args
	return notSentRow{}
}

// notSentRow is the row of a statement not sent.
type notSentRow struct{}

func (notSentRow) Scan(...any) error { return errNotSent }

// addFinishedJobs inserts n succeeded jobs, without gathering statistics.
func addFinishedJobs(t *testing.T, b *bundle, n int) {
	t.Helper()
	execReported(t, b, fmt.Sprintf(`
		INSERT INTO jobs (kind, state, attempt, fence, leased_by, started_at, finished_at)
		SELECT 'noop', 'succeeded', 1, 1, 'w', now(), now() FROM generate_series(1, %d)`, n))
}
