package modelcheck

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
)

// Reasons a reclaim records, as docs/failure-semantics.md names them.
const (
	ReasonLeaseExpired = "lease expired"
	ReasonSessionEnded = "worker session ended"
)

// Job is a job as the model knows it: every column of jobs that the state
// machine decides. Errors counts the entries of the error history, whose
// format the model leaves alone; Result is canonical JSON, "" for none.
type Job struct {
	ID                int64
	Queue             string
	Priority          int16
	State             db.JobState
	Attempt           int32
	MaxAttempts       int32
	Fence             int64
	RunAt             time.Time
	LeaseToken        pgtype.UUID
	LeaseExpiresAt    *time.Time
	LeasedBy          *string
	LeaseSession      *int32
	CancelRequestedAt *time.Time
	CreatedAt         time.Time
	StartedAt         *time.Time
	FinishedAt        *time.Time
	LastError         *string
	Errors            int
	Result            string
	IdempotencyKey    *string
}

// Terminal reports whether the job is in a state only a retry may leave.
func (j Job) Terminal() bool {
	return j.State == db.JobStateSucceeded || j.State == db.JobStateDead || j.State == db.JobStateCancelled
}

// session is a worker session as the model knows it: whether it still
// holds its lock, and whether worker_sessions still has its row.
type session struct {
	workerID string
	alive    bool
	recorded bool
}

// Model is the reference state machine. Every transition takes the
// instant at which the database applies it (the transaction's now()).
type Model struct {
	jobs     map[int64]*Job
	keys     map[[2]string]int64
	sessions map[int32]*session
	holders  map[string]int32
	maxID    int64
}

// NewModel returns the model of an empty, freshly migrated database.
func NewModel() *Model {
	return &Model{
		jobs:     map[int64]*Job{},
		keys:     map[[2]string]int64{},
		sessions: map[int32]*session{},
		holders:  map[string]int32{},
	}
}

// Enqueue is one job to insert. RunAt, when set, is when it becomes ready;
// otherwise it is Delay after the insert.
type Enqueue struct {
	Queue          string
	Priority       int16
	MaxAttempts    int32
	RunAt          *time.Time
	Delay          time.Duration
	IdempotencyKey *string
}

// ByIdempotencyKey returns the job that holds key in queue, if one does:
// an insert with that key must then insert nothing.
func (m *Model) ByIdempotencyKey(queue, key string) (Job, bool) {
	id, ok := m.keys[[2]string{queue, key}]
	if !ok {
		return Job{}, false
	}
	return *m.jobs[id], true
}

// Insert records the job the database inserted at now under id, and
// returns it as the insert must have returned it. Ids only grow.
func (m *Model) Insert(now time.Time, id int64, e Enqueue) (Job, error) {
	if id <= m.maxID {
		return Job{}, fmt.Errorf("inserted job got id %d, not above the highest so far (%d)", id, m.maxID)
	}
	if e.IdempotencyKey != nil {
		if old, ok := m.keys[[2]string{e.Queue, *e.IdempotencyKey}]; ok {
			return Job{}, fmt.Errorf("inserted job %d with idempotency key %q, which job %d of queue %s holds", id, *e.IdempotencyKey, old, e.Queue)
		}
		m.keys[[2]string{e.Queue, *e.IdempotencyKey}] = id
	}
	runAt := now.Add(e.Delay)
	if e.RunAt != nil {
		runAt = *e.RunAt
	}
	j := &Job{
		ID: id, Queue: e.Queue, Priority: e.Priority, State: db.JobStateAvailable,
		MaxAttempts: e.MaxAttempts, RunAt: runAt, CreatedAt: now, IdempotencyKey: clone(e.IdempotencyKey),
	}
	m.jobs[id] = j
	m.maxID = id
	return *j, nil
}

// Claim is one claim: as many jobs as Tokens at most, one token each.
type Claim struct {
	Queue    string
	WorkerID string
	Session  *int32
	Tokens   []pgtype.UUID
	Lease    time.Duration
}

// Ready returns the ids of the jobs a claim of queue at now would take,
// in claim order: available, run_at reached, by priority, run_at, id.
func (m *Model) Ready(now time.Time, queue string) []int64 {
	var ready []*Job
	for _, j := range m.jobs {
		if j.State == db.JobStateAvailable && j.Queue == queue && !j.RunAt.After(now) {
			ready = append(ready, j)
		}
	}
	slices.SortFunc(ready, func(a, b *Job) int {
		switch {
		case a.Priority != b.Priority:
			return int(a.Priority) - int(b.Priority)
		case !a.RunAt.Equal(b.RunAt):
			return a.RunAt.Compare(b.RunAt)
		}
		return int(a.ID - b.ID)
	})
	ids := make([]int64, len(ready))
	for i, j := range ready {
		ids[i] = j.ID
	}
	return ids
}

