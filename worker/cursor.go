package worker

import (
	"slices"
	"sync"
	"time"

	"github.com/relayq/relay/db"
)

// claimCursorSlack is how far behind the newest run_at this worker has
// claimed at a priority its claims of that priority start. A job of that
// priority whose run_at lies further behind (one released or taken back, or
// inserted with an old run_at, such as by a transaction that began longer
// ago than this) is found by the next claim from the head.
const claimCursorSlack = time.Second

// claimFromHeadEvery is how often a worker makes a claim from the head of
// every priority, which finds the jobs behind its cursors.
const claimFromHeadEvery = time.Second

// maxClaimCursors is how many priorities a worker keeps a cursor for. The
// jobs of any other priority are looked for from its head at every claim.
const maxClaimCursors = 8

// claimCursors remembers, per priority, the newest run_at among the jobs
// this worker claimed, so that its claims scan the claim index from there
// instead of from the head (JobCompleteAndClaim's cursors). While a long
// transaction holds back vacuum, the head of each priority holds an entry
// for every job claimed since the transaction began; a claim from a cursor
// steps over them. It is safe for use by concurrent rounds.
type claimCursors struct {
	mu sync.Mutex
	// newest holds, per priority, the newest run_at claimed.
	newest map[int16]time.Time
	// headDue is when the next claim from the head is due; zero: now.
	headDue time.Time
}

// params returns the cursors for a claim sent at now, in the form of
// JobCompleteAndClaim's parameters, ascending by priority: none when a claim
// from the head is due, which it then counts as made.
func (c *claimCursors) params(now time.Time) ([]int16, []time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !now.Before(c.headDue) {
		c.headDue = now.Add(claimFromHeadEvery)
		return nil, nil
	}
	priorities := make([]int16, 0, len(c.newest))
	for p := range c.newest {
		priorities = append(priorities, p)
	}
	slices.Sort(priorities)
	since := make([]time.Time, len(priorities))
	for i, p := range priorities {
		since[i] = c.newest[p].Add(-claimCursorSlack)
	}
	return priorities, since
}

// due returns when the next claim from the head is due.
func (c *claimCursors) due() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.headDue
}

// claimed moves the cursors past the jobs of a claim, rows in the order
// claimed. A claim from the head (fromHead) that came back full may have
// left more jobs behind the cursor of the last priority it took, where it
// found the last of its own: a backlog enqueued with a run_at in the past,
// or taken back. That cursor moves to the last job's run_at, back if need
// be, so that the claims that follow take the rest, rather than a claim
// from the head a second for each claim's worth.
func (c *claimCursors) claimed(rows []db.JobCompleteAndClaimRow, fromHead, full bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, r := range rows {
		if r.Priority == nil || r.RunAt == nil {
			continue
		}
		p, at := *r.Priority, *r.RunAt
		old, ok := c.newest[p]
		if !ok && len(c.newest) >= maxClaimCursors {
			continue
		}
		if c.newest == nil {
			c.newest = make(map[int16]time.Time)
		}
		if !ok || at.After(old) || (fromHead && full && i == len(rows)-1) {
			c.newest[p] = at
		}
	}
}

// fromHead makes the next claim one from the head: jobs may wait behind
// the cursors (this worker took some back).
func (c *claimCursors) fromHead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.headDue = time.Time{}
}
