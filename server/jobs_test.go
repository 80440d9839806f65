package server

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
)

func TestGetJob_ReturnsTheJob(t *testing.T) {
	t.Parallel()
	e := setup(t)
	created := e.enqueue(t, `{"kind":"a","payload":{"x":[1,2]},"priority":3}`)
	rec := e.do(t, "GET", fmt.Sprintf("/v1/jobs/%d", created.ID), "")
	wantStatus(t, rec, http.StatusOK)
	if diff := cmp.Diff(created, decode[JobView](t, rec), jsonValues); diff != "" {
		t.Errorf("job (-created +got):\n%s", diff)
	}
}

func TestGetJob_ShowsEveryFieldButNeverTheLeaseToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	created := e.enqueue(t, `{"kind":"a","queue":"q"}`)
	tokens := e.claim(t, "q")
	token, ok := tokens[created.ID]
	if !ok {
		t.Fatal("job not claimed")
	}
	rec := e.do(t, "GET", fmt.Sprintf("/v1/jobs/%d", created.ID), "")
	wantStatus(t, rec, http.StatusOK)
	if strings.Contains(rec.Body.String(), token.String()) {
		t.Fatalf("response carries the lease token: %s", rec.Body)
	}
	fields := decode[map[string]json.RawMessage](t, rec)
	want := []string{
		"id", "queue", "kind", "payload", "priority", "state", "attempt", "max_attempts", "fence",
		"run_at", "created_at", "started_at", "finished_at", "leased_by", "lease_expires_at",
		"cancel_requested_at", "last_error", "error_count", "errors", "errors_omitted", "result",
	}
	if diff := cmp.Diff(slices.Sorted(slices.Values(want)), slices.Sorted(maps.Keys(fields))); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
	got := decode[JobView](t, rec)
	if got.State != db.JobStateRunning || got.Attempt != 1 || got.Fence != 1 ||
		got.LeasedBy == nil || *got.LeasedBy != "test-worker" || got.LeaseExpiresAt == nil || got.StartedAt == nil {
		t.Errorf("running job shown as %+v", got)
	}
}

