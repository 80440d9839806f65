package worker_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/worker"
)

// These tests specify how many acknowledgement rounds a worker keeps in
// flight: a worker of many slots sends a second round, with the outcomes
// that gathered behind a first whose statement is slow, so that its
// statements can run on two of the server's cores; a worker of few slots
// sends one at a time, so that each carries as many outcomes as it can.

// statementCounter counts the statements sent on a pool's connections, by
// the name sqlc gives each at the head of its text ("-- name: JobGet :one").
type statementCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if rest, ok := strings.CutPrefix(data.SQL, "-- name: "); ok {
		name, _, _ := strings.Cut(rest, " ")
		c.mu.Lock()
		c.n[name]++
		// The statements that complete jobs take their ids first.
		if len(data.Args) > 0 {
			if ids, ok := data.Args[0].([]int64); ok && len(ids) > 0 && strings.HasPrefix(name, "JobComplete") {
				c.n[completing]++
			}
		}
		c.mu.Unlock()
	}
	return ctx
}

// completing counts, among a statementCounter's names, the statements that
// completed jobs: JobCompleteMany, and JobCompleteAndClaim with
// completions.
const completing = "(completing)"

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// count returns how many statements of the name given were sent.
func (c *statementCounter) count(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[name]
}

// countedPool opens a pool on the test's database whose statements c
// counts, closed when the test ends.
func (b *bundle) countedPool(t *testing.T) (*pgxpool.Pool, *statementCounter) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(b.url)
	if err != nil {
		t.Fatal(err)
	}
	c := &statementCounter{n: make(map[string]int)}
	cfg.ConnConfig.Tracer = c
	pool, err := pgxpool.NewWithConfig(b.ctx, cfg)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, c
}

func TestWorker_ToldOfNewJobsClaimsWhenToldNotWithEveryCompletion(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, counted := b.countedPool(t)
	// No poll in the test's time: only notifications announce jobs.
	b.runWorker(t, pool, worker.Config{Slots: 2, PollInterval: time.Hour}, func(w *worker.Worker) {
		w.HandleFunc("quick", func(ctx context.Context, j *worker.Job) (any, error) { return nil, nil })
	})
	// One job at a time, each announced by its insert: a claim for each
	// is all the worker needs, besides the claims it makes as it starts.
	const jobs = 30
	for range jobs {
		job := b.enqueue(t, "quick", `{}`, 1)
		b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	}
	claims, alone := counted.count("JobCompleteAndClaim"), counted.count("JobCompleteMany")
	t.Logf("%d jobs: %d claims, %d completions without a claim", jobs, claims, alone)
	if claims > jobs+3 {
		t.Errorf("%d claims for %d jobs, each announced: the worker claims with its completions, not only when told", claims, jobs)
	}
	if alone < jobs/2 {
		t.Errorf("%d of %d completions sent without a claim, want at least half", alone, jobs)
	}
}

func TestWorker_RoundThatClaimsNothingWaitsForTheHandlersStillRunning(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, counted := b.countedPool(t)
	b.runWorker(t, pool, worker.Config{Slots: 4, PollInterval: time.Hour}, func(w *worker.Worker) {
		w.HandleFunc("short", func(ctx context.Context, j *worker.Job) (any, error) {
			time.Sleep(20 * time.Millisecond)
			return nil, nil
		})
	})
	// Batches of four jobs, each inserted by one statement and so announced
	// by one notification: one claim takes the four, and their handlers
	// start together and end within a fraction of their run time.
	const batches, size = 20, 4
	for range batches {
		var ids []int64
		rows, err := b.pool.Query(b.ctx, `
			INSERT INTO jobs (queue, kind, max_attempts)
			SELECT 'default', 'short', 1 FROM generate_series(1, $1::integer)
			RETURNING id`, size)
		if err != nil {
			t.Fatal(err)
		}
		ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range ids {
			b.waitForState(t, id, db.JobStateSucceeded, 10*time.Second)
		}
	}
	// The first batches teach the worker how long its handlers run; it
	// lingers for half of that, 5 ms at most. Sent at once, the first
	// outcome of a batch would go alone and the others after it: two
	// statements a batch or more.
	got := counted.count(completing)
	t.Logf("%d batches of %d jobs: %d statements completed them", batches, size, got)
	if got > batches*3/2 {
		t.Errorf("%d statements completed %d batches of %d jobs that ended together, want about one a batch", got, batches, size)
	}
}

// roundsWatch samples, until stop is called, how many rounds' statements
// (JobCompleteAndClaim, and JobCompleteMany for a round that claims
// nothing) run at once in the test's database, and reports the most it
// saw.
func (b *bundle) roundsWatch(t *testing.T) (stop func() int) {
	t.Helper()
	return b.mostWatch(t, "the statements in flight", `
		SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND state = 'active'
		  AND (query LIKE '-- name: JobCompleteAndClaim %' OR query LIKE '-- name: JobCompleteMany %')`)
}

