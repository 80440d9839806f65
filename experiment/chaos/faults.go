package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/devdb"
	"github.com/relayq/relay/internal/faultproxy"
)

// faultLog collects what the fault schedules did, for the evaluation.
type faultLog struct {
	crashes   []string
	selfExits int
	pauses    []workerPause
	heals     []partitionHeal
	cuts      []faultproxy.CutEvent
	restarts  []serverRestart
	badInput  *BadInputResult
}

// workerPause is one SIGSTOP/SIGCONT of a worker.
type workerPause struct {
	worker  string
	faultID int64
	proc    *harness.Proc
	// longJobs is how many young long jobs the worker held when it was
	// chosen: 0 if none did by the deadline, or if that could not be read.
	longJobs int64
}

// partitionHeal is the end of a partition of one worker.
type partitionHeal struct {
	worker string
	kind   string
	at     time.Time // database clock, just before the heal
}

// serverRestart is one restart of the database server.
type serverRestart struct {
	mode devdb.ShutdownMode
	// down, start and up are when the stop began, when the start command
	// was given, and when it returned (the host's clock): the database was
	// down from down to up.
	down, start, up time.Time
	stopTook        time.Duration
	readyzDown      map[int]int
}

// injectFaults runs the scenario's fault schedule, which ends within the
// configured duration (faults land between 10% and 85% of it, so that jobs
// keep arriving after the last one is healed).
func (r *scenarioRun) injectFaults(ctx context.Context) error {
	start := time.Now()
	var err error
	switch r.cfg.Scenario {
	case Kill, PgBouncer:
		err = r.killWorkers(ctx, start)
	case Pause:
		err = r.pauseWorkers(ctx, start)
	case Partition:
		err = r.partitionWorkers(ctx, start)
	case BackendKill:
		err = r.killBackends(ctx, start)
	case Restart:
		err = r.restartDatabase(ctx, start)
	case BadInput:
		if sleepUntil(ctx, start.Add(r.cfg.Duration*3/10)) {
			err = r.sendBadInput(ctx)
		}
	case Poison, Starvation:
		// The workload itself is the fault.
	}
	if err != nil {
		return err
	}
	if !sleepUntil(ctx, start.Add(r.cfg.Duration)) {
		return fmt.Errorf("chaos: %w", ctx.Err())
	}
	return nil
}

// window returns the part of the run in which faults land.
func (r *scenarioRun) window(start time.Time) (from, until time.Time) {
	return start.Add(r.cfg.Duration / 10), start.Add(r.cfg.Duration * 85 / 100)
}

// killWorkers SIGKILLs a random worker (one that holds jobs, if any does)
// every FaultEvery and starts a new one in its place at once. In the
// pgbouncer scenario, the victims are by turns workers with a session and
// workers without one.
func (r *scenarioRun) killWorkers(ctx context.Context, start time.Time) error {
	next, until := r.window(start)
	for kills := 0; ctx.Err() == nil; kills++ {
		if !sleepUntil(ctx, next) || time.Now().After(until) {
			return nil
		}
		next = next.Add(r.jitter(r.cfg.FaultEvery))
		w := r.randomBusyWorker(ctx, func(w *workerProc) bool {
			return r.cfg.Scenario != PgBouncer || w.leaseOnly == (kills%2 == 1)
		})
		if w == nil {
			continue
		}
		kind := "kill"
		if w.leaseOnly {
			// Its death shows only when its leases expire.
			kind = "kill_lease_only"
		}
		r.recordFault(ctx, kind, w.id, w.proc.PID(), "SIGKILL")
		w.killed.Store(true)
		if err := w.proc.Kill(); err != nil {
			r.log.Warn("kill a worker", "worker", w.id, "err", err)
		}
		if _, err := r.startWorker(ctx); err != nil {
			return err
		}
	}
	return nil
}

// pauseWorkers SIGSTOPs the worker holding the most young long jobs for
// 1.75 leases, then SIGCONTs it, as often as the window allows (at least
// once), a lease apart.
func (r *scenarioRun) pauseWorkers(ctx context.Context, start time.Time) error {
	pause := r.cfg.Lease * 7 / 4
	next, until := r.window(start)
	for first := true; ctx.Err() == nil; first = false {
		if !first && next.Add(pause).After(until) {
			return nil
		}
		if !sleepUntil(ctx, next) {
			return nil
		}
		w, longJobs := r.pauseVictim(ctx, until.Add(-pause))
		if w == nil {
			next = time.Now().Add(100 * time.Millisecond)
			continue
		}
		id := r.recordFault(ctx, "pause", w.id, w.proc.PID(), fmt.Sprintf("SIGSTOP for %s", pause))
		if err := w.proc.Pause(); err != nil {
			return fmt.Errorf("chaos: pause %s: %w", w.id, err)
		}
		sleepUntil(ctx, time.Now().Add(pause))
		// The end is recorded before SIGCONT, so that everything the
		// worker does once awake comes after it.
		r.endFault(context.WithoutCancel(ctx), id)
		if err := w.proc.Resume(); err != nil {
			return fmt.Errorf("chaos: resume %s: %w", w.id, err)
		}
		r.mu.Lock()
		r.details.pauses = append(r.details.pauses, workerPause{worker: w.id, faultID: id, proc: w.proc, longJobs: longJobs})
		r.mu.Unlock()
		next = time.Now().Add(r.cfg.Lease)
	}
	return nil
}