// TestGetJob_ShowsTheNewest20ErrorsAndCountsThemAll holds for each statement
// that records an error: after 30 of them, the job shows the newest 20,
// oldest first, and says that 10 older ones were left out.
func TestGetJob_ShowsTheNewest20ErrorsAndCountsThemAll(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		// record claims the job and records error number round of it.
		record func(t *testing.T, e *testEnv, id int64, round int)
		// want is the error the entry of that round holds.
		want func(round int) string
	}{
		{
			name: "failed",
			record: func(t *testing.T, e *testEnv, id int64, round int) {
				rows, err := e.q.JobFailMany(context.Background(), db.JobFailManyParams{
					IDs: []int64{id}, Tokens: []pgtype.UUID{e.claimOne(t, id, time.Minute)},
					Errors: []string{fmt.Sprintf("boom %d", round)}, Permanent: []bool{false}, RetryInMs: []int64{0},
				})
				if err != nil || len(rows) != 1 {
					t.Fatalf("fail: %v %+v", err, rows)
				}
			},
			want: func(round int) string { return fmt.Sprintf("boom %d", round) },
		},
		{
			name: "reclaimed",
			record: func(t *testing.T, e *testEnv, id int64, round int) {
				e.claimOne(t, id, time.Millisecond)
				for {
					rows, err := e.q.JobReclaim(context.Background(), db.JobReclaimParams{MaxJobs: 10})
					if err != nil {
						t.Fatalf("reclaim: %v", err)
					}
					if len(rows) == 1 && rows[0].ID != nil {
						return
					}
					time.Sleep(time.Millisecond) // until the lease has expired by the database clock
				}
			},
			want: func(int) string { return "lease expired" },
		},
		{
			name: "released",
			record: func(t *testing.T, e *testEnv, id int64, round int) {
				note := fmt.Sprintf("released: round %d", round)
				ids, err := e.q.JobReleaseMany(context.Background(), db.JobReleaseManyParams{
					Note: &note, IDs: []int64{id}, Tokens: []pgtype.UUID{e.claimOne(t, id, time.Minute)},
				})
				if err != nil || len(ids) != 1 {
					t.Fatalf("release: %v %v", err, ids)
				}
			},
			want: func(round int) string { return fmt.Sprintf("released: round %d", round) },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			job := e.enqueue(t, `{"kind":"a","queue":"q","max_attempts":100}`)
			for round := 1; round <= 30; round++ {
				tt.record(t, e, job.ID, round)
			}

			got := decode[JobView](t, e.do(t, "GET", fmt.Sprintf("/v1/jobs/%d", job.ID), ""))
			if got.ErrorCount != 30 || got.ErrorsOmitted != 10 {
				t.Errorf("error_count %d, errors_omitted %d; want 30 and 10", got.ErrorCount, got.ErrorsOmitted)
			}
			var entries []struct {
				Error string `json:"error"`
			}
			if err := json.Unmarshal(got.Errors, &entries); err != nil {
				t.Fatalf("errors %s: %v", got.Errors, err)
			}
			var gotErrors, wantErrors []string
			for _, entry := range entries {
				gotErrors = append(gotErrors, entry.Error)
			}
			for round := 11; round <= 30; round++ {
				wantErrors = append(wantErrors, tt.want(round))
			}
			if diff := cmp.Diff(wantErrors, gotErrors); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestGetJob_BadIDIs400(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue(t, `{"kind":"a"}`)
	for _, id := range []string{"abc", "0", "-1", "+1", "1.5", "1e3", "0x10", "9223372036854775808", "%201", "batch"} {
		t.Run(id, func(t *testing.T) {
			if id != "batch" { // the path of POST /v1/jobs/batch: a 405 (TestRoutes_WrongMethodIs405JSONWithAllow)
				got := wantError(t, e.do(t, "GET", "/v1/jobs/"+id, ""), http.StatusBadRequest, "id")
				if want := "job id must be a whole number from 1 to 9223372036854775807"; got.Error != want {
					t.Errorf("error %q, want %q", got.Error, want)
				}
			}
			wantError(t, e.do(t, "POST", "/v1/jobs/"+id+"/cancel", ""), http.StatusBadRequest, "id")
			wantError(t, e.do(t, "POST", "/v1/jobs/"+id+"/retry", ""), http.StatusBadRequest, "id")
		})
	}
}

// TestGetJob_MissingIs404SayingWhetherItWasDeletedAfterItsRetention asks
// for a job pruned after its retention, and for ids never issued: each is
// a 404, for reads, cancels and retries alike, whose message tells the two
// apart.
func TestGetJob_MissingIs404SayingWhetherItWasDeletedAfterItsRetention(t *testing.T) {
	t.Parallel()
	e := setup(t)
	pruned := e.enqueue(t, `{"kind":"a"}`).ID
	wantStatus(t, e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/cancel", pruned), ""), http.StatusOK)
	if n, err := e.q.JobPrune(context.Background(), db.JobPruneParams{RetainCancelledMs: new(int64), MaxJobs: 10}); err != nil || n.Cancelled != 1 {
		t.Fatalf("prune the cancelled job: %+v, %v", n, err)
	}
	const deleted = "finished and was deleted once its retention passed"
	const never = "no job with this id was ever enqueued"
	tests := []struct {
		id   int64
		want string
	}{
		{pruned, deleted},
		{pruned + 1, never},
		{math.MaxInt64, never},
	}
	for _, tt := range tests {
		for _, req := range []string{"GET /v1/jobs/%d", "POST /v1/jobs/%d/cancel", "POST /v1/jobs/%d/retry"} {
			method, path, _ := strings.Cut(fmt.Sprintf(req, tt.id), " ")
			got := wantError(t, e.do(t, method, path, ""), http.StatusNotFound, "")
			if want := fmt.Sprintf("job %d not found: ", tt.id); !strings.HasPrefix(got.Error, want) || !strings.Contains(got.Error, tt.want) {
				t.Errorf("%s %s: error %q, want %q...%q", method, path, got.Error, want, tt.want)
			}
		}
	}
}

// TestGetJob_MissingIs404SayingItsEnqueueMayNotHaveCommittedYet stores a
// job in a transaction still open, as client.Tx does, whose caller may
// hand the id on before it commits: until then the job is a 404 whose
// message says that its enqueue may not have committed yet, not only that
// it was deleted or never stored, and once it has committed the job is
// there.
func TestGetJob_MissingIs404SayingItsEnqueueMayNotHaveCommittedYet(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // committed below
	job, err := db.New(tx).JobInsert(ctx, db.JobInsertParams{Queue: "default", Kind: "a", Payload: json.RawMessage(`{}`), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("/v1/jobs/%d", job.ID)
	got := wantError(t, e.do(t, "GET", path, ""), http.StatusNotFound, "")
	if want := "its enqueue has not committed yet"; !strings.Contains(got.Error, want) {
		t.Errorf("GET %s while its enqueue is open: error %q, want it to say %q", path, got.Error, want)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, e.do(t, "GET", path, ""), http.StatusOK)
}

// TestGetJob_MissingIs404WhenTheRoleCannotReadTheIDSequence runs the API
// as a role that may read and change jobs but not read the jobs' id
// sequence, which telling a deleted job from one never enqueued needs: a
// missing job is still a 404, one that says this is unknown rather than
// that the id was never issued.
func TestGetJob_MissingIs404WhenTheRoleCannotReadTheIDSequence(t *testing.T) {
	t.Parallel()
	admin := setup(t)
	job := admin.enqueue(t, `{"kind":"a"}`)
	e := setupWithPool(t, poolWithoutSequenceAccess(t, admin.pool))

	wantStatus(t, e.do(t, "GET", fmt.Sprintf("/v1/jobs/%d", job.ID), ""), http.StatusOK)
	for _, req := range []string{"GET /v1/jobs/%d", "POST /v1/jobs/%d/cancel", "POST /v1/jobs/%d/retry"} {
		method, path, _ := strings.Cut(fmt.Sprintf(req, job.ID+1), " ")
		got := wantError(t, e.do(t, method, path, ""), http.StatusNotFound, "")
		if want := fmt.Sprintf("job %d not found: whether its id was ever issued is unknown", job.ID+1); !strings.HasPrefix(got.Error, want) {
			t.Errorf("%s %s: error %q, want %q...", method, path, got.Error, want)
		}
	}
}

// poolWithoutSequenceAccess returns a pool on the database of pool, as a
// new role that may read and change the jobs table but has no privilege
// on its id sequence. The role is dropped when the test ends.
func poolWithoutSequenceAccess(t testing.TB, pool *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	ctx := context.Background()
	// Roles belong to the cluster, not the test's database.
	role := "relay_test_noseq_" + strings.ReplaceAll(uuid.NewString(), "-", "")
	password := uuid.NewString()
	ident := pgx.Identifier{role}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE ROLE "+ident+" LOGIN PASSWORD '"+password+"'"); err != nil {
		t.Fatalf("create role: %v", err)
	}
	cfg := pool.Config()
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, password
	var rolePool *pgxpool.Pool
	t.Cleanup(func() {
		if rolePool != nil {
			rolePool.Close()
		}
		// DROP OWNED revokes its grants in this database, which DROP ROLE
		// needs.
		if _, err := pool.Exec(ctx, "DROP OWNED BY "+ident+"; DROP ROLE "+ident); err != nil {
			t.Errorf("drop role %s: %v", role, err)
		}
	})
	if _, err := pool.Exec(ctx, "GRANT SELECT, INSERT, UPDATE, DELETE ON jobs TO "+ident); err != nil {
		t.Fatalf("grant: %v", err)
	}
	rolePool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	return rolePool
}

func TestListJobs_PagesThroughJobsInIDOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	var ids []int64
	for i := range 5 {
		ids = append(ids, e.enqueue(t, fmt.Sprintf(`{"kind":"k%d"}`, i)).ID)
	}
	var got []int64
	after := ""
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("pagination does not end")
		}
		rec := e.do(t, "GET", "/v1/jobs?limit=2&after="+after, "")
		wantStatus(t, rec, http.StatusOK)
		resp := decode[listResponse](t, rec)
		if len(resp.Jobs) > 2 {
			t.Fatalf("page of %d jobs with limit 2", len(resp.Jobs))
		}
		for _, j := range resp.Jobs {
			got = append(got, j.ID)
		}
		if resp.Next == nil {
			break
		}
		after = *resp.Next
	}
	if diff := cmp.Diff(ids, got); diff != "" {
		t.Errorf("ids (-want +got):\n%s", diff)
	}
}

// TestListJobs_ShowsEachJobsSummaryWithoutPayloadResultOrErrors pins the
// lean shape of a listing: every field of the job's view but the payload,
// the result and the error history, with the count of its errors.
func TestListJobs_ShowsEachJobsSummaryWithoutPayloadResultOrErrors(t *testing.T) {
	t.Parallel()
	e := setup(t)
	big := strings.Repeat("p", 64<<10)
	succeeded := e.enqueue(t, `{"kind":"a","queue":"done","payload":{"big":"`+big+`"}}`)
	token := e.claimOne(t, succeeded.ID, time.Minute)
	if _, err := e.q.JobCompleteAndClaim(context.Background(), db.JobCompleteAndClaimParams{
		CompleteIDs: []int64{succeeded.ID}, CompleteTokens: []pgtype.UUID{token},
		CompleteResults: [][]byte{json.RawMessage(`{"secret":"result"}`)},
		Queue:           "done", ClaimTokens: []pgtype.UUID{}, LeaseMs: 1000, WorkerID: "test-worker",
	}); err != nil {
		t.Fatalf("complete: %v", err)
	}
	dead := e.enqueue(t, `{"kind":"b","queue":"failing"}`)
	e.kill(t, "failing", dead.ID)
	running := e.enqueue(t, `{"kind":"c","queue":"busy","payload":{"big":"`+big+`"}}`)
	e.claim(t, "busy")

	rec := e.do(t, "GET", "/v1/jobs", "")
	wantStatus(t, rec, http.StatusOK)
	for _, s := range []string{big, "secret", `"payload"`, `"result"`, `"errors"`} {
		if strings.Contains(rec.Body.String(), s) {
			t.Errorf("listing carries %.20q", s)
		}
	}
	wantNoLeak(t, rec.Body.String())
	listed := decode[struct {
		Jobs []map[string]json.RawMessage `json:"jobs"`
	}](t, rec).Jobs
	wantFields := []string{
		"id", "queue", "kind", "state", "priority", "attempt", "max_attempts", "fence",
		"run_at", "created_at", "started_at", "finished_at", "leased_by", "lease_expires_at",
		"cancel_requested_at", "last_error", "error_count",
	}
	for _, fields := range listed {
		if diff := cmp.Diff(slices.Sorted(slices.Values(wantFields)), slices.Sorted(maps.Keys(fields))); diff != "" {
			t.Errorf("fields (-want +got):\n%s", diff)
		}
	}

	summaries := decode[listResponse](t, rec).Jobs
	var views []JobSummary
	for _, id := range []int64{succeeded.ID, dead.ID, running.ID} {
		views = append(views, decode[JobView](t, e.do(t, "GET", fmt.Sprintf("/v1/jobs/%d", id), "")).JobSummary)
	}
	if diff := cmp.Diff(views, summaries); diff != "" {
		t.Errorf("summaries differ from the jobs' views (-views +listed):\n%s", diff)
	}
	if len(summaries) == 3 && (summaries[1].ErrorCount != 1 || summaries[0].ErrorCount != 0) {
		t.Errorf("error counts %d and %d, want 0 for the succeeded job and 1 for the dead one", summaries[0].ErrorCount, summaries[1].ErrorCount)
	}
}

func TestListJobs_LastPageHasNullNext(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.enqueue(t, `{"kind":"a"}`)
	e.enqueue(t, `{"kind":"a"}`)
	rec := e.do(t, "GET", "/v1/jobs?limit=2", "")
	wantStatus(t, rec, http.StatusOK)
	if !strings.Contains(rec.Body.String(), `"next":null`) {
		t.Errorf("full last page should end the listing: %s", rec.Body)
	}
	rec = e.do(t, "GET", "/v1/jobs?queue=none", "")
	wantStatus(t, rec, http.StatusOK)
	if got := strings.TrimSpace(rec.Body.String()); got != `{"jobs":[],"next":null}` {
		t.Errorf("empty listing = %s", got)
	}
}

func TestListJobs_DefaultLimitIs100(t *testing.T) {
	t.Parallel()
	e := setup(t)
	body := `{"jobs":[` + strings.TrimSuffix(strings.Repeat(`{"kind":"k"},`, 101), ",") + `]}`
	wantStatus(t, e.do(t, "POST", "/v1/jobs/batch", body), http.StatusCreated)
	resp := decode[listResponse](t, e.do(t, "GET", "/v1/jobs", ""))
	if len(resp.Jobs) != DefaultListLimit || resp.Next == nil {
		t.Errorf("%d jobs, next %v; want %d and a next cursor", len(resp.Jobs), resp.Next, DefaultListLimit)
	}
	resp = decode[listResponse](t, e.do(t, "GET", "/v1/jobs?limit=1000", ""))
	if len(resp.Jobs) != 101 || resp.Next != nil {
		t.Errorf("%d jobs, next %v; want 101 and no next cursor", len(resp.Jobs), resp.Next)
	}
}

func TestListJobs_FiltersByQueueStateAndKind(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a := e.enqueue(t, `{"kind":"x","queue":"one"}`)
	b := e.enqueue(t, `{"kind":"y","queue":"one"}`)
	c := e.enqueue(t, `{"kind":"x","queue":"two"}`)
	wantStatus(t, e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/cancel", b.ID), ""), http.StatusOK)

	tests := []struct {
		query string
		want  []int64
	}{
		{"", []int64{a.ID, b.ID, c.ID}},
		{"queue=one", []int64{a.ID, b.ID}},
		{"kind=x", []int64{a.ID, c.ID}},
		{"state=cancelled", []int64{b.ID}},
		{"state=available&queue=one", []int64{a.ID}},
		{"queue=one&kind=x&state=available", []int64{a.ID}},
		{"queue=&state=&kind=&limit=&after=", []int64{a.ID, b.ID, c.ID}},
		{"queue=three", []int64{}},
		{fmt.Sprintf("after=%d", a.ID), []int64{b.ID, c.ID}},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			rec := e.do(t, "GET", "/v1/jobs?"+tt.query, "")
			wantStatus(t, rec, http.StatusOK)
			got := []int64{}
			for _, j := range decode[listResponse](t, rec).Jobs {
				got = append(got, j.ID)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("ids (-want +got):\n%s", diff)
			}
		})
	}
}

