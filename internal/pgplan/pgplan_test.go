package pgplan

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/relayq/relay/internal/dbtest"
)

func TestParse_ReadsThePlanThatPostgreSQLExplains(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := dbtest.New(t)
	var text []byte
	if err := pool.QueryRow(ctx, `
		EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, FORMAT JSON)
		SELECT id FROM jobs WHERE id = 1 ORDER BY id`).Scan(&text); err != nil {
		t.Fatal(err)
	}
	root, err := Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	// Whether the planner reads the index alone or the table too, it
	// reads jobs_pkey once, for id 1, and finds nothing.
	var scans []Node
	root.Walk(func(n Node) {
		if n.IndexName != "" {
			n.NodeType, n.Plans, n.SharedHitBlocks, n.SharedReadBlocks = "", nil, 0, 0
			scans = append(scans, n)
		}
	})
	want := []Node{{RelationName: "jobs", IndexName: "jobs_pkey", IndexCond: "(id = 1)", ActualRows: 0, ActualLoops: 1}}
	if diff := cmp.Diff(want, scans); diff != "" {
		t.Errorf("index scans (-want +got):\n%s\n%s", diff, text)
	}
	if root.Buffers() < 1 {
		t.Errorf("touched %d buffers, want at least the index's root", root.Buffers())
	}
}

func TestParse_RefusesWhatIsNotOnePlan(t *testing.T) {
	t.Parallel()
	for _, text := range []string{``, `{}`, `[]`, `[{"Plan": {}}, {"Plan": {}}]`, `[{"Plan": {"Plans": 3}}]`} {
		if _, err := Parse([]byte(text)); err == nil {
			t.Errorf("Parse(%q) returned no error", text)
		}
	}
}
