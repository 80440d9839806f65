package modelcheck

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
)

// Queues the simulated workers serve.
const (
	QueueDefault = client.DefaultQueue
	QueueOther   = "other"
)

// logLines is how many operations a Violation keeps.
const logLines = 40

// Violation is a step at which the database broke a promise: it
// disagreed with the model, or with what the workers were told.
type Violation struct {
	Seed uint64
	Step int
	Err  error
	// Log holds the last operations, the failing one last.
	Log []string
}

func (f *Violation) Error() string {
	return fmt.Sprintf("seed %d, step %d: %v", f.Seed, f.Step, f.Err)
}

func (f *Violation) Unwrap() error { return f.Err }

// Driver plays simulated workers against one database, one operation at
// a time, and checks each against its Model.
type Driver struct {
	seed  uint64
	rng   *rand.Rand
	pool  *pgxpool.Pool
	q     *db.Queries
	model *Model

	workers []*simWorker
	// conns holds the open connection of every live session, by key.
	conns map[int32]*pgx.Conn
	// ended holds the sessions the driver has ended.
	ended map[int32]bool
	// leases holds every claim the database handed out, as its holder was
	// told about it; claimsOf lists them by job, newest last.
	leases    map[pgtype.UUID]*leaseView
	claimsOf  map[int64][]pgtype.UUID
	graveyard []Ack

	// lastNow is the now() of the newest transaction: about the
	// database's clock, for choices only.
	lastNow time.Time
	step    int
	log     []string
	counts  map[string]int
	prev    map[int64]Job
	retried map[int64]bool
	ops     []op
}

// simWorker is a simulated worker: what it believes it holds.
type simWorker struct {
	id    string
	queue string
	// leaseOnly workers have no session, as behind a transaction pooler.
	leaseOnly bool
	// session is the key it claims under; it may have ended unbeknownst
	// to the worker. Nil while it has none.
	session *int32
	held    []held
	// lost holds the tokens of a claim whose answer the worker lost.
	lost []pgtype.UUID
}

// held is a claim a worker believes it holds.
type held struct {
	Ack
	cancelRequested bool
}

// leaseView is a claim as its holder knows it: the lease expiry the
// database last told it, and whether the database accepted its end.
type leaseView struct {
	id      int64
	expires time.Time
	session *int32
	ended   bool
}

// op is one kind of operation, chosen with weight among the others.
type op struct {
	name   string
	weight func() float64
	run    func(ctx context.Context) error
}

// NewDriver returns a driver on pool, which must reach a freshly migrated
// database that nothing else uses; seed chooses every operation. It
// registers the workers' first sessions.
func NewDriver(ctx context.Context, pool *pgxpool.Pool, seed uint64) (*Driver, error) {
	d := &Driver{
		seed:     seed,
		rng:      rand.New(rand.NewPCG(seed, seed^0x5eed)),
		pool:     pool,
		q:        db.New(pool),
		model:    NewModel(),
		conns:    map[int32]*pgx.Conn{},
		ended:    map[int32]bool{},
		leases:   map[pgtype.UUID]*leaseView{},
		claimsOf: map[int64][]pgtype.UUID{},
		counts:   map[string]int{},
		prev:     map[int64]Job{},
		retried:  map[int64]bool{},
	}
	d.workers = []*simWorker{
		{id: "w0", queue: QueueDefault},
		{id: "w1", queue: QueueDefault},
		{id: "w2", queue: QueueDefault},
		{id: "w3", queue: QueueDefault, leaseOnly: true},
		{id: "w4", queue: QueueOther},
	}
	d.ops = d.operations()
	for _, w := range d.workers {
		if w.leaseOnly {
			continue
		}
		if err := d.register(ctx, w, nil); err != nil {
			return nil, &Violation{Seed: seed, Err: err, Log: d.log}
		}
	}
	return d, nil
}

// Close ends every session still open.
func (d *Driver) Close() {
	for key, conn := range d.conns {
		conn.Close(context.Background())
		delete(d.conns, key)
	}
}

// Counts returns how many times each operation and outcome occurred.
func (d *Driver) Counts() map[string]int { return d.counts }

// Steps returns how many steps the driver has completed.
func (d *Driver) Steps() int { return d.step }

// Run runs steps operations, checking the whole database against the
// model after each. It returns a *Violation at the first disagreement.
func (d *Driver) Run(ctx context.Context, steps int) error {
	for range steps {
		d.step++
		clear(d.retried)
		o := d.pick()
		d.count(o.name)
		if err := o.run(ctx); err != nil {
			return d.violation(fmt.Errorf("%s: %w", o.name, err))
		}
		if err := d.check(ctx); err != nil {
			return d.violation(fmt.Errorf("after %s: %w", o.name, err))
		}
	}
	return nil
}