// Claim applies c at now and returns the jobs it claimed, in claim order,
// the i-th under the i-th token. A claim under a session that has ended
// claims nothing.
func (m *Model) Claim(now time.Time, c Claim) []Job {
	if c.Session != nil && !m.Alive(*c.Session) {
		return nil
	}
	ready := m.Ready(now, c.Queue)
	var claimed []Job
	for i, id := range ready {
		if i == len(c.Tokens) {
			break
		}
		j := m.jobs[id]
		j.State = db.JobStateRunning
		j.Attempt++
		j.Fence++
		j.LeaseToken = c.Tokens[i]
		j.LeaseExpiresAt = ptr(now.Add(c.Lease))
		j.LeasedBy = ptr(c.WorkerID)
		j.LeaseSession = clone(c.Session)
		j.StartedAt = ptr(now)
		claimed = append(claimed, *j)
	}
	return claimed
}

// Ack names a claim of a job: the job and its lease token.
type Ack struct {
	ID    int64
	Token pgtype.UUID
}

// fenced returns the job a presents, if the fence lets a through at now:
// the same claim, still running, lease not yet expired.
func (m *Model) fenced(now time.Time, a Ack) (*Job, bool) {
	j, ok := m.jobs[a.ID]
	if !ok || j.State != db.JobStateRunning || !j.LeaseToken.Valid || j.LeaseToken != a.Token {
		return nil, false
	}
	return j, j.LeaseExpiresAt.After(now)
}

// Accepts reports whether an acknowledgement of a at now passes the fence.
func (m *Model) Accepts(now time.Time, a Ack) bool {
	_, ok := m.fenced(now, a)
	return ok
}

// endLease clears the lease of a job leaving running.
func endLease(j *Job) {
	j.LeaseToken = pgtype.UUID{}
	j.LeaseExpiresAt = nil
	j.LeaseSession = nil
	j.CancelRequestedAt = nil
}

// finish moves j to a terminal or available state at now.
func finish(j *Job, state db.JobState, now time.Time) {
	j.State = state
	j.FinishedAt = nil
	if j.Terminal() {
		j.FinishedAt = ptr(now)
	}
}

// Complete applies the completions acks (with results, canonical JSON) at
// now and returns the ids of those accepted, in ascending order. A
// completion stands even if someone asked to cancel the job.
func (m *Model) Complete(now time.Time, acks []Ack, results []string) []int64 {
	var done []int64
	for i, a := range acks {
		j, ok := m.fenced(now, a)
		if !ok {
			continue
		}
		endLease(j)
		finish(j, db.JobStateSucceeded, now)
		j.Result = results[i]
		done = append(done, j.ID)
	}
	slices.Sort(done)
	return done
}

// Renewal is a heartbeat the fence accepted.
type Renewal struct {
	ID              int64
	LeaseExpiresAt  time.Time
	CancelRequested bool
}

// Heartbeat renews the leases of acks at now to lease from now, and
// returns those renewed, by id. An expired lease stays expired.
func (m *Model) Heartbeat(now time.Time, lease time.Duration, acks []Ack) []Renewal {
	var renewed []Renewal
	for _, a := range acks {
		j, ok := m.fenced(now, a)
		if !ok {
			continue
		}
		j.LeaseExpiresAt = ptr(now.Add(lease))
		renewed = append(renewed, Renewal{ID: j.ID, LeaseExpiresAt: *j.LeaseExpiresAt, CancelRequested: j.CancelRequestedAt != nil})
	}
	slices.SortFunc(renewed, func(a, b Renewal) int { return int(a.ID - b.ID) })
	return renewed
}

// Failure is the failure of one claim.
type Failure struct {
	Ack
	Error     string
	Permanent bool
	RetryIn   time.Duration
}

// Failed is a failure the fence accepted, and the state it moved the job to.
type Failed struct {
	ID    int64
	State db.JobState
}

