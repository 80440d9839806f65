package adapter

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// DefaultInsertBatch is how many jobs Insert writes per statement.
const DefaultInsertBatch = 10_000

// Insert inserts n jobs of args on queue, available at once, batch at a
// time (DefaultInsertBatch if batch is 0) through River's InsertManyFast,
// which copies them in (COPY FROM) and skips the returning of rows.
func Insert(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, args river.JobArgs, queue string, n, batch int) error {
	if batch == 0 {
		batch = DefaultInsertBatch
	}
	if n < 0 || batch < 1 {
		return fmt.Errorf("insert %d jobs %d at a time: want zero or more jobs, at least one at a time", n, batch)
	}
	c, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), &river.Config{Logger: logger, Workers: workers()})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	opts := &river.InsertOpts{Queue: queue}
	params := make([]river.InsertManyParams, 0, min(n, batch))
	for done := 0; done < n; {
		params = params[:0]
		for range min(batch, n-done) {
			params = append(params, river.InsertManyParams{Args: args, InsertOpts: opts})
		}
		inserted, err := c.InsertManyFast(ctx, params)
		if err != nil {
			return fmt.Errorf("insert jobs %d to %d of %d: %w", done+1, done+len(params), n, err)
		}
		if inserted != len(params) {
			return fmt.Errorf("insert jobs %d to %d of %d: River inserted %d", done+1, done+len(params), n, inserted)
		}
		done += inserted
	}
	return nil
}

// Feed inserts jobs of args on queue as the lines of in ask: each line is
// a number of jobs, inserted at once through one InsertManyFast, after
// which Feed writes "ok N" to out, so that the caller paces a steady load
// with River's own client and knows when each batch is in. It returns nil
// when in ends, and at the first line it cannot parse or insert, after
// writing "error: ..." to out.
func Feed(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, args river.JobArgs, queue string, in io.Reader, out io.Writer) error {
	c, err := river.NewClient[pgx.Tx](riverpgxv5.New(pool), &river.Config{Logger: logger, Workers: workers()})
	if err != nil {
		return fmt.Errorf("river client: %w", err)
	}
	opts := &river.InsertOpts{Queue: queue}
	lines := bufio.NewScanner(in)
	for lines.Scan() {
		err := func() error {
			n, err := strconv.Atoi(strings.TrimSpace(lines.Text()))
			if err != nil || n < 1 {
				return fmt.Errorf("want a number of jobs of at least 1, got %q", lines.Text())
			}
			params := make([]river.InsertManyParams, n)
			for i := range params {
				params[i] = river.InsertManyParams{Args: args, InsertOpts: opts}
			}
			inserted, err := c.InsertManyFast(ctx, params)
			if err != nil {
				return fmt.Errorf("insert %d jobs: %w", n, err)
			}
			if inserted != n {
				return fmt.Errorf("insert %d jobs: River inserted %d", n, inserted)
			}
			_, err = fmt.Fprintf(out, "ok %d\n", n)
			return err
		}()
		if err != nil {
			fmt.Fprintf(out, "error: %v\n", err)
			return fmt.Errorf("feed: %w", err)
		}
	}
	if err := lines.Err(); err != nil {
		return fmt.Errorf("feed: read: %w", err)
	}
	return nil
}