// randomBusyWorker returns a random live worker among those that hold
// jobs now, or among all live workers if none does.
func (r *scenarioRun) randomBusyWorker(ctx context.Context, eligible func(*workerProc) bool) *workerProc {
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	rows, err := r.q.ChaosRunningByWorker(qctx, labdb.ChaosRunningByWorkerParams{LongMs: 1, YoungMs: 1})
	cancel()
	var busy []*workerProc
	if err == nil {
		for _, row := range rows {
			if w := r.worker(row.Worker); w != nil && !w.proc.Exited() && !w.killed.Load() && row.Running > 0 && eligible(w) {
				busy = append(busy, w)
			}
		}
	}
	if len(busy) == 0 {
		for _, w := range r.liveWorkers() {
			if eligible(w) {
				busy = append(busy, w)
			}
		}
	}
	if len(busy) == 0 {
		return nil
	}
	return busy[r.randN(len(busy))]
}

// pauseVictim returns the worker to pause: the one that holds the most long
// jobs young enough to outlive the pause (started less than a lease ago),
// so that the zombie's handlers are still running when it wakes. It waits
// for one that holds two such jobs until half-way to deadline, then for one
// that holds one until deadline; after that it takes the busiest live
// worker, or a random one. It returns how many such jobs the worker held.
func (r *scenarioRun) pauseVictim(ctx context.Context, deadline time.Time) (*workerProc, int64) {
	start := time.Now()
	soft := start.Add(deadline.Sub(start) / 2)
	for {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		rows, err := r.q.ChaosRunningByWorker(qctx, labdb.ChaosRunningByWorkerParams{
			LongMs:  (longJobLeases * r.cfg.Lease).Milliseconds(),
			YoungMs: r.cfg.Lease.Milliseconds(),
		})
		cancel()
		now := time.Now()
		want := int64(2)
		switch {
		case now.After(deadline):
			want = 0
		case now.After(soft):
			want = 1
		}
		if err == nil {
			for _, row := range rows {
				w := r.worker(row.Worker)
				if w != nil && !w.proc.Exited() && !w.killed.Load() && row.LongRunning >= want {
					return w, row.LongRunning
				}
			}
		}
		if want == 0 {
			live := r.liveWorkers()
			if len(live) == 0 {
				return nil, 0
			}
			return live[r.randN(len(live))], 0
		}
		if !sleepUntil(ctx, now.Add(50*time.Millisecond)) {
			return nil, 0
		}
	}
}

// partitionWorkers cuts the first worker off (a reset, new connections
// refused) and blackholes the second (a silent partition), each for 1.5
// leases, overlapping, while cutting the third worker's connection just
// after its completions commit, CommitCuts times.
func (r *scenarioRun) partitionWorkers(ctx context.Context, start time.Time) error {
	live := r.liveWorkers()
	if len(live) < 3 {
		return fmt.Errorf("chaos: the partition scenario needs 3 workers, has %d", len(live))
	}
	a, b, c := live[0], live[1], live[2]
	length := r.cfg.Lease * 3 / 2
	from, until := r.window(start)

	var wg sync.WaitGroup
	partition := func(w *workerProc, at time.Time, kind string, cut func(), detail string) {
		defer wg.Done()
		if !sleepUntil(ctx, at) {
			return
		}
		id := r.recordFault(ctx, kind, w.id, w.proc.PID(), detail)
		cut()
		sleepUntil(ctx, time.Now().Add(length))
		healCtx := context.WithoutCancel(ctx)
		healedAt, _ := r.nowRetry(healCtx)
		r.endFault(healCtx, id)
		w.proxy.Heal()
		r.mu.Lock()
		r.details.heals = append(r.details.heals, partitionHeal{worker: w.id, kind: kind, at: healedAt})
		r.mu.Unlock()
	}
	wg.Add(2)
	go partition(a, from, "partition_cut", func() { a.proxy.Cut() },
		fmt.Sprintf("connections reset and refused for %s", length))
	go partition(b, from.Add(r.cfg.Lease/2), "blackhole", b.proxy.Blackhole,
		fmt.Sprintf("nothing forwarded for %s", length))

	wg.Add(1)
	go func() {
		defer wg.Done()
		r.cutAtCommits(ctx, c, from, until)
	}()
	wg.Wait()
	for _, w := range []*workerProc{a, b, c} {
		w.proxy.Heal()
		w.proxy.Disarm()
	}
	return nil
}

