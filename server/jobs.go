package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/jobrow"
	"github.com/relayq/relay/internal/jsonb"
	"github.com/relayq/relay/internal/pgerr"
)

// JobSummary is a job as a listing shows it: all of its view but the
// payload, the result and the error history, which can be large and are
// read one job at a time. ErrorCount counts every error ever recorded for
// the job.
type JobSummary struct {
	ID                int64       `json:"id"`
	Queue             string      `json:"queue"`
	Kind              string      `json:"kind"`
	State             db.JobState `json:"state"`
	Priority          int16       `json:"priority"`
	Attempt           int32       `json:"attempt"`
	MaxAttempts       int32       `json:"max_attempts"`
	Fence             int64       `json:"fence"`
	RunAt             time.Time   `json:"run_at"`
	CreatedAt         time.Time   `json:"created_at"`
	StartedAt         *time.Time  `json:"started_at"`
	FinishedAt        *time.Time  `json:"finished_at"`
	LeasedBy          *string     `json:"leased_by"`
	LeaseExpiresAt    *time.Time  `json:"lease_expires_at"`
	CancelRequestedAt *time.Time  `json:"cancel_requested_at"`
	LastError         *string     `json:"last_error"`
	ErrorCount        int32       `json:"error_count"`
}

// NewJobSummary returns the API's summary of s.
func NewJobSummary(s db.JobSummary) JobSummary {
	return JobSummary{
		ID:                s.ID,
		Queue:             s.Queue,
		Kind:              s.Kind,
		State:             s.State,
		Priority:          s.Priority,
		Attempt:           s.Attempt,
		MaxAttempts:       s.MaxAttempts,
		Fence:             s.Fence,
		RunAt:             s.RunAt,
		CreatedAt:         s.CreatedAt,
		StartedAt:         s.StartedAt,
		FinishedAt:        s.FinishedAt,
		LeasedBy:          s.LeasedBy,
		LeaseExpiresAt:    s.LeaseExpiresAt,
		CancelRequestedAt: s.CancelRequestedAt,
		LastError:         s.LastError,
		ErrorCount:        s.ErrorCount,
	}
}

// JobView is a job as the API shows it, and as other tools print it: its
// summary, with its payload, its result and its error history. It leaves
// out the lease token, which only the worker holding the lease may know,
// and the idempotency key. Errors holds the newest entries of the error
// history, oldest first, and ErrorsOmitted counts the older ones it no
// longer holds.
type JobView struct {
	JobSummary
	Payload       json.RawMessage `json:"payload"`
	Errors        json.RawMessage `json:"errors"`
	ErrorsOmitted int32           `json:"errors_omitted"`
	Result        json.RawMessage `json:"result"`
}

// NewJobView returns the API's view of j.
func NewJobView(j db.Job) JobView {
	payload := j.Payload
	if len(payload) == 0 {
		payload = json.RawMessage("null")
	}
	errs := j.Errors
	if len(errs) == 0 {
		errs = json.RawMessage("[]")
	}
	// The database holds errors as an array (jobs_errors_array), whose
	// entries may nest deeper than encoding/json reads.
	kept := jsonb.ArrayLen(errs)
	return JobView{
		JobSummary: JobSummary{
			ID:                j.ID,
			Queue:             j.Queue,
			Kind:              j.Kind,
			State:             j.State,
			Priority:          j.Priority,
			Attempt:           j.Attempt,
			MaxAttempts:       j.MaxAttempts,
			Fence:             j.Fence,
			RunAt:             j.RunAt,
			CreatedAt:         j.CreatedAt,
			StartedAt:         j.StartedAt,
			FinishedAt:        j.FinishedAt,
			LeasedBy:          j.LeasedBy,
			LeaseExpiresAt:    j.LeaseExpiresAt,
			CancelRequestedAt: j.CancelRequestedAt,
			LastError:         j.LastError,
			ErrorCount:        j.ErrorCount,
		},
		Payload:       payload,
		Errors:        errs,
		ErrorsOmitted: max(j.ErrorCount-int32(kept), 0),
		Result:        j.Result,
	}
}