// Fail applies the failures at now: a job someone asked to cancel ends
// cancelled; a permanent error or a last attempt ends it dead; otherwise
// it is available again RetryIn after now. Returns those accepted, by id.
func (m *Model) Fail(now time.Time, failures []Failure) []Failed {
	var failed []Failed
	for _, f := range failures {
		j, ok := m.fenced(now, f.Ack)
		if !ok {
			continue
		}
		state := db.JobStateAvailable
		switch {
		case j.CancelRequestedAt != nil:
			state = db.JobStateCancelled
		case f.Permanent || j.Attempt >= j.MaxAttempts:
			state = db.JobStateDead
		default:
			j.RunAt = now.Add(f.RetryIn)
		}
		endLease(j)
		finish(j, state, now)
		j.LastError = ptr(f.Error)
		j.Errors++
		failed = append(failed, Failed{ID: j.ID, State: state})
	}
	slices.SortFunc(failed, func(a, b Failed) int { return int(a.ID - b.ID) })
	return failed
}

// Release hands acks back at now: available again at once with the
// attempt given back and run_at kept, or cancelled if someone asked. A
// release with a note records it in the error history, and as the last
// error; a release of jobs claimed ahead (no note) records nothing.
// Returns the ids released, ascending.
func (m *Model) Release(now time.Time, note *string, acks []Ack) []int64 {
	var released []int64
	for _, a := range acks {
		j, ok := m.fenced(now, a)
		if !ok {
			continue
		}
		state := db.JobStateAvailable
		if j.CancelRequestedAt != nil {
			state = db.JobStateCancelled
		}
		endLease(j)
		finish(j, state, now)
		j.Attempt--
		if note != nil {
			j.LastError = clone(note)
			j.Errors++
		}
		released = append(released, j.ID)
	}
	slices.Sort(released)
	return released
}

// Reclaimed is a job a reclaim takes back, as the reclaim returns it.
type Reclaimed struct {
	ID        int64
	State     db.JobState
	Attempt   int32
	LeasedBy  *string
	LastError *string
}

// ReclaimedOf returns the jobs the rows of a JobReclaim say it took back,
// without the row that stands for none, and the jobs it says it left.
func ReclaimedOf(rows []db.JobReclaimRow) (taken []Reclaimed, left []int64) {
	for _, r := range rows {
		left = r.LeftIDs
		if r.ID != nil {
			taken = append(taken, Reclaimed{ID: *r.ID, State: *r.State, Attempt: *r.Attempt, LeasedBy: r.LeasedBy, LastError: r.LastError})
		}
	}
	return taken, left
}

// Reclaimable returns, by id, the running jobs a reclaim at now must take
// back, each as the reclaim returns it: those whose lease expired, and
// those whose session ended (and is still recorded in worker_sessions).
// An expired lease is the reason given when both hold.
func (m *Model) Reclaimable(now time.Time) map[int64]Reclaimed {
	out := map[int64]Reclaimed{}
	for _, j := range m.jobs {
		if j.State != db.JobStateRunning {
			continue
		}
		expired := !j.LeaseExpiresAt.After(now)
		ended := false
		if j.LeaseSession != nil {
			s, ok := m.sessions[*j.LeaseSession]
			ended = ok && s.recorded && !s.alive
		}
		if !expired && !ended {
			continue
		}
		reason := ReasonSessionEnded
		if expired {
			reason = ReasonLeaseExpired
		}
		state := db.JobStateAvailable
		switch {
		case j.CancelRequestedAt != nil:
			state = db.JobStateCancelled
		case j.Attempt >= j.MaxAttempts:
			state = db.JobStateDead
		}
		out[j.ID] = Reclaimed{ID: j.ID, State: state, Attempt: j.Attempt, LeasedBy: clone(j.LeasedBy), LastError: ptr(reason)}
	}
	return out
}

// Reclaim applies at now the reclaim of ids, which must be reclaimable.
func (m *Model) Reclaim(now time.Time, ids []int64) error {
	can := m.Reclaimable(now)
	for _, id := range ids {
		r, ok := can[id]
		if !ok {
			return fmt.Errorf("job %d is not reclaimable at %s", id, now.Format(time.RFC3339Nano))
		}
		j := m.jobs[id]
		endLease(j)
		finish(j, r.State, now)
		j.LastError = clone(r.LastError)
		j.Errors++
	}
	return nil
}

// Cancel applies a cancel of id at now: an available job ends cancelled at
// once, a running one is marked (keeping the first mark). Returns the job
// as the cancel returns it, or false for a job missing or finished.
func (m *Model) Cancel(now time.Time, id int64) (Job, bool) {
	j, ok := m.jobs[id]
	if !ok {
		return Job{}, false
	}
	switch j.State {
	case db.JobStateAvailable:
		finish(j, db.JobStateCancelled, now)
	case db.JobStateRunning:
		if j.CancelRequestedAt == nil {
			j.CancelRequestedAt = ptr(now)
		}
	default:
		return Job{}, false
	}
	return *j, true
}

