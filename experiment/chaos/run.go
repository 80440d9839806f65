package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/builtin"
)

// plannedJob is one job of a workload.
type plannedJob struct {
	Kind        string
	Payload     json.RawMessage
	MaxAttempts int32
}

// jobMaxAttempts is the max_attempts of the workload's jobs: high enough
// that no healthy job runs out of attempts under the faults, while the
// poison jobs get poisonAttempts.
const (
	jobMaxAttempts = 25
	poisonAttempts = 3
)

// longJobLeases is how many leases the pause scenario's long jobs run.
const longJobLeases = 3

// workload returns the scenario's jobs, in the order they are enqueued:
// sleep and hash jobs of 5 to 300 Millis, plus what the scenario needs (long
// jobs for a pause or a kill to catch, poison jobs, connection hogs).
func (r *scenarioRun) workload() []plannedJob {
	c := r.cfg
	n := c.Jobs
	var jobs []plannedJob
	add := func(kind string, payload any, maxAttempts int32) {
		b, err := json.Marshal(payload)
		if err != nil {
			panic(err) // static payload types
		}
		jobs = append(jobs, plannedJob{Kind: kind, Payload: b, MaxAttempts: maxAttempts})
	}
	switch c.Scenario {
	case Pause:
		// Jobs that run for three leases, so that the paused worker surely
		// holds some that are still running when it wakes: as many as fill
		// about 30% of the slots over the run.
		long := int(0.3 * float64(c.Workers*c.Slots) * c.Duration.Seconds() / (longJobLeases * c.Lease.Seconds()))
		long = min(max(long, 5*c.Workers), n/20)
		for range long {
			add(builtin.KindSleep, builtin.SleepPayload{Ms: (longJobLeases * c.Lease).Milliseconds()}, jobMaxAttempts)
		}
		// Jobs that wait a little, then fail their first attempt: the
		// paused worker's failures must be refused too.
		for range n / 10 {
			add(KindFlaky, FlakyPayload{Ms: int64(100 + r.randN(300)), FailAttempts: 1}, jobMaxAttempts)
		}
	case Poison:
		for range max(3, n*3/100) {
			add(KindPanic, struct{}{}, poisonAttempts)
		}
		for range max(3, n*3/100) {
			add(KindFail, struct{}{}, poisonAttempts)
		}
		for range max(2, n/500) {
			add(KindExit, struct{}{}, poisonAttempts)
		}
	case PgBouncer:
		// Jobs that run for a lease, so that a worker killed holds some:
		// a job held by a worker without a session shows how long only
		// its lease takes to bring the job back. As many as fill about 15%
		// of the slots over the run.
		long := int(0.15 * float64(c.Workers*c.Slots) * c.Duration.Seconds() / c.Lease.Seconds())
		for range min(max(long, 5*c.Workers), n/20) {
			add(builtin.KindSleep, builtin.SleepPayload{Ms: c.Lease.Milliseconds()}, jobMaxAttempts)
		}
	case Starvation:
		for range 2 * c.Workers {
			add(KindHoldConns, HoldConnsPayload{HoldMs: (c.Lease * 5 / 4).Milliseconds()}, jobMaxAttempts)
		}
	}
	// The healthy mix: half short sleeps, three tenths hashes, a fifth
	// longer sleeps, so that a worker hit by a fault usually holds jobs.
	for len(jobs) < n {
		switch k := r.randN(10); {
		case k < 5:
			add(builtin.KindSleep, builtin.SleepPayload{Ms: int64(5 + r.randN(46))}, jobMaxAttempts)
		case k < 8:
			add(builtin.KindHash, builtin.HashPayload{SleepMs: int64(2 + r.randN(19)), Iterations: int64(200 + r.randN(1801))}, jobMaxAttempts)
		default:
			add(builtin.KindSleep, builtin.SleepPayload{Ms: int64(100 + r.randN(201))}, jobMaxAttempts)
		}
	}
	r.rngMu.Lock()
	r.rng.Shuffle(len(jobs), func(i, j int) { jobs[i], jobs[j] = jobs[j], jobs[i] })
	r.rngMu.Unlock()
	return jobs
}

