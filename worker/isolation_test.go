package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
)

// TestRound_ReportsWhatTheDatabaseAnsweredForWhenIsolationEndsOnALostConnection
// acknowledges three jobs in one round: the database refuses the second's
// result, and, once the first's completion has committed on its own,
// loses the connection as it records the third's. The first is reported
// completed at once, not sent again to be rejected as no longer this
// worker's; the rest are sent again, and each job ends once, as its
// handler said.
func TestRound_ReportsWhatTheDatabaseAnsweredForWhenIsolationEndsOnALostConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	// Rules of this database that the worker cannot know of: it refuses a
	// result, and it cuts the connection of the first statement that
	// records the third job's result after the first job's has committed.
	if _, err := pool.Exec(ctx, `
		CREATE SEQUENCE cut_once;
		CREATE FUNCTION refuse_or_cut() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.result ? 'refuse' THEN
				RAISE EXCEPTION 'this database refuses the result of job %', NEW.id USING ERRCODE = '22023';
			END IF;
			IF NEW.result ? 'cut' AND EXISTS (
				SELECT FROM jobs AS c
				WHERE c.result ? 'first' AND c.state = 'succeeded' AND c.xmin <> pg_current_xact_id()::xid
			) AND nextval('cut_once') = 1 THEN
				PERFORM pg_terminate_backend(pg_backend_pid());
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_or_cut BEFORE UPDATE OF result ON jobs
			FOR EACH ROW EXECUTE FUNCTION refuse_or_cut();`); err != nil {
		t.Fatal(err)
	}
	w, acks := recordingWorker(t, pool, 0)
	q := db.New(pool)
	results := []string{`{"first": true}`, `{"refuse": true}`, `{"cut": true}`}
	rows := insertAndClaim(t, pool, "default", len(results), 1)
	d := &dispatcher{w: w}
	var ids []int64
	for i, row := range rows {
		e := newExecution(row, "w", time.Now())
		w.held[e.job.ID] = e
		ids = append(ids, e.job.ID)
		d.p.done = append(d.p.done, outcome{exec: e, result: json.RawMessage(results[i])})
	}

	r := d.newRound(0)
	r.acknowledge(ctx, w)
	if r.err == nil {
		t.Fatal("the first round succeeded, want the connection lost as it recorded the third job")
	}
	d.finish(r)
	if diff := cmp.Diff(map[int64][]string{ids[0]: {"completed accepted=true"}}, acks()); diff != "" {
		t.Errorf("reported after the round that lost its connection (-want +got):\n%s", diff)
	}
	for round := 0; !d.p.empty() && round < 3; round++ {
		r := d.newRound(0)
		r.acknowledge(ctx, w)
		d.finish(r)
		if r.err != nil {
			t.Logf("round %d: %v", round+2, r.err)
		}
	}
	want := map[int64][]string{
		ids[0]: {"completed accepted=true"},
		ids[1]: {"failed accepted=true"},
		ids[2]: {"completed accepted=true"},
	}
	if diff := cmp.Diff(want, acks()); diff != "" {
		t.Errorf("reported in all (-want +got):\n%s", diff)
	}
	for i, state := range []db.JobState{db.JobStateSucceeded, db.JobStateDead, db.JobStateSucceeded} {
		if job, err := q.JobGet(ctx, ids[i]); err != nil || job.State != state {
			t.Errorf("job %d: %s, %v; want %s", ids[i], job.State, err, state)
		}
	}
}

// TestRound_CarriesNoMoreResultsThanOneStatementCanAndLeavesTheRestForTheNext:
// five completions whose results each fit in a statement, but which
// together pass what one carries (1 GiB less 16 MiB, which pgx and
// PostgreSQL carry in one message; 1 MiB here), are not sent in one
// statement, which would fail, and fail again in every round after: a
// round takes as many as one statement carries, and the next takes the
// rest.
func TestRound_CarriesNoMoreResultsThanOneStatementCanAndLeavesTheRestForTheNext(t *testing.T) {
	SetMaxStatementResults(t, 1<<20)
	ctx := context.Background()
	pool := dbtest.New(t)
	w, acks := recordingWorker(t, pool, 0)
	result := bytes.Repeat([]byte("x"), 300<<10)
	result[0], result[len(result)-1] = '"', '"'
	rows := insertAndClaim(t, pool, "default", 5, 1)
	d := &dispatcher{w: w}
	want := map[int64][]string{}
	for _, row := range rows {
		e := newExecution(row, "w", time.Now())
		w.held[e.job.ID] = e
		want[e.job.ID] = []string{"completed accepted=true"}
		d.p.done = append(d.p.done, outcome{exec: e, result: result})
	}
	var carried []int
	for round := 1; !d.p.empty() && round <= 3; round++ {
		r := d.newRound(0)
		carried = append(carried, len(r.batch.done))
		r.acknowledge(ctx, w)
		d.finish(r)
		if r.err != nil {
			t.Errorf("round %d: %v", round, r.err)
		}
	}
	if diff := cmp.Diff([]int{3, 2}, carried); diff != "" {
		t.Errorf("completions carried by each round (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want, acks()); diff != "" {
		t.Errorf("reported (-want +got):\n%s", diff)
	}
	q := db.New(pool)
	for id := range want {
		if job, err := q.JobGet(ctx, id); err != nil || job.State != db.JobStateSucceeded || len(job.Result) != len(result) {
			t.Errorf("job %d: %s with a result of %d bytes, %v; want succeeded with %d", id, job.State, len(job.Result), err, len(result))
		}
	}
}