// handlerFunc is an http.HandlerFunc that returns its error for
// handleErrors to write.
type handlerFunc func(w http.ResponseWriter, r *http.Request) error

// handleErrors adapts fn to an http.Handler that writes fn's error, if any,
// with respondError.
func handleErrors(logger *slog.Logger, fn handlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			respondError(logger, w, r, err)
		}
	})
}

// dbContext bounds the database work of a request.
func dbContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), dbTimeout)
}

// handleEnqueue serves POST /v1/jobs: 201 with the new job. With an
// Idempotency-Key header, a repeat of the same request (same kind, queue,
// payload as JSON values, priority and max_attempts; run_at and delay are
// not compared, since a delay is relative to the time of each request)
// returns the original job with 200, and a different request under the same
// key in the same queue is a 409. A request whose key another enqueue is
// storing a job under, still uncommitted, waits for it to commit (then
// 200 or 409) or roll back (then 201), for as long as dbTimeout allows,
// past which it is the 504 of an insert whose answer was lost. A key
// whose job changed hands at every try of client.Insert is a 503 that
// says to try again. Jobs without a key are stored through
// e, together with those of requests that arrive meanwhile. An insert
// whose answer was lost (client.ErrOutcomeUnknown) is a 504: the job may
// have been stored, and only a request with a key is safe to send again.
// One whose statement the database stored fewer jobs of than it was sent,
// as when a trigger on the jobs table drops rows, is a 500 that
// says whether the job may have been stored, and answers with no job, a
// job with a key too.
func handleEnqueue(logger *slog.Logger, dbtx db.DBTX, e *client.Enqueuer, maxBody int64) http.Handler {
	return handleErrors(logger, func(w http.ResponseWriter, r *http.Request) error {
		key, err := idempotencyKey(r)
		if err != nil {
			return err
		}
		body, err := readBody(w, r, maxBody)
		if err != nil {
			return err
		}
		req, err := decodeJob(body)
		if err != nil {
			return err
		}
		spec, err := validateJob(req, key, time.Now())
		if err != nil {
			return err
		}

		ctx, cancel := dbContext(r)
		defer cancel()
		var job db.Job
		var dropped *client.JobsDroppedError
		replayed := false
		if spec.IdempotencyKey == nil {
			job, err = e.Insert(ctx, spec)
		} else {
			job, replayed, err = client.Insert(ctx, dbtx, spec)
		}
		switch {
		case errors.Is(err, client.ErrIdempotencyConflict):
			return conflict("Idempotency-Key", "Idempotency-Key was already used in this queue for a different job")
		case errors.Is(err, client.ErrOutcomeUnknown) && key != nil:
			return outcomeUnknown("the job may have been stored; a retry with the same Idempotency-Key answers with it if it was", err)
		case errors.Is(err, client.ErrOutcomeUnknown):
			return outcomeUnknown("the job may have been stored, and a retry stores it again (a request with an Idempotency-Key can be retried safely)", err)
		case errors.As(err, &dropped):
			if dropped.Stored == 0 {
				return jobsDropped("the job was not stored: a trigger on the jobs table dropped it", err)
			}
			return jobsDropped("the job may have been stored: a trigger on the jobs table dropped some of the jobs stored in one statement with it, and which is not known", err)
		case errors.Is(err, client.ErrIdempotencyRace):
			return &apiError{
				status: http.StatusServiceUnavailable,
				msg:    "the job holding this Idempotency-Key changed while the request ran; try again",
				cause:  err,
			}
		case err != nil:
			return err
		}
		status := http.StatusCreated
		if replayed {
			status = http.StatusOK
		}
		w.Header().Set("Location", "/v1/jobs/"+strconv.FormatInt(job.ID, 10))
		writeJSON(w, status, NewJobView(job))
		return nil
	})
}

// idempotencyKey returns the Idempotency-Key header, or nil without one.
// It is validated with the rest of the request, by validateJob.
func idempotencyKey(r *http.Request) (*string, error) {
	values, ok := r.Header["Idempotency-Key"]
	if !ok {
		return nil, nil
	}
	if len(values) != 1 {
		return nil, badRequest("Idempotency-Key", "Idempotency-Key must be given once")
	}
	key := values[0]
	return &key, nil
}