// Retry makes a dead or cancelled job available at now with a fresh set
// of attempts (the fence keeps growing). Returns the job as the retry
// returns it, or false for a job in any other state.
func (m *Model) Retry(now time.Time, id int64) (Job, bool) {
	j, ok := m.jobs[id]
	if !ok || (j.State != db.JobStateDead && j.State != db.JobStateCancelled) {
		return Job{}, false
	}
	j.State = db.JobStateAvailable
	j.Attempt = 0
	j.RunAt = now
	j.FinishedAt = nil
	j.Result = ""
	return *j, true
}

// Prune deletes the finished jobs whose retention has passed at now: by
// state, those that finished more than its retention before now, where a
// nil retention keeps the state forever. The idempotency key of a job
// deleted is free again. Returns how many of each state it deleted:
// succeeded, dead, cancelled.
func (m *Model) Prune(now time.Time, succeeded, dead, cancelled *time.Duration) [3]int64 {
	retain := map[db.JobState]*time.Duration{
		db.JobStateSucceeded: succeeded, db.JobStateDead: dead, db.JobStateCancelled: cancelled,
	}
	var n [3]int64
	for id, j := range m.jobs {
		r, finished := retain[j.State]
		if !finished || r == nil || !j.FinishedAt.Before(now.Add(-*r)) {
			continue
		}
		delete(m.jobs, id)
		maps.DeleteFunc(m.keys, func(_ [2]string, holder int64) bool { return holder == id })
		switch j.State {
		case db.JobStateSucceeded:
			n[0]++
		case db.JobStateDead:
			n[1]++
		case db.JobStateCancelled:
			n[2]++
		}
	}
	return n
}

// Claimed returns, by id, the jobs running under one of tokens with their
// lease unexpired at now: what a worker that lost the answer to its claim
// finds.
func (m *Model) Claimed(now time.Time, tokens []pgtype.UUID) []Job {
	var found []Job
	for _, j := range m.jobs {
		if j.State == db.JobStateRunning && slices.Contains(tokens, j.LeaseToken) && j.LeaseExpiresAt.After(now) {
			found = append(found, *j)
		}
	}
	slices.SortFunc(found, func(a, b Job) int { return int(a.ID - b.ID) })
	return found
}

// Alive reports whether the session with key still holds its lock.
func (m *Model) Alive(key int32) bool {
	s, ok := m.sessions[key]
	return ok && s.alive
}

// MayRegister reports whether a new session may take workerID: when no
// live session holds it, or the one holding it is previous, the caller's
// own.
func (m *Model) MayRegister(workerID string, previous *int32) bool {
	holder, ok := m.holders[workerID]
	return !ok || !m.Alive(holder) || (previous != nil && *previous == holder)
}

// Holder returns the session that holds workerID, if any.
func (m *Model) Holder(workerID string) (int32, bool) {
	key, ok := m.holders[workerID]
	return key, ok
}

// Register records a new live session with key, holding workerID.
func (m *Model) Register(workerID string, key int32) error {
	if _, ok := m.sessions[key]; ok {
		return fmt.Errorf("session key %d registered twice", key)
	}
	m.sessions[key] = &session{workerID: workerID, alive: true, recorded: true}
	m.holders[workerID] = key
	return nil
}

// EndSession records that the session with key has lost its lock.
func (m *Model) EndSession(key int32) {
	if s, ok := m.sessions[key]; ok {
		s.alive = false
	}
}

// runningUnder reports whether a job runs under the session with key.
func (m *Model) runningUnder(key int32) bool {
	for _, j := range m.jobs {
		if j.State == db.JobStateRunning && j.LeaseSession != nil && *j.LeaseSession == key {
			return true
		}
	}
	return false
}

// leasedUnder reports whether a job runs under the session with key with
// its lease unexpired at now.
func (m *Model) leasedUnder(key int32, now time.Time) bool {
	for _, j := range m.jobs {
		if j.State == db.JobStateRunning && j.LeaseSession != nil && *j.LeaseSession == key && j.LeaseExpiresAt.After(now) {
			return true
		}
	}
	return false
}

