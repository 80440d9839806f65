package server

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
)

// TestQueuesAndListings_AgreeWithTheJobsTableThroughRandomTransitions
// moves jobs of three queues and two kinds through random transitions, as
// the API and workers make them, by the statements they run: enqueues of
// one job (some under idempotency keys, replayed or conflicting), batches,
// claims under leases that run out, completions, failures for good or to
// run again, releases, reclaims, cancels and retries (of any id, missing
// ones included), and prunes of some states in batches of a few jobs.
// After every step GET /v1/queues counts, for every queue that holds
// jobs, the available and running jobs a count(*) of the table finds, and
// one listing, with filters and a page size drawn at random, pages
// through exactly the jobs a scan of the table matches, in id order. A
// job a prune deleted is a 404 that says it was deleted once its
// retention passed; an id beyond the last issued, one that says it was
// never enqueued.
func TestQueuesAndListings_AgreeWithTheJobsTableThroughRandomTransitions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	queues := []string{"a", "b", "c"}
	kinds := []string{"x", "y"}
	pick := func(names []string) string { return names[rng.IntN(len(names))] }

	held := map[int64]pgtype.UUID{} // running jobs as their claims left them
	takeHeld := func() (ids []int64, tokens []pgtype.UUID) {
		for _, id := range slices.Sorted(maps.Keys(held)) {
			if rng.IntN(2) == 0 {
				ids, tokens = append(ids, id), append(tokens, held[id])
				delete(held, id)
			}
		}
		return ids, tokens
	}
	jobBody := func() string {
		body := map[string]any{"kind": pick(kinds), "queue": pick(queues)}
		switch rng.IntN(5) {
		case 0:
			body["delay"] = "1h"
		case 1:
			body["run_at"] = time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
		}
		out, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	anyID := func() int64 {
		var id int64
		if err := e.pool.QueryRow(ctx, `SELECT COALESCE(max(id), 0) + 1 FROM jobs`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return 1 + rng.Int64N(id)
	}

	const steps = 300
	var history []string
	for step := range steps {
		var did string
		switch op := rng.IntN(11); op {
		case 0, 1:
			headers := []string{}
			if rng.IntN(3) == 0 {
				headers = append(headers, "Idempotency-Key", fmt.Sprintf("key-%d", rng.IntN(4)))
			}
			rec := e.do(t, "POST", "/v1/jobs", jobBody(), headers...)
			if rec.Code != http.StatusCreated && rec.Code != http.StatusOK && rec.Code != http.StatusConflict {
				t.Fatalf("step %d: enqueue: %d %s", step, rec.Code, rec.Body)
			}
			did = fmt.Sprintf("enqueue %v: %d", headers, rec.Code)
		case 2:
			jobs := make([]string, 1+rng.IntN(4))
			for i := range jobs {
				jobs[i] = jobBody()
			}
			wantStatus(t, e.do(t, "POST", "/v1/jobs/batch", `{"jobs":[`+strings.Join(jobs, ",")+`]}`), http.StatusCreated)
			did = fmt.Sprintf("batch of %d", len(jobs))
		case 3:
			lease := time.Minute
			if rng.IntN(2) == 0 {
				lease = time.Millisecond // runs out by the next reclaim
			}
			rows, err := e.q.JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
				CompleteIDs: []int64{}, CompleteTokens: []pgtype.UUID{}, CompleteResults: [][]byte{},
				Queue: pick(queues), ClaimTokens: leaseTokens(1 + rng.IntN(3)), LeaseMs: lease.Milliseconds(), WorkerID: "w",
			})
			if err != nil {
				t.Fatalf("step %d: claim: %v", step, err)
			}
			var claimed []int64
			for _, r := range rows {
				if r.ID != nil {
					held[*r.ID] = r.LeaseToken
					claimed = append(claimed, *r.ID)
				}
			}
			did = fmt.Sprintf("claim under a lease of %s: %v", lease, claimed)
		case 4:
			ids, tokens := takeHeld()
			results := make([][]byte, len(ids))
			for i := range results {
				results[i] = []byte(`{}`)
			}
			if _, err := e.q.JobCompleteMany(ctx, db.JobCompleteManyParams{IDs: ids, Tokens: tokens, Results: results}); err != nil {
				t.Fatalf("step %d: complete: %v", step, err)
			}
			did = fmt.Sprintf("complete %v", ids)
		case 5:
			ids, tokens := takeHeld()
			errs, permanent, retry := make([]string, len(ids)), make([]bool, len(ids)), make([]int64, len(ids))
			for i := range ids {
				errs[i], permanent[i] = "boom", rng.IntN(2) == 0
			}
			if _, err := e.q.JobFailMany(ctx, db.JobFailManyParams{IDs: ids, Tokens: tokens, Errors: errs, Permanent: permanent, RetryInMs: retry}); err != nil {
				t.Fatalf("step %d: fail: %v", step, err)
			}
			did = fmt.Sprintf("fail %v, for good %v", ids, permanent)
		case 6:
			ids, tokens := takeHeld()
			if _, err := e.q.JobReleaseMany(ctx, db.JobReleaseManyParams{IDs: ids, Tokens: tokens}); err != nil {
				t.Fatalf("step %d: release: %v", step, err)
			}
			did = fmt.Sprintf("release %v", ids)
		case 7:
			rows, err := e.q.JobReclaim(ctx, db.JobReclaimParams{MaxJobs: 1000})
			if err != nil {
				t.Fatalf("step %d: reclaim: %v", step, err)
			}
			var taken []int64
			for _, r := range rows {
				if r.ID != nil {
					taken = append(taken, *r.ID)
					delete(held, *r.ID)
				}
			}
			did = fmt.Sprintf("reclaim: %v", taken)
		case 8, 9:
			verb := "cancel"
			if op == 9 {
				verb = "retry"
			}
			id := anyID()
			rec := e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/%s", id, verb), "")
			if rec.Code != http.StatusOK && rec.Code != http.StatusNotFound && rec.Code != http.StatusConflict {
				t.Fatalf("step %d: %s job %d: %d %s", step, verb, id, rec.Code, rec.Body)
			}
			did = fmt.Sprintf("%s job %d: %d", verb, id, rec.Code)
		case 10:
			before := jobIDs(t, e, "")
			var params db.JobPruneParams
			params.MaxJobs = int32(1 + rng.IntN(3))
			for _, r := range []**int64{&params.RetainSucceededMs, &params.RetainDeadMs, &params.RetainCancelledMs} {
				if rng.IntN(3) > 0 {
					*r = new(int64)
				}
			}
			n, err := e.q.JobPrune(ctx, params)
			if err != nil {
				t.Fatalf("step %d: prune: %v", step, err)
			}
			after := jobIDs(t, e, "")
			var pruned []int64
			for _, id := range before {
				if _, found := slices.BinarySearch(after, id); !found {
					pruned = append(pruned, id)
				}
			}
			if int64(len(pruned)) != n.Succeeded+n.Dead+n.Cancelled {
				t.Fatalf("step %d: prune reported %+v, and %d jobs went", step, n, len(pruned))
			}
			for _, id := range pruned {
				delete(held, id)
				got := wantError(t, e.do(t, "GET", fmt.Sprintf("/v1/jobs/%d", id), ""), http.StatusNotFound, "")
				if !strings.Contains(got.Error, "finished and was deleted once its retention passed") {
					t.Fatalf("step %d: job %d, pruned, is a 404 saying %q", step, id, got.Error)
				}
			}
			did = fmt.Sprintf("prune %d of each state: %v", params.MaxJobs, pruned)
		}
		history = append(history, did)
		checkQueues(t, e)
		checkListing(t, e, rng, append(queues, "none"), append(kinds, "none"))
		if t.Failed() {
			t.Fatalf("seed %d, after steps:\n%s", seed, strings.Join(history, "\n"))
		}
	}
	never := anyID() + 1000
	got := wantError(t, e.do(t, "GET", fmt.Sprintf("/v1/jobs/%d", never), ""), http.StatusNotFound, "")
	if !strings.Contains(got.Error, "no job with this id was ever enqueued") {
		t.Errorf("job %d, never issued, is a 404 saying %q", never, got.Error)
	}
}

