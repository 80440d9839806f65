package burst

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/builtin"
	"github.com/relayq/relay/worker"
)

// probeHandler times the built-in hash handler, in this process, n times
// with the workload and n times without its sleep, to split a job's time
// in a worker between the sleep, the timer's lateness and the hashing.
func probeHandler(ctx context.Context, workload builtin.HashPayload, n int) HandlerProbe {
	h := builtin.Handlers()[builtin.KindHash]
	run := func(p builtin.HashPayload) harness.Percentiles {
		payload, _ := json.Marshal(p)
		var samples []float64
		for i := range n {
			if ctx.Err() != nil {
				break
			}
			job := &worker.Job{ID: int64(i + 1), Kind: builtin.KindHash, Payload: payload, Attempt: 1, Fence: 1, WorkerID: "experiment-probe"}
			t0 := time.Now()
			if _, err := h.Work(ctx, job); err != nil {
				break
			}
			samples = append(samples, harness.Millis(time.Since(t0)))
		}
		return harness.PercentilesOf(samples)
	}
	hashOnly := workload
	hashOnly.SleepMs = 0
	return HandlerProbe{Handler: run(workload), HashOnly: run(hashOnly)}
}

// StatementProbe times, in a burst configuration's database once its
// processes are stopped, what a one-slot worker sends between two jobs, on
// one connection with a worker's plan settings, and how much CPU the
// server process behind it spends.
type StatementProbe struct {
	// PlanSettings are those of the probe's connection.
	PlanSettings
	// CompleteAndClaim is the worker's statement as the worker sends it
	// (its own transaction, committed synchronously): completing the
	// previous job and claiming the next, back to back.
	CompleteAndClaim harness.Percentiles `json:"complete_and_claim"`
	// CompleteAndClaimPaced is the same with the workload's sleep between
	// two statements, as in a one-slot worker, where both the worker and its
	// database backend sit idle between jobs and must be woken up again.
	CompleteAndClaimPaced harness.Percentiles `json:"complete_and_claim_paced"`
	PaceMs                float64             `json:"pace_ms"`
	// InTxSyncCommit is the same statement in an explicit transaction, from
	// the statement to the end of COMMIT; InTxAsyncCommit the same with
	// synchronous_commit off for that transaction. Their difference is the
	// wait for the WAL flush (fsync) of every commit.
	InTxSyncCommit  harness.Percentiles `json:"in_tx_sync_commit"`
	InTxAsyncCommit harness.Percentiles `json:"in_tx_async_commit"`
	// RoundTrip is a statement that does nothing (reading the clock), and
	// RoundTripPaced the same with the pace between two: the cost of waking
	// an idle backend and client, whatever the statement.
	RoundTrip      harness.Percentiles `json:"round_trip"`
	RoundTripPaced harness.Percentiles `json:"round_trip_paced"`
	// BackendCPUMs is the CPU time the server process spent per statement
	// in each series ("complete_and_claim", "complete_and_claim_paced",
	// "round_trip", "round_trip_paced", ...), from /proc in 10 Millis ticks:
	// a coarse figure, good to a few tens of percent.
	BackendCPUMs map[string]float64 `json:"backend_cpu_ms_per_statement,omitempty"`
}

