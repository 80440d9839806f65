package burst

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/builtin"
	"github.com/relayq/relay/worker"
)

// WorkerTrace follows a one-slot worker, run in the experiment's own
// process with Relay's worker library and the built-in hash handler
// wrapped in a stopwatch, through a queue of jobs: it shows where a job's
// cycle goes outside the handler, which the database's timestamps cannot.
type WorkerTrace struct {
	// PlanSettings are those of the worker's pool.
	PlanSettings
	// Jobs is how many jobs were traced.
	Jobs int `json:"jobs"`
	// Handler is the wrapped handler's run time: sleep, timer lateness, hash.
	Handler harness.Percentiles `json:"handler"`
	// EndToAck is from a handler's end to the moment the worker learns its
	// completion was accepted: encoding the result, handing it to the
	// dispatcher, and the complete-and-claim statement (which also claims
	// the next job).
	EndToAck harness.Percentiles `json:"end_to_ack"`
	// AckToNextStart is from there to the next handler's start.
	AckToNextStart harness.Percentiles `json:"ack_to_next_start"`
	// EndToNextStart is the worker's whole overhead per job: from one
	// handler's end to the next one's start.
	EndToNextStart harness.Percentiles `json:"end_to_next_start"`
	// Cycle is from one handler's start to the next one's.
	Cycle harness.Percentiles `json:"cycle"`
}

// traceWorker runs the WorkerTrace on n jobs of workload, in a database of
// its own on adminURL.
func traceWorker(ctx context.Context, adminURL string, workload builtin.HashPayload, n int) (_ *WorkerTrace, err error) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(n)*time.Duration(workload.SleepMs+50)*time.Millisecond+time.Minute)
	defer cancel()
	d, err := harness.CreateDatabase(ctx, adminURL, "relay_exp_trace_")
	if err != nil {
		return nil, err
	}
	defer d.DropAtEnd(ctx, &err)

	// The worker gets a pool of its own, with the plan settings of
	// relay work's.
	pool, err := openWorkerPool(ctx, d.URL, "relay-burst-trace")
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer pool.Close()
	plans, err := readPlanSettings(ctx, pool)
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}

	type times struct{ start, end, ack time.Time }
	var mu sync.Mutex
	byJob := map[int64]*times{}
	get := func(id int64) *times {
		t, ok := byJob[id]
		if !ok {
			t = &times{}
			byJob[id] = t
		}
		return t
	}
	const queue = "trace"
	w, err := worker.New(pool, worker.Config{
		Queue:  queue,
		Slots:  1,
		ID:     "experiment-trace",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		OnAck: func(a worker.Ack) {
			now := time.Now()
			if a.Outcome == worker.OutcomeCompleted && a.Accepted {
				mu.Lock()
				get(a.Job.ID).ack = now
				mu.Unlock()
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	hash := builtin.Handlers()[builtin.KindHash]
	w.HandleFunc(builtin.KindHash, func(ctx context.Context, job *worker.Job) (any, error) {
		start := time.Now()
		res, err := hash.Work(ctx, job)
		end := time.Now()
		mu.Lock()
		t := get(job.ID)
		t.start, t.end = start, end
		mu.Unlock()
		return res, err
	})

	payload, _ := json.Marshal(workload)
	if err := harness.InsertJobs(ctx, d.Pool, harness.Job(queue, builtin.KindHash, payload, 1), n); err != nil {
		return nil, fmt.Errorf("trace: insert jobs: %w", err)
	}

	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		p, err := d.Lab.ExperimentQueueProgress(pctx, queue)
		cancel()
		if err != nil {
			stop()
			<-done
			return nil, fmt.Errorf("trace: progress: %w", err)
		}
		if int(p.Finished) >= n {
			break
		}
		select {
		case <-ctx.Done():
			stop()
			<-done
			return nil, fmt.Errorf("trace: %d of %d jobs done: %w", p.Finished, n, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
	stop()
	if err := <-done; err != nil {
		return nil, fmt.Errorf("trace: worker: %w", err)
	}

	mu.Lock()
	defer mu.Unlock()
	var order []*times
	for _, t := range byJob {
		if !t.start.IsZero() && !t.ack.IsZero() {
			order = append(order, t)
		}
	}
	sort.Slice(order, func(i, j int) bool { return order[i].start.Before(order[j].start) })
	var handler, endToAck, ackToNext, endToNext, cycle []float64
	for i, t := range order {
		handler = append(handler, harness.Millis(t.end.Sub(t.start)))
		endToAck = append(endToAck, harness.Millis(t.ack.Sub(t.end)))
		if i+1 < len(order) {
			next := order[i+1].start
			ackToNext = append(ackToNext, harness.Millis(next.Sub(t.ack)))
			endToNext = append(endToNext, harness.Millis(next.Sub(t.end)))
			cycle = append(cycle, harness.Millis(next.Sub(t.start)))
		}
	}
	return &WorkerTrace{
		PlanSettings:   plans,
		Jobs:           len(order),
		Handler:        harness.PercentilesOf(handler),
		EndToAck:       harness.PercentilesOf(endToAck),
		AckToNextStart: harness.PercentilesOf(ackToNext),
		EndToNextStart: harness.PercentilesOf(endToNext),
		Cycle:          harness.PercentilesOf(cycle),
	}, nil
}