func (d *Driver) violation(err error) error {
	if lost := d.lostSessions(); len(lost) > 0 {
		err = fmt.Errorf("%w\n(the connections of sessions %v were ended by the server, not by the driver: "+
			"something outside this test terminated them, so the model's expectations after that are void)", err, lost)
	}
	return &Violation{Seed: d.seed, Step: d.step, Err: err, Log: slices.Clone(d.log)}
}

// lostSessions returns the sessions whose connections the driver holds
// open but the server has ended.
func (d *Driver) lostSessions() []int32 {
	var lost []int32
	for key, conn := range d.conns {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if conn.Ping(ctx) != nil {
			lost = append(lost, key)
		}
		cancel()
	}
	slices.Sort(lost)
	return lost
}

// pick chooses the next operation by weight.
func (d *Driver) pick() op {
	weights := make([]float64, len(d.ops))
	total := 0.0
	for i, o := range d.ops {
		weights[i] = o.weight()
		total += weights[i]
	}
	r := d.rng.Float64() * total
	for i, w := range weights {
		if r < w {
			return d.ops[i]
		}
		r -= w
	}
	return d.ops[0]
}

// logf records an operation and its outcome.
func (d *Driver) logf(format string, args ...any) {
	d.log = append(d.log, fmt.Sprintf("step %d: ", d.step)+fmt.Sprintf(format, args...))
	if len(d.log) > logLines {
		d.log = d.log[len(d.log)-logLines:]
	}
}

func (d *Driver) count(name string) { d.counts[name]++ }

func (d *Driver) countN(name string, n int) { d.counts[name] += n }

// inTx runs f in a transaction of its own that first reads now(), and
// commits. It returns that now: the instant PostgreSQL judged every
// statement of f at, and so the one the model must judge them at.
func (d *Driver) inTx(ctx context.Context, f func(q *db.Queries, now time.Time) error) (time.Time, error) {
	now, err := inTx(ctx, d.pool, f)
	if err == nil {
		d.lastNow = now
	}
	return now, err
}