// run enqueues the workload while the scenario's faults are injected,
// waits for every job to finish, stops the processes and checks the
// history.
func (r *scenarioRun) run(ctx context.Context, started time.Time) (*Result, error) {
	jobs := r.workload()
	r.progress = harness.NewProgress(r.cfg.Progress, fmt.Sprintf("chaos %-12s", r.cfg.Scenario), len(jobs))

	bgCtx, stopBackground := context.WithCancel(ctx)
	var bg sync.WaitGroup
	bg.Add(2)
	go func() { defer bg.Done(); r.ledger.run(bgCtx) }()
	go func() { defer bg.Done(); r.showProgress(bgCtx) }()
	defer func() { stopBackground(); bg.Wait() }()

	windowStart, err := r.d.Now(ctx)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	// Enqueueing is bounded: an enqueue the API keeps refusing must not
	// hold the run forever.
	enqCtx, cancelEnqueue := context.WithTimeout(ctx, r.cfg.Duration+r.cfg.DrainTimeout)
	defer cancelEnqueue()
	enqueued := make(chan error, 1)
	go func() { enqueued <- r.enqueue(enqCtx, jobs) }()
	faultErr := r.injectFaults(ctx)
	enqErr := <-enqueued
	if err := errors.Join(faultErr, enqErr); err != nil {
		return nil, err
	}
	windowEnd, err := r.nowRetry(ctx)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}

	drained, err := r.drain(ctx)
	if err != nil {
		return nil, err
	}
	if r.cfg.Scenario == Restart {
		r.awaitSessions(ctx)
	}
	runEnd, err := r.nowRetry(ctx)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}

	// The processes that must have survived the faults are checked before
	// they are stopped.
	survivors := r.survivors()
	r.stopping.Store(true)
	stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
	stopErr := r.procs.StopAll(stopCtx, 15*time.Second)
	cancel()
	if stopErr != nil {
		r.log.Warn("a process did not stop gracefully", "err", stopErr)
	}
	stopBackground()
	bg.Wait()
	flushCtx, cancel := context.WithTimeout(ctx, time.Minute)
	err = r.ledger.flushAll(flushCtx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	r.progress.Finish("done in %.1fs, drained: %v", time.Since(started).Seconds(), drained)

	evalCtx, cancelEval := context.WithTimeout(ctx, 5*time.Minute)
	defer cancelEval()
	check, hist, err := checkHistory(evalCtx, r.q)
	if err != nil {
		return nil, err
	}
	res := &Result{
		Scenario:    r.cfg.Scenario,
		StartedAt:   started.UTC(),
		WallSeconds: harness.Round3(time.Since(started).Seconds()),
		Config:      newResultConfig(r.cfg, len(jobs)),
		Drained:     drained,
		Check:       check,
	}
	if err := r.evaluate(evalCtx, res, hist, windowStart, windowEnd, runEnd, survivors); err != nil {
		return nil, err
	}
	return res, nil
}

// sessionWait bounds how long the restart scenario waits, once the queue
// is drained, for every worker to show a session begun after the last
// restart: a worker waits up to 2 s between tries to open its session,
// and a server slow to come back may leave the drain ending before the
// next try.
const sessionWait = 10 * time.Second

