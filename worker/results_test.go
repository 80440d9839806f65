package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/jsonb"
	"github.com/relayq/relay/worker"
)

// These tests specify what the worker does with a handler's result that
// PostgreSQL cannot store: that job fails, permanently and clearly, and no
// other job, nor the worker, notices.

func TestWorker_UnstorableResultFailsOnlyItsJobAndTheWorkerKeepsClaiming(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Results json.Marshal accepts and jsonb refuses.
	poison := map[string]any{
		"lone high surrogate":   json.RawMessage(`{"s": "\ud800"}`),
		"lone low surrogate":    json.RawMessage(`["\udc00"]`),
		"number beyond numeric": json.Number("1e200000"),
		"NUL escape":            json.RawMessage(`{"k": "a\u0000b"}`),
		"invalid UTF-8":         json.RawMessage("\"\xff\""),
	}
	var poisonJobs []db.Job
	names := map[int64]string{}
	for name := range poison {
		job := b.enqueue(t, "poison", `{"name": "`+name+`"}`, 5)
		poisonJobs = append(poisonJobs, job)
		names[job.ID] = name
	}
	var healthy []db.Job
	for range 8 {
		healthy = append(healthy, b.enqueue(t, "healthy", `{}`, 1))
	}
	b.startWorker(t, worker.Config{Slots: 4}, func(w *worker.Worker) {
		w.HandleFunc("poison", func(ctx context.Context, j *worker.Job) (any, error) {
			var p struct{ Name string }
			if err := json.Unmarshal(j.Payload, &p); err != nil {
				return nil, worker.Permanent(err)
			}
			return poison[p.Name], nil
		})
		w.HandleFunc("healthy", func(ctx context.Context, j *worker.Job) (any, error) {
			return map[string]int64{"job": j.ID}, nil
		})
	})

	for _, job := range poisonJobs {
		got := b.waitForState(t, job.ID, db.JobStateDead, 10*time.Second)
		if got.Attempt != 1 || !strings.HasPrefix(deref(got.LastError), "permanent: result is not storable as jsonb: contains ") {
			t.Errorf("%s: dead after attempt %d with %q; want dead after attempt 1, saying the result is not storable as jsonb",
				names[job.ID], got.Attempt, deref(got.LastError))
		}
	}
	for _, job := range healthy {
		b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	}
	// The worker still claims.
	late := b.enqueue(t, "healthy", `{}`, 1)
	b.waitForState(t, late.ID, db.JobStateSucceeded, 10*time.Second)
}

func TestWorker_ResultWithTheTextBackslashU0000IsStored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	job := b.enqueue(t, "text", `{}`, 1)
	b.startWorker(t, worker.Config{Slots: 1}, func(w *worker.Worker) {
		w.HandleFunc("text", func(ctx context.Context, j *worker.Job) (any, error) {
			// Six characters, a backslash first: JSON "\\u0000", which jsonb stores.
			return map[string]string{"path": `C:\u0000`}, nil
		})
	})
	got := b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	var stored map[string]string
	if err := json.Unmarshal(got.Result, &stored); err != nil || stored["path"] != `C:\u0000` {
		t.Errorf("stored result %s (%v), want the path C:\\u0000 as written", got.Result, err)
	}
}

func TestWorker_ResultLargerThanMaxResultBytesFailsItsJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	small := b.enqueue(t, "sized", `{"n": 100}`, 3)
	large := b.enqueue(t, "sized", `{"n": 5000}`, 3)
	b.startWorker(t, worker.Config{Slots: 2, MaxResultBytes: 1000}, func(w *worker.Worker) {
		w.HandleFunc("sized", func(ctx context.Context, j *worker.Job) (any, error) {
			var p struct{ N int }
			if err := json.Unmarshal(j.Payload, &p); err != nil {
				return nil, worker.Permanent(err)
			}
			return strings.Repeat("x", p.N), nil
		})
	})
	b.waitForState(t, small.ID, db.JobStateSucceeded, 10*time.Second)
	got := b.waitForState(t, large.ID, db.JobStateDead, 10*time.Second)
	if want := "permanent: result is 5002 bytes encoded, more than the 1000 allowed"; !strings.HasPrefix(deref(got.LastError), want) {
		t.Errorf("large result: %q, want %q...", deref(got.LastError), want)
	}
}

