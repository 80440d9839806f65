package server

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
)

// enqueuer stores the jobs of single-job requests (POST /v1/jobs without an
// Idempotency-Key) that arrive while others are being stored together, in
// one statement and one commit (client.InsertAll). What bounds how many
// one-job requests per second a server takes is the wait for each commit
// to reach the disk; requests that arrive during one commit share the
// next. A request that arrives alone, while no statement runs, is stored
// at once: it waits for no one.
//
// Each request is answered only once its own job is committed, or with
// the error that kept it from being stored. One job the database refuses
// fails alone: a statement the database refuses for a value it holds (a
// data exception, a constraint violation, or a statement too large or too
// complex, 54000 and 54001: each raised before the statement commits, so
// that nothing of it was stored) is replayed one job at a time. Any other error, even one that arrives as a
// PostgreSQL error, may have come after the commit: a connection pooler
// between, such as PgBouncer at its query_timeout, answers with an error
// of its own while the server goes on to commit. Each request of the group
// is then answered with it, and nothing is stored again.
type enqueuer struct {
	dbtx      db.DBTX
	announcer *announcer

	mu       sync.Mutex
	pending  []*pendingJob
	flushing int // goroutines storing groups, at most maxFlushers
}

// maxFlushers is how many group statements run at once: one gathers
// requests while another commits. Each holds a connection of the pool
// while it runs, and the announcer one more while it sends; the others
// stay free for the rest of the API.
const maxFlushers = 2

// maxGroup is the most jobs one statement stores.
const maxGroup = client.MaxBatchJobs

// maxGroupBytes bounds the bytes of the jobs one statement stores (their
// payloads and names; see size), unless its first job alone is larger. A
// group bounded by its count alone could gather maxGroup requests of the
// largest body the API takes (DefaultMaxBodyBytes, 1 MiB) into one
// statement of a gigabyte, PostgreSQL's limit for a message, built in
// memory beside the requests' own copies.
const maxGroupBytes = 8 << 20

// The states of a pendingJob.
const (
	jobWaiting   int32 = iota // in pending, not yet taken
	jobTaken                  // in a statement, which will answer it
	jobAbandoned              // its request gave up before it was taken
)

// pendingJob is one request's job, waiting to be stored.
type pendingJob struct {
	job   client.Job
	state atomic.Int32
	done  chan stored // buffered: the flusher never waits for the request
}

// stored is what became of a pendingJob.
type stored struct {
	job db.Job
	err error
}

func newEnqueuer(dbtx db.DBTX, a *announcer) *enqueuer { return &enqueuer{dbtx: dbtx, announcer: a} }

// insert stores job, together with the jobs of the requests that arrive
// meanwhile, and returns it as stored. If ctx ends before a statement
// takes the job, nothing is stored and insert returns ctx's error; once
// taken, it waits for the statement's outcome, which is bounded by
// dbTimeout.
func (e *enqueuer) insert(ctx context.Context, job client.Job) (db.Job, error) {
	p := &pendingJob{job: job, done: make(chan stored, 1)}
	e.mu.Lock()
	e.pending = append(e.pending, p)
	start := e.flushing < maxFlushers
	if start {
		e.flushing++
	}
	e.mu.Unlock()
	if start {
		go e.flush()
	}
	select {
	case s := <-p.done:
		return s.job, s.err
	case <-ctx.Done():
		if p.state.CompareAndSwap(jobWaiting, jobAbandoned) {
			return db.Job{}, fmt.Errorf("insert job: %w", context.Cause(ctx))
		}
		s := <-p.done
		return s.job, s.err
	}
}

// flush stores groups of pending jobs until none is left.
func (e *enqueuer) flush() {
	for {
		group := e.take()
		if group == nil {
			return
		}
		e.store(group)
	}
}

// take removes up to maxGroup waiting jobs, of maxGroupBytes at most,
// from pending and marks them taken, skipping those whose request gave up.
// With none left, it counts the calling flusher out and returns nil.
func (e *enqueuer) take() []*pendingJob {
	e.mu.Lock()
	defer e.mu.Unlock()
	var group []*pendingJob
	n, bytes := 0, 0
	for ; n < len(e.pending) && len(group) < maxGroup; n++ {
		p := e.pending[n]
		if p.state.Load() != jobWaiting {
			continue // its request gave up
		}
		size := size(p.job)
		if len(group) > 0 && bytes+size > maxGroupBytes {
			break
		}
		if p.state.CompareAndSwap(jobWaiting, jobTaken) {
			group = append(group, p)
			bytes += size
		}
	}
	clear(e.pending[:n])
	e.pending = e.pending[n:]
	if len(e.pending) == 0 {
		e.pending = nil // let the backing array go
	}
	if len(group) == 0 {
		e.flushing--
		return nil
	}
	return group
}

// size is what a job adds to the statement that stores it: its payload and
// its names, the fields that can be large.
func size(job client.Job) int {
	return len(job.Payload) + len(job.Queue) + len(job.Kind)
}

// store stores a group in one statement, and answers each of its requests.
func (e *enqueuer) store(group []*pendingJob) {
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	jobs := make([]client.Job, len(group))
	for i, p := range group {
		jobs[i] = p.job
	}
	var rows []db.Job
	var err error
	if e.announcer.lead() {
		rows, err = client.InsertAll(ctx, e.dbtx, jobs)
	} else {
		rows, err = client.InsertAllUnannounced(ctx, e.dbtx, jobs)
		if err == nil || !refusedAValue(err) {
			e.announcer.owe(jobs, rows) // committed, or its outcome unknown
		}
	}
	if err != nil && len(group) > 1 && refusedAValue(err) {
		// Nothing of the statement was stored: store each job alone, so
		// that the one the database refuses fails alone.
		for _, p := range group {
			job, _, err := client.Insert(ctx, e.dbtx, p.job)
			p.done <- stored{job: job, err: err}
		}
		return
	}
	for i, p := range group {
		if err != nil {
			p.done <- stored{err: err}
			continue
		}
		p.done <- stored{job: rows[i]}
	}
}

// refusedAValue reports whether err is PostgreSQL refusing a value a
// statement was to store, the only errors the API answers with a 4xx
// (classify): raised before the statement's commit, so that it stored
// nothing.
func refusedAValue(err error) bool {
	return classify(err).status < http.StatusInternalServerError
}