// TestListJobs_FindsJobsWhoseNamesHoldControlCharacters: enqueueing
// refuses control characters in a queue or a kind, but jobs stored before
// it did may have them, and a listing still finds them by those names.
func TestListJobs_FindsJobsWhoseNamesHoldControlCharacters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	// Stored as a job enqueued before the refusal was.
	old, err := e.q.JobInsert(context.Background(), db.JobInsertParams{
		Queue: "old\nqueue", Kind: "old\u0085kind", Payload: json.RawMessage(`{}`), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.enqueue(t, `{"kind":"new","queue":"old"}`)
	e.wantListedAloneByItsNames(t, old)
}

// wantListedAloneByItsNames fails the test unless listings by job's queue,
// by its kind, and by both and its state list job alone, with its names.
func (e *testEnv) wantListedAloneByItsNames(t *testing.T, job db.Job) {
	t.Helper()
	for _, query := range []string{
		"queue=" + url.QueryEscape(job.Queue),
		"kind=" + url.QueryEscape(job.Kind),
		"queue=" + url.QueryEscape(job.Queue) + "&kind=" + url.QueryEscape(job.Kind) + "&state=" + string(job.State),
	} {
		rec := e.do(t, "GET", "/v1/jobs?"+query, "")
		wantStatus(t, rec, http.StatusOK)
		jobs := decode[listResponse](t, rec).Jobs
		if len(jobs) != 1 || jobs[0].ID != job.ID || jobs[0].Queue != job.Queue || jobs[0].Kind != job.Kind {
			t.Errorf("%s listed %+v, want job %d alone", query, jobs, job.ID)
		}
	}
}

// TestListJobs_FindsJobsWhoseNamesTheDatabaseHoldsBeyond128Bytes: the
// database holds a queue or a kind of up to 128 characters, which may take
// more bytes than enqueueing allows (a job stored from a client.Job built
// by hand, or by SQL). GET /v1/queues shows such a queue, and a listing
// finds its jobs by those names; a name longer than any the database
// holds is still refused.
func TestListJobs_FindsJobsWhoseNamesTheDatabaseHoldsBeyond128Bytes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	long, err := e.q.JobInsert(context.Background(), db.JobInsertParams{
		Queue: strings.Repeat("é", 128), Kind: strings.Repeat("日", 128), Payload: json.RawMessage(`{}`), MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.enqueue(t, `{"kind":"other"}`)

	queues := decode[queuesResponse](t, e.do(t, "GET", "/v1/queues", "")).Queues
	if !slices.ContainsFunc(queues, func(q queueStats) bool { return q.Queue == long.Queue }) {
		t.Errorf("GET /v1/queues shows %+v, without the queue of job %d", queues, long.ID)
	}
	e.wantListedAloneByItsNames(t, long)
	for _, name := range []string{"queue", "kind"} {
		got := wantError(t, e.do(t, "GET", "/v1/jobs?"+name+"="+url.QueryEscape(strings.Repeat("é", 129)), ""),
			http.StatusBadRequest, name)
		if want := name + " must be at most 128 characters"; got.Error != want {
			t.Errorf("error %q, want %q", got.Error, want)
		}
	}
}

// TestListJobs_EveryCombinationOfFiltersPagesThroughItsJobs lists jobs of
// two queues, two kinds and every state by each combination of filters,
// values that match nothing included, a page of two at a time: each
// listing holds exactly the jobs that match, in id order.
func TestListJobs_EveryCombinationOfFiltersPagesThroughItsJobs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	type job struct {
		id                 int64
		queue, kind, state string
	}
	var jobs []job
	for range 2 {
		for _, state := range db.AllJobStateValues() {
			for _, queue := range []string{"one", "two"} {
				for _, kind := range []string{"x", "y"} {
					jobs = append(jobs, job{queue: queue, kind: kind, state: string(state)})
				}
			}
		}
	}
	var queues, kinds, states []string
	for _, j := range jobs {
		queues, kinds, states = append(queues, j.queue), append(kinds, j.kind), append(states, j.state)
	}
	// A fixture: each job as the transitions to its state would leave it.
	rows, err := e.pool.Query(context.Background(), `
		INSERT INTO jobs (queue, kind, state, attempt, fence, lease_token, lease_expires_at, leased_by, started_at, finished_at)
		SELECT s.queue, s.kind, s.state,
		       CASE WHEN s.state = 'available' THEN 0 ELSE 1 END,
		       CASE WHEN s.state = 'available' THEN 0 ELSE 1 END,
		       CASE WHEN s.state = 'running' THEN gen_random_uuid() END,
		       CASE WHEN s.state = 'running' THEN now() + interval '1 hour' END,
		       CASE WHEN s.state <> 'available' THEN 'test-worker' END,
		       CASE WHEN s.state <> 'available' THEN now() END,
		       CASE WHEN s.state IN ('succeeded', 'dead', 'cancelled') THEN now() END
		FROM unnest($1::text[], $2::text[], $3::job_state[]) WITH ORDINALITY AS s (queue, kind, state, n)
		ORDER BY s.n
		RETURNING id`, queues, kinds, states)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || len(ids) != len(jobs) {
		t.Fatalf("insert jobs: %v (%d ids)", err, len(ids))
	}
	for i := range jobs {
		jobs[i].id = ids[i]
	}

	for _, queue := range []string{"", "one", "two", "none"} {
		for _, kind := range []string{"", "x", "y", "none"} {
			for _, state := range append([]db.JobState{""}, db.AllJobStateValues()...) {
				query := url.Values{"queue": {queue}, "kind": {kind}, "state": {string(state)}, "limit": {"2"}}
				t.Run(query.Encode(), func(t *testing.T) {
					want := []int64{}
					for _, j := range jobs {
						if (queue == "" || j.queue == queue) && (kind == "" || j.kind == kind) && (state == "" || j.state == string(state)) {
							want = append(want, j.id)
						}
					}
					got := e.pageThrough(t, query, len(jobs)+1)
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("ids (-want +got):\n%s", diff)
					}
				})
			}
		}
	}
}

