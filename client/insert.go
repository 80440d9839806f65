package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/jsonb"
)

// ErrIdempotencyConflict is returned by Insert when the job's idempotency
// key was used already in its queue, by a different job.
var ErrIdempotencyConflict = errors.New("idempotency key was already used in this queue for a different job")

// ErrIdempotencyRace is returned by Insert when the job holding the key was
// deleted each time between the insert that found the key taken and the
// read of that job, and another job took the key again before Insert's own
// insert. Trying again is safe. In a transaction in which Insert cannot
// set a savepoint (see Insert), it is also the error of a job that a
// trigger drops.
var ErrIdempotencyRace = errors.New("the job holding this idempotency key changed while the enqueue ran; try again")

// idempotencyAttempts bounds how often Insert retries when its insert found
// the key taken but the job holding it was gone by the time it was read,
// and the key was taken again by the time it inserted once more.
const idempotencyAttempts = 3

// Insert stores job (JobInsert) and returns it, with replayed false. With
// an idempotency key the queue already holds, it stores nothing: if the job
// holding the key is the same job (same kind, queue, payload as JSON
// values, priority and max_attempts; run_at and delay are not compared,
// since a delay is relative to each request), it returns that job with
// replayed true, and otherwise ErrIdempotencyConflict. dbtx may be a
// transaction of the caller's.
//
// A key under which another transaction, still open, has stored a job
// makes Insert wait until that transaction ends, as PostgreSQL's insert
// waits for it: if it commits, Insert answers as for a key the queue
// holds; if it rolls back, Insert stores its job. ctx bounds the wait:
// if it ends first, through a pool or a connection with no transaction
// open, the error wraps ErrOutcomeUnknown, since the insert, sent, may
// yet store the job once that transaction rolls back.
//
// An insert that stores nothing for a key taken (ON CONFLICT DO NOTHING)
// cannot tell that apart from a BEFORE INSERT trigger on the jobs table
// that returns NULL for the job. So where the job holding the key is gone
// by the time Insert reads it, as it would be had it been deleted in
// between, Insert sends the insert once more without ON CONFLICT
// (JobInsertStrict): a job it stores is returned, as new; a unique
// violation on the key says that a job took the key again, and Insert
// starts over, up to idempotencyAttempts times in all before it fails
// with ErrIdempotencyRace; no row and no error says that a trigger
// dropped the job, and Insert fails with a JobsDroppedError, as for a job
// without a key (such a trigger has seen the job twice). A unique
// violation fails the transaction it comes in, so Insert sends that
// insert only where it commits on its own, or in a pgx.Tx (a Tx too)
// under a savepoint, which it rolls back to on an error, so that the
// caller's transaction goes on as it was. On a connection on which the
// caller began a transaction by hand, or through a DBTX of another kind,
// it can set no savepoint, and a job a trigger drops fails with
// ErrIdempotencyRace, as for a key that kept changing hands.
//
// A job stored in a transaction of the caller's is announced to its queue's
// workers when that transaction commits, if its run_at was not after the
// transaction began (now() in the database, which the trigger that notifies
// compares it with): one due later, even before the commit, is left to the
// workers' poll. In a Tx it is announced once the transaction has
// committed, if due by then. One stored through a pool or a connection
// outside a transaction commits on its own, and is announced once it has,
// by a statement of its own, so that its commit need not wait for the other
// notifying commits of the server (migrations/00016), which lets concurrent
// callers share their flushes. That statement is sent behind the insert, in
// the same round trip (JobAnnounceMany, storeThenAnnounce), unless the job
// has an idempotency key, which is announced only once Insert knows it
// stored a new job, or the connection runs a statement mode other than
// pgx's default or has a tracer: then Insert sends it once the insert has
// returned (JobAnnounce), a second round trip. A job given a non-zero delay
// rather than a run_at is not announced: the workers find it when it is
// due. If the announcement fails, as when ctx ends first, the job is stored
// all the same and Insert does not fail: the workers find it at their next
// poll.
//
// Through a pool or a connection with no transaction open, a statement the
// server refuses as stale, prepared on the connection before a DEALLOCATE
// ALL or a migration that changed a column it returns, is prepared again
// and sent once more: refused, it stored nothing. Otherwise, as in a
// transaction, which the refusal has failed, its error is returned (but
// for the insert without ON CONFLICT sent under a savepoint, whose
// refusal is rolled back to it, leaving the transaction as it was).
//
// Through a pool, or a connection with no transaction open, an error says
// whether the job may have been stored. One that wraps ErrOutcomeUnknown
// says that the insert was sent and its answer lost, as when ctx ends or
// the connection fails while it commits: the job may have been stored,
// and a caller that tries again stores it twice unless the job has an
// idempotency key, with which the retry returns the job the first attempt
// stored (docs/failure-semantics.md, "An enqueue's answer is lost"). Any
// other error, ctx's included, says that this call stored nothing: the
// insert was not sent (ctx had ended, or no connection could be had),
// PostgreSQL answered it with an error, which rolled it back, it found
// the idempotency key taken (ErrIdempotencyConflict, ErrIdempotencyRace,
// or the job holding the key could not be read), or a trigger on
// the jobs table dropped the job (a JobsDroppedError). In a
// transaction, nothing is stored before that transaction commits, and an
// error is returned as it came.
func Insert(ctx context.Context, dbtx db.DBTX, job Job) (stored db.Job, replayed bool, err error) {
	tx, inTx := dbtx.(*Tx)
	ownCommit := commitsOnItsOwn(dbtx)
	params := db.JobInsertParams{
		Queue:               job.Queue,
		Kind:                job.Kind,
		Payload:             job.Payload,
		Priority:            job.Priority,
		MaxAttempts:         job.MaxAttempts,
		RunAt:               job.RunAt,
		DelayMs:             job.DelayMs,
		IdempotencyKey:      job.IdempotencyKey,
		AnnounceAfterCommit: inTx || ownCommit,
	}
	// own holds the job's queue if the job commits on its own and is due
	// to be announced once it has.
	var own dueQueues
	if ownCommit {
		addDue(&own, job)
	}
	if len(own) > 0 && job.IdempotencyKey == nil {
		var stored db.Job
		if handled, err := storeThenAnnounce(ctx, dbtx, own, func(d db.DBTX) (err error) {
			stored, err = db.New(d).JobInsert(ctx, params)
			return outcome(err)
		}); handled {
			if errors.Is(err, pgx.ErrNoRows) {
				err = &JobsDroppedError{Stored: 0, Sent: 1, Committed: true}
			}
			if err != nil {
				return db.Job{}, false, fmt.Errorf("insert job: %w", err)
			}
			return stored, false, nil
		}
	}
	for range idempotencyAttempts {
		var stored db.Job
		err := againIfStale(ctx, dbtx, ownCommit, func(d db.DBTX) (err error) {
			stored, err = db.New(d).JobInsert(ctx, params)
			if ownCommit {
				return outcome(err)
			}
			return err
		})
		if errors.Is(err, pgx.ErrNoRows) && job.IdempotencyKey == nil {
			// Only a trigger on the jobs table drops a job
			// without a key.
			err = &JobsDroppedError{Stored: 0, Sent: 1, Committed: ownCommit}
		}
		if errors.Is(err, pgx.ErrNoRows) {
			var existing db.Job
			err = againIfStale(ctx, dbtx, ownCommit, func(d db.DBTX) (err error) {
				existing, err = db.New(d).JobGetByIdempotencyKey(ctx, db.JobGetByIdempotencyKeyParams{
					Queue:          job.Queue,
					IdempotencyKey: job.IdempotencyKey,
				})
				return err
			})
			if err == nil {
				if !sameJob(existing, job) {
					return existing, false, ErrIdempotencyConflict
				}
				return existing, true, nil
			}
			if !errors.Is(err, pgx.ErrNoRows) {
				return db.Job{}, false, fmt.Errorf("get the job holding idempotency key %q: %w", *job.IdempotencyKey, err)
			}
			// No job holds the key: the one that did was deleted since
			// the insert, or a trigger dropped the job.
			stored, err = insertStrict(ctx, dbtx, ownCommit, params)
			switch {
			case errors.Is(err, errKeyTaken), errors.Is(err, errNoSavepoint):
				continue
			case errors.Is(err, pgx.ErrNoRows):
				err = &JobsDroppedError{Stored: 0, Sent: 1, Committed: ownCommit}
			}
		}
		if err != nil {
			return db.Job{}, false, fmt.Errorf("insert job: %w", err)
		}
		if inTx {
			tx.due.add(stored.Queue, stored.RunAt)
		} else if len(own) > 0 {
			// Stored and committed: if the announcement fails, as when
			// ctx has ended, the workers find the job at their next
			// poll, and the enqueue has not failed.
			_ = againIfStale(ctx, dbtx, ownCommit, func(d db.DBTX) error {
				return db.New(d).JobAnnounce(ctx, db.JobAnnounceParams{Queue: stored.Queue, RunAt: stored.RunAt})
			})
		}
		return stored, false, nil
	}
	return db.Job{}, false, fmt.Errorf("insert job with idempotency key %q: %w", *job.IdempotencyKey, ErrIdempotencyRace)
}

// idempotencyKeyIndex is the unique index that holds each queue's
// idempotency keys (migrations/00001).
const idempotencyKeyIndex = "jobs_idempotency_key_idx"

// errKeyTaken is insertStrict's error where a job holds the key.
var errKeyTaken = errors.New("a job holds the idempotency key")

// errNoSavepoint is insertStrict's error where dbtx is a transaction that
// it cannot set a savepoint in.
var errNoSavepoint = errors.New("no savepoint can be set in this transaction")

// insertStrict stores a job with an idempotency key that JobInsert
// stored nothing of and whose key no job held when read next, by
// JobInsertStrict, and returns it. It fails with errKeyTaken where a job
// holds the key again, and with pgx.ErrNoRows where, as no job held the
// key, a trigger on the jobs table dropped the job. A unique violation
// fails the transaction it comes in, so insertStrict sends the statement
// only where that transaction is its own (ownCommit), its stale statement
// sent once more as JobInsert's is, or in a pgx.Tx (a Tx too) under a
// savepoint, rolled back to on any error, which leaves the caller's
// transaction as it was. In any other transaction, as on a connection on
// which the caller began one by hand, it sends nothing and fails with
// errNoSavepoint.
func insertStrict(ctx context.Context, dbtx db.DBTX, ownCommit bool, params db.JobInsertParams) (db.Job, error) {
	var stored db.Job
	insert := func(d db.DBTX) (err error) {
		stored, err = db.New(d).JobInsertStrict(ctx, db.JobInsertStrictParams(params))
		if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == idempotencyKeyIndex {
			return fmt.Errorf("%w: %w", errKeyTaken, err)
		}
		return err
	}
	if ownCommit {
		err := againIfStale(ctx, dbtx, ownCommit, func(d db.DBTX) error { return outcome(insert(d)) })
		return stored, err
	}
	tx, ok := dbtx.(pgx.Tx)
	if !ok {
		return db.Job{}, errNoSavepoint
	}
	savepoint, err := tx.Begin(ctx)
	if err != nil {
		return db.Job{}, fmt.Errorf("set a savepoint: %w", err)
	}
	err = insert(savepoint)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		if rbErr := savepoint.Rollback(ctx); rbErr != nil {
			return db.Job{}, fmt.Errorf("%w (and roll back to its savepoint: %v)", err, rbErr)
		}
		return db.Job{}, err
	}
	// Stored, or dropped by a trigger, whose work is the caller's
	// transaction's as a statement's own would be.
	if relErr := savepoint.Commit(ctx); relErr != nil {
		return db.Job{}, fmt.Errorf("release a savepoint: %w", relErr)
	}
	return stored, err
}

// commitsOnItsOwn reports whether a statement run through dbtx commits on
// its own: through a pool, or on a connection with no transaction open.
// A transaction, or a DBTX of a kind Insert does not know, is taken to
// commit when its owner says.
func commitsOnItsOwn(dbtx db.DBTX) bool {
	switch d := dbtx.(type) {
	case *pgxpool.Pool:
		return true
	case *pgxpool.Conn:
		return d.Conn().PgConn().TxStatus() == 'I'
	case *pgx.Conn:
		return d.PgConn().TxStatus() == 'I'
	}
	return false
}

// againIfStale runs run, which sends one statement of package db through
// the DBTX it is given, on dbtx, and where that statement commits on its
// own (ownCommit: see commitsOnItsOwn) and the server refused it as stale
// (stale), as after a DEALLOCATE ALL or a migration that changed a
// column it returns, runs it once more: refused, it ran in an implicit
// transaction that stored nothing, and pgx, having marked the statement
// invalid as it read the error, prepares it again. Through a pool, both
// run on one connection of it, whose statement was stale. Otherwise, as
// in a transaction, which a refused statement has failed, its error is
// returned.
func againIfStale(ctx context.Context, dbtx db.DBTX, ownCommit bool, run func(db.DBTX) error) error {
	if !ownCommit {
		return run(dbtx)
	}
	if p, ok := dbtx.(*pgxpool.Pool); ok {
		c, err := p.Acquire(ctx)
		if err != nil {
			return fmt.Errorf("acquire a connection: %w", err)
		}
		defer c.Release()
		dbtx = c
	}
	return onceMoreIfStale(func() error { return run(dbtx) })
}

// sameJob reports whether j is what job would have stored, for an
// idempotent replay.
func sameJob(j db.Job, job Job) bool {
	return j.Kind == job.Kind &&
		j.Queue == job.Queue &&
		j.Priority == job.Priority &&
		j.MaxAttempts == job.MaxAttempts &&
		jsonb.Equal(j.Payload, job.Payload)
}

// ErrJobsDropped is wrapped by the error of an insert that the database
// answered with fewer jobs than it was sent (see JobsDroppedError), as when
// a BEFORE INSERT trigger on the jobs table returns NULL for some rows, or
// a rule rewrites the insert.
var ErrJobsDropped = errors.New("a trigger on the jobs table dropped rows")

// JobsDroppedError is the error of an insert that the database answered
// with fewer jobs than it was sent. Which of the jobs given were stored is
// not known, since the rows it returns no longer line up with them, so the
// insert answers none. Committed says whether those stored are committed:
// the statement committed on its own, through a pool or a connection with
// no transaction open. Otherwise they are in the caller's transaction,
// which the caller should roll back.
type JobsDroppedError struct {
	Stored    int  // the jobs the database returned, as stored
	Sent      int  // the jobs the insert sent
	Committed bool // whether those stored are committed
}

// Error says how many of the jobs were stored, and what became of them.
func (e *JobsDroppedError) Error() string {
	msg := fmt.Sprintf("the database stored %d of %d jobs: %v", e.Stored, e.Sent, ErrJobsDropped)
	switch {
	case e.Stored == 0:
		return msg
	case e.Committed:
		return msg + "; those stored are committed"
	}
	return msg + "; the transaction holds those stored: roll it back"
}

// Unwrap returns ErrJobsDropped.
func (e *JobsDroppedError) Unwrap() error { return ErrJobsDropped }

// ErrNoIdempotencyInBatch is returned by InsertMany for a job with an
// idempotency key, which only Insert honours.
var ErrNoIdempotencyInBatch = errors.New("jobs inserted together take no idempotency key")