// checkQueues compares GET /v1/queues with a count(*) of the jobs of each
// queue, and the age of its oldest ready job with that of the table, to
// within the time between the two reads.
func checkQueues(t *testing.T, e *testEnv) {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), `
		SELECT queue,
		       count(*) FILTER (WHERE state = 'available'),
		       count(*) FILTER (WHERE state = 'running'),
		       COALESCE(EXTRACT(EPOCH FROM now() - min(run_at) FILTER (WHERE state = 'available' AND run_at <= now())), 0)::float8
		FROM jobs GROUP BY queue ORDER BY queue`)
	if err != nil {
		t.Fatal(err)
	}
	want, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (queueStats, error) {
		var s queueStats
		err := row.Scan(&s.Queue, &s.Counts.Available, &s.Counts.Running, &s.OldestReadyAgeSeconds)
		return s, err
	})
	if err != nil {
		t.Fatal(err)
	}
	rec := e.do(t, "GET", "/v1/queues", "")
	wantStatus(t, rec, http.StatusOK)
	got := decode[queuesResponse](t, rec).Queues
	if diff := cmp.Diff(emptyNil(want), emptyNil(got), cmpopts.EquateApprox(0, 2)); diff != "" {
		t.Errorf("GET /v1/queues (-count(*) +got):\n%s", diff)
	}
}

