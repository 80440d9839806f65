package worker

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// sendIsolating sends items in one statement, with send. When the database
// refuses that statement for the data of one of its rows (see
// isRowDataError), it sends each half of the batch on its own, and so on
// down to single rows, so that a row the database cannot take never holds
// up the others; it returns the rows refused on their own, by index into
// items, with the database's error. Any other error ends the sending and is
// returned, with settled, how many items at the head of items the database
// answered for, each in a part it took or refused alone: the parts are
// sent in the order of items, so only those from settled on are still to
// be sent. send records what the database took of each part.
func sendIsolating[T any](ctx context.Context, items []T, send func(context.Context, []T) error) (refused map[int]error, settled int, err error) {
	refused = map[int]error{}
	var split func(offset int, part []T) error
	split = func(offset int, part []T) error {
		err := send(ctx, part)
		switch {
		case err == nil:
			return nil
		case !isRowDataError(err):
			settled = offset
			return err
		}
		if len(part) == 1 {
			refused[offset] = err
			return nil
		}
		half := len(part) / 2
		if err := split(offset, part[:half]); err != nil {
			return err
		}
		return split(offset+half, part[half:])
	}
	if len(items) == 0 {
		return refused, 0, nil
	}
	if err := split(0, items); err != nil {
		return refused, settled, err
	}
	return refused, len(items), nil
}

// isRowDataError reports whether err is the database refusing a value of
// some row of the statement: a data exception (SQLSTATE class 22, such as a
// jsonb value it cannot represent), an integrity constraint violation
// (class 23) or a program limit exceeded (class 54, such as a jsonb value
// too large or too deep). Sent again, the same rows fail the same way, so
// the batch has to be split rather than retried.
func isRowDataError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	for _, class := range []string{"22", "23", "54"} {
		if strings.HasPrefix(pgErr.Code, class) {
			return true
		}
	}
	return false
}

// refusalText describes, for a job's error history, why the database
// refused a row.
func refusalText(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return fmt.Sprintf("%s (SQLSTATE %s)", pgErr.Message, pgErr.Code)
	}
	return err.Error()
}
