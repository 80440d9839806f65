package soak

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
)

// ApartStats is the table apart that the readers counted
// (Config.ReadersApart).
type ApartStats struct {
	// Database is the readers' own database, on the queue's server.
	Database string `json:"database"`
	// Rows is how many jobs it was filled with, and TableBytes its size
	// then, without indexes.
	Rows       int64 `json:"rows"`
	TableBytes int64 `json:"table_bytes"`
	// CountMs is how long a count of it took once filled, and
	// JobTableCountMs how long a count of the queue's job table took as
	// the phase started, the time it was filled to (each the median of
	// three counts).
	CountMs         float64 `json:"count_ms"`
	JobTableCountMs float64 `json:"job_table_count_ms"`
	// JobTableBytes is the size of the queue's job table then, without
	// indexes.
	JobTableBytes int64 `json:"job_table_bytes"`
}

// apartFillBatch is how many jobs each statement adds to the table apart,
// which is filled one batch at a time until it is large enough.
const apartFillBatch = 5000

// apartMaxRows bounds the fill, in case a count of the table apart never
// takes as long as one of the queue's.
const apartMaxRows = 10_000_000

// apartTable is the readers' own database, with Relay's schema, whose
// jobs table they count (countRelayJobs) in place of the queue's, whatever
// the system under test: with River, its rows are Relay's, filled until a
// count of them takes as long as one of River's table.
type apartTable struct {
	db   *harness.Database
	pool *pgxpool.Pool
}

// openApart creates the readers' database on the server of adminURL,
// migrated to Relay's schema, and a pool of n connections to it, one per
// reader.
func openApart(ctx context.Context, adminURL string, n int) (*apartTable, error) {
	d, err := harness.CreateDatabase(ctx, adminURL, "relay_exp_soak_apart_")
	if err != nil {
		return nil, fmt.Errorf("the readers' database apart: %w", err)
	}
	drop := func(err error) error {
		var dropErr error
		d.DropAtEnd(ctx, &dropErr)
		return fmt.Errorf("the readers' database apart: %w", errors.Join(err, dropErr))
	}
	if err := d.Lab.SoakApartUnvacuumed(ctx); err != nil {
		return nil, drop(fmt.Errorf("keep autovacuum off its table: %w", err))
	}
	pool, err := harness.OpenPool(ctx, d.URL, harness.ApplicationName, int32(n), 0)
	if err != nil {
		return nil, drop(err)
	}
	return &apartTable{db: d, pool: pool}, nil
}

// closeAtEnd closes the readers' pool and drops their database, with the
// drop's error put in *err unless the run already failed.
func (a *apartTable) closeAtEnd(ctx context.Context, err *error) {
	a.pool.Close()
	a.db.DropAtEnd(ctx, err)
}

// fill adds waiting jobs to the table apart until a count of it takes as
// long as a count of the queue's table through queue, with countQueue,
// takes now: the median of apartTimings counts each, so that a reader's
// count costs the server about what it would on the queue's table as the
// phase starts (there it then grows, with the versions the phase leaves).
// The first count after each batch sets its rows' hint bits, as the
// readers' would. The fill's pages are written out after it, by the
// server's background writer and its next checkpoint, not by a forced
// checkpoint, after which the queue would log a full image of each page
// it changes first.
func (a *apartTable) fill(ctx context.Context, queue *labdb.Queries, countQueue func(context.Context, *labdb.Queries) (int64, error), jobTable string) (*ApartStats, error) {
	want, err := medianCount(ctx, queue, countQueue)
	if err != nil {
		return nil, fmt.Errorf("count %s: %w", jobTable, err)
	}
	st := &ApartStats{Database: a.db.Name, JobTableCountMs: harness.Millis(want)}
	if st.JobTableBytes, err = queue.SoakTableBytes(ctx, jobTable); err != nil {
		return nil, fmt.Errorf("read the size of %s: %w", jobTable, err)
	}
	// One session fills and times the table, and reports its statistics
	// as it goes idle at the end (SoakFlushStats): the WAL it wrote is
	// then counted before the phase, not up to 10 s into it.
	conn, err := a.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("fill the readers' table apart: %w", err)
	}
	defer conn.Release()
	q := labdb.New(conn)
	for {
		if st.Rows >= apartMaxRows {
			return nil, fmt.Errorf("the readers' table apart holds %d jobs and a count of it takes %.1f ms, still less than %s's %.1f ms", st.Rows, st.CountMs, jobTable, st.JobTableCountMs)
		}
		if err := q.SoakFillApart(ctx, apartFillBatch); err != nil {
			return nil, fmt.Errorf("fill the readers' table apart: %w", err)
		}
		st.Rows += apartFillBatch
		got, err := medianCount(ctx, q, countRelayJobs)
		if err != nil {
			return nil, fmt.Errorf("count the readers' table apart: %w", err)
		}
		st.CountMs = harness.Millis(got)
		if got >= want {
			break
		}
	}
	if st.TableBytes, err = q.SoakTableBytes(ctx, "jobs"); err != nil {
		return nil, fmt.Errorf("read the size of the readers' table apart: %w", err)
	}
	if err := q.SoakFlushStats(ctx); err != nil {
		return nil, fmt.Errorf("report the fill's statistics: %w", err)
	}
	return st, nil
}

// apartTimings is how many counts fill times for each median.
const apartTimings = 3

// medianCount runs count through q apartTimings times and returns the
// median of their durations.
func medianCount(ctx context.Context, q *labdb.Queries, count func(context.Context, *labdb.Queries) (int64, error)) (time.Duration, error) {
	took := make([]time.Duration, apartTimings)
	for i := range took {
		t0 := time.Now()
		if _, err := count(ctx, q); err != nil {
			return 0, err
		}
		took[i] = time.Since(t0)
	}
	slices.Sort(took)
	return took[len(took)/2], nil
}