// TestWorker_AResultNestedDeeperThanAPayloadFailsItsJob: a result may nest
// as deep as a payload, client.MaxPayloadDepth, and no deeper, so that the
// job's view, which holds it a level down, stays within what
// encoding/json reads: a job whose result nests deeper fails
// permanently. One as deep as a payload may be is stored.
func TestWorker_AResultNestedDeeperThanAPayloadFailsItsJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	deepest := b.enqueue(t, "nested", fmt.Sprintf(`{"depth": %d}`, client.MaxPayloadDepth), 3)
	tooDeep := b.enqueue(t, "nested", fmt.Sprintf(`{"depth": %d}`, client.MaxPayloadDepth+1), 3)
	b.startWorker(t, worker.Config{Slots: 2}, func(w *worker.Worker) {
		w.HandleFunc("nested", func(ctx context.Context, j *worker.Job) (any, error) {
			var p struct{ Depth int }
			if err := json.Unmarshal(j.Payload, &p); err != nil {
				return nil, worker.Permanent(err)
			}
			return json.RawMessage(strings.Repeat("[", p.Depth) + strings.Repeat("]", p.Depth)), nil
		})
	})
	b.waitForState(t, deepest.ID, db.JobStateSucceeded, 10*time.Second)
	got := b.waitForState(t, tooDeep.ID, db.JobStateDead, 10*time.Second)
	want := fmt.Sprintf("permanent: result nests arrays and objects %d deep, more than the %d allowed", client.MaxPayloadDepth+1, client.MaxPayloadDepth)
	if got.Attempt != 1 || !strings.HasPrefix(deref(got.LastError), want) {
		t.Errorf("dead after attempt %d with %q, want after attempt 1 with %q...", got.Attempt, deref(got.LastError), want)
	}
}

// TestWorker_APayloadNestedDeeperThanEncodingJSONReadsReachesItsHandler: a
// payload nested deeper than encoding/json reads, which no client stores
// but SQL can, and jsonb holds, is claimed with the job claimed beside it
// and reaches its handler as PostgreSQL returns it.
func TestWorker_APayloadNestedDeeperThanEncodingJSONReadsReachesItsHandler(t *testing.T) {
	t.Parallel()
	b := setup(t)
	depth := jsonb.MaxDecodeDepth + 50
	deep := strings.Repeat("[", depth) + strings.Repeat("]", depth)
	deepJob := b.enqueue(t, "echo", `{}`, 1)
	if _, err := b.pool.Exec(b.ctx, `UPDATE jobs SET payload = $2::text::jsonb WHERE id = $1`, deepJob.ID, deep); err != nil {
		t.Fatalf("write the payload: %v", err)
	}
	beside := b.enqueue(t, "echo", `[]`, 1)
	b.startWorker(t, worker.Config{Slots: 2}, func(w *worker.Worker) {
		w.HandleFunc("echo", func(ctx context.Context, j *worker.Job) (any, error) {
			return map[string]any{"bytes": len(j.Payload), "as_stored": string(j.Payload) == deep}, nil
		})
	})
	for id, want := range map[int64]string{
		deepJob.ID: fmt.Sprintf(`{"bytes": %d, "as_stored": true}`, len(deep)),
		beside.ID:  `{"bytes": 2, "as_stored": false}`,
	} {
		got := b.waitForState(t, id, db.JobStateSucceeded, 10*time.Second)
		if string(got.Result) != want {
			t.Errorf("job %d: result %s, want %s", id, got.Result, want)
		}
	}
}

