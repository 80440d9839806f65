package worker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/faultproxy"
)

// These tests set up, step by step, what a worker's dispatcher, rounds and
// heartbeats do around the release of a job claimed ahead, in the orders
// their goroutines may take: a heartbeat runs beside the rounds, and may
// renew its leases while a release is under way.

// aheadRelease is a worker "w" of one slot, which a handler keeps busy,
// holding one job claimed ahead that has waited PrefetchWait for the slot.
type aheadRelease struct {
	w    *Worker
	d    *dispatcher
	e    *execution
	pool *pgxpool.Pool
	logs *bytes.Buffer
	// acks is what the worker reported to OnAck, in order.
	acks *[]Ack
}

// newAheadRelease makes an aheadRelease on pool, whose worker logs from
// Debug up to its logs. Nothing runs in the background: the test makes
// each step itself.
func newAheadRelease(t *testing.T, pool *pgxpool.Pool) *aheadRelease {
	t.Helper()
	logs := &bytes.Buffer{}
	queue := "ahead-" + uuid.NewString()
	// The test's steps run one after another: OnAck needs no lock.
	acks := &[]Ack{}
	w, err := New(pool, Config{ID: "w", Queue: queue, Slots: 1,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OnAck:  func(a Ack) { *acks = append(*acks, a) }})
	if err != nil {
		t.Fatal(err)
	}
	e := newExecution(insertAndClaim(t, pool, queue, 1, 3)[0], "w", time.Now())
	e.claimedAt = time.Now().Add(-w.cfg.PrefetchWait)
	w.mu.Lock()
	w.held[e.job.ID] = e
	w.ahead = append(w.ahead, e)
	w.slotsBusy = 1 // the handler that keeps the slot busy
	w.mu.Unlock()
	return &aheadRelease{w: w, d: &dispatcher{w: w}, e: e, pool: pool, logs: logs, acks: acks}
}

// releaseStale has the dispatcher find the job waited too long, as its
// timer would, to be released by the next round.
func (a *aheadRelease) releaseStale(t *testing.T) {
	t.Helper()
	a.d.releaseStale()
	if len(a.d.p.toRelease) != 1 || a.d.p.toRelease[0] != a.e {
		t.Fatalf("to release after releaseStale: %d jobs, want the job claimed ahead", len(a.d.p.toRelease))
	}
}

// round sends a round that claims claim jobs, and returns it without
// finishing it: as it is when it comes back to the dispatcher.
func (a *aheadRelease) round(claim int) *round {
	r := a.d.newRound(claim)
	r.acknowledge(context.Background(), a.w)
	return r
}

// answeredRound sends a round as round does, and fails the test unless the
// database answered it.
func (a *aheadRelease) answeredRound(t *testing.T, claim int) *round {
	t.Helper()
	r := a.round(claim)
	if r.err != nil {
		t.Fatal(r.err)
	}
	return r
}

// heartbeat renews the worker's leases, as its heartbeater does on a tick.
func (a *aheadRelease) heartbeat() { heartbeater{w: a.w}.heartbeat(context.Background()) }

// releaseWithAHeartbeatBetween releases the job, found to have waited too
// long, in a round whose answer a heartbeat beats back to the dispatcher.
func (a *aheadRelease) releaseWithAHeartbeatBetween(t *testing.T) {
	t.Helper()
	a.releaseStale(t)
	r := a.answeredRound(t, 0)
	a.heartbeat()
	a.d.finish(r)
}

// warnings returns the warnings logged of the job.
func (a *aheadRelease) warnings() []string {
	var got []string
	for line := range strings.Lines(a.logs.String()) {
		if strings.Contains(line, "level=WARN") && strings.Contains(line, fmt.Sprintf(" job=%d ", a.e.job.ID)) {
			got = append(got, strings.TrimSpace(line))
		}
	}
	return got
}

