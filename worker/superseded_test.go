package worker

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
)

// TestRound_ReportsOnlyTheNewestClaimsOutcomeAcceptedWhenARoundCarriesTwoOfOneJob
// has a round carry two outcomes of one job: that of an attempt whose
// lease expired and whose job was taken back, and that of the attempt
// the worker claimed it for again, as when the first was set aside while
// another transaction held the job's row. The database takes only the
// newest claim's; the older one, refused by the fence, must be reported
// not accepted, for completions and failures alike.
func TestRound_ReportsOnlyTheNewestClaimsOutcomeAcceptedWhenARoundCarriesTwoOfOneJob(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		err   error
		kind  Outcome
		state db.JobState
	}{
		{"completions", nil, OutcomeCompleted, db.JobStateSucceeded},
		{"failures", Permanent(errors.New("boom")), OutcomeFailed, db.JobStateDead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := dbtest.New(t)
			q := db.New(pool)
			w, acks := recordingWorker(t, pool, 0)
			first := insertAndClaim(t, pool, "default", 1, 3)[0]
			id := *first.ID
			// The first claim's lease runs out, and a reclaim takes the job back.
			if _, err := pool.Exec(ctx, `UPDATE jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1`, id); err != nil {
				t.Fatal(err)
			}
			if rows, err := q.JobReclaim(ctx, db.JobReclaimParams{MaxJobs: DefaultReclaimBatch}); err != nil || len(rows) != 1 || rows[0].ID == nil {
				t.Fatalf("reclaim: %v, %v; want the job taken back", rows, err)
			}
			second, err := q.JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
				Queue: "default", ClaimTokens: []pgtype.UUID{{Bytes: uuid.New(), Valid: true}},
				LeaseMs: time.Minute.Milliseconds(), WorkerID: "w",
			})
			if err != nil || len(second) != 1 || second[0].ID == nil || *second[0].ID != id {
				t.Fatalf("claim again: %v, %v; want job %d", second, err, id)
			}

			d := &dispatcher{w: w}
			for _, row := range []db.JobCompleteAndClaimRow{first, second[0]} {
				o := outcome{exec: newExecution(row, "w", time.Now()), result: json.RawMessage(`{}`), err: tc.err}
				if tc.err == nil {
					d.p.done = append(d.p.done, o)
				} else {
					o.result = nil
					d.p.failed = append(d.p.failed, o)
				}
			}
			r := d.newRound(0)
			r.acknowledge(ctx, w)
			if r.err != nil {
				t.Fatal(r.err)
			}
			d.finish(r)

			want := map[int64][]string{id: {string(tc.kind) + " accepted=false", string(tc.kind) + " accepted=true"}}
			if diff := cmp.Diff(want, acks()); diff != "" {
				t.Errorf("reported (-want +got):\n%s", diff)
			}
			if job, err := q.JobGet(ctx, id); err != nil || job.State != tc.state || job.Attempt != 2 {
				t.Errorf("job: %s at attempt %d, %v; want %s at attempt 2", job.State, job.Attempt, err, tc.state)
			}
		})
	}
}
