package adapter

import (
	"context"
	"fmt"
	"log/slog"

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