// Unregister removes the worker id if the session with key holds it, and
// reports whether it did; the session's row stays for ForgetEnded.
func (m *Model) Unregister(workerID string, key int32) (idReleased bool) {
	if holder, ok := m.holders[workerID]; ok && holder == key {
		delete(m.holders, workerID)
		return true
	}
	return false
}

// ForgetEnded forgets the ended sessions that hold no running job and
// frees the ids whose holder ended; returns how many sessions it forgot.
func (m *Model) ForgetEnded() int64 {
	for id, key := range m.holders {
		if !m.Alive(key) {
			delete(m.holders, id)
		}
	}
	var n int64
	for key, s := range m.sessions {
		if s.recorded && !s.alive && !m.runningUnder(key) {
			s.recorded = false
			n++
		}
	}
	return n
}

// Holding is a worker id and the session that holds it.
type Holding struct {
	ID           string
	SessionKey   int32
	SessionAlive bool
}

// Holdings returns every worker id held, by id.
func (m *Model) Holdings() []Holding {
	var out []Holding
	for id, key := range m.holders {
		out = append(out, Holding{ID: id, SessionKey: key, SessionAlive: m.Alive(key)})
	}
	slices.SortFunc(out, func(a, b Holding) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// RecordedSessions returns the keys worker_sessions must hold, ascending.
func (m *Model) RecordedSessions() []int32 {
	var out []int32
	for key, s := range m.sessions {
		if s.recorded {
			out = append(out, key)
		}
	}
	slices.Sort(out)
	return out
}

// Job returns the job with id.
func (m *Model) Job(id int64) (Job, bool) {
	j, ok := m.jobs[id]
	if !ok {
		return Job{}, false
	}
	return *j, true
}

// Jobs returns every job, by id.
func (m *Model) Jobs() []Job {
	out := make([]Job, 0, len(m.jobs))
	for _, j := range m.jobs {
		out = append(out, *j)
	}
	slices.SortFunc(out, func(a, b Job) int { return int(a.ID - b.ID) })
	return out
}

// QueueStats is the count of one queue's available and running jobs, and
// the age at now of its oldest job that is ready and waits for a worker.
type QueueStats struct {
	Queue              string
	Available, Running int64
	OldestReadyAge     time.Duration
}

// Stats returns the statistics of every queue that has jobs, finished
// ones included, by queue.
func (m *Model) Stats(now time.Time) []QueueStats {
	byQueue := map[string]*QueueStats{}
	var queues []string
	for _, j := range m.Jobs() {
		s, ok := byQueue[j.Queue]
		if !ok {
			s = &QueueStats{Queue: j.Queue}
			byQueue[j.Queue] = s
			queues = append(queues, j.Queue)
		}
		switch j.State {
		case db.JobStateAvailable:
			s.Available++
			if !j.RunAt.After(now) {
				s.OldestReadyAge = max(s.OldestReadyAge, now.Sub(j.RunAt))
			}
		case db.JobStateRunning:
			s.Running++
		}
	}
	slices.Sort(queues)
	out := make([]QueueStats, len(queues))
	for i, q := range queues {
		out[i] = *byQueue[q]
	}
	return out
}

func ptr[T any](v T) *T { return &v }

func clone[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// sameJob reports whether a and b agree on every field; it spares the
// driver a reflective comparison of the whole table at every step.
func sameJob(a, b Job) bool {
	return a.ID == b.ID && a.Queue == b.Queue && a.Priority == b.Priority && a.State == b.State &&
		a.Attempt == b.Attempt && a.MaxAttempts == b.MaxAttempts && a.Fence == b.Fence && a.RunAt.Equal(b.RunAt) &&
		a.LeaseToken == b.LeaseToken && sameTime(a.LeaseExpiresAt, b.LeaseExpiresAt) &&
		samePtr(a.LeasedBy, b.LeasedBy) && samePtr(a.LeaseSession, b.LeaseSession) &&
		sameTime(a.CancelRequestedAt, b.CancelRequestedAt) && a.CreatedAt.Equal(b.CreatedAt) &&
		sameTime(a.StartedAt, b.StartedAt) && sameTime(a.FinishedAt, b.FinishedAt) &&
		samePtr(a.LastError, b.LastError) && a.Errors == b.Errors && a.Result == b.Result &&
		samePtr(a.IdempotencyKey, b.IdempotencyKey)
}

func samePtr[T comparable](a, b *T) bool {
	return a == b || (a != nil && b != nil && *a == *b)
}

func sameTime(a, b *time.Time) bool {
	return a == b || (a != nil && b != nil && a.Equal(*b))
}