// pageThrough lists the jobs query matches, following each page's next
// cursor, for at most pages pages, and returns their ids in the order
// listed. query is left as it was given.
func (e *testEnv) pageThrough(t *testing.T, query url.Values, pages int) []int64 {
	t.Helper()
	query = maps.Clone(query)
	got := []int64{}
	for range pages {
		rec := e.do(t, "GET", "/v1/jobs?"+query.Encode(), "")
		wantStatus(t, rec, http.StatusOK)
		resp := decode[listResponse](t, rec)
		for _, j := range resp.Jobs {
			got = append(got, j.ID)
		}
		if resp.Next == nil {
			break
		}
		query.Set("after", *resp.Next)
	}
	return got
}

func TestListJobs_RejectsBadParameters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	tests := []struct{ query, field string }{
		{"limit=0", "limit"},
		{"limit=-1", "limit"},
		{"limit=1001", "limit"},
		{"limit=ten", "limit"},
		{"limit=%2B2", "limit"},
		{"limit=+2", "limit"},
		{"limit=2.0", "limit"},
		{"limit=%202", "limit"},
		{"limit=1&limit=2", "limit"},
		{"after=-1", "after"},
		{"after=abc", "after"},
		{"after=%2B1", "after"},
		{"after=9223372036854775808", "after"},
		{"state=done", "state"},
		{"state=AVAILABLE", "state"},
		{"state=available&state=dead", "state"},
		{"queue=a%00b", "queue"},
		{"queue=%FF", "queue"},
		{"queue=" + strings.Repeat("q", 129), "queue"},
		{"kind=%00", "kind"},
		{"status=dead", "status"},
		{"State=dead", "State"},
		{"limit=1;after=2", ""},
		{"queue=%zz", ""},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			wantError(t, e.do(t, "GET", "/v1/jobs?"+tt.query, ""), http.StatusBadRequest, tt.field)
		})
	}
}

