package soak

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/internal/dbtest"
)

// TestSampler_CountsAClaimCommittedAfterItsWindowWasRead checks that a
// claim whose transaction commits more than the window's lag after it
// began, stamped with that start, is still counted, with its pickup, in
// one window: a window read while the transaction is open must not end
// past its start, or the claim falls in a window already read and is
// never counted.
func TestSampler_CountsAClaimCommittedAfterItsWindowWasRead(t *testing.T) {
	ctx := t.Context()
	d, err := harness.CreateDatabase(ctx, dbtest.NewURL(t), "relay_test_soak_")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Drop(context.WithoutCancel(ctx)) })
	sys := NewRelay(RelayConfig{Database: d, JobMs: 1})
	if err := sys.Enqueue(ctx, 1); err != nil {
		t.Fatal(err)
	}
	start, err := d.Now(ctx)
	if err != nil {
		t.Fatal(err)
	}
	smp, err := newSampler(ctx, sys, d.Lab, start)
	if err != nil {
		t.Fatal(err)
	}
	// A worker's session, claiming the job in a transaction that stays
	// open a while: a slow claim statement, or its commit.
	cc, err := pgx.ParseConfig(d.URL)
	if err != nil {
		t.Fatal(err)
	}
	cc.RuntimeParams["application_name"] = "relay-worker-slow"
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, `UPDATE jobs SET state = 'running', attempt = 1, fence = fence + 1, lease_token = gen_random_uuid(),
		lease_expires_at = now() + interval '1 minute', leased_by = 'slow', started_at = now() WHERE queue = $1`, Queue); err != nil {
		t.Fatal(err)
	}
	var claimed int64
	var pickups int
	take := func() {
		t.Helper()
		s, err := smp.take(ctx)
		if err != nil {
			t.Fatal(err)
		}
		claimed += int64(s.ClaimedPerSec*(s.WindowEnd-s.WindowStart) + 0.5)
		pickups += len(s.pickups)
	}
	time.Sleep(windowLag + 500*time.Millisecond)
	take() // while the claim is open, its start a window's lag behind
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(windowLag + 200*time.Millisecond)
	take()
	time.Sleep(windowLag + 200*time.Millisecond)
	take()
	if claimed != 1 || pickups != 1 {
		t.Errorf("the claim counted %d times with %d pickups over the windows, want once with its pickup", claimed, pickups)
	}
}
