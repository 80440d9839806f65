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
// would, without the caller waiting a second time for the server.
//
// It reports false, having run nothing, where dbtx cannot carry the two
// together: unless it is a pool, or a connection with no transaction open,
// that runs pgx's default statement mode (cache_statement, which prepares
// each statement on the connection it runs on) and has no tracer, which
// would not see statements sent this way. The caller then stores and
// announces as two round trips. If store's statement fails, the
// announcement runs all the same, and the workers told find nothing new;
// if the announcement fails, store's outcome stands.
func storeThenAnnounce(ctx context.Context, dbtx db.DBTX, due dueQueues, store func(db.DBTX) error) (bool, error) {
	var announcement recorder
	if err := due.announce(ctx, &announcement); err != nil || !announcement.recorded {
		return false, err // no queue to announce
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
	case *pgx.Conn:
		conn = d
	default:
		return false, nil
	}
	if !pipelines(conn.Config()) || conn.PgConn().TxStatus() != 'I' {
		return false, nil
	}
	return true, store(&announcedBehind{conn: conn, announcement: announcement.statement})
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
// statement's rows. Closing them reads the rest of the pipeline; the
// announcement's own outcome is dropped.
func (a *announcedBehind) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if a.sent {
		return nil, errors.New("a second statement sent where one was expected with an announcement behind it")
	}
	a.sent = true
	first, err := a.conn.Prepare(ctx, statementName(sql), sql)
	if err != nil {
		return nil, err
	}
	second, err := a.conn.Prepare(ctx, statementName(a.announcement.sql), a.announcement.sql)
	if err != nil {
		return nil, fmt.Errorf("prepare the announcement: %w", err)
	}
	forget := func() { forgetStatements(ctx, a.conn, sql, a.announcement.sql) }
	var stored, announced pgx.ExtendedQueryBuilder
	if err := stored.Build(a.conn.TypeMap(), first, args); err != nil {
		return nil, err
	}
	if err := announced.Build(a.conn.TypeMap(), second, a.announcement.args); err != nil {
		return nil, fmt.Errorf("encode the announcement: %w", err)
	}
	p := a.conn.PgConn().StartPipeline(ctx)
	p.SendQueryStatement(first, stored.ParamValues, stored.ParamFormats, stored.ResultFormats)
	p.SendPipelineSync()
	p.SendQueryStatement(second, announced.ParamValues, announced.ParamFormats, announced.ResultFormats)
	p.SendPipelineSync()
	if err := p.Flush(); err != nil {
		_ = p.Close()
		forget()
		return nil, err
	}
	results, err := p.GetResults()
	if err != nil {
		_ = p.Close()
		forget()
		return nil, err
	}
	reader, ok := results.(*pgconn.ResultReader)
	if !ok {
		_ = p.Close()
		forget()
		return nil, fmt.Errorf("a pipeline answered %T where a statement's rows were expected", results)
	}
	return &pipelinedRows{Rows: pgx.RowsFromResultReader(a.conn.TypeMap(), reader), pipeline: p, forget: forget}, nil
}

// statementName is the name sql is prepared under on a connection that
// sends it in a pipeline: one of its own, apart from the statements pgx
// prepares and caches by their SQL, so that a failure here drops only
// these (forgetStatements).
func statementName(sql string) string {
	sum := sha256.Sum256([]byte(sql))
	return "relay_pipelined_" + hex.EncodeToString(sum[:12])
}

// forgetStatements drops the statements of sqls prepared on conn for
// pipelines, after one of them failed, so that the next use prepares them
// again: as pgx does with those it caches, since a statement prepared
// before a change to the schema, or dropped under the connection, would
// otherwise fail every time.
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

// pipelinedRows are the rows of the first statement of a pipeline. Close
// closes them, then reads what the pipeline still owes and ends it.
type pipelinedRows struct {
	pgx.Rows
	pipeline *pgconn.Pipeline
	forget   func()
	closed   bool
}

// Close closes the rows and ends the pipeline. An error of the statements
// behind the rows' own is not theirs, and is dropped; the connection is
// closed if the pipeline could not be read to its end. After any error,
// the pipeline's statements are prepared again at their next use.
func (r *pipelinedRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	if err := r.pipeline.Close(); err != nil || r.Rows.Err() != nil {
		r.forget()
	}
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