// TestRoutes_WithoutParametersRejectQueryStrings: only the listing takes
// parameters; every other /v1 route refuses a query string rather than
// ignore it, and changes nothing. The health routes take what they get.
func TestRoutes_WithoutParametersRejectQueryStrings(t *testing.T) {
	t.Parallel()
	e := setup(t)
	job := e.enqueue(t, `{"kind":"a","queue":"q"}`)
	e.kill(t, "q", job.ID)
	routes := []struct{ method, path string }{
		{"GET", fmt.Sprintf("/v1/jobs/%d", job.ID)},
		{"POST", fmt.Sprintf("/v1/jobs/%d/cancel", job.ID)},
		{"POST", fmt.Sprintf("/v1/jobs/%d/retry", job.ID)},
		{"GET", "/v1/queues"},
	}
	tests := []struct{ query, field string }{
		{"state=available", "state"},
		{"limit=1&after=2", "after"}, // the first in sorted order
		{"x", "x"},
		{"a=%zz", ""},
		{"a=1;b=2", ""},
	}
	for _, r := range routes {
		for _, tt := range tests {
			t.Run(r.method+" "+r.path+"?"+tt.query, func(t *testing.T) {
				got := wantError(t, e.do(t, r.method, r.path+"?"+tt.query, ""), http.StatusBadRequest, tt.field)
				if tt.field != "" && !strings.Contains(got.Error, "takes no query parameters") {
					t.Errorf("error %q does not say the route takes no query parameters", got.Error)
				}
			})
		}
	}
	stored, err := e.q.JobGet(context.Background(), job.ID)
	if err != nil || stored.State != db.JobStateDead {
		t.Errorf("job is %s (%v), want it left dead", stored.State, err)
	}
	for _, path := range []string{"/healthz?probe=1", "/readyz?probe=1"} {
		wantStatus(t, e.do(t, "GET", path, ""), http.StatusOK)
	}
}