func TestWorker_SendsASecondRoundBesideASlowOneOnlyWithManySlots(t *testing.T) {
	t.Parallel()
	// A round beside another carries at least 32 outcomes, which a worker
	// that holds fewer jobs never has.
	tests := []struct {
		name            string
		slots, prefetch int
		jobs            int
		wantMost        int
	}{
		{"64 slots: a second round beside the first", 64, 0, 600, 2},
		{"4 slots and 4 ahead: one round at a time", 4, 4, 400, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			// The completion of a job of kind "slow" takes half a second,
			// so that the round that records it is still in flight while
			// the other slots finish their jobs.
			if _, err := b.pool.Exec(b.ctx, `
				CREATE FUNCTION slow_completion() RETURNS trigger LANGUAGE plpgsql AS $$
				BEGIN
					IF NEW.kind = 'slow' AND NEW.state = 'succeeded' THEN PERFORM pg_sleep(0.5); END IF;
					RETURN NEW;
				END $$;
				CREATE TRIGGER slow_completion BEFORE UPDATE ON jobs FOR EACH ROW EXECUTE FUNCTION slow_completion()`); err != nil {
				t.Fatal(err)
			}
			if _, err := b.pool.Exec(b.ctx, `
				INSERT INTO jobs (queue, kind)
				SELECT 'default', CASE WHEN i % 200 = 0 THEN 'slow' ELSE 'work' END
				FROM generate_series(1, $1::integer) AS i`, tt.jobs); err != nil {
				t.Fatal(err)
			}
			var c concurrency
			w, _ := b.startWorker(t, worker.Config{Slots: tt.slots, Prefetch: tt.prefetch}, func(w *worker.Worker) {
				work := func(ctx context.Context, j *worker.Job) (any, error) {
					c.enter()
					defer c.leave()
					time.Sleep(2 * time.Millisecond)
					return nil, nil
				}
				w.HandleFunc("work", work)
				w.HandleFunc("slow", work)
			})
			stopRounds := b.roundsWatch(t)
			stopHeld := b.heldWatch(t, w.ID())
			deadline := time.Now().Add(time.Minute)
			for {
				var left int
				if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM jobs WHERE state <> 'succeeded'").Scan(&left); err != nil {
					t.Fatal(err)
				}
				if left == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d of %d jobs not succeeded after a minute", left, tt.jobs)
				}
				time.Sleep(20 * time.Millisecond)
			}
			most, held := stopRounds(), stopHeld()
			if most != tt.wantMost {
				t.Errorf("most rounds in flight at once: %d, want %d", most, tt.wantMost)
			}
			cfg := w.Config()
			if held > cfg.Slots+cfg.Prefetch {
				t.Errorf("held %d jobs at once, more than %d slots and %d ahead", held, cfg.Slots, cfg.Prefetch)
			}
			if n := c.most.Load(); n > int64(cfg.Slots) {
				t.Errorf("%d handlers ran at once on %d slots", n, cfg.Slots)
			}
			var again int
			if err := b.pool.QueryRow(b.ctx, "SELECT count(*) FROM jobs WHERE attempt <> 1 OR fence <> 1").Scan(&again); err != nil {
				t.Fatal(err)
			}
			if again > 0 {
				t.Errorf("%d jobs claimed more than once", again)
			}
		})
	}
}

func TestWorker_IdlePollsClaimOnlyWhenTheQueueHoldsAReadyJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool, counted := b.countedPool(t)
	b.runWorker(t, pool, worker.Config{Slots: 1, PollInterval: 20 * time.Millisecond}, func(w *worker.Worker) {
		w.HandleFunc("unannounced", func(ctx context.Context, j *worker.Job) (any, error) { return nil, nil })
	})
	// Idle, the worker polls every 20ms: each poll asks whether the queue
	// holds a job, and none is there to claim.
	deadline := time.Now().Add(10 * time.Second)
	for counted.count("JobAnyReady") < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("the idle worker asked %d times in 10s whether a job was ready, want at least 10", counted.count("JobAnyReady"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	probes, claims := counted.count("JobAnyReady"), counted.count("JobCompleteAndClaim")
	// The worker claims as it starts and as its session is registered.
	if claims > 2 {
		t.Errorf("%d claims beside %d polls that found no job: an idle poll claims only what it finds", claims, probes)
	}

	// A ready job that no notification announces is found by a poll, and
	// claimed.
	job, err := b.q.JobInsert(b.ctx, db.JobInsertParams{
		Queue: "default", Kind: "unannounced", Payload: []byte(`{}`), MaxAttempts: 1, AnnounceAfterCommit: true,
	})
	if err != nil {
		t.Fatalf("enqueue: %v", err)
	}
	b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	if got := counted.count("JobCompleteAndClaim"); got <= claims {
		t.Errorf("the job ran with %d claims sent in all, as many as before it was stored", got)
	}
}