// checkListing pages through GET /v1/jobs with filters and a page size
// drawn at random, and compares what it lists with a scan of the table.
func checkListing(t *testing.T, e *testEnv, rng *rand.Rand, queues, kinds []string) {
	t.Helper()
	query := url.Values{"limit": {strconv.Itoa(1 + rng.IntN(4))}}
	var where []string
	var args []any
	if rng.IntN(2) == 0 {
		query.Set("queue", queues[rng.IntN(len(queues))])
		args = append(args, query.Get("queue"))
		where = append(where, fmt.Sprintf("queue = $%d", len(args)))
	}
	if rng.IntN(2) == 0 {
		query.Set("kind", kinds[rng.IntN(len(kinds))])
		args = append(args, query.Get("kind"))
		where = append(where, fmt.Sprintf("kind = $%d", len(args)))
	}
	if rng.IntN(2) == 0 {
		states := db.AllJobStateValues()
		query.Set("state", string(states[rng.IntN(len(states))]))
		args = append(args, query.Get("state"))
		where = append(where, fmt.Sprintf("state = $%d::job_state", len(args)))
	}
	cond := ""
	if len(where) > 0 {
		cond = "WHERE " + strings.Join(where, " AND ")
	}
	want := jobIDs(t, e, cond, args...)
	got := e.pageThrough(t, query, len(want)+1)
	if diff := cmp.Diff(emptyNil(want), emptyNil(got)); diff != "" {
		t.Errorf("GET /v1/jobs?%s (-scan +got):\n%s", query.Encode(), diff)
	}
}