// batchRequest is the body of POST /v1/jobs/batch.
type batchRequest struct {
	Jobs []json.RawMessage `json:"jobs"`
}

type batchResponse struct {
	IDs []int64 `json:"ids"`
}

// handleEnqueueBatch serves POST /v1/jobs/batch: up to client.MaxBatchJobs jobs,
// each as in POST /v1/jobs, inserted in one statement, all or none. It
// answers 201 with their ids in request order. If any job is invalid the
// whole batch is rejected, naming the first bad one (field "jobs[3].kind").
// Batches take no Idempotency-Key. An insert whose answer was lost is a
// 504, as in handleEnqueue: the jobs may have been stored. One that the
// database stored fewer jobs of than it was sent, as when a trigger or
// rule on the jobs table drops rows, is a 500 that says how many it
// stored, without their ids, which no longer line up with the request.
func handleEnqueueBatch(logger *slog.Logger, dbtx db.DBTX, maxBody int64) http.Handler {
	return handleErrors(logger, func(w http.ResponseWriter, r *http.Request) error {
		if _, ok := r.Header["Idempotency-Key"]; ok {
			return badRequest("Idempotency-Key", "batch requests do not support Idempotency-Key")
		}
		body, err := readBody(w, r, maxBody)
		if err != nil {
			return err
		}
		var batch batchRequest
		if err := decodeStrict(body, &batch, []string{"jobs"}); err != nil {
			return err
		}
		switch n := len(batch.Jobs); {
		case n == 0:
			return badRequest("jobs", "jobs must hold at least one job")
		case n > client.MaxBatchJobs:
			return badRequest("jobs", "jobs must hold at most %d jobs, not %d", client.MaxBatchJobs, n)
		}

		now := time.Now()
		jobs := make([]client.Job, 0, len(batch.Jobs))
		for i, raw := range batch.Jobs {
			job, err := batchJob(raw, now)
			if err != nil {
				return inBatch(i, err)
			}
			jobs = append(jobs, job)
		}

		ctx, cancel := dbContext(r)
		defer cancel()
		ids, err := client.InsertMany(ctx, dbtx, jobs)
		if errors.Is(err, client.ErrOutcomeUnknown) {
			return outcomeUnknown("the jobs may have been stored, and a retry may store them again", err)
		}
		if dropped := (*client.JobsDroppedError)(nil); errors.As(err, &dropped) {
			if dropped.Stored == 0 {
				return jobsDropped("no job was stored: a trigger on the jobs table dropped them", err)
			}
			return jobsDropped(fmt.Sprintf("the database stored %d of the %d jobs, and a trigger on the jobs table dropped the others: those stored are committed, and which they are is not known", dropped.Stored, dropped.Sent), err)
		}
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusCreated, batchResponse{IDs: ids})
		return nil
	})
}

func batchJob(raw json.RawMessage, now time.Time) (client.Job, error) {
	if len(raw) == 0 || raw[0] != '{' {
		return client.Job{}, badRequest("", "each job must be a JSON object")
	}
	req, err := decodeJob(raw)
	if err != nil {
		return client.Job{}, err
	}
	return validateJob(req, nil, now)
}

// inBatch places the error of the i-th job of a batch.
func inBatch(i int, err error) error {
	var ae *apiError
	if !errors.As(err, &ae) {
		return err
	}
	prefix := fmt.Sprintf("jobs[%d]", i)
	out := *ae
	out.msg = prefix + ": " + ae.msg
	if ae.field == "" {
		out.field = prefix
	} else {
		out.field = prefix + "." + ae.field
	}
	return &out
}

// jobID parses the {id} of the path: a positive int64 in decimal digits.
func jobID(r *http.Request) (int64, error) {
	id, ok := parseDigits(r.PathValue("id"))
	if !ok || id <= 0 {
		return 0, badRequest("id", "job id must be a whole number from 1 to %d", int64(math.MaxInt64))
	}
	return id, nil
}

// jobNotFound is the 404 for an id that names no job, which says whether
// the id was ever issued: a job that finished is deleted once its
// retention passes, and its id then names nothing, as does one never
// enqueued. An id issued also names nothing yet while the transaction that
// stores its job is open, as a client.Tx whose caller hands the id on
// before it commits. A role that may not read the jobs' id sequence, which
// JobIDIssued reads, still gets its 404, saying that this is unknown.
func jobNotFound(ctx context.Context, queries *db.Queries, id int64) error {
	seq, err := queries.JobIDIssued(ctx, id)
	if err != nil {
		return fmt.Errorf("job %d not found, and whether its id was issued is unknown: %w", id, err)
	}
	switch {
	case !seq.Known:
		return notFound(fmt.Sprintf("job %d not found: whether its id was ever issued is unknown "+
			"(this role may not read the jobs' id sequence)", id))
	case seq.Issued:
		return notFound(fmt.Sprintf("job %d not found: it finished and was deleted once its retention passed "+
			"(the workers' --retain-succeeded, --retain-dead and --retain-cancelled), its enqueue has not committed yet, "+
			"or no job took this id (its enqueue was rolled back, or was an idempotent replay)", id))
	}
	return notFound(fmt.Sprintf("job %d not found: no job with this id was ever enqueued", id))
}

// handleGetJob serves GET /v1/jobs/{id}: 404 for a job deleted after its
// retention, with a message that says so.
func handleGetJob(logger *slog.Logger, queries *db.Queries) http.Handler {
	return handleErrors(logger, func(w http.ResponseWriter, r *http.Request) error {
		id, err := jobID(r)
		if err != nil {
			return err
		}
		ctx, cancel := dbContext(r)
		defer cancel()
		job, err := queries.JobGet(ctx, id)
		if errors.Is(err, pgx.ErrNoRows) {
			return jobNotFound(ctx, queries, id)
		}
		if err != nil {
			return fmt.Errorf("get job %d: %w", id, err)
		}
		writeJSON(w, http.StatusOK, NewJobView(job))
		return nil
	})
}

type listResponse struct {
	Jobs []JobSummary `json:"jobs"`
	// Next is the cursor of the next page, to pass as after, or null on the
	// last page.
	Next *string `json:"next"`
}

// handleListJobs serves GET /v1/jobs?queue=&state=&kind=&limit=&after=,
// the summaries of jobs in id order a page at a time. Empty parameters are
// ignored. limit, in decimal digits as after is, defaults to
// DefaultListLimit; above MaxListLimit it is a 400. after is the next
// cursor of the previous page.
func handleListJobs(logger *slog.Logger, queries *db.Queries) http.Handler {
	return handleErrors(logger, func(w http.ResponseWriter, r *http.Request) error {
		filter, limit, err := listParams(r)
		if err != nil {
			return err
		}
		ctx, cancel := dbContext(r)
		defer cancel()
		jobs, err := listJobs(ctx, queries, filter)
		if err != nil {
			return fmt.Errorf("list jobs: %w", err)
		}
		resp := listResponse{Jobs: make([]JobSummary, 0, min(len(jobs), limit))}
		if len(jobs) > limit {
			jobs = jobs[:limit]
			next := strconv.FormatInt(jobs[limit-1].ID, 10)
			resp.Next = &next
		}
		for _, j := range jobs {
			resp.Jobs = append(resp.Jobs, NewJobSummary(j))
		}
		writeJSON(w, http.StatusOK, resp)
		return nil
	})
}

// listFilter is what a job listing asks for: up to maxJobs jobs with an id
// above afterID, of the queue, kind and state given (nil for any).
type listFilter struct {
	afterID int64
	maxJobs int32
	queue   *string
	kind    *string
	state   *db.JobState
}

// listJobs runs the statement of queries/jobs.sql that serves f's filters,
// one for each combination of them, each through the index made for it.
func listJobs(ctx context.Context, queries *db.Queries, f listFilter) ([]db.JobSummary, error) {
	switch {
	case f.queue != nil && f.kind != nil && f.state != nil:
		return queries.JobListByQueueKindState(ctx, db.JobListByQueueKindStateParams{
			Queue: *f.queue, Kind: *f.kind, State: *f.state, AfterID: f.afterID, MaxJobs: f.maxJobs})
	case f.queue != nil && f.kind != nil:
		return queries.JobListByQueueKind(ctx, db.JobListByQueueKindParams{
			Queue: *f.queue, Kind: *f.kind, AfterID: f.afterID, MaxJobs: f.maxJobs})
	case f.queue != nil && f.state != nil:
		return queries.JobListByQueueState(ctx, db.JobListByQueueStateParams{
			Queue: *f.queue, State: *f.state, AfterID: f.afterID, MaxJobs: f.maxJobs})
	case f.queue != nil:
		return queries.JobListByQueue(ctx, db.JobListByQueueParams{
			Queue: *f.queue, AfterID: f.afterID, MaxJobs: f.maxJobs})
	case f.kind != nil && f.state != nil:
		return queries.JobListByKindState(ctx, db.JobListByKindStateParams{
			Kind: *f.kind, State: *f.state, AfterID: f.afterID, MaxJobs: f.maxJobs})
	case f.kind != nil:
		return queries.JobListByKind(ctx, db.JobListByKindParams{
			Kind: *f.kind, AfterID: f.afterID, MaxJobs: f.maxJobs})
	case f.state != nil:
		return queries.JobListByState(ctx, db.JobListByStateParams{
			State: *f.state, AfterID: f.afterID, MaxJobs: f.maxJobs})
	default:
		return queries.JobList(ctx, db.JobListParams{AfterID: f.afterID, MaxJobs: f.maxJobs})
	}
}

// listParameters are the parameters a job listing takes.
var listParameters = []string{"state", "queue", "kind", "limit", "after"}

// queryParams parses the query string of r, and refuses a parameter not in
// known (none, for most routes) rather than ignore it: a misspelt filter
// would answer with other jobs than those asked for, and POST
// /v1/jobs?queue=emails would store its job in the default queue. The
// first unknown parameter, in sorted order, is named.
func queryParams(r *http.Request, known []string) (url.Values, *apiError) {
	query, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return nil, badRequest("", "the query string is malformed: %v", err)
	}
	for _, name := range slices.Sorted(maps.Keys(query)) {
		if !slices.Contains(known, name) {
			takes := "no query parameters"
			if len(known) > 0 {
				takes = strings.Join(known, ", ")
			}
			return nil, badRequest(name, "unknown parameter %q: %s takes %s", name, r.Pattern, takes)
		}
	}
	return query, nil
}

// parseDigits parses s, decimal digits alone (no sign, no space), as a
// non-negative int64.
func parseDigits(s string) (int64, bool) {
	if s == "" || strings.TrimLeft(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// listParams parses the query of a job listing. It asks for one job more
// than the limit, to know whether there is a next page. A parameter it
// does not know, or a query it cannot parse, is refused (queryParams).
func listParams(r *http.Request) (listFilter, int, error) {
	query, qerr := queryParams(r, listParameters)
	if qerr != nil {
		return listFilter{}, 0, qerr
	}
	get := func(name string) (string, error) {
		if len(query[name]) > 1 {
			return "", badRequest(name, "%s must be given at most once", name)
		}
		return query.Get(name), nil
	}
	var p listFilter
	limit := DefaultListLimit

	if s, err := get("limit"); err != nil {
		return p, 0, err
	} else if s != "" {
		n, ok := parseDigits(s)
		if !ok || n < 1 || n > MaxListLimit {
			return p, 0, badRequest("limit", "limit must be an integer from 1 to %d", MaxListLimit)
		}
		limit = int(n)
	}
	if s, err := get("after"); err != nil {
		return p, 0, err
	} else if s != "" {
		n, ok := parseDigits(s)
		if !ok {
			return p, 0, badRequest("after", "after must be the next cursor of a previous page")
		}
		p.afterID = n
	}
	if s, err := get("state"); err != nil {
		return p, 0, err
	} else if s != "" {
		state := db.JobState(s)
		if !state.Valid() {
			return p, 0, badRequest("state", "state must be one of available, running, succeeded, dead, cancelled")
		}
		p.state = &state
	}
	for _, f := range []struct {
		name string
		dst  **string
	}{{"queue", &p.queue}, {"kind", &p.kind}} {
		s, err := get(f.name)
		if err != nil {
			return p, 0, err
		}
		if s == "" {
			continue
		}
		if err := checkName(f.name, s); err != nil {
			return p, 0, err
		}
		*f.dst = &s
	}
	p.maxJobs = int32(limit + 1)
	return p, limit, nil
}

// handleCancelJob serves POST /v1/jobs/{id}/cancel: an available job is
// cancelled at once; a running one is marked (cancel_requested_at), its
// worker cancels its handler's context at its next heartbeat, and the job
// stays running until the handler returns: cancelled if it returns an
// error, succeeded if it returns success all the same. 409 for a job that
// has already finished.
func handleCancelJob(logger *slog.Logger, pool *pgxpool.Pool) http.Handler {
	return handleTransition(logger, pool, "cancel",
		"GET the job to see its state; sending the cancel again is safe, and answers 409 if the job is already cancelled or finished",
		(*db.Queries).JobCancel)
}

// handleRetryJob serves POST /v1/jobs/{id}/retry: a dead or cancelled job
// becomes available again at once with a fresh set of attempts. 409 for a
// job in any other state.
func handleRetryJob(logger *slog.Logger, pool *pgxpool.Pool) http.Handler {
	return handleTransition(logger, pool, "retry",
		"GET the job to see its state before sending the retry again: a job retried that has run and failed since would be retried once more",
		func(q *db.Queries, ctx context.Context, id int64) (db.JobCancelRow, error) {
			row, err := q.JobRetry(ctx, id)
			return db.JobCancelRow(row), err
		})
}

// transitionDone, when not nil, runs once the statement of a cancel or a
// retry has returned, before the answer is made: tests set it to change
// the job at that moment (export_test.go). It is nil in production.
var transitionDone func(id int64)

// handleTransition runs a state change, JobCancel or JobRetry (whose rows
// have the same columns), which returns no row for a missing job, and the
// job as it found it, locked, when its state does not allow the change:
// the 409 then names the state the change was refused for, whatever a
// concurrent change has made of the job since.
//
// The statement commits on its own, so an answer lost after it was sent
// (pgerr.AnswerLost) leaves the change unknown: that is a 504 whose
// message, lost, says what to do. The connection is taken from the pool
// first, so that a wait for one that runs out, before anything is sent,
// is a 503 (nothing changed) and not mistaken for a lost answer.
func handleTransition(logger *slog.Logger, pool *pgxpool.Pool, verb, lost string, change func(*db.Queries, context.Context, int64) (db.JobCancelRow, error)) http.Handler {
	return handleErrors(logger, func(w http.ResponseWriter, r *http.Request) error {
		id, err := jobID(r)
		if err != nil {
			return err
		}
		ctx, cancel := dbContext(r)
		defer cancel()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("%s job %d: acquire a connection: %w", verb, id, errors.Join(errUnavailable, err))
		}
		defer conn.Release()
		queries := db.New(conn)
		row, err := change(queries, ctx, id)
		if transitionDone != nil {
			transitionDone(id)
		}
		if errors.Is(err, pgx.ErrNoRows) {
			return jobNotFound(ctx, queries, id)
		}
		if pgerr.AnswerLost(err) {
			return outcomeUnknown(fmt.Sprintf("the %s may have been applied; %s", verb, lost), err)
		}
		if err != nil {
			return fmt.Errorf("%s job %d: %w", verb, id, err)
		}
		if !row.Applied {
			return conflict("", fmt.Sprintf("cannot %s a job that is %s", verb, row.State))
		}
		writeJSON(w, http.StatusOK, NewJobView(jobrow.OfTransition(row)))
		return nil
	})
}