// cutAtCommits arms w's proxy, one cut at a time, to cut its connection
// just after a statement that completes jobs commits (JobCompleteAndClaim,
// or JobCompleteMany for a round that claims nothing: both names begin
// "JobComplete"), until CommitCuts cuts were made or the window closes.
func (r *scenarioRun) cutAtCommits(ctx context.Context, w *workerProc, from, until time.Time) {
	if !sleepUntil(ctx, from) {
		return
	}
	for done := 0; done < r.cfg.CommitCuts && time.Now().Before(until); {
		fired := make(chan faultproxy.CutEvent, 1)
		w.proxy.CutAfterCommit(faultproxy.CommitCut{
			Statement:          "-- name: JobComplete",
			NonEmptyFirstArray: true,
			Times:              1,
			OnCut:              func(ev faultproxy.CutEvent) { fired <- ev },
		})
		select {
		case ev := <-fired:
			done++
			r.recordFault(context.WithoutCancel(ctx), "commit_cut", w.id, w.proc.PID(),
				fmt.Sprintf("connection %d cut after a completion committed; %d bytes of its answer dropped", ev.Conn, ev.DroppedBytes))
			r.mu.Lock()
			r.details.cuts = append(r.details.cuts, ev)
			r.mu.Unlock()
			sleepUntil(ctx, time.Now().Add(r.jitter(r.cfg.Duration/time.Duration(3*r.cfg.CommitCuts+1))))
		case <-time.After(time.Until(until)):
			w.proxy.Disarm()
			return
		case <-ctx.Done():
			w.proxy.Disarm()
			return
		}
	}
	w.proxy.Disarm()
}

// killBackends ends 1 or 2 random worker connections with
// pg_terminate_backend, about every two thirds of FaultEvery; every other
// time, one of them is a worker's session.
func (r *scenarioRun) killBackends(ctx context.Context, start time.Time) error {
	next, until := r.window(start)
	round := 0
	for ctx.Err() == nil {
		if !sleepUntil(ctx, next) || time.Now().After(until) {
			return nil
		}
		next = next.Add(r.jitter(r.cfg.FaultEvery * 2 / 3))
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		backends, err := r.q.ChaosWorkerBackends(qctx)
		cancel()
		if err != nil {
			return fmt.Errorf("chaos: list the workers' connections: %w", err)
		}
		if len(backends) == 0 {
			continue
		}
		// Every other round ends a worker's session (the connection
		// holding its advisory lock); the others end any connection.
		var sessions []int
		for i, b := range backends {
			if b.HoldsSession {
				sessions = append(sessions, i)
			}
		}
		round++
		picked := map[int]bool{}
		for k := range 1 + r.randN(2) {
			i := r.randN(len(backends))
			if k == 0 && round%2 == 1 && len(sessions) > 0 {
				i = sessions[r.randN(len(sessions))]
			}
			if picked[i] {
				continue
			}
			picked[i] = true
			b := backends[i]
			kind := "backend_kill"
			if b.HoldsSession {
				kind = "backend_kill_session"
			}
			target := strings.TrimPrefix(b.ApplicationName, "relay-worker-")
			r.recordFault(ctx, kind, target, int(b.PID), fmt.Sprintf("backend %d (%s): %s", b.PID, b.State, oneLine(b.Query)))
			qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := r.q.ChaosTerminateBackend(qctx, b.PID)
			cancel()
			if err != nil {
				return fmt.Errorf("chaos: terminate backend %d: %w", b.PID, err)
			}
		}
	}
	return nil
}

// restartDatabase stops the private cluster (immediate shutdown, a crash,
// then fast, alternately) for Downtime, Restarts times, probing /readyz
// while it is down.
func (r *scenarioRun) restartDatabase(ctx context.Context, start time.Time) error {
	from, until := r.window(start)
	span := until.Sub(from)
	for i := range r.cfg.Restarts {
		at := from.Add(span * time.Duration(i) / time.Duration(r.cfg.Restarts))
		if i == 0 {
			at = start.Add(r.cfg.Duration / 4)
		}
		if !sleepUntil(ctx, at) {
			return nil
		}
		mode := devdb.ShutdownImmediate
		if i%2 == 1 {
			mode = devdb.ShutdownFast
		}
		id := r.recordFault(ctx, "db_restart", "*", 0, fmt.Sprintf("%s shutdown, down for %s", mode, r.cfg.Downtime))
		rs := serverRestart{mode: mode, down: time.Now(), readyzDown: map[int]int{}}
		if err := r.cluster.StopServer(ctx, mode); err != nil {
			return fmt.Errorf("chaos: stop the database: %w", err)
		}
		rs.stopTook = time.Since(rs.down)
		for time.Since(rs.down) < r.cfg.Downtime && ctx.Err() == nil {
			status, _, err := r.http.do(ctx, r, "GET", "/readyz", nil, nil, false)
			if err == nil {
				rs.readyzDown[status]++
			}
			sleepUntil(ctx, time.Now().Add(200*time.Millisecond))
		}
		rs.start = time.Now()
		if err := r.cluster.StartServer(context.WithoutCancel(ctx)); err != nil {
			return fmt.Errorf("chaos: start the database again: %w", err)
		}
		rs.up = time.Now()
		r.endFault(context.WithoutCancel(ctx), id)
		r.mu.Lock()
		r.details.restarts = append(r.details.restarts, rs)
		r.mu.Unlock()
	}
	return nil
}

// oneLine squeezes whitespace, for details.
func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }
