package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/pgbouncer"
)

// TestEnqueuer_AnInsertThatGivesUpBeforeItsJobIsTakenStoresNothing holds
// every flusher busy while a caller's context ends: its Insert returns
// the context's error, and the next statement leaves its job out.
func TestEnqueuer_AnInsertThatGivesUpBeforeItsJobIsTakenStoresNothing(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	enq := NewEnqueuer(pool, EnqueuerConfig{AnnounceEvery: -1})
	job := func(kind string) Job {
		j, err := Validate(Request{Kind: kind}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	enq.mu.Lock()
	enq.flushing, enq.flushed = maxFlushers, make(chan struct{}) // as if every flusher were storing a group
	enq.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := enq.Insert(ctx, job("abandoned")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("insert with every flusher busy: %v, want the context's deadline", err)
	}
	enq.mu.Lock()
	enq.flushing, enq.flushed = 0, nil
	enq.mu.Unlock()
	stored, err := enq.Insert(context.Background(), job("next"))
	if err != nil || stored.Kind != "next" {
		t.Fatalf("next insert: %+v, %v", stored, err)
	}
	var kinds string
	if err := pool.QueryRow(context.Background(), `SELECT string_agg(kind, ',' ORDER BY id) FROM jobs`).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	if kinds != "next" {
		t.Errorf("jobs stored: %s, want only next", kinds)
	}
	// The flusher counts itself out once it finds nothing more to store.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		enq.mu.Lock()
		pending, flushing := len(enq.pending), enq.flushing
		enq.mu.Unlock()
		if pending == 0 && flushing == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the last insert: %d pending, %d flushing; want none", pending, flushing)
		}
	}
}