func TestCancelJob_CancelsAvailableJobAtOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	job := e.enqueue(t, `{"kind":"a"}`)
	rec := e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/cancel", job.ID), "")
	wantStatus(t, rec, http.StatusOK)
	got := decode[JobView](t, rec)
	if got.State != db.JobStateCancelled || got.FinishedAt == nil {
		t.Errorf("cancelled job = %+v", got)
	}
	stored, err := e.q.JobGet(context.Background(), job.ID)
	if err != nil || stored.State != db.JobStateCancelled {
		t.Errorf("stored job: %v %v", stored.State, err)
	}
}

func TestCancelJob_MarksRunningJob(t *testing.T) {
	t.Parallel()
	e := setup(t)
	job := e.enqueue(t, `{"kind":"a","queue":"q"}`)
	e.claim(t, "q")
	rec := e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/cancel", job.ID), "")
	wantStatus(t, rec, http.StatusOK)
	got := decode[JobView](t, rec)
	if got.State != db.JobStateRunning || got.CancelRequestedAt == nil {
		t.Errorf("job = state %s, cancel_requested_at %v; want running and marked", got.State, got.CancelRequestedAt)
	}
	wantNoLeak(t, rec.Body.String())
}

func TestCancelJob_FinishedJobIs409(t *testing.T) {
	t.Parallel()
	e := setup(t)
	job := e.enqueue(t, `{"kind":"a"}`)
	path := fmt.Sprintf("/v1/jobs/%d/cancel", job.ID)
	wantStatus(t, e.do(t, "POST", path, ""), http.StatusOK)
	got := wantError(t, e.do(t, "POST", path, ""), http.StatusConflict, "")
	if !strings.Contains(got.Error, "cancelled") {
		t.Errorf("error %q does not name the state", got.Error)
	}
}

func TestCancelJob_MissingIs404(t *testing.T) {
	t.Parallel()
	e := setup(t)
	wantError(t, e.do(t, "POST", "/v1/jobs/12345/cancel", ""), http.StatusNotFound, "")
}

func TestRetryJob_MakesDeadJobAvailable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	job := e.enqueue(t, `{"kind":"a","queue":"q"}`)
	e.kill(t, "q", job.ID)
	rec := e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/retry", job.ID), "")
	wantStatus(t, rec, http.StatusOK)
	got := decode[JobView](t, rec)
	if got.State != db.JobStateAvailable || got.Attempt != 0 || got.FinishedAt != nil || got.Fence != 1 {
		t.Errorf("retried job = %+v", got)
	}
	if got.LastError == nil || *got.LastError != "boom" {
		t.Errorf("last_error = %v, want the history kept", got.LastError)
	}
}