// InsertMany stores jobs in one statement (JobInsertMany), all or none, and
// returns their ids in the order given; where the database stores fewer
// than it was sent (a trigger on the jobs table dropped rows),
// their ids no longer line up with the jobs, and InsertMany fails with a
// JobsDroppedError. It takes from 1 to MaxBatchJobs jobs, none with an
// idempotency key. dbtx may be a transaction of the caller's. The jobs
// are announced to their queues' workers as Insert's are: when the
// caller's transaction commits, or, in a Tx or when the statement commits
// on its own, once it has committed (JobAnnounceMany).
// A job given a non-zero delay rather than a run_at is not announced
// then, since its run_at is the database's to compute: the workers find
// it when it is due, as after a commit that notifies. Outside a
// transaction the announcement, a statement of its own, lets concurrent
// callers share their flushes (docs/experiments.md, "Batches announced
// after their commit"); it is sent behind the insert, in the same round
// trip, as Insert's is, or after it where the connection cannot carry
// both. If that announcement fails, as when ctx ends first, the jobs are
// stored all the same and InsertMany does not fail: the workers find them
// at their next poll. A statement found stale is sent again as Insert's.
// Its errors say what Insert's do: through a pool, or a connection with no
// transaction open, one that wraps ErrOutcomeUnknown says that the jobs
// may have been stored, and inserting them again may store them twice;
// one that wraps ErrJobsDropped (a JobsDroppedError) says how many were
// stored, and whether they are committed or wait in the caller's
// transaction, which it should then roll back; any other, that none was.
func InsertMany(ctx context.Context, dbtx db.DBTX, jobs []Job) ([]int64, error) {
	params, err := manyParams(jobs)
	if err != nil {
		return nil, err
	}
	tx, inTx := dbtx.(*Tx)
	ownCommit := commitsOnItsOwn(dbtx)
	params.AnnounceAfterCommit = inTx || ownCommit
	var own dueQueues
	if ownCommit {
		for _, job := range jobs {
			addDue(&own, job)
		}
		var ids []int64
		if handled, err := storeThenAnnounce(ctx, dbtx, own, func(d db.DBTX) (err error) {
			ids, err = db.New(d).JobInsertMany(ctx, params)
			return outcome(err)
		}); handled {
			if err == nil && len(ids) != len(jobs) {
				err = &JobsDroppedError{Stored: len(ids), Sent: len(jobs), Committed: true}
			}
			if err != nil {
				return nil, fmt.Errorf("insert %d jobs: %w", len(jobs), err)
			}
			return ids, nil
		}
	}
	var ids []int64
	err = againIfStale(ctx, dbtx, ownCommit, func(d db.DBTX) (err error) {
		ids, err = db.New(d).JobInsertMany(ctx, params)
		if ownCommit {
			return outcome(err)
		}
		return err
	})
	if err == nil && len(ids) != len(jobs) {
		err = &JobsDroppedError{Stored: len(ids), Sent: len(jobs), Committed: ownCommit}
	}
	if err != nil {
		return nil, fmt.Errorf("insert %d jobs: %w", len(jobs), err)
	}
	if !params.AnnounceAfterCommit {
		return ids, nil // announced by the trigger at the caller's commit
	}
	if inTx {
		for _, job := range jobs {
			addDue(&tx.due, job)
		}
	}
	// Stored and committed, if on its own: if the announcement fails, as
	// when ctx has ended, the workers find the jobs at their next poll,
	// and the insert has not failed.
	if len(own) > 0 {
		_ = againIfStale(ctx, dbtx, ownCommit, func(d db.DBTX) error { return own.announce(ctx, d) })
	}
	return ids, nil
}

// addDue records in due the queue of job if its run_at is known before it
// is stored: given, or now for a job with no delay. A job delayed from the
// database's now() is left to the workers, as at an insert's commit.
func addDue(due *dueQueues, job Job) {
	switch {
	case job.RunAt != nil:
		due.add(job.Queue, *job.RunAt)
	case job.DelayMs == 0:
		due.add(job.Queue, time.Time{})
	}
}

