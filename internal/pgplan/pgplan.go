// Package pgplan reads the plans that PostgreSQL's EXPLAIN (FORMAT JSON)
// prints, for the tests that hold a statement to the plan it must keep:
// which index it reads, how many rows each node returns, how many buffers
// it touches.
package pgplan

import (
	"encoding/json"
	"fmt"
)

// Node is a node of a plan, with the fields the tests look at. A field
// that EXPLAIN did not print for a node (such as IndexName for a Sort, or
// the actual figures without ANALYZE) is left zero.
type Node struct {
	NodeType     string `json:"Node Type"`
	RelationName string `json:"Relation Name"`
	IndexName    string `json:"Index Name"`
	IndexCond    string `json:"Index Cond"`
	// ActualRows is the rows a node returned per loop, and ActualLoops
	// how many times it ran (EXPLAIN ANALYZE).
	ActualRows  float64 `json:"Actual Rows"`
	ActualLoops float64 `json:"Actual Loops"`
	// SharedHitBlocks and SharedReadBlocks count the buffers the node and
	// those below it found in shared buffers and read in (EXPLAIN
	// BUFFERS).
	SharedHitBlocks  int64  `json:"Shared Hit Blocks"`
	SharedReadBlocks int64  `json:"Shared Read Blocks"`
	Plans            []Node `json:"Plans"`
}

// Buffers is how many shared buffers the node and those below it
// touched, hit or read.
func (n Node) Buffers() int64 { return n.SharedHitBlocks + n.SharedReadBlocks }

// Walk calls f for n, then for every node below it, depth first.
func (n Node) Walk(f func(Node)) {
	f(n)
	for _, c := range n.Plans {
		c.Walk(f)
	}
}

// Parse reads the output of EXPLAIN (FORMAT JSON) for one statement and
// returns the root of its plan.
func Parse(explained []byte) (Node, error) {
	var out []struct {
		Plan Node `json:"Plan"`
	}
	if err := json.Unmarshal(explained, &out); err != nil {
		return Node{}, fmt.Errorf("read EXPLAIN (FORMAT JSON): %w", err)
	}
	if len(out) != 1 {
		return Node{}, fmt.Errorf("read EXPLAIN (FORMAT JSON): %d plans, want one", len(out))
	}
	return out[0].Plan, nil
}
