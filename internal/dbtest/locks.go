package dbtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Blocks reports whether a session of pool's server waits for a lock that
// holder, an open transaction, holds: a row it wrote, or the idempotency
// key of a job it stored, which an insert under the same key waits for.
func Blocks(t testing.TB, pool *pgxpool.Pool, holder pgx.Tx) bool {
	t.Helper()
	var waiting bool
	if err := pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE $1::integer = ANY (pg_blocking_pids(pid)))",
		holder.Conn().PgConn().PID()).Scan(&waiting); err != nil {
		t.Fatalf("dbtest: look for sessions that wait for a lock: %v", err)
	}
	return waiting
}

// WaitBlocks waits up to 10 s for holder to hold up another session (see
// Blocks), what names, and fails the test if it never does.
func WaitBlocks(t testing.TB, pool *pgxpool.Pool, holder pgx.Tx, what string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !Blocks(t, pool, holder); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not wait for the transaction holding its lock within 10s", what)
		}
	}
}