// jobIDs returns the ids of the jobs that cond (a WHERE clause, or
// nothing) matches, in id order.
func jobIDs(t *testing.T, e *testEnv, cond string, args ...any) []int64 {
	t.Helper()
	rows, err := e.pool.Query(context.Background(), "SELECT id FROM jobs "+cond+" ORDER BY id", args...)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// emptyNil turns an empty slice into nil, so that the two compare equal.
func emptyNil[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

// TestListJobs_PagingWhileJobsChangeListsEveryJobThatLastsOnce pages
// through listings, a few jobs a page, while other jobs are enqueued,
// completed and pruned, and the jobs listed are claimed, failed to run
// again or for good, cancelled and retried meanwhile. Every job that
// exists from before the first page to after the last is listed once, if
// its queue and kind match, whatever its state when its page was read,
// and no job is listed twice.
func TestListJobs_PagingWhileJobsChangeListsEveryJobThatLastsOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	queues, kinds := []string{"a", "b"}, []string{"x", "y"}

	// The jobs that last: never completed, so never pruned.
	var batch []string
	for i := range 120 {
		batch = append(batch, fmt.Sprintf(`{"kind":%q,"queue":%q}`, kinds[i%2], queues[i/2%2]))
	}
	rec := e.do(t, "POST", "/v1/jobs/batch", `{"jobs":[`+strings.Join(batch, ",")+`]}`)
	wantStatus(t, rec, http.StatusCreated)
	lasting := decode[batchResponse](t, rec).IDs
	isLasting := map[int64]bool{}
	for _, id := range lasting {
		isLasting[id] = true
	}

	stop := make(chan struct{})
	done := make(chan struct{})
	var rounds atomic.Int64 // of the churn, begun
	go func() {
		defer close(done)
		rng := rand.New(rand.NewPCG(seed, 1))
		held := map[int64]pgtype.UUID{} // jobs of kind t to complete
		for {
			select {
			case <-stop:
				return
			default:
			}
			rounds.Add(1)
			queue := queues[rng.IntN(len(queues))]
			if rec := e.do(t, "POST", "/v1/jobs/batch", fmt.Sprintf(`{"jobs":[{"kind":"t","queue":%q},{"kind":"t","queue":"a"}]}`, queue)); rec.Code != http.StatusCreated {
				t.Errorf("enqueue: %d %s", rec.Code, rec.Body)
				return
			}
			var ids []int64
			var tokens []pgtype.UUID
			var results [][]byte
			for id, token := range held {
				ids, tokens, results = append(ids, id), append(tokens, token), append(results, []byte(`{}`))
			}
			clear(held)
			rows, err := e.q.JobCompleteAndClaim(ctx, db.JobCompleteAndClaimParams{
				CompleteIDs: ids, CompleteTokens: tokens, CompleteResults: results,
				Queue: queue, ClaimTokens: leaseTokens(4), LeaseMs: time.Minute.Milliseconds(), WorkerID: "churn",
			})
			if err != nil {
				t.Errorf("complete and claim: %v", err)
				return
			}
			for _, r := range rows {
				switch {
				case r.ID == nil:
				case !isLasting[*r.ID]:
					held[*r.ID] = r.LeaseToken
				case rng.IntN(3) > 0:
					// Failed to run again, or for good; or left running.
					if _, err := e.q.JobFailMany(ctx, db.JobFailManyParams{
						IDs: []int64{*r.ID}, Tokens: []pgtype.UUID{r.LeaseToken}, Errors: []string{"boom"},
						Permanent: []bool{rng.IntN(2) == 0}, RetryInMs: []int64{0},
					}); err != nil {
						t.Errorf("fail job %d: %v", *r.ID, err)
						return
					}
				}
			}
			for _, verb := range []string{"cancel", "retry"} {
				id := lasting[rng.IntN(len(lasting))]
				if rec := e.do(t, "POST", fmt.Sprintf("/v1/jobs/%d/%s", id, verb), ""); rec.Code != http.StatusOK && rec.Code != http.StatusConflict {
					t.Errorf("%s job %d: %d %s", verb, id, rec.Code, rec.Body)
					return
				}
			}
			if _, err := e.q.JobPrune(ctx, db.JobPruneParams{RetainSucceededMs: new(int64), MaxJobs: 5}); err != nil {
				t.Errorf("prune: %v", err)
				return
			}
		}
	}()

	// Six passes at least, and as many more as it takes for the churn to
	// have run a few rounds while they paged, however fast either goes,
	// unless it failed.
	churning := func() bool {
		select {
		case <-done:
			return false
		default:
			return true
		}
	}
	for pass := 0; pass < 6 || rounds.Load() < 5 && churning(); pass++ {
		query := url.Values{"limit": {"3"}}
		if pass%3 > 0 {
			query.Set("queue", queues[pass%2])
		}
		if pass%3 > 1 || pass == 3 {
			query.Set("kind", kinds[pass%2])
		}
		got := e.pageThrough(t, query, 1000)
		var want []int64
		for i, id := range lasting {
			if (query.Get("queue") == "" || query.Get("queue") == queues[i/2%2]) &&
				(query.Get("kind") == "" || query.Get("kind") == kinds[i%2]) {
				want = append(want, id)
			}
		}
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Errorf("GET /v1/jobs?%s listed ids out of order or twice: %v", query.Encode(), got)
		}
		var listed []int64
		for _, id := range got {
			if isLasting[id] {
				listed = append(listed, id)
			}
		}
		if diff := cmp.Diff(want, listed); diff != "" {
			t.Errorf("GET /v1/jobs?%s listed of the jobs that last (-want +got):\n%s", query.Encode(), diff)
		}
	}
	close(stop)
	<-done
	if n := rounds.Load(); n < 5 {
		t.Errorf("the jobs changed in %d rounds only while the listings paged", n)
	}
}
