package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/jsonb"
)

// beyondEncodingJSON is a depth encoding/json refuses and PostgreSQL's
// jsonb stores: with the default max_stack_depth (2MB), PostgreSQL 15
// parses arrays nested some 14,500 deep, and objects some 13,000.
const beyondEncodingJSON = jsonb.MaxDecodeDepth + 50

// deepArray is a string in arrays nested depth deep, which PostgreSQL
// renders as it is written: it holds no space for jsonb's output to add.
func deepArray(depth int) string {
	return strings.Repeat("[", depth) + `"deep"` + strings.Repeat("]", depth)
}

// TestJobView_ShowsStoredJSONNestedDeeperThanEncodingJSONReads: a job whose
// result, payload or error history nests deeper than encoding/json reads,
// as a result stored by a build before the worker refused one, or a row
// written by SQL, is answered 200 by every route that answers with a job,
// with the document as PostgreSQL returns it, and the rest of the view as
// for any job.
func TestJobView_ShowsStoredJSONNestedDeeperThanEncodingJSONReads(t *testing.T) {
	t.Parallel()
	deep := deepArray(beyondEncodingJSON)
	tests := []struct {
		name string
		// field is the column, and the field of the view, that holds deep.
		field string
		// store makes the job whose field holds deep, and returns the
		// request that answers with it.
		store func(t *testing.T, e *testEnv) (id int64, method, path, body string, headers []string)
	}{
		{
			name:  "GET, with the result stored by the worker's statement",
			field: "result",
			store: func(t *testing.T, e *testEnv) (int64, string, string, string, []string) {
				id := e.enqueue(t, `{"kind":"a","queue":"q"}`).ID
				completeWith(t, e, id, deep)
				return id, "GET", fmt.Sprintf("/v1/jobs/%d", id), "", nil
			},
		},
		{
			name:  "an idempotent replay, with the result of the job holding the key",
			field: "result",
			store: func(t *testing.T, e *testEnv) (int64, string, string, string, []string) {
				rec := e.do(t, "POST", "/v1/jobs", `{"kind":"a","queue":"q"}`, "Idempotency-Key", "k")
				wantStatus(t, rec, http.StatusCreated)
				id := decode[JobView](t, rec).ID
				completeWith(t, e, id, deep)
				return id, "POST", "/v1/jobs", `{"kind":"a","queue":"q"}`, []string{"Idempotency-Key", "k"}
			},
		},
		{
			name:  "a cancel, with the payload written by SQL",
			field: "payload",
			store: func(t *testing.T, e *testEnv) (int64, string, string, string, []string) {
				id := e.enqueue(t, `{"kind":"a"}`).ID
				setColumn(t, e, id, "payload", deep)
				return id, "POST", fmt.Sprintf("/v1/jobs/%d/cancel", id), "", nil
			},
		},
		{
			name:  "a retry, with an entry of the error history written by SQL",
			field: "errors",
			store: func(t *testing.T, e *testEnv) (int64, string, string, string, []string) {
				id := e.enqueue(t, `{"kind":"a","queue":"q"}`).ID
				e.kill(t, "q", id)
				setColumn(t, e, id, "errors", "["+deep+"]")
				return id, "POST", fmt.Sprintf("/v1/jobs/%d/retry", id), "", nil
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			id, method, path, body, headers := tt.store(t, e)
			var stored string
			if err := e.pool.QueryRow(context.Background(),
				fmt.Sprintf("SELECT %s::text FROM jobs WHERE id = $1", tt.field), id).Scan(&stored); err != nil {
				t.Fatalf("read the stored %s: %v", tt.field, err)
			}
			if !strings.Contains(stored, deep) {
				t.Fatalf("stored %s is not the document written (%d bytes, want it to hold %d)", tt.field, len(stored), len(deep))
			}

			rec := e.do(t, method, path, body, headers...)
			wantStatus(t, rec, http.StatusOK)
			field := `"` + tt.field + `":` + stored
			if !strings.Contains(rec.Body.String(), field) {
				t.Fatalf("answer does not hold the %s as stored: %.200s...", tt.field, rec.Body)
			}
			// Without the deep document, the view reads as any other.
			rec.Body = bytes.NewBufferString(strings.Replace(rec.Body.String(), field, `"`+tt.field+`":null`, 1))
			view := decode[JobView](t, rec)
			if view.ID != id || view.ErrorsOmitted != 0 {
				t.Errorf("view of job %d shows id %d, errors_omitted %d (error_count %d); want errors_omitted 0: the history holds every error",
					id, view.ID, view.ErrorsOmitted, view.ErrorCount)
			}
		})
	}
}

// completeWith claims the job with id, the only ready job of its queue,
// and completes it with result through the statement a worker uses.
func completeWith(t *testing.T, e *testEnv, id int64, result string) {
	t.Helper()
	token := e.claimOne(t, id, time.Minute)
	done, err := e.q.JobCompleteMany(context.Background(), db.JobCompleteManyParams{
		IDs: []int64{id}, Tokens: []pgtype.UUID{token}, Results: [][]byte{[]byte(result)}, LockWaitMs: 1000,
	})
	if err != nil || len(done) != 1 {
		t.Fatalf("complete job %d: %v (completed %v)", id, err, done)
	}
}

// setColumn writes doc into the jsonb column of the job with id, as SQL
// run by hand would.
func setColumn(t *testing.T, e *testEnv, id int64, column, doc string) {
	t.Helper()
	if _, err := e.pool.Exec(context.Background(),
		fmt.Sprintf("UPDATE jobs SET %s = $2::text::jsonb WHERE id = $1", column), id, doc); err != nil {
		t.Fatalf("write the %s of job %d: %v", column, id, err)
	}
}

// TestGetJob_AnswersAJobAsJSONMarshalWritesIt: the view of an ordinary job
// is written byte for byte as json.Marshal writes a JobView, as writeJSON
// always wrote it: its documents compact, with <, >, &, U+2028 and U+2029
// escaped, whatever PostgreSQL's rendering.
func TestGetJob_AnswersAJobAsJSONMarshalWritesIt(t *testing.T) {
	t.Parallel()
	e := setup(t)
	payload := `{"html": "<a href='x'>&amp;</a>", "seps": "\u2028 \u2029", "escapes": "\"\\/\b\f\n\r\t\u0001\u007f",` +
		` "caf\u00e9 é": [1.50, -0.0, 1e3, 12345678901234567890], "nested": [[{}], [], {"k": null}], "t": true}`
	job := e.enqueue(t, `{"kind":"a","queue":"q","payload":`+payload+`}`)
	failLeased(t, e.q, job.ID, e.claimOne(t, job.ID, time.Minute), false)
	completeWith(t, e, job.ID, `{"out": ["<done>", "\u2028", {"n": 2.50}]}`)
	stored, err := e.q.JobGet(context.Background(), job.ID)
	if err != nil {
		t.Fatal(err)
	}
	want, err := json.Marshal(NewJobView(stored))
	if err != nil {
		t.Fatal(err)
	}

	rec := e.do(t, "GET", fmt.Sprintf("/v1/jobs/%d", job.ID), "")
	wantStatus(t, rec, http.StatusOK)
	if got := rec.Body.String(); got != string(want)+"\n" {
		t.Errorf("answer\n%s\nwant json.Marshal's\n%s", got, want)
	}
}

// TestWriteJSON_WritesAJobViewWhoseDocumentsNestDeeperThanEncodingJSONReads:
// a view whose payload, result and error history nest deeper than
// encoding/json reads is answered 200, each document written as
// json.Marshal writes a shallower one.
func TestWriteJSON_WritesAJobViewWhoseDocumentsNestDeeperThanEncodingJSONReads(t *testing.T) {
	t.Parallel()
	n := beyondEncodingJSON / 2
	// As PostgreSQL renders it, and as json.Marshal writes it.
	stored := strings.Repeat(`{"a": [`, n) + `"<&>"` + strings.Repeat(`]}`, n)
	written := strings.Repeat(`{"a":[`, n) + `"\u003c\u0026\u003e"` + strings.Repeat(`]}`, n)
	view := NewJobView(db.Job{
		ID: 7, Queue: "q", Kind: "k", State: db.JobStateSucceeded, ErrorCount: 3,
		Payload: json.RawMessage(stored), Errors: json.RawMessage("[" + stored + ", " + stored + "]"), Result: json.RawMessage(stored),
	})
	rec := httptest.NewRecorder()
	writeJSON(rec, http.StatusOK, view)
	wantStatus(t, rec, http.StatusOK)

	body := rec.Body.String()
	for _, field := range []string{`"payload":` + written + `,`, `"errors":[` + written + `,` + written + `],`, `"result":` + written + "}\n"} {
		if !strings.Contains(body, field) {
			t.Errorf("answer does not hold %.40s...%.40s", field, field[len(field)-40:])
		}
	}
	// Without the deep documents, the view is as json.Marshal writes it.
	view.Payload, view.Errors, view.Result = json.RawMessage("1"), json.RawMessage("[2,3]"), json.RawMessage("4")
	want, err := json.Marshal(view)
	if err != nil {
		t.Fatal(err)
	}
	body = strings.Replace(body, `"payload":`+written, `"payload":1`, 1)
	body = strings.Replace(body, `"errors":[`+written+`,`+written+`]`, `"errors":[2,3]`, 1)
	body = strings.Replace(body, `"result":`+written, `"result":4`, 1)
	if body != string(want)+"\n" {
		t.Errorf("answer\n%s\nwant, the documents aside,\n%s", body, want)
	}
	if view.ErrorsOmitted != 1 {
		t.Errorf("errors_omitted %d, want 1: the history holds 2 of the 3 errors", view.ErrorsOmitted)
	}
}