// InsertAll stores jobs in one statement (JobInsertAll), all or none, as
// InsertMany does, and returns them whole, in the order given. It is for
// those who store groups of jobs of their own, as an Enqueuer does the
// one-job inserts that arrive together. Unlike InsertMany's, its jobs are announced when the
// statement's transaction commits, also when it commits on its own: for
// those groups, a second statement that announces them after the commit
// accepted requests no faster than the runs' spread alone, and slower
// beside an idle fleet of workers and with a slower flush
// (docs/experiments.md, "The API's groups, announced after their
// commit"). In a Tx they are announced once it has committed. A statement
// found stale is sent again as Insert's. Its errors say what InsertMany's
// do, and it fails as InsertMany does where the database stores fewer of
// the jobs than it was sent (JobsDroppedError).
func InsertAll(ctx context.Context, dbtx db.DBTX, jobs []Job) ([]db.Job, error) {
	return insertAll(ctx, dbtx, jobs, true)
}

// insertAll is InsertAll. With announced false, no notification is sent
// for the jobs, whatever dbtx is: an Enqueuer that spaces its
// notifications tells their queues' workers once the statement has
// committed (dueQueues.announce), since each notifying commit wakes every
// listening session of the database (docs/experiments.md, "Every
// listener hears every queue").
func insertAll(ctx context.Context, dbtx db.DBTX, jobs []Job, announced bool) ([]db.Job, error) {
	params, err := manyParams(jobs)
	if err != nil {
		return nil, err
	}
	tx, inTx := dbtx.(*Tx)
	ownCommit := commitsOnItsOwn(dbtx)
	params.AnnounceAfterCommit = inTx || !announced
	var stored []db.Job
	err = againIfStale(ctx, dbtx, ownCommit, func(d db.DBTX) (err error) {
		stored, err = db.New(d).JobInsertAll(ctx, db.JobInsertAllParams(params))
		if ownCommit {
			return outcome(err)
		}
		return err
	})
	if err == nil && len(stored) != len(jobs) {
		err = &JobsDroppedError{Stored: len(stored), Sent: len(jobs), Committed: ownCommit}
	}
	if err != nil {
		return nil, fmt.Errorf("insert %d jobs: %w", len(jobs), err)
	}
	if inTx && announced {
		for _, j := range stored {
			tx.due.add(j.Queue, j.RunAt)
		}
	}
	return stored, nil
}

// manyParams turns jobs into the columns of one insert of them all.
func manyParams(jobs []Job) (db.JobInsertManyParams, error) {
	n := len(jobs)
	if n == 0 || n > MaxBatchJobs {
		return db.JobInsertManyParams{}, fmt.Errorf("insert %d jobs: a batch holds from 1 to %d jobs", n, MaxBatchJobs)
	}
	params := db.JobInsertManyParams{
		Queues:      make([]string, 0, n),
		Kinds:       make([]string, 0, n),
		Payloads:    make([][]byte, 0, n),
		Priorities:  make([]int16, 0, n),
		MaxAttempts: make([]int32, 0, n),
		RunAts:      make([]time.Time, 0, n),
		DelaysMs:    make([]int64, 0, n),
	}
	for i, job := range jobs {
		if job.IdempotencyKey != nil {
			return db.JobInsertManyParams{}, fmt.Errorf("insert %d jobs: job %d: %w", n, i, ErrNoIdempotencyInBatch)
		}
		var runAt time.Time // zero: DelayMs after now() in the database
		if job.RunAt != nil {
			runAt = *job.RunAt
		}
		params.Queues = append(params.Queues, job.Queue)
		params.Kinds = append(params.Kinds, job.Kind)
		params.Payloads = append(params.Payloads, job.Payload)
		params.Priorities = append(params.Priorities, job.Priority)
		params.MaxAttempts = append(params.MaxAttempts, job.MaxAttempts)
		params.RunAts = append(params.RunAts, runAt)
		params.DelaysMs = append(params.DelaysMs, job.DelayMs)
	}
	return params, nil
}