func TestWorker_ResultTheDatabaseRefusesFailsOnlyItsJobAndSparesTheBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// A rule of this database that the worker cannot know of: it refuses
	// some results, as it would refuse a value it cannot represent.
	if _, err := b.pool.Exec(b.ctx, `
		CREATE FUNCTION refuse_some_results() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.result ? 'refuse' THEN
				RAISE EXCEPTION 'this database refuses the result of job %', NEW.id USING ERRCODE = '22023';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse_some_results BEFORE UPDATE OF result ON jobs
			FOR EACH ROW EXECUTE FUNCTION refuse_some_results();`); err != nil {
		t.Fatal(err)
	}
	refused := b.enqueue(t, "answer", `{"refuse": true}`, 5)
	var healthy []db.Job
	for range 11 {
		healthy = append(healthy, b.enqueue(t, "answer", `{}`, 1))
	}
	var acks sync.Map
	b.startWorker(t, worker.Config{Slots: 4, OnAck: func(a worker.Ack) {
		acks.Store(a.Job.ID, a)
	}}, func(w *worker.Worker) {
		w.HandleFunc("answer", func(ctx context.Context, j *worker.Job) (any, error) {
			// Each job answers with its own payload.
			return j.Payload, nil
		})
	})
	got := b.waitForState(t, refused.ID, db.JobStateDead, 10*time.Second)
	want := "permanent: result refused by the database: this database refuses the result of job " + strconv.FormatInt(refused.ID, 10) + " (SQLSTATE 22023)"
	if got.Attempt != 1 || deref(got.LastError) != want {
		t.Errorf("refused job: dead after attempt %d with %q; want attempt 1 and %q", got.Attempt, deref(got.LastError), want)
	}
	for _, job := range healthy {
		b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
	}
	late := b.enqueue(t, "answer", `{}`, 1)
	b.waitForState(t, late.ID, db.JobStateSucceeded, 10*time.Second)
	if a, ok := acks.Load(refused.ID); !ok || a.(worker.Ack).Outcome != worker.OutcomeFailed || !a.(worker.Ack).Accepted {
		t.Errorf("the refused job's acknowledgement was reported as %+v, want an accepted failure", a)
	}
}

// panickingResult is a handler's result whose own encoding panics.
type panickingResult struct{}

func (panickingResult) MarshalJSON() ([]byte, error) { panic("boom in MarshalJSON") }

func TestWorker_AResultWhoseMarshalerPanicsFailsItsJobAndTheWorkerGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs syncBuffer
	// Attempts to spare: the job is dead after its first, since the same
	// result would panic again.
	bad := b.enqueue(t, "bad", `{}`, 5)
	b.startWorker(t, worker.Config{
		Slots:  1,
		Logger: logs.logger(),
	}, func(w *worker.Worker) {
		w.HandleFunc("bad", func(ctx context.Context, j *worker.Job) (any, error) { return panickingResult{}, nil })
		w.HandleFunc("fine", func(ctx context.Context, j *worker.Job) (any, error) { return "ok", nil })
	})

	got := b.waitForState(t, bad.ID, db.JobStateDead, 10*time.Second)
	if want := "permanent: encode result: result marshaler panicked: boom in MarshalJSON"; got.Attempt != 1 ||
		!strings.HasPrefix(deref(got.LastError), want) || !strings.Contains(deref(got.LastError), "results_test.go") {
		t.Errorf("dead after attempt %d with %q; want dead after attempt 1 with %q... and a stack", got.Attempt, deref(got.LastError), want)
	}
	logs.waitForLog(t, 5*time.Second, "job failed", "boom in MarshalJSON")
	// The process, and the worker's only slot, go on.
	fine := b.enqueue(t, "fine", `{}`, 1)
	b.waitForState(t, fine.ID, db.JobStateSucceeded, 10*time.Second)
}

// TestWorker_AResultLargerThanAStatementCarriesFailsItsJobWithoutALimit: with
// no limit of its own (a negative Config.MaxResultBytes), a worker still
// cannot send a result larger than one statement carries (1 GiB less 16
// MiB, which pgx and PostgreSQL refuse to carry in one message; 1 MiB
// here): its job fails permanently at its first attempt, where each round
// carrying it failed, holding up the completions and claims of the others
// until its lease ran out and it ran again.
func TestWorker_AResultLargerThanAStatementCarriesFailsItsJobWithoutALimit(t *testing.T) {
	worker.SetMaxStatementResults(t, 1<<20)
	b := setup(t)
	huge := b.enqueue(t, "huge", `{}`, 5)
	b.startWorker(t, worker.Config{Slots: 2, MaxResultBytes: -1}, func(w *worker.Worker) {
		w.HandleFunc("huge", func(ctx context.Context, j *worker.Job) (any, error) {
			s := bytes.Repeat([]byte("x"), 1<<20+2)
			s[0], s[len(s)-1] = '"', '"'
			return json.RawMessage(s), nil
		})
		w.HandleFunc("small", func(ctx context.Context, j *worker.Job) (any, error) { return "ok", nil })
	})
	got := b.waitFor(t, huge.ID, 10*time.Second, "finished", func(j db.Job) bool { return j.FinishedAt != nil })
	want := fmt.Sprintf("permanent: result is %d bytes encoded, more than the %d one statement can carry", 1<<20+2, 1<<20)
	if got.State != db.JobStateDead || got.Attempt != 1 || !strings.HasPrefix(deref(got.LastError), want) {
		t.Errorf("%s after attempt %d with %q; want dead after attempt 1 with %q", got.State, got.Attempt, deref(got.LastError), want)
	}
	small := b.enqueue(t, "small", `{}`, 1)
	b.waitForState(t, small.ID, db.JobStateSucceeded, 10*time.Second)
}

// caseless is a map key that encodes as its text in lower case, so that
// two keys of one map can encode as the same object key.
type caseless struct{ text string }

func (c caseless) MarshalText() ([]byte, error) { return []byte(strings.ToLower(c.text)), nil }

// TestWorker_AResultWithAKeyTwiceInOneObjectFailsItsJob: jsonb keeps only
// the last value of a key given twice in one object, so a result that
// holds one, which json.Marshal writes as it is given (a json.RawMessage,
// a MarshalJSON of the handler's, map keys whose texts coincide), would
// lose the others without a word, as a payload would, which the client
// refuses for that reason. Its job fails permanently, naming the key and
// where it comes a second time in the result as encoded (compact); the
// jobs beside it, whose results hold the same key in different objects,
// succeed.
func TestWorker_AResultWithAKeyTwiceInOneObjectFailsItsJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lossy := map[string]struct {
		result any
		want   string
	}{
		"raw": {json.RawMessage(`{"amount": 100, "amount": 1}`),
			`permanent: result contains the key "amount" twice in one object, at byte 14: jsonb would keep only the last value`},
		"nested and escaped": {json.RawMessage(`{"lines": [{"sku": "x"}, {"sku": "y", "\u0073ku": "z"}]}`),
			`permanent: result contains the key "sku" twice in one object, at byte 33: jsonb would keep only the last value`},
		"map keys that encode alike": {map[caseless]int{{"Total"}: 1, {"total"}: 2},
			`permanent: result contains the key "total" twice in one object, at byte 11: jsonb would keep only the last value`},
	}
	names := map[int64]string{}
	for name := range lossy {
		names[b.enqueue(t, "lossy", `{"name": "`+name+`"}`, 5).ID] = name
	}
	var healthy []db.Job
	for range 6 {
		healthy = append(healthy, b.enqueue(t, "healthy", `{}`, 1))
	}
	b.startWorker(t, worker.Config{Slots: 4}, func(w *worker.Worker) {
		w.HandleFunc("lossy", func(ctx context.Context, j *worker.Job) (any, error) {
			var p struct{ Name string }
			if err := json.Unmarshal(j.Payload, &p); err != nil {
				return nil, worker.Permanent(err)
			}
			return lossy[p.Name].result, nil
		})
		w.HandleFunc("healthy", func(ctx context.Context, j *worker.Job) (any, error) {
			return json.RawMessage(`{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}`), nil
		})
	})
	for id, name := range names {
		got := b.waitForState(t, id, db.JobStateDead, 10*time.Second)
		if want := lossy[name].want; got.Attempt != 1 || deref(got.LastError) != want || got.Result != nil {
			t.Errorf("%s: dead after attempt %d with %q and result %s; want dead after attempt 1 with %q and no result",
				name, got.Attempt, deref(got.LastError), got.Result, want)
		}
	}
	for _, job := range healthy {
		got := b.waitForState(t, job.ID, db.JobStateSucceeded, 10*time.Second)
		if want := `{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}`; string(got.Result) != want {
			t.Errorf("job %d: result %s, want %s", job.ID, got.Result, want)
		}
	}
}