// inTx runs f on pool in a transaction that first reads now(), and
// commits; it returns that now.
func inTx(ctx context.Context, pool *pgxpool.Pool, f func(q *db.Queries, now time.Time) error) (time.Time, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once committed
	q := db.New(tx)
	now, err := q.DatabaseNow(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("read now(): %w", err)
	}
	if err := f(q, now); err != nil {
		return time.Time{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return time.Time{}, fmt.Errorf("commit: %w", err)
	}
	return now, nil
}

// endSession closes a session's connection and waits until PostgreSQL has
// dropped its lock.
func endSession(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn, key int32) error {
	if err := conn.Close(ctx); err != nil {
		return fmt.Errorf("close session %d: %w", key, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		alive, err := db.New(pool).WorkerSessionAlive(ctx, key)
		if err != nil {
			return fmt.Errorf("read whether session %d is alive: %w", key, err)
		}
		if !alive {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("session %d still holds its lock 10s after its connection closed", key)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// check compares the whole database with the model, and checks that no
// terminal job changed but by a retry.
func (d *Driver) check(ctx context.Context) error {
	rows, err := readJobs(ctx, d.q)
	if err != nil {
		return err
	}
	got := make([]Job, len(rows))
	for i, r := range rows {
		if got[i], err = fromDB(r); err != nil {
			return err
		}
	}
	if err := compareJobs(d.model.Jobs(), got); err != nil {
		return err
	}
	for _, j := range got {
		p, ok := d.prev[j.ID]
		if ok && p.Terminal() && !d.retried[j.ID] && !sameJob(p, j) {
			return fmt.Errorf("job %d changed after it ended %s (-before +after):\n%s", j.ID, p.State, cmp.Diff(p, j))
		}
		// A job asked to cancel keeps its claim and its mark until the
		// claim ends, and then ends cancelled, or succeeded if its
		// handler did: never available, but by a retry after that.
		if ok && p.State == db.JobStateRunning && p.CancelRequestedAt != nil {
			kept := j.State == db.JobStateRunning && j.Fence == p.Fence && sameTime(j.CancelRequestedAt, p.CancelRequestedAt)
			if !kept && j.State != db.JobStateCancelled && j.State != db.JobStateSucceeded {
				return fmt.Errorf("job %d, running at fence %d and asked to cancel at %s, is now %s at fence %d with cancel_requested_at %v",
					j.ID, p.Fence, stamp(*p.CancelRequestedAt), j.State, j.Fence, j.CancelRequestedAt)
			}
		}
		d.prev[j.ID] = j
		if j.State == db.JobStateRunning {
			if d.newest(j.ID) != j.LeaseToken {
				return fmt.Errorf("job %d runs under token %s, which is not the token of its newest claim", j.ID, j.LeaseToken)
			}
		}
	}

	workers, err := d.q.WorkerList(ctx)
	if err != nil {
		return fmt.Errorf("list workers: %w", err)
	}
	var holdings []Holding
	for _, w := range workers {
		holdings = append(holdings, Holding{ID: w.ID, SessionKey: w.SessionKey, SessionAlive: w.SessionAlive})
	}
	if want := d.model.Holdings(); !slices.Equal(want, holdings) {
		return fmt.Errorf("the workers table differs from the model (-model +database):\n%s", cmp.Diff(want, holdings))
	}
	sessions, err := d.recordedSessions(ctx)
	if err != nil {
		return err
	}
	if want := d.model.RecordedSessions(); !slices.Equal(want, sessions) {
		return fmt.Errorf("worker_sessions differs from the model (-model +database):\n%s", cmp.Diff(want, sessions))
	}
	return nil
}

// compareJobs compares the jobs of the model and of the database, both
// by id, and names each job they disagree on.
func compareJobs(want, got []Job) error {
	if slices.EqualFunc(want, got, sameJob) {
		return nil
	}
	byID := map[int64]Job{}
	for _, j := range got {
		byID[j.ID] = j
	}
	var b strings.Builder
	for _, w := range want {
		g, ok := byID[w.ID]
		delete(byID, w.ID)
		switch {
		case !ok:
			fmt.Fprintf(&b, "job %d is missing from the database: %+v\n", w.ID, w)
		case !sameJob(w, g):
			fmt.Fprintf(&b, "job %d (-model +database):\n%s", w.ID, cmp.Diff(w, g))
		}
	}
	for _, g := range got {
		if _, ok := byID[g.ID]; ok {
			fmt.Fprintf(&b, "job %d is in the database only: %+v\n", g.ID, g)
		}
	}
	return fmt.Errorf("the jobs table differs from the model:\n%s", b.String())
}

// recordedSessions reads the keys of worker_sessions.
func (d *Driver) recordedSessions(ctx context.Context) ([]int32, error) {
	keys, err := db.New(d.pool).WorkerSessionKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("read worker_sessions: %w", err)
	}
	return keys, nil
}

// fromDB turns a row of jobs into the model's terms.
func fromDB(r db.Job) (Job, error) {
	var history []json.RawMessage
	if err := json.Unmarshal(r.Errors, &history); err != nil {
		return Job{}, fmt.Errorf("job %d: error history %s is not an array: %w", r.ID, r.Errors, err)
	}
	// The history keeps the newest entries; error_count counts them all.
	if want := min(int(r.ErrorCount), maxErrorHistory); len(history) != want {
		return Job{}, fmt.Errorf("job %d: error history of %d entries for %d errors, want %d", r.ID, len(history), r.ErrorCount, want)
	}
	result, err := canonicalJSON(r.Result)
	if err != nil {
		return Job{}, fmt.Errorf("job %d: result: %w", r.ID, err)
	}
	return Job{
		ID: r.ID, Queue: r.Queue, Priority: r.Priority, State: r.State,
		Attempt: r.Attempt, MaxAttempts: r.MaxAttempts, Fence: r.Fence, RunAt: r.RunAt,
		LeaseToken: r.LeaseToken, LeaseExpiresAt: r.LeaseExpiresAt, LeasedBy: r.LeasedBy, LeaseSession: r.LeaseSession,
		CancelRequestedAt: r.CancelRequestedAt, CreatedAt: r.CreatedAt, StartedAt: r.StartedAt, FinishedAt: r.FinishedAt,
		LastError: r.LastError, Errors: int(r.ErrorCount), Result: result, IdempotencyKey: r.IdempotencyKey,
	}, nil
}

// maxErrorHistory is how many entries an error history keeps, as
// docs/failure-semantics.md says: the newest 20.
const maxErrorHistory = 20

// readJobs reads the whole jobs table, every column, in id order: the ids
// from the listing, then the jobs themselves.
func readJobs(ctx context.Context, q *db.Queries) ([]db.Job, error) {
	list, err := q.JobList(ctx, db.JobListParams{MaxJobs: 1 << 30})
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	ids := make([]int64, len(list))
	for i, j := range list {
		ids[i] = j.ID
	}
	jobs, err := q.JobGetMany(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("read jobs: %w", err)
	}
	if len(jobs) != len(ids) {
		return nil, fmt.Errorf("read jobs: %d listed, %d read", len(ids), len(jobs))
	}
	return jobs, nil
}

// canonicalJSON returns raw re-encoded with sorted keys and no spaces, ""
// for none, so that jsonb's own formatting does not count.
func canonicalJSON(raw json.RawMessage) (string, error) {
	if len(raw) == 0 {
		return "", nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", err
	}
	out, err := json.Marshal(v)
	return string(out), err
}

// checkLeaseFree checks, as job id is claimed at now, that no earlier
// claim of it still holds a lease the database told its holder was live
// at now, unless that claim's session has ended: never two live leases on
// one job.
func (d *Driver) checkLeaseFree(now time.Time, id int64) error {
	for _, token := range d.claimsOf[id] {
		l := d.leases[token]
		if l.ended || !l.expires.After(now) || (l.session != nil && d.ended[*l.session]) {
			continue
		}
		return fmt.Errorf("job %d claimed at %s while claim %s holds a live lease until %s under session %s",
			id, stamp(now), token, stamp(l.expires), show(l.session))
	}
	return nil
}

// checkAccepted checks that every acknowledgement accepted at now came
// from the job's newest claim within its lease, and keeps what its holder
// learns: ends says the acknowledgement ends the claim; renewed gives the
// new expiry of a renewed lease.
func (d *Driver) checkAccepted(now time.Time, kind string, accepted []int64, acks []Ack, ends bool, renewed map[int64]time.Time) error {
	for _, id := range accepted {
		// A batch may name one job under several tokens (a worker that
		// claimed it twice); the database says only which job it accepted.
		token := d.newest(id)
		if !token.Valid {
			return fmt.Errorf("%s accepted for job %d, which was never claimed", kind, id)
		}
		if !slices.Contains(acks, Ack{ID: id, Token: token}) {
			return fmt.Errorf("%s of job %d accepted, though none of the tokens sent for it is its newest claim's (%s): %s", kind, id, token, ids(acks))
		}
		l := d.leases[token]
		switch {
		case l.ended:
			return fmt.Errorf("%s of job %d accepted under token %s, whose claim had already ended", kind, id, token)
		case !l.expires.After(now):
			return fmt.Errorf("%s of job %d accepted at %s under token %s, whose lease expired at %s", kind, id, stamp(now), token, stamp(l.expires))
		}
		if ends {
			l.ended = true
		}
		if e, ok := renewed[id]; ok {
			l.expires = e
		}
	}
	return nil
}

// newest returns the token of the newest claim of job id.
func (d *Driver) newest(id int64) pgtype.UUID {
	claims := d.claimsOf[id]
	if len(claims) == 0 {
		return pgtype.UUID{}
	}
	return claims[len(claims)-1]
}

// recordClaim keeps a claim the database handed out.
func (d *Driver) recordClaim(j Job) {
	d.leases[j.LeaseToken] = &leaseView{id: j.ID, expires: *j.LeaseExpiresAt, session: clone(j.LeaseSession)}
	d.claimsOf[j.ID] = append(d.claimsOf[j.ID], j.LeaseToken)
}

// token draws a lease token from the seeded source, a version 4 UUID.
func (d *Driver) token() pgtype.UUID {
	u := pgtype.UUID{Valid: true}
	binary.LittleEndian.PutUint64(u.Bytes[:8], d.rng.Uint64())
	binary.LittleEndian.PutUint64(u.Bytes[8:], d.rng.Uint64())
	u.Bytes[6] = (u.Bytes[6] & 0x0f) | 0x40
	u.Bytes[8] = (u.Bytes[8] & 0x3f) | 0x80
	return u
}

func (d *Driver) tokens(n int) []pgtype.UUID {
	out := make([]pgtype.UUID, n)
	for i := range out {
		out[i] = d.token()
	}
	return out
}

// lease draws a lease: tens to hundreds of milliseconds, so that leases
// run out between steps.
func (d *Driver) lease() time.Duration {
	return []time.Duration{15, 40, 100, 300, 800}[d.rng.IntN(5)] * time.Millisecond
}

func (d *Driver) choose(n int) int { return d.rng.IntN(n) }

// diffOrNil returns an error naming what if want and got differ.
func diffOrNil(what string, want, got any) error {
	if cmp.Equal(want, got) {
		return nil
	}
	return fmt.Errorf("%s (-model +database):\n%s", what, cmp.Diff(want, got))
}

// noRow reports whether err says a :one statement returned no row.
func noRow(err error) bool { return errors.Is(err, pgx.ErrNoRows) }

func stamp(t time.Time) string { return t.UTC().Format("15:04:05.000000") }

func show[T any](p *T) string {
	if p == nil {
		return "none"
	}
	return fmt.Sprint(*p)
}

func ids(acks []Ack) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, a := range acks {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%d/%s", a.ID, a.Token.String()[:8])
	}
	b.WriteByte(']')
	return b.String()
}

// newToken draws a fresh random lease token.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }
