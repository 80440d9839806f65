package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgplan"
)

// TestListQueues_CostsTheSameHoweverLongTheHistory explains the statement
// GET /v1/queues runs, over a backlog of available and running jobs in 4
// queues and a history of 10,000 and then 200,000 finished jobs of those
// queues and one more. Its plan scans no table, and touches no more
// pages over the longer history than one level more of an index per
// descent.
func TestListQueues_CostsTheSameHoweverLongTheHistory(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := e.pool.Exec(ctx, `
		INSERT INTO jobs (queue, kind, run_at) SELECT 'q' || i % 4, 'k', now() - interval '1 minute' FROM generate_series(1, 20) AS i;
		INSERT INTO jobs (queue, kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, started_at)
		SELECT 'q' || i % 4, 'k', 'running', 1, 1, gen_random_uuid(), now() + interval '1 hour', 'w', now()
		FROM generate_series(1, 8) AS i`); err != nil {
		t.Fatal(err)
	}
	rec := &statementRecorder{DBTX: conn}
	if _, err := db.New(rec).JobQueueStats(ctx); err != nil {
		t.Fatal(err)
	}

	var before int64
	for _, history := range []int{10_000, 200_000} {
		addFinished(t, ctx, e.pool, history, "'q' || i % 5", "'k'")
		analyzeWhole(t, ctx, e.pool)
		var text []byte
		if err := conn.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+rec.sql).Scan(&text); err != nil {
			t.Fatal(err)
		}
		plan, err := pgplan.Parse(text)
		if err != nil {
			t.Fatal(err)
		}
		descents := int64(0)
		plan.Walk(func(n pgplan.Node) {
			switch {
			case strings.Contains(n.NodeType, "Index"):
				descents += int64(n.ActualLoops)
			case n.NodeType == "Seq Scan":
				t.Errorf("over %d finished jobs: scans the table", history)
			}
		})
		got := plan.Buffers()
		t.Logf("over %d finished jobs: %d index descents, %d buffers", history, descents, got)
		switch {
		case before == 0:
			before = got
		case got > before+descents:
			var lines []string
			rows, _ := conn.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+rec.sql)
			lines, _ = pgx.CollectRows(rows, pgx.RowTo[string])
			t.Errorf("touched %d buffers over %d finished jobs, %d over 10,000: more than one index level more per descent\n%s",
				got, history, before, strings.Join(lines, "\n"))
		}
	}
}
