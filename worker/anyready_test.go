package worker_test

import (
	"testing"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/pgplan"
)

// TestJobAnyReady_ReadsTheClaimIndexNotTheTable asks an idle worker's
// question, whether the queue holds a ready job, of a table whose 100,000
// jobs were all ready when it was last analyzed and have all finished
// since (a backlog drained, its statistics not yet taken again), beside 200
// running and 1,000 due tomorrow. Nothing is ready, and the answer must
// come from the claim index's few entries, not from reading the table,
// under the plan made for the values given (as through a transaction-mode
// pooler) and under a generic plan (as a worker's own connections keep).
func TestJobAnyReady_ReadsTheClaimIndexNotTheTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO jobs (queue, kind) SELECT 'default', 'noop' FROM generate_series(1, 100000);
		ANALYZE jobs;
		UPDATE jobs SET state = 'succeeded', attempt = 1, fence = 1, leased_by = 'w', started_at = now(), finished_at = now();`); err != nil {
		t.Fatal(err)
	}
	// Vacuumed, as autovacuum would have done by now, but not analyzed:
	// the finished jobs' entries leave the claim index, and the statistics
	// still say every job is ready.
	if _, err := b.pool.Exec(b.ctx, `VACUUM jobs`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(b.ctx, `
		INSERT INTO jobs (kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, started_at)
		SELECT 'noop', 'running', 1, 1, gen_random_uuid(), now() + interval '1 hour', 'w', now() FROM generate_series(1, 200);
		INSERT INTO jobs (queue, kind, run_at) SELECT 'default', 'noop', now() + interval '1 day' FROM generate_series(1, 1000);`); err != nil {
		t.Fatal(err)
	}
	ask := func(q *db.Queries) error {
		ready, err := q.JobAnyReady(b.ctx, "default")
		if err == nil && ready {
			t.Errorf("a job is ready, want none")
		}
		return err
	}
	if err := ask(b.q); err != nil {
		t.Fatal(err)
	}
	custom := explain(t, b, ask, nil)
	generic, genericPlan := explainGeneric(t, b, ask)
	for _, tc := range []struct {
		name string
		root pgplan.Node
		plan string
	}{
		{"the plan for the values given", custom.root, custom.plan},
		{"a generic plan", generic, genericPlan},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := map[string]bool{}
			tc.root.Walk(func(n pgplan.Node) {
				read[n.IndexName] = true
				if n.RelationName == "jobs" && n.NodeType == "Seq Scan" {
					t.Errorf("reads jobs by a %s", n.NodeType)
				}
			})
			if !read["jobs_claim_idx"] {
				t.Errorf("does not read jobs_claim_idx")
			}
			// The 1,000 entries due tomorrow fill a few pages of the index.
			if tc.root.Buffers() > 50 {
				t.Errorf("touched %d buffers, want at most 50", tc.root.Buffers())
			}
			if t.Failed() {
				t.Logf("plan:\n%s", tc.plan)
			}
		})
	}
}