// awaitSessions waits, up to sessionWait, until every worker that
// evaluateRestart judges has a session registered since the last restart
// began. It only gives the workers time to show it: whether and when each
// did is judged by evaluateRestart, from the database's records.
func (r *scenarioRun) awaitSessions(ctx context.Context) {
	r.mu.Lock()
	var since time.Time
	if n := len(r.details.restarts); n > 0 {
		since = r.details.restarts[n-1].start
	}
	r.mu.Unlock()
	if since.IsZero() {
		return
	}
	workers := workerNames(r.survivors())
	renewed := func(sessions []labdb.ChaosSession) bool {
		for _, w := range workers {
			if _, ok := sessionAfter(sessions, w, since); !ok {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(sessionWait); time.Now().Before(deadline); {
		if sessions, err := r.q.ChaosSessions(ctx); err == nil && renewed(sessions) {
			return
		}
		if !sleepUntil(ctx, time.Now().Add(100*time.Millisecond)) {
			return
		}
	}
}

// nowRetry reads the database clock, retrying for a while: the database
// may just be coming back.
func (r *scenarioRun) nowRetry(ctx context.Context) (time.Time, error) {
	var err error
	for range 100 {
		var t time.Time
		if t, err = r.d.Now(ctx); err == nil {
			return t, nil
		}
		if ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Time{}, err
}

// survivors returns, for the scenarios in which no process may be
// restarted (restart, partition), the processes that ran through the
// faults and whether each still runs.
func (r *scenarioRun) survivors() map[string]bool {
	out := map[string]bool{}
	r.mu.Lock()
	for _, w := range r.workers {
		out[w.id] = !w.proc.Exited()
	}
	r.mu.Unlock()
	if r.server != nil {
		out["serve"] = !r.server.Exited()
	}
	return out
}

// batchEvery is the pace of the enqueuer: a batch this often.
const batchEvery = 200 * time.Millisecond

// enqueue enqueues jobs at an even pace over the configured duration: by
// Go calls (client.InsertMany) in batches, or, in the restart and pgbouncer
// scenarios, one by one through the HTTP API.
func (r *scenarioRun) enqueue(ctx context.Context, jobs []plannedJob) error {
	if r.cfg.Scenario == Restart || r.cfg.Scenario == PgBouncer {
		return r.enqueueHTTP(ctx, jobs)
	}
	batch := max(1, int(int64(len(jobs))*int64(batchEvery)/int64(r.cfg.Duration)))
	interval := time.Duration(int64(r.cfg.Duration) * int64(batch) / int64(len(jobs)))
	start := time.Now()
	for i, n := 0, 0; i < len(jobs); i, n = i+batch, n+1 {
		if !sleepUntil(ctx, start.Add(time.Duration(n)*interval)) {
			return fmt.Errorf("chaos: enqueue: %w", ctx.Err())
		}
		chunk := jobs[i:min(i+batch, len(jobs))]
		batch := make([]client.Job, 0, len(chunk))
		for _, j := range chunk {
			batch = append(batch, harness.Job(client.DefaultQueue, j.Kind, j.Payload, j.MaxAttempts))
		}
		ictx, cancel := context.WithTimeout(ctx, 30*time.Second)
		ids, err := client.InsertMany(ictx, r.d.Pool, batch)
		cancel()
		if err != nil {
			// Not retried: a retry after an ambiguous failure could enqueue
			// the batch twice. The Go path is never faulted, so this is a
			// failure of the harness's setup.
			return fmt.Errorf("chaos: enqueue %d jobs: %w", len(chunk), err)
		}
		r.ledger.ack(ids, "go")
	}
	return nil
}

// sleepUntil waits until t, or returns false when ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// drain waits until every acknowledged job has finished, or DrainTimeout.
func (r *scenarioRun) drain(ctx context.Context) (bool, error) {
	deadline := time.Now().Add(r.cfg.DrainTimeout)
	for {
		fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := r.ledger.flush(fctx)
		var p labdb.ChaosProgressRow
		if err == nil {
			p, err = r.q.ChaosProgress(fctx)
		}
		cancel()
		if err == nil && p.Enqueued == r.ledger.acked() && p.Finished == p.Enqueued {
			return true, nil
		}
		if time.Now().After(deadline) {
			r.log.Warn("jobs left unfinished", "enqueued", p.Enqueued, "finished", p.Finished, "err", err)
			return false, nil
		}
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("chaos: wait for the jobs to finish: %w", ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// showProgress updates the progress line until ctx ends.
func (r *scenarioRun) showProgress(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		p, err := r.q.ChaosProgress(qctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			r.progress.Note("(database unreachable) faults %d", r.faultCount.Load())
			continue
		}
		r.progress.Update(int(p.Finished), fmt.Sprintf("enqueued %d, faults %d", p.Enqueued, r.faultCount.Load()))
	}
}

// enqueueLedger is the harness's record of its enqueues: the ids
// acknowledged and the Idempotency-Keys sent. It is written to the database
// in the background, and retried, since the database may be down.
type enqueueLedger struct {
	q *labdb.Queries

	mu      sync.Mutex
	pending map[string][]int64 // via -> ids not yet written
	keys    []string           // keys not yet written
	total   atomic.Int64
}

func newLedger(q *labdb.Queries) *enqueueLedger {
	return &enqueueLedger{q: q, pending: map[string][]int64{}}
}

// ack notes that the enqueue of ids was acknowledged, by via ("go" or
// "http").
func (l *enqueueLedger) ack(ids []int64, via string) {
	l.mu.Lock()
	l.pending[via] = append(l.pending[via], ids...)
	l.mu.Unlock()
	l.total.Add(int64(len(ids)))
}

// sent notes that an enqueue was sent with an Idempotency-Key.
func (l *enqueueLedger) sent(key string) {
	l.mu.Lock()
	l.keys = append(l.keys, key)
	l.mu.Unlock()
}

// acked returns how many enqueues were acknowledged.
func (l *enqueueLedger) acked() int64 { return l.total.Load() }

// run writes the ledger every 100 Millis until ctx ends.
func (l *enqueueLedger) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(100 * time.Millisecond):
		}
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = l.flush(fctx) // retried at the next round
		cancel()
	}
}

// flush writes what is pending; what fails stays pending.
func (l *enqueueLedger) flush(ctx context.Context) error {
	l.mu.Lock()
	pending, keys := l.pending, l.keys
	l.pending, l.keys = map[string][]int64{}, nil
	l.mu.Unlock()
	var errs []error
	if len(keys) > 0 {
		if err := l.q.ChaosEnqueueKeys(ctx, keys); err != nil {
			errs = append(errs, fmt.Errorf("record %d idempotency keys: %w", len(keys), err))
			l.mu.Lock()
			l.keys = append(l.keys, keys...)
			l.mu.Unlock()
		}
	}
	for via, ids := range pending {
		if len(ids) == 0 {
			continue
		}
		if err := l.q.ChaosEnqueued(ctx, labdb.ChaosEnqueuedParams{JobIDs: ids, Via: via}); err != nil {
			errs = append(errs, fmt.Errorf("record %d enqueues: %w", len(ids), err))
			l.mu.Lock()
			l.pending[via] = append(l.pending[via], ids...)
			l.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}

// flushAll writes everything pending, retrying until ctx ends.
func (l *enqueueLedger) flushAll(ctx context.Context) error {
	for {
		err := l.flush(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("write the enqueue ledger: %w", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