// TestEnqueuer_AGroupHoldsAtMostMaxGroupBytes queues five jobs of 3 MiB
// payloads before any flusher runs: they are stored two, two and one to a
// statement, none of more than maxGroupBytes, and a job larger than that
// alone still gets a statement of its own.
func TestEnqueuer_AGroupHoldsAtMostMaxGroupBytes(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	enq := NewEnqueuer(pool, EnqueuerConfig{AnnounceEvery: -1})
	job := func(kind string, payloadBytes int) Job {
		payload := `"` + strings.Repeat("x", payloadBytes-2) + `"`
		j, err := Validate(Request{Kind: kind, Payload: json.RawMessage(payload)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	jobs := []Job{
		job("a", 3<<20), job("b", 3<<20), job("c", 3<<20), job("d", 3<<20), job("e", 3<<20),
		job("huge", maxGroupBytes+1),
	}
	enq.mu.Lock()
	enq.flushing, enq.flushed = maxFlushers, make(chan struct{}) // as if every flusher were storing a group
	enq.mu.Unlock()
	errs := make(chan error, len(jobs))
	for i, j := range jobs {
		go func() {
			_, err := enq.Insert(context.Background(), j)
			errs <- err
		}()
		// Queued in order.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			enq.mu.Lock()
			queued := len(enq.pending)
			enq.mu.Unlock()
			if queued == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d jobs queued, want %d", queued, i+1)
			}
		}
	}
	enq.mu.Lock()
	enq.flushing = 1 // the one flush below; flushed is still open
	enq.mu.Unlock()
	go enq.flush()
	for range jobs {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(context.Background(), `
		SELECT string_agg(kind, '' ORDER BY id), sum(octet_length(payload::text))
		FROM jobs GROUP BY xmin::text ORDER BY min(id)`)
	if err != nil {
		t.Fatal(err)
	}
	var statements []string
	for rows.Next() {
		var kinds string
		var bytes int64
		if err := rows.Scan(&kinds, &bytes); err != nil {
			t.Fatal(err)
		}
		statements = append(statements, kinds)
		if bytes > maxGroupBytes && kinds != "huge" {
			t.Errorf("statement storing %s held %d payload bytes, more than %d", kinds, bytes, maxGroupBytes)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"ab", "cd", "e", "huge"}; !slices.Equal(statements, want) {
		t.Errorf("jobs stored by statement: %v, want %v", statements, want)
	}
}

// TestEnqueuer_AGroupAPoolerGaveUpOnIsNotStoredAgain stores a group through
// PgBouncer in transaction mode whose query_timeout ends the wait for a
// slow commit: PgBouncer answers with an error of its own (08P01) while
// the server goes on to commit the group. Each request gets that error as
// ErrOutcomeUnknown, and the group's jobs are stored once, not replayed
// one by one beside it.
func TestEnqueuer_AGroupAPoolerGaveUpOnIsNotStoredAgain(t *testing.T) {
	t.Parallel()
	dsn := dbtest.NewURL(t)
	direct := dbtest.Connect(t, dsn)
	dbtest.SlowCommits(t, direct, 3*time.Second)
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	bouncer := pgbouncer.ForTest(t, dsn, pgbouncer.Options{PoolMode: pgbouncer.PoolModeTransaction, QueryTimeout: time.Second})
	cfg, err := pgxpool.ParseConfig(bouncer.URL(strings.TrimPrefix(u.Path, "/")))
	if err != nil {
		t.Fatal(err)
	}
	// As relay serve runs behind a transaction-mode pooler.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
	pooled, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pooled.Close)

	group := make([]*pendingJob, 3)
	for i := range group {
		payload := `{}`
		if i == 0 {
			payload = dbtest.SlowCommitPayload
		}
		job, err := Validate(Request{Kind: fmt.Sprintf("k%d", i), Payload: json.RawMessage(payload)}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		group[i] = &pendingJob{job: job, done: make(chan stored, 1)}
	}
	NewEnqueuer(pooled, EnqueuerConfig{AnnounceEvery: -1}).store(group)
	for i, p := range group {
		if s := <-p.done; !errors.Is(s.err, ErrOutcomeUnknown) {
			t.Errorf("job %d: stored as job %d with error %v, want ErrOutcomeUnknown for the pooler's error", i, s.job.ID, s.err)
		}
	}
	// The server committed the group after PgBouncer gave up on it.
	deadline := time.Now().Add(10 * time.Second)
	for dbtest.CountJobs(t, direct) < len(group) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	var kinds string
	if err := direct.QueryRow(context.Background(), `SELECT string_agg(kind, ',' ORDER BY kind) FROM jobs`).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	if kinds != "k0,k1,k2" {
		t.Errorf("jobs stored: %s, want k0,k1,k2, each once", kinds)
	}
}

// TestRefusedAValue_IsTheServersRefusalOfAValueOnly specifies which
// errors have a group stored again one job at a time: PostgreSQL refusing
// a value, raised before the statement commits, and nothing that could
// come after a commit.
func TestRefusedAValue_IsTheServersRefusalOfAValueOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"a check constraint", &pgconn.PgError{Code: "23514"}, true},
		{"a unique violation", &pgconn.PgError{Code: "23505"}, true},
		{"a value out of range", &pgconn.PgError{Code: "22003"}, true},
		{"a NUL in a string", &pgconn.PgError{Code: "22P05"}, true},
		{"a statement too large", &pgconn.PgError{Code: "54000"}, true},
		{"a statement too complex", &pgconn.PgError{Code: "54001"}, true},
		{"wrapped", fmt.Errorf("insert 3 jobs: %w", &pgconn.PgError{Code: "23514"}), true},
		{"too many connections", &pgconn.PgError{Code: "53300"}, false},
		{"a pooler's protocol error", &pgconn.PgError{Code: "08P01"}, false},
		{"a query cancelled", &pgconn.PgError{Code: "57014"}, false},
		{"a serialization failure", &pgconn.PgError{Code: "40001"}, false},
		{"a deadline", context.DeadlineExceeded, false},
		{"no error", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := RefusedAValue(tc.err); got != tc.want {
				t.Errorf("RefusedAValue(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestEnqueuer_AGroupWithAJobTheDatabaseRefusesIsStoredOneJobAtATime
// stores a group of three whose second job a constraint refuses: the
// statement stores nothing, so each job is stored alone, and only the
// refused one fails.
func TestEnqueuer_AGroupWithAJobTheDatabaseRefusesIsStoredOneJobAtATime(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	forbidKind(t, pool)
	kinds := []string{"k0", "forbidden", "k2"}
	group := groupOf(t, kinds, func(kind string) Request { return Request{Kind: kind} })
	NewEnqueuer(pool, EnqueuerConfig{AnnounceEvery: -1}).store(group)
	wantOnlyForbiddenRefused(t, kinds, group)
	var stored, statements int
	if err := pool.QueryRow(t.Context(), `SELECT count(*), count(DISTINCT xmin::text) FROM jobs`).Scan(&stored, &statements); err != nil {
		t.Fatal(err)
	}
	if stored != 2 || statements != 2 {
		t.Errorf("%d jobs stored by %d statements, want 2 by 2: one each", stored, statements)
	}
}

// TestEnqueuer_TheJobsOfARefusedGroupAreStoredEachInItsOwnTimeAndSpaced
// has the database refuse a group of five jobs for one of them, with a
// commit that takes 150 ms and a StoreTimeout of 400 ms. Each of the four
// others is stored alone within a StoreTimeout of its own, though the
// five take longer than one, and their notifications keep the spacing
// the refused statement began: owed, and sent together at Close.
func TestEnqueuer_TheJobsOfARefusedGroupAreStoredEachInItsOwnTimeAndSpaced(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	forbidKind(t, pool)
	dbtest.SlowCommits(t, pool, 150*time.Millisecond)
	listener, _ := dbtest.Listen(t, pool, "spaced")
	queue := "spaced"
	kinds := []string{"forbidden", "k1", "k2", "k3", "k4"}
	group := groupOf(t, kinds, func(kind string) Request {
		return Request{Kind: kind, Queue: &queue, Payload: json.RawMessage(`{"slow_commit": true}`)}
	})
	enq := NewEnqueuer(pool, EnqueuerConfig{AnnounceEvery: time.Hour, StoreTimeout: 400 * time.Millisecond})
	enq.store(group)
	wantOnlyForbiddenRefused(t, kinds, group)
	// The refused statement was to notify, and began the spacing.
	if heard := dbtest.Heard(t, t.Context(), listener); len(heard) != 0 {
		t.Errorf("heard %d notifications of the four jobs stored within an hour's spacing, want none yet", len(heard))
	}
	enq.Close(t.Context())
	if heard := dbtest.Heard(t, t.Context(), listener); len(heard) != 1 {
		t.Errorf("heard %d notifications once the Enqueuer closed, want 1 for the queue", len(heard))
	}
}

// TestEnqueuer_AJobOfARefusedGroupThatFailsOtherwiseStopsTheRest has the
// database refuse a group for one job (a constraint), so that its jobs are
// stored one at a time, and then fail one of them for another reason (an
// error a trigger raises, as a database that stops answering would fail
// it): the jobs after that one fail at once, unsent, and are not stored.
func TestEnqueuer_AJobOfARefusedGroupThatFailsOtherwiseStopsTheRest(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	forbidKind(t, pool)
	breakKind(t, pool)
	kinds := []string{"forbidden", "k1", "broken", "k3", "k4"}
	group := groupOf(t, kinds, func(kind string) Request { return Request{Kind: kind} })
	NewEnqueuer(pool, EnqueuerConfig{AnnounceEvery: -1}).store(group)
	var got []string
	for i, p := range group {
		s := <-p.done
		switch {
		case s.err == nil:
			got = append(got, kinds[i]+": stored")
		case strings.Contains(s.err.Error(), "not sent"):
			got = append(got, kinds[i]+": not sent")
		default:
			got = append(got, kinds[i]+": failed")
		}
	}
	want := []string{"forbidden: failed", "k1: stored", "broken: failed", "k3: not sent", "k4: not sent"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
	var stored []string
	rows, _ := pool.Query(t.Context(), `SELECT kind FROM jobs ORDER BY id`)
	for rows.Next() {
		var kind string
		if err := rows.Scan(&kind); err != nil {
			t.Fatal(err)
		}
		stored = append(stored, kind)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(stored, []string{"k1"}) {
		t.Errorf("stored %q, want only k1", stored)
	}
}

// TestEnqueuer_AGroupTheDatabaseFailsOwesNoNotification spaces the
// notifications an hour apart and has the database fail a group stored
// within the spacing for another reason than a refusal (an error a
// trigger raises), which rolled it back: its queue is owed nothing, and
// Close, which sends what is owed, wakes none of its workers.
func TestEnqueuer_AGroupTheDatabaseFailsOwesNoNotification(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	breakKind(t, pool)
	queue := "failed"
	listener, _ := dbtest.Listen(t, pool, queue)
	enq := NewEnqueuer(pool, EnqueuerConfig{AnnounceEvery: time.Hour})
	// Announced at its commit, it begins the spacing.
	enq.store(groupOf(t, []string{"first"}, func(kind string) Request { return Request{Kind: kind} }))
	kinds := []string{"broken", "k1"}
	group := groupOf(t, kinds, func(kind string) Request { return Request{Kind: kind, Queue: &queue} })
	enq.store(group)
	for i, p := range group {
		if s := <-p.done; s.err == nil || RefusedAValue(s.err) || errors.Is(s.err, ErrOutcomeUnknown) {
			t.Errorf("%s: stored %+v, %v; want the trigger's error", kinds[i], s.job, s.err)
		}
	}
	enq.Close(t.Context())
	if heard := dbtest.Heard(t, t.Context(), listener); len(heard) != 0 {
		t.Errorf("heard %d notifications on %s, where nothing was stored, want none", len(heard), queue)
	}
	if n := dbtest.CountJobs(t, pool); n != 1 {
		t.Errorf("%d jobs stored, want only the first", n)
	}
}

// TestEnqueuer_AGroupATriggerThinnedOwesANotificationForWhatItStored: a
// group of which a trigger dropped some jobs committed the others, whose
// queue's workers are still told of them.
func TestEnqueuer_AGroupATriggerThinnedOwesANotificationForWhatItStored(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	dbtest.DropJobsOfKind(t, pool)
	queue := "thinned"
	listener, _ := dbtest.Listen(t, pool, queue)
	enq := NewEnqueuer(pool, EnqueuerConfig{AnnounceEvery: time.Hour})
	// Announced at its commit, it begins the spacing.
	enq.store(groupOf(t, []string{"first"}, func(kind string) Request { return Request{Kind: kind} }))
	group := groupOf(t, []string{"kept", dbtest.DroppedKind}, func(kind string) Request { return Request{Kind: kind, Queue: &queue} })
	if err := enq.store(group); !errors.Is(err, ErrJobsDropped) {
		t.Fatalf("the group's statement failed with %v, want ErrJobsDropped", err)
	}
	enq.Close(t.Context())
	if heard := dbtest.Heard(t, t.Context(), listener); len(heard) != 1 {
		t.Errorf("heard %d notifications on %s, where a job was stored, want one", len(heard), queue)
	}
}

// TestEnqueuer_AJobLeftUnsentBehindALostAnswerIsNotErrOutcomeUnknown
// stores a refused group one job at a time, and loses the answer of the
// second, whose commit outlasts the StoreTimeout and lands all the same:
// that job's error is ErrOutcomeUnknown, and the one left unsent behind
// it gets an error that is not, since nothing of it was stored.
func TestEnqueuer_AJobLeftUnsentBehindALostAnswerIsNotErrOutcomeUnknown(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	forbidKind(t, pool)
	const timeout = 300 * time.Millisecond
	dbtest.SlowCommitsPastCancels(t, pool, 3*timeout)
	kinds := []string{"forbidden", "slow", "k3"}
	var errs []error
	dbtest.LoseASlowCommitsAnswer(t, pool, func() error {
		group := groupOf(t, kinds, func(kind string) Request {
			if kind == "slow" {
				return Request{Kind: kind, Payload: json.RawMessage(dbtest.SlowCommitPayload)}
			}
			return Request{Kind: kind}
		})
		NewEnqueuer(pool, EnqueuerConfig{AnnounceEvery: -1, StoreTimeout: timeout}).store(group)
		errs = make([]error, len(group))
		for i, p := range group {
			errs[i] = (<-p.done).err
		}
		return errs[1]
	})
	if !RefusedAValue(errs[0]) {
		t.Errorf("forbidden: %v, want the database's refusal", errs[0])
	}
	if !errors.Is(errs[1], ErrOutcomeUnknown) {
		t.Errorf("slow: %v, want ErrOutcomeUnknown", errs[1])
	}
	if errs[2] == nil || errors.Is(errs[2], ErrOutcomeUnknown) || !strings.Contains(errs[2].Error(), "not sent") {
		t.Errorf("k3: %v, want an error saying that it was not sent, not ErrOutcomeUnknown", errs[2])
	}
	var stored string
	if err := pool.QueryRow(t.Context(), `SELECT string_agg(kind, ',' ORDER BY id) FROM jobs`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if stored != "slow" {
		t.Errorf("jobs stored: %s, want only slow, whose answer was lost", stored)
	}
}

// forbidKind makes the database refuse every job of kind "forbidden", by
// a constraint named no_forbidden.
func forbidKind(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `ALTER TABLE jobs ADD CONSTRAINT no_forbidden CHECK (kind <> 'forbidden')`); err != nil {
		t.Fatal(err)
	}
}

// breakKind has a trigger fail the insert of a job of kind "broken" with
// an error raised, as a database that stops answering would fail it, not
// a value refused.
func breakKind(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	if _, err := pool.Exec(t.Context(), `
		CREATE FUNCTION test_broken() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.kind = 'broken' THEN RAISE EXCEPTION 'broken on purpose'; END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER test_broken BEFORE INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION test_broken()`); err != nil {
		t.Fatal(err)
	}
}

// groupOf makes a group of jobs for an Enqueuer to store, one of each
// kind, each asked for as request says.
func groupOf(t *testing.T, kinds []string, request func(kind string) Request) []*pendingJob {
	t.Helper()
	group := make([]*pendingJob, len(kinds))
	for i, kind := range kinds {
		job, err := Validate(request(kind), time.Now())
		if err != nil {
			t.Fatal(err)
		}
		group[i] = &pendingJob{job: job, done: make(chan stored, 1)}
	}
	return group
}

// wantOnlyForbiddenRefused fails the test unless every job of the group
// stored was stored as asked, but those of kind "forbidden", which
// no_forbidden refused (see forbidKind).
func wantOnlyForbiddenRefused(t *testing.T, kinds []string, group []*pendingJob) {
	t.Helper()
	for i, p := range group {
		s := <-p.done
		var pgErr *pgconn.PgError
		refused := errors.As(s.err, &pgErr) && pgErr.ConstraintName == "no_forbidden"
		if want := kinds[i] == "forbidden"; refused != want || !want && (s.err != nil || s.job.Kind != kinds[i]) {
			t.Errorf("job %d (%s): stored %+v, %v", i, kinds[i], s.job, s.err)
		}
	}
}

// TestInsertAll_UnannouncedIsHeardOnlyOnceItsQueuesAreAnnounced specifies
// the store an Enqueuer makes while it owes notifications: a group stored
// unannounced is not heard at its commit, its queues announced after it
// are, once each, and a queue whose job is not yet due is not.
func TestInsertAll_UnannouncedIsHeardOnlyOnceItsQueuesAreAnnounced(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	ctx := t.Context()
	listeners := map[string]*pgx.Conn{}
	for _, q := range []string{"a", "b", "later"} {
		listeners[q], _ = dbtest.Listen(t, pool, q)
	}
	job := func(queue string, delay time.Duration) Job {
		j, err := Validate(Request{Kind: "k", Queue: &queue, Delay: &delay}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	stored, err := insertAll(ctx, pool, []Job{job("a", 0), job("a", 0), job("b", 0), job("later", time.Hour)}, false)
	if err != nil {
		t.Fatal(err)
	}
	heard := func(when string, want map[string]int) {
		t.Helper()
		for q, n := range want {
			if got := len(dbtest.Heard(t, ctx, listeners[q])); got != n {
				t.Errorf("%s: queue %s heard %d notifications, want %d", when, q, got, n)
			}
		}
	}
	heard("at the commit", map[string]int{"a": 0, "b": 0, "later": 0})
	var due dueQueues
	for _, j := range stored {
		due.add(j.Queue, j.RunAt)
	}
	if err := due.announce(ctx, pool); err != nil {
		t.Fatal(err)
	}
	heard("once announced", map[string]int{"a": 1, "b": 1, "later": 0})
}

// TestEnqueuer_AGroupATriggerThinnedAnswersNoCallerWithAJob stores a group
// of three callers' jobs, the second of which a BEFORE INSERT trigger of
// the user's drops: the two others are stored, but which callers they
// belong to is not known, so none is answered with a job, and each is
// told how many of the group were stored and that they are committed. A
// job that arrives alone and is dropped is told that it was not stored.
func TestEnqueuer_AGroupATriggerThinnedAnswersNoCallerWithAJob(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	dbtest.DropJobsOfKind(t, pool)
	enq := NewEnqueuer(pool, EnqueuerConfig{AnnounceEvery: -1})
	pending := func(kinds ...string) []*pendingJob {
		var group []*pendingJob
		for _, kind := range kinds {
			j, err := Validate(Request{Kind: kind}, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			p := &pendingJob{job: j, done: make(chan stored, 1)}
			p.state.Store(jobTaken)
			group = append(group, p)
		}
		return group
	}
	for _, tt := range []struct {
		kinds []string
		want  JobsDroppedError
	}{
		{[]string{"first", dbtest.DroppedKind, "third"}, JobsDroppedError{Stored: 2, Sent: 3, Committed: true}},
		{[]string{dbtest.DroppedKind}, JobsDroppedError{Stored: 0, Sent: 1, Committed: true}},
	} {
		group := pending(tt.kinds...)
		if err := enq.store(group); !errors.Is(err, ErrJobsDropped) {
			t.Errorf("%v: the group's statement failed with %v, want ErrJobsDropped", tt.kinds, err)
		}
		for i, p := range group {
			s := <-p.done
			var dropped *JobsDroppedError
			if !errors.As(s.err, &dropped) || *dropped != tt.want {
				t.Errorf("%v: caller %d answered %v; want %+v", tt.kinds, i, s.err, tt.want)
			}
			if s.job.ID != 0 {
				t.Errorf("%v: caller %d answered with job %d, with its error", tt.kinds, i, s.job.ID)
			}
		}
	}
	var kinds string
	if err := pool.QueryRow(t.Context(), `SELECT string_agg(kind, ',' ORDER BY id) FROM jobs`).Scan(&kinds); err != nil {
		t.Fatal(err)
	}
	if kinds != "first,third" {
		t.Errorf("jobs stored: %s, want first,third", kinds)
	}
}