func TestRetryJob_MakesCancelledJobAvailable(t *testing.T) {
	t.Parallel()
	e := setup(t)
	job := e.enqueue(t, `{"kind":"a"}`)
	wantStatus(t, e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/cancel", job.ID), ""), http.StatusOK)
	rec := e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/retry", job.ID), "")
	wantStatus(t, rec, http.StatusOK)
	if got := decode[JobView](t, rec); got.State != db.JobStateAvailable {
		t.Errorf("state = %s", got.State)
	}
}

func TestRetryJob_JobInOtherStateIs409(t *testing.T) {
	t.Parallel()
	e := setup(t)
	available := e.enqueue(t, `{"kind":"a"}`)
	running := e.enqueue(t, `{"kind":"a","queue":"q"}`)
	e.claim(t, "q")
	for _, id := range []int64{available.ID, running.ID} {
		wantError(t, e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/retry", id), ""), http.StatusConflict, "")
	}
}

func TestRetryJob_MissingIs404(t *testing.T) {
	t.Parallel()
	e := setup(t)
	wantError(t, e.do(t, "POST", "/v1/jobs/12345/retry", ""), http.StatusNotFound, "")
}

// transitionCase is a job in some state, a cancel or a retry asked of it,
// and a change that someone else makes to it meanwhile.
type transitionCase struct {
	name string
	// job enqueues a job and brings it to its state, and returns its id
	// and, for a running job, its lease token.
	job  func(t *testing.T, e *testEnv) (int64, pgtype.UUID)
	verb string
	// meanwhile is the other change, made through q.
	meanwhile func(t *testing.T, q *db.Queries, id int64, token pgtype.UUID)
}

func deadJob(t *testing.T, e *testEnv) (int64, pgtype.UUID) {
	t.Helper()
	job := e.enqueue(t, `{"kind":"a","queue":"q"}`)
	e.kill(t, "q", job.ID)
	return job.ID, pgtype.UUID{}
}

func cancelledJob(t *testing.T, e *testEnv) (int64, pgtype.UUID) {
	t.Helper()
	job := e.enqueue(t, `{"kind":"a"}`)
	wantStatus(t, e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/cancel", job.ID), ""), http.StatusOK)
	return job.ID, pgtype.UUID{}
}

func availableJob(t *testing.T, e *testEnv) (int64, pgtype.UUID) {
	t.Helper()
	return e.enqueue(t, `{"kind":"a"}`).ID, pgtype.UUID{}
}

func runningJob(t *testing.T, e *testEnv) (int64, pgtype.UUID) {
	t.Helper()
	id := e.enqueue(t, `{"kind":"a","queue":"q"}`).ID
	return id, e.claimOne(t, id, time.Minute)
}

func retryJob(t *testing.T, q *db.Queries, id int64, _ pgtype.UUID) {
	t.Helper()
	if row, err := q.JobRetry(context.Background(), id); err != nil || !row.Applied {
		t.Fatalf("retry job %d: applied %t, %v", id, row.Applied, err)
	}
}

func cancelJob(t *testing.T, q *db.Queries, id int64, _ pgtype.UUID) {
	t.Helper()
	if row, err := q.JobCancel(context.Background(), id); err != nil || !row.Applied {
		t.Fatalf("cancel job %d: applied %t, %v", id, row.Applied, err)
	}
}

// failForGood fails the running job id, under the lease token, with an
// error that is permanent, as its worker would: it ends dead.
func failForGood(t *testing.T, q *db.Queries, id int64, token pgtype.UUID) {
	t.Helper()
	failLeased(t, q, id, token, true)
}

// claimJob claims the job id, the only ready job of its queue, as a
// worker would.
func claimJob(t *testing.T, q *db.Queries, id int64, _ pgtype.UUID) {
	t.Helper()
	job, err := q.JobGet(context.Background(), id)
	if err != nil {
		t.Fatalf("get job %d: %v", id, err)
	}
	if tokens := claimWith(t, q, job.Queue, time.Minute); len(tokens) != 1 || tokens[id] == (pgtype.UUID{}) {
		t.Fatalf("job %d was not claimed alone (claimed %v)", id, tokens)
	}
}

// failToRunAgain fails the running job id, under the lease token, with an
// error that leaves it attempts: it is available again at once.
func failToRunAgain(t *testing.T, q *db.Queries, id int64, token pgtype.UUID) {
	t.Helper()
	failLeased(t, q, id, token, false)
}

// TestTransitionJob_RefusalNamesTheStateThatRefusedItWhateverComesNext
// makes, right after the statement of a cancel or a retry has refused the
// change, another change that makes the job one that the refused change
// allows. The 409 still names the state the change was refused for, never
// one that allows it, and the other change stands.
//
// Not parallel: it sets the package's transitionDone.
func TestTransitionJob_RefusalNamesTheStateThatRefusedItWhateverComesNext(t *testing.T) {
	for _, tc := range []struct {
		transitionCase
		wantNamed db.JobState // in the 409
		wantAfter db.JobState // the job's state in the end
	}{
		{transitionCase{"cancel of a dead job retried meanwhile", deadJob, "cancel", retryJob},
			db.JobStateDead, db.JobStateAvailable},
		{transitionCase{"cancel of a cancelled job retried meanwhile", cancelledJob, "cancel", retryJob},
			db.JobStateCancelled, db.JobStateAvailable},
		{transitionCase{"retry of an available job cancelled meanwhile", availableJob, "retry", cancelJob},
			db.JobStateAvailable, db.JobStateCancelled},
		{transitionCase{"retry of a running job failed for good meanwhile", runningJob, "retry", failForGood},
			db.JobStateRunning, db.JobStateDead},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := setup(t)
			id, token := tc.job(t, e)
			done := false
			setTransitionDone(t, func(got int64) {
				if got != id || done {
					return
				}
				done = true
				tc.meanwhile(t, e.q, id, token)
			})
			got := wantError(t, e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/%s", id, tc.verb), ""), http.StatusConflict, "")
			if want := fmt.Sprintf("cannot %s a job that is %s", tc.verb, tc.wantNamed); got.Error != want {
				t.Errorf("error %q, want %q", got.Error, want)
			}
			if !done {
				t.Fatal("the other change was never made")
			}
			if stored, err := e.q.JobGet(context.Background(), id); err != nil || stored.State != tc.wantAfter {
				t.Errorf("stored job: state %s, %v; want %s", stored.State, err, tc.wantAfter)
			}
		})
	}
}

// TestTransitionJob_WaitsForAChangeInProgressAndDecidesOnItsOutcome asks
// for a cancel or a retry while another transaction holds a change of the
// job that is not yet committed: the request waits for it, and decides on
// the job that change leaves, as a 200 or a 409 that names its state.
func TestTransitionJob_WaitsForAChangeInProgressAndDecidesOnItsOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		transitionCase
		wantStatus int
		wantState  db.JobState // of the job answered, or named in the 409
	}{
		{transitionCase{"cancel of a dead job being retried", deadJob, "cancel", retryJob},
			http.StatusOK, db.JobStateCancelled},
		{transitionCase{"cancel of a running job being failed for good", runningJob, "cancel", failForGood},
			http.StatusConflict, db.JobStateDead},
		{transitionCase{"retry of an available job being cancelled", availableJob, "retry", cancelJob},
			http.StatusOK, db.JobStateAvailable},
		{transitionCase{"retry of a dead job being retried", deadJob, "retry", retryJob},
			http.StatusConflict, db.JobStateAvailable},
		// Changes that take or give back the lease: the cancel or retry
		// must decide on the row they leave, lease and all.
		{transitionCase{"cancel of an available job being claimed", availableJob, "cancel", claimJob},
			http.StatusOK, db.JobStateRunning},
		{transitionCase{"cancel of a running job being failed to run again", runningJob, "cancel", failToRunAgain},
			http.StatusOK, db.JobStateCancelled},
		{transitionCase{"retry of a running job being failed for good", runningJob, "retry", failForGood},
			http.StatusOK, db.JobStateAvailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			ctx := context.Background()
			id, token := tc.job(t, e)
			tx, err := e.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(ctx) })
			tc.meanwhile(t, e.q.WithTx(tx), id, token)

			answered := make(chan *httptest.ResponseRecorder, 1)
			go func() { answered <- serve(t, e.h, "POST", fmt.Sprintf("/v1/jobs/%d/%s", id, tc.verb), "") }()
			waitBlocks(t, e.pool, tx, answered)
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			rec := <-answered
			if tc.wantStatus == http.StatusOK {
				wantStatus(t, rec, http.StatusOK)
				if got := decode[JobView](t, rec); got.State != tc.wantState {
					t.Errorf("job answered: state %s, want %s", got.State, tc.wantState)
				}
				return
			}
			got := wantError(t, rec, tc.wantStatus, "")
			if want := fmt.Sprintf("cannot %s a job that is %s", tc.verb, tc.wantState); got.Error != want {
				t.Errorf("error %q, want %q", got.Error, want)
			}
		})
	}
}

// waitBlocks waits up to 10 s for tx to hold up another session, or for
// a request that was to wait for it to be answered instead, and fails the
// test if neither comes.
func waitBlocks(t *testing.T, pool *pgxpool.Pool, tx pgx.Tx, answered <-chan *httptest.ResponseRecorder) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if len(answered) > 0 {
			return // it did not wait: what it answered is checked
		}
		if dbtest.Blocks(t, pool, tx) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the request neither waited for the change in progress nor was answered within 10s")
		}
	}
}

// TestListQueues_CountsWaitingAndRunningJobsWithOldestReadyAge lists
// queues with available, scheduled, running and finished jobs: finished
// jobs keep their queue listed, and are not counted.
func TestListQueues_CountsWaitingAndRunningJobsWithOldestReadyAge(t *testing.T) {
	t.Parallel()
	e := setup(t)
	old := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	e.enqueue(t, `{"kind":"a","queue":"alpha","run_at":"`+old+`"}`)
	e.enqueue(t, `{"kind":"a","queue":"alpha"}`)
	e.enqueue(t, `{"kind":"a","queue":"alpha","delay":"1h"}`)
	cancelled := e.enqueue(t, `{"kind":"a","queue":"beta"}`)
	wantStatus(t, e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/cancel", cancelled.ID), ""), http.StatusOK)
	dead := e.enqueue(t, `{"kind":"a","queue":"gamma"}`)
	e.kill(t, "gamma", dead.ID)
	e.enqueue(t, `{"kind":"a","queue":"gamma"}`)
	e.claim(t, "gamma")

	rec := e.do(t, "GET", "/v1/queues", "")
	wantStatus(t, rec, http.StatusOK)
	got := decode[queuesResponse](t, rec)
	want := queuesResponse{Queues: []queueStats{
		{Queue: "alpha", Counts: queueCounts{Available: 3}},
		{Queue: "beta", Counts: queueCounts{}},
		{Queue: "gamma", Counts: queueCounts{Running: 1}},
	}}
	if len(got.Queues) == 3 {
		age := got.Queues[0].OldestReadyAgeSeconds
		if age < 59 || age > 120 {
			t.Errorf("alpha's oldest ready job is %vs old, want about 60", age)
		}
		want.Queues[0].OldestReadyAgeSeconds = age
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("queues (-want +got):\n%s", diff)
	}
}

func TestListQueues_EmptyDatabaseHasNoQueues(t *testing.T) {
	t.Parallel()
	e := setup(t)
	rec := e.do(t, "GET", "/v1/queues", "")
	wantStatus(t, rec, http.StatusOK)
	if got := strings.TrimSpace(rec.Body.String()); got != `{"queues":[]}` {
		t.Errorf("body = %s", got)
	}
}
