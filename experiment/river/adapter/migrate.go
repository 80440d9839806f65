package adapter

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// Migrate applies every one of River's migrations (its main line, through
// River's own migrator) that the database of pool lacks, and returns how
// many it applied: none on a database already migrated.
func Migrate(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) (int, error) {
	m, err := rivermigrate.New(riverpgxv5.New(pool), &rivermigrate.Config{Logger: logger})
	if err != nil {
		return 0, fmt.Errorf("river migrator: %w", err)
	}
	res, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil)
	if err != nil {
		return 0, fmt.Errorf("river migrations: %w", err)
	}
	return len(res.Versions), nil
}