// job returns the job as the database holds it.
func (a *aheadRelease) job(t *testing.T) db.Job {
	t.Helper()
	job, err := db.New(a.pool).JobGet(context.Background(), a.e.job.ID)
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// wantReleasedQuietly fails the test unless the job is available again
// with its attempt given back, and the worker warned of nothing about it,
// nor cancelled it for a lease lost: it gave the job up itself.
func (a *aheadRelease) wantReleasedQuietly(t *testing.T) {
	t.Helper()
	if job := a.job(t); job.State != db.JobStateAvailable || job.Attempt != 0 {
		t.Errorf("job: %s at attempt %d, want available at attempt 0, released", job.State, job.Attempt)
	}
	if got := a.warnings(); len(got) > 0 {
		t.Errorf("warned of a job the worker released itself:\n%s\nlog:\n%s", strings.Join(got, "\n"), a.logs)
	}
	if cause := context.Cause(a.e.ctx); errors.Is(cause, ErrLeaseLost) {
		t.Errorf("the job released was cancelled with %v", cause)
	}
}

func TestLeaseLost_NeverWarnedOfForAJobClaimedAheadTheWorkerReleasedItself(t *testing.T) {
	t.Parallel()
	t.Run("a heartbeat between the release and its round's return", func(t *testing.T) {
		t.Parallel()
		a := newAheadRelease(t, dbtest.New(t))
		a.releaseWithAHeartbeatBetween(t)
		a.wantReleasedQuietly(t)
	})

	t.Run("a claim of the job again, by a round that returns first", func(t *testing.T) {
		t.Parallel()
		a := newAheadRelease(t, dbtest.New(t))
		a.w.session.leaseOnly.Store(true)
		a.releaseStale(t)
		released := a.answeredRound(t, 0)
		// A round sent beside the first finds the job available again.
		again := a.answeredRound(t, 1)
		if len(again.claimed) != 1 || *again.claimed[0].ID != a.e.job.ID {
			t.Fatalf("claim beside the release: %d jobs, want the job released", len(again.claimed))
		}
		a.d.finish(again)
		a.heartbeat()
		a.d.finish(released)
		if got := a.warnings(); len(got) > 0 {
			t.Errorf("warned of a job the worker released itself and claimed again:\n%s\nlog:\n%s", strings.Join(got, "\n"), a.logs)
		}
		if cause := context.Cause(a.e.ctx); errors.Is(cause, ErrLeaseLost) {
			t.Errorf("the attempt released was cancelled with %v", cause)
		}
		a.w.mu.Lock()
		renewed := a.w.held[a.e.job.ID]
		a.w.mu.Unlock()
		if renewed == nil || renewed == a.e || renewed.lost {
			t.Errorf("the worker does not hold the job's new claim")
		}
	})

	t.Run("a heartbeat after a release whose answer was lost, before it is sent again", func(t *testing.T) {
		t.Parallel()
		a := releasedWithItsAnswerLost(t)
		a.heartbeat()
		a.d.finish(a.answeredRound(t, 0))
		a.wantReleasedQuietly(t)
	})
}

// releasedWithItsAnswerLost makes an aheadRelease whose worker reaches the
// database through a proxy, releases the job in a round whose answer the
// proxy cuts once the release has committed, and lets the dispatcher
// find the round unanswered.
func releasedWithItsAnswerLost(t *testing.T) *aheadRelease {
	t.Helper()
	p, through, err := faultproxy.StartFor(dbtest.NewURL(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	a := newAheadRelease(t, dbtest.Connect(t, through))
	a.releaseStale(t)
	p.CutAfterCommit(faultproxy.CommitCut{Statement: "-- name: JobReleaseMany"})
	lost := a.round(0)
	if lost.err == nil || p.Armed() != 0 {
		t.Fatalf("release: %v, %d cuts still armed; want its answer lost", lost.err, p.Armed())
	}
	a.d.finish(lost)
	return a
}

// takeBack has the job's lease run out and a reclaim take the job back,
// then another worker claim it: the lease is lost, for real.
func (a *aheadRelease) takeBack(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	q := db.New(a.pool)
	if _, err := a.pool.Exec(ctx, `UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, a.e.job.ID); err != nil {
		t.Fatal(err)
	}
	if rows, err := q.JobReclaim(ctx, db.JobReclaimParams{MaxJobs: DefaultReclaimBatch}); err != nil || len(rows) != 1 || rows[0].ID == nil {
		t.Fatalf("reclaim: %v, %v; want the job taken back", rows, err)
	}
	rows, err := q.JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
		Queue: a.w.cfg.Queue, ClaimTokens: []pgtype.UUID{{Bytes: uuid.New(), Valid: true}},
		LeaseMs: time.Minute.Milliseconds(), WorkerID: "other",
	})
	if err != nil || len(rows) != 1 || rows[0].ID == nil || *rows[0].ID != a.e.job.ID {
		t.Fatalf("claim by another worker: %v, %v; want the job", rows, err)
	}
}

// wantWarnedOnce fails the test unless the worker warned once that the
// job's lease is no longer its own, and left the job to the worker that
// claimed it.
func (a *aheadRelease) wantWarnedOnce(t *testing.T) {
	t.Helper()
	if got := a.warnings(); len(got) != 1 {
		t.Errorf("%d warnings of a lease another worker took, want one:\n%s", len(got), a.logs)
	}
	if job := a.job(t); job.State != db.JobStateRunning || deref(job.LeasedBy) != "other" {
		t.Errorf("job: %s, leased by %q; want running under the other worker's lease", job.State, deref(job.LeasedBy))
	}
}

func TestLeaseLost_WarnedOfOnceWhenAnotherWorkerTookTheJob(t *testing.T) {
	t.Parallel()
	t.Run("a job claimed ahead, taken back before its release", func(t *testing.T) {
		t.Parallel()
		a := newAheadRelease(t, dbtest.New(t))
		a.takeBack(t)
		a.releaseWithAHeartbeatBetween(t)
		a.wantWarnedOnce(t)
	})

	t.Run("a job claimed ahead, taken back and found lost by a heartbeat, then released", func(t *testing.T) {
		t.Parallel()
		a := newAheadRelease(t, dbtest.New(t))
		a.takeBack(t)
		a.heartbeat()
		a.releaseStale(t)
		a.d.finish(a.answeredRound(t, 0))
		a.wantWarnedOnce(t)
	})

	t.Run("a job started, taken back while its handler runs", func(t *testing.T) {
		t.Parallel()
		a := newAheadRelease(t, dbtest.New(t))
		if next := a.w.nextForSlot(nil); next != a.e {
			t.Fatal("the slot did not start the job claimed ahead")
		}
		a.takeBack(t)
		a.heartbeat()
		a.wantWarnedOnce(t)
		if cause := context.Cause(a.e.ctx); !errors.Is(cause, ErrLeaseLost) {
			t.Errorf("the handler's context ended with %v, want %v", cause, ErrLeaseLost)
		}
		if got := a.warnings(); len(got) == 1 && !strings.Contains(got[0], "lease lost; cancelling handler") {
			t.Errorf("warned %q, want that the lease was lost and the handler cancelled", got[0])
		}
	})
}

// wantReported fails the test unless OnAck was told of job id, and of
// nothing else, once, as released, accepted or not, in doubt or not, for
// cause.
func (a *aheadRelease) wantReported(t *testing.T, id int64, accepted, inDoubt bool, cause error) {
	t.Helper()
	want := fmt.Sprintf("job %d released accepted=%t in_doubt=%t err=%v", id, accepted, inDoubt, cause)
	var got []string
	for _, ack := range *a.acks {
		got = append(got, fmt.Sprintf("job %d %s accepted=%t in_doubt=%t err=%v", ack.Job.ID, ack.Outcome, ack.Accepted, ack.InDoubt, ack.Err))
	}
	if len(got) != 1 || got[0] != want {
		t.Errorf("reported to OnAck:\n%s\nwant %s", strings.Join(got, "\n"), want)
	}
}

func TestOnAck_ToldOfEachReleaseOfAJobClaimedAhead(t *testing.T) {
	t.Parallel()
	t.Run("released after it waited too long for a slot", func(t *testing.T) {
		t.Parallel()
		a := newAheadRelease(t, dbtest.New(t))
		a.releaseStale(t)
		a.d.finish(a.answeredRound(t, 0))
		a.wantReported(t, a.e.job.ID, true, false, nil)
	})

	t.Run("taken back by another worker before its release", func(t *testing.T) {
		t.Parallel()
		a := newAheadRelease(t, dbtest.New(t))
		a.takeBack(t)
		a.releaseStale(t)
		a.d.finish(a.answeredRound(t, 0))
		a.wantReported(t, a.e.job.ID, false, false, nil)
	})

	t.Run("released once its first release's answer was lost", func(t *testing.T) {
		t.Parallel()
		a := releasedWithItsAnswerLost(t)
		if len(*a.acks) > 0 {
			t.Errorf("reported before the release was answered: %v", *a.acks)
		}
		a.d.finish(a.answeredRound(t, 0))
		a.wantReported(t, a.e.job.ID, false, true, nil)
	})

	t.Run("claimed as the worker began to stop", func(t *testing.T) {
		t.Parallel()
		a := newAheadRelease(t, dbtest.New(t))
		job, err := db.New(a.pool).JobInsert(context.Background(), db.JobInsertParams{Queue: a.w.cfg.Queue, Kind: "noop", Payload: []byte(`{}`), MaxAttempts: 3})
		if err != nil {
			t.Fatal(err)
		}
		a.w.session.leaseOnly.Store(true)
		a.w.mu.Lock()
		a.w.stopping = true
		a.w.mu.Unlock()
		claimed := a.answeredRound(t, 1)
		if len(claimed.claimed) != 1 || *claimed.claimed[0].ID != job.ID {
			t.Fatalf("claim as the worker stops: %d jobs, want the job inserted", len(claimed.claimed))
		}
		a.d.finish(claimed)
		a.d.finish(a.answeredRound(t, 0))
		a.wantReported(t, job.ID, true, false, ErrShutdown)
	})
}