// probeStatements runs the StatementProbe in d with n samples in each
// series, the paced ones pace apart.
func probeStatements(ctx context.Context, d *harness.Database, n int, pace time.Duration) (*StatementProbe, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	pool, err := openWorkerPool(ctx, d.URL, "relay-burst-probe")
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	defer pool.Close()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("probe: connect: %w", err)
	}
	defer conn.Release()
	q, lab := db.New(conn), labdb.New(conn)
	pid, err := lab.ExperimentBackendPID(ctx)
	if err != nil {
		return nil, fmt.Errorf("probe: backend pid: %w", err)
	}
	plans, err := readPlanSettings(ctx, conn)
	if err != nil {
		return nil, fmt.Errorf("probe: %w", err)
	}
	// The backend's CPU can be read only when the server runs on this host.
	local := harness.IsPostgres(int(pid))

	if err := harness.InsertJobs(ctx, conn, harness.Job(probeQueue, builtin.KindNoop, json.RawMessage(`{}`), 1), 4*n+4); err != nil {
		return nil, fmt.Errorf("probe: insert jobs: %w", err)
	}
	cp := db.JobCompleteAndClaimParams{
		CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
		Queue: probeQueue, LeaseMs: 30000, WorkerID: "experiment-probe",
	}
	result := json.RawMessage(`{"worker":"experiment-probe","pid":0,"attempt":1,"fence":1}`)
	// step sends one statement of the series mode and returns how long it
	// took, from sending it to its commit.
	step := func(mode string) (time.Duration, error) {
		if strings.HasSuffix(mode, "_paced") {
			time.Sleep(pace)
		}
		var rows []db.JobCompleteAndClaimRow
		var err error
		cp.ClaimTokens = []pgtype.UUID{newToken()}
		t0 := time.Now()
		switch mode {
		case "round_trip", "round_trip_paced":
			_, err = lab.ExperimentClock(ctx)
			return time.Since(t0), err
		case "complete_and_claim", "complete_and_claim_paced":
			rows, err = q.JobCompleteAndClaim(ctx, cp)
		default: // in_tx_sync_commit, in_tx_async_commit
			tx, txErr := conn.Begin(ctx)
			if txErr != nil {
				return 0, txErr
			}
			defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck
			qtx := q.WithTx(tx)
			if mode == "in_tx_async_commit" {
				if err := lab.WithTx(tx).ExperimentSkipCommitWait(ctx); err != nil {
					return 0, err
				}
			}
			t0 = time.Now()
			if rows, err = qtx.JobCompleteAndClaim(ctx, cp); err == nil {
				err = tx.Commit(ctx)
			}
		}
		elapsed := time.Since(t0)
		if err != nil {
			return 0, err
		}
		cp.CompleteIDs, cp.CompleteTokens, cp.CompleteResults = cp.CompleteIDs[:0], cp.CompleteTokens[:0], cp.CompleteResults[:0]
		if len(rows) > 0 && rows[0].ID != nil {
			cp.CompleteIDs = append(cp.CompleteIDs, *rows[0].ID)
			cp.CompleteTokens = append(cp.CompleteTokens, rows[0].LeaseToken)
			cp.CompleteResults = append(cp.CompleteResults, result)
		}
		return elapsed, nil
	}
	out := &StatementProbe{
		PlanSettings: plans,
		PaceMs:       harness.Millis(pace), BackendCPUMs: map[string]float64{},
	}
	for _, m := range []struct {
		mode string
		into *harness.Percentiles
	}{
		{"complete_and_claim", &out.CompleteAndClaim},
		{"complete_and_claim_paced", &out.CompleteAndClaimPaced},
		{"in_tx_sync_commit", &out.InTxSyncCommit},
		{"in_tx_async_commit", &out.InTxAsyncCommit},
		{"round_trip", &out.RoundTrip},
		{"round_trip_paced", &out.RoundTripPaced},
	} {
		// The first statement of each series completes nothing: a warm-up.
		if _, err := step(m.mode); err != nil {
			return nil, fmt.Errorf("probe: %s: %w", m.mode, err)
		}
		cpu0, cpuOK := harness.ProcCPU(int(pid))
		samples := make([]float64, 0, n)
		for range n {
			d, err := step(m.mode)
			if err != nil {
				return nil, fmt.Errorf("probe: %s: %w", m.mode, err)
			}
			samples = append(samples, harness.Millis(d))
		}
		if cpu1, ok := harness.ProcCPU(int(pid)); ok && cpuOK && local && n > 0 {
			out.BackendCPUMs[m.mode] = harness.Round3(harness.Millis(cpu1-cpu0) / float64(n))
		}
		*m.into = harness.PercentilesOf(samples)
	}
	return out, nil
}

// newToken draws a fresh random lease token.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }

// openWorkerPool opens a pool on url with the plan settings relay work
// gives its own (worker.KeepGenericPlans), so that what the lab times or
// traces through it plans and runs each statement as a worker does.
func openWorkerPool(ctx context.Context, url, appName string) (*pgxpool.Pool, error) {
	return harness.OpenPool(ctx, url, appName, 0, 0, worker.KeepGenericPlans)
}

// PlanSettings are the settings that decide how a connection plans a
// prepared statement and whether it compiles the plan. The statement
// probe and the worker trace record those they ran under, a worker's
// (openWorkerPool).
type PlanSettings struct {
	PlanCacheMode string `json:"plan_cache_mode"`
	JIT           string `json:"jit"`
}

// readPlanSettings reads the PlanSettings of a connection of dbtx.
func readPlanSettings(ctx context.Context, dbtx labdb.DBTX) (PlanSettings, error) {
	s, err := labdb.New(dbtx).ExperimentPlanSettings(ctx)
	if err != nil {
		return PlanSettings{}, fmt.Errorf("read the plan settings: %w", err)
	}
	return PlanSettings{PlanCacheMode: s.PlanCacheMode, JIT: s.Jit}, nil
}
