package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
)

// storeThenAnnounce runs store, which sends one statement of package db
// through the DBTX it is given, on a connection of dbtx, and sends behind
// that statement, in the same round trip, the announcement of due's
// queues (JobAnnounceMany). Each runs in an implicit transaction of its
// own, ended by a Sync of the pipeline, so the announcement runs once the
// statement has committed, as the one Insert and InsertMany send after it
// would, without the caller waiting a second time for the server. The
// statement's error, including one of its commit or a commit whose
// outcome the connection lost, is store's. The first time a connection
// carries each of the two statements it prepares it, a round trip of its
// own, as pgx's default statement mode does. Where the server refuses the
// statement as stale, prepared under it earlier but since deallocated or
// planned for a table whose columns have changed (a migration's ALTER
// TABLE), it is prepared again and store runs once more: refused, the
// statement ran in an implicit transaction that stored nothing.
//
// It reports false, having run nothing, where dbtx cannot carry the two
// together: unless it is a pool, or a connection with no transaction open,
// that runs pgx's default statement mode (cache_statement, which prepares
// each statement on the connection it runs on) and has no tracer, which
// would not see statements sent this way. The caller then stores and
// announces as two round trips. If store's statement fails, the
// announcement runs all the same, and the workers told find nothing new;
// if the announcement fails, store's outcome stands.
func storeThenAnnounce(ctx context.Context, dbtx db.DBTX, due dueQueues, store func(db.DBTX) error) (handled bool, err error) {
	var announcement recorder
	if err := due.announce(ctx, &announcement); err != nil {
		return true, err
	}
	if !announcement.recorded {
		return false, nil // no queue to announce
	}
	var conn *pgx.Conn
	switch d := dbtx.(type) {
	case *pgxpool.Pool:
		if !pipelines(d.Config().ConnConfig) {
			return false, nil
		}
		c, err := d.Acquire(ctx)
		if err != nil {
			return true, fmt.Errorf("acquire a connection: %w", err)
		}
		defer c.Release()
		conn = c.Conn()
	case *pgxpool.Conn:
		conn = d.Conn()
		if !pipelines(conn.Config()) {
			return false, nil
		}
	case *pgx.Conn:
		conn = d
		if !pipelines(conn.Config()) {
			return false, nil
		}
	default:
		return false, nil
	}
	if conn.PgConn().TxStatus() != 'I' {
		return false, nil
	}
	// A stale statement's statements were dropped as its error was read.
	return true, onceMoreIfStale(func() error {
		return store(&announcedBehind{conn: conn, announcement: announcement.statement})
	})
}

// pipelines reports whether a connection of cfg can carry a statement and
// an announcement in one round trip: see storeThenAnnounce.
func pipelines(cfg *pgx.ConnConfig) bool {
	return cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement && cfg.Tracer == nil
}

// statement is one statement as a method of package db sends it.
type statement struct {
	sql  string
	args []any
}

// errRecorded answers a query sent to a recorder, which runs none.
var errRecorded = errors.New("statement recorded, not run")

// recorder is a db.DBTX that runs nothing: it keeps the statement a method
// of package db sends through it, for sending later.
type recorder struct {
	statement
	recorded bool
}

// record keeps sql and args as the statement recorded.
func (r *recorder) record(sql string, args []any) {
	r.statement = statement{sql: sql, args: args}
	r.recorded = true
}

// Exec records the statement and reports it done.
func (r *recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	r.record(sql, args)
	return pgconn.CommandTag{}, nil
}

// Query records the statement and answers errRecorded.
func (r *recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	r.record(sql, args)
	return nil, errRecorded
}

// QueryRow records the statement and answers errRecorded.
func (r *recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	r.record(sql, args)
	return errRow{errRecorded}
}

// errRow is a pgx.Row that answers err.
type errRow struct{ err error }

// Scan returns the row's error.
func (r errRow) Scan(...any) error { return r.err }

// announcedBehind is a db.DBTX, for one statement, on a connection with no
// transaction open: it sends that statement and, behind it, announcement,
// in one round trip (storeThenAnnounce).
type announcedBehind struct {
	conn         *pgx.Conn
	announcement statement
	sent         bool
}

// Query sends the statement and the announcement, and returns the
// statement's rows, whose Err is also that of the statement's commit.
// Closing them reads the rest of the pipeline; the announcement's own
// outcome is dropped. An error of a step before the two are sent, their
// preparation or the encoding of their arguments, is marked safe to
// retry (unsent): nothing was stored.
func (a *announcedBehind) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if a.sent {
		return nil, errors.New("a second statement sent where one was expected with an announcement behind it")
	}
	a.sent = true
	first, err := a.conn.Prepare(ctx, statementName(sql), sql)
	if err != nil {
		return nil, unsent{fmt.Errorf("prepare: %w", err)}
	}
	second, err := a.conn.Prepare(ctx, statementName(a.announcement.sql), a.announcement.sql)
	if err != nil {
		return nil, unsent{fmt.Errorf("prepare the announcement: %w", err)}
	}
	var stored, announced pgx.ExtendedQueryBuilder
	if err := stored.Build(a.conn.TypeMap(), first, args); err != nil {
		return nil, unsent{fmt.Errorf("encode the arguments: %w", err)}
	}
	if err := announced.Build(a.conn.TypeMap(), second, a.announcement.args); err != nil {
		return nil, unsent{fmt.Errorf("encode the announcement: %w", err)}
	}
	p := a.conn.PgConn().StartPipeline(ctx)
	p.SendQueryStatement(first, stored.ParamValues, stored.ParamFormats, stored.ResultFormats)
	p.SendPipelineSync()
	p.SendQueryStatement(second, announced.ParamValues, announced.ParamFormats, announced.ResultFormats)
	p.SendPipelineSync()
	forget := func(errs ...error) {
		for _, err := range errs {
			if stale(err) {
				forgetStatements(ctx, a.conn, sql, a.announcement.sql)
				return
			}
		}
	}
	if err := p.Flush(); err != nil {
		_ = p.Close()
		return nil, fmt.Errorf("send: %w", err)
	}
	results, err := p.GetResults()
	if err != nil {
		forget(err, p.Close())
		return nil, err
	}
	reader, ok := results.(*pgconn.ResultReader)
	if !ok {
		_ = p.Close()
		return nil, fmt.Errorf("a pipeline answered %T where a statement's rows were expected", results)
	}
	return &pipelinedRows{Rows: pgx.RowsFromResultReader(a.conn.TypeMap(), reader), pipeline: p, forget: forget}, nil
}

// QueryRow sends the statement and the announcement, as Query does, and
// returns the statement's one row.
func (a *announcedBehind) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	rows, err := a.Query(ctx, sql, args...)
	if err != nil {
		return errRow{err}
	}
	return firstRow{rows}
}

// Exec sends the statement and the announcement, as Query does, and
// returns the statement's command tag.
func (a *announcedBehind) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	rows, err := a.Query(ctx, sql, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	rows.Close()
	return rows.CommandTag(), rows.Err()
}

// statementName is the name sql is prepared under on a connection that
// sends it in a pipeline: one of its own, apart from the statements pgx
// prepares and caches by their SQL, so that forgetStatements drops only
// these.
func statementName(sql string) string {
	sum := sha256.Sum256([]byte(sql))
	return "relay_pipelined_" + hex.EncodeToString(sum[:12])
}

// stale reports whether err says that a statement prepared on the
// connection is gone (invalid_sql_statement_name, 26000), as after a
// DEALLOCATE, or no longer fits the schema ("cached plan must not change
// result type", feature_not_supported, 0A000).
func stale(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "26000" || pgErr.Code == "0A000")
}

// onceMoreIfStale runs run, which sends one statement, and runs it once
// more where the server refused that statement as stale: refused, it ran
// in an implicit transaction that stored nothing. The caller sees that
// it commits on its own, and that the statement is prepared again.
func onceMoreIfStale(run func() error) error {
	err := run()
	if stale(err) {
		err = run()
	}
	return err
}

// forgetStatements drops the statements of sqls prepared on conn for
// pipelines, after one of them was found stale, so that the next use
// prepares them again: as pgx does with those it caches, since such a
// statement would otherwise fail every time.
func forgetStatements(ctx context.Context, conn *pgx.Conn, sqls ...string) {
	if conn.IsClosed() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), forgetTimeout)
	defer cancel()
	for _, sql := range sqls {
		_ = conn.Deallocate(ctx, statementName(sql))
	}
}

// forgetTimeout bounds forgetStatements, which runs after a failure.
const forgetTimeout = 5 * time.Second

// pipelinedRows are the rows of the first statement of a pipeline. Once
// they are read, they read the Sync after them, which commits the
// statement's implicit transaction: Err reports a failed commit, or a
// connection lost before its outcome came back, as the statement's error.
// Close then reads what the pipeline still owes and ends it.
type pipelinedRows struct {
	pgx.Rows
	pipeline *pgconn.Pipeline
	forget   func(...error)
	// synced is set once the Sync after the rows was read; commitErr is
	// what it answered.
	synced    bool
	commitErr error
	closed    bool
}

// Next advances to the next row; after the last, it reads the commit.
func (r *pipelinedRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.sync()
	return false
}

// Err returns the statement's error, or its commit's.
func (r *pipelinedRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.commitErr
}

// sync closes the rows and reads the Sync after them, once.
func (r *pipelinedRows) sync() {
	if r.synced {
		return
	}
	r.synced = true
	r.Rows.Close()
	results, err := r.pipeline.GetResults()
	switch {
	case err != nil:
		r.commitErr = fmt.Errorf("commit: %w", err)
	case results == nil:
		r.commitErr = errors.New("commit: the pipeline ended before its Sync was answered")
	default:
		if _, ok := results.(*pgconn.PipelineSync); !ok {
			r.commitErr = fmt.Errorf("commit: a pipeline answered %T where a Sync was expected", results)
		}
	}
}

// Close reads the commit if it was not read yet, and ends the pipeline.
// An error of the announcement behind is not the statement's and is
// dropped; the connection is closed if the pipeline could not be read to
// its end. Statements found stale are prepared again at their next use.
func (r *pipelinedRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.sync()
	r.forget(r.Err(), r.pipeline.Close())
}

// firstRow is the first row of rows, as pgx.Conn.QueryRow answers it.
type firstRow struct{ rows pgx.Rows }

// Scan scans the first row into dest and closes the rows; pgx.ErrNoRows
// if there is none.
func (r firstRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}
