package faultproxy

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/pgurl"
)

// proxied returns a fresh migrated database's URL, and a proxy to its
// server with a URL that goes through it.
func proxied(t *testing.T) (direct, through string, p *Proxy) {
	t.Helper()
	direct = dbtest.NewURL(t)
	target, err := pgurl.HostPort(direct)
	if err != nil {
		t.Fatal(err)
	}
	p, err = Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	through, err = pgurl.WithHostPort(direct, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	return direct, through, p
}

func connect(t *testing.T, ctx context.Context, dsn string) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close(context.Background()) })
	return c
}

func TestProxy_ForwardsUntilCutThenRefusesUntilHealed(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, through, p := proxied(t)
	c := connect(t, ctx, through)
	if err := c.Ping(ctx); err != nil {
		t.Fatalf("ping through the proxy: %v", err)
	}

	if n := p.Cut(); n != 1 {
		t.Errorf("Cut closed %d connections, want 1", n)
	}
	if err := c.Ping(ctx); err == nil {
		t.Errorf("ping on a cut connection succeeded")
	}
	shortCtx, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	_, err := pgx.Connect(shortCtx, through)
	cancelShort()
	if err == nil {
		t.Errorf("connected while cut")
	}

	p.Heal()
	c2 := connect(t, ctx, through)
	if err := c2.Ping(ctx); err != nil {
		t.Errorf("ping after Heal: %v", err)
	}
	if s := p.Stats(); s.Refused < 1 || s.Cut != 1 {
		t.Errorf("stats = %+v, want at least one refused connection and one cut", s)
	}
}

func TestProxy_BlackholeHoldsTrafficAndDeliversItLateOnHeal(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	direct, through, p := proxied(t)
	c := connect(t, ctx, through)
	if err := c.Ping(ctx); err != nil {
		t.Fatal(err)
	}

	p.Blackhole()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "INSERT INTO jobs (kind) VALUES ('sent during the blackhole')")
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("a statement completed through a blackhole (err %v)", err)
	case <-time.After(500 * time.Millisecond):
	}
	d := connect(t, ctx, direct)
	var n int
	if err := d.QueryRow(ctx, "SELECT count(*) FROM jobs").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the server saw the statement during the blackhole: %d rows, %v", n, err)
	}

	p.Heal()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("statement after Heal: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the held statement was not delivered after Heal")
	}
	if err := d.QueryRow(ctx, "SELECT count(*) FROM jobs").Scan(&n); err != nil || n != 1 {
		t.Errorf("after Heal: %d rows, %v; want the one sent during the blackhole", n, err)
	}
}

func TestProxy_SlowDeliversEachStatementLateAndLosesNothing(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	direct, through, p := proxied(t)
	c := connect(t, ctx, through)
	d := connect(t, ctx, direct)
	const hold = 400 * time.Millisecond

	p.Slow(hold)
	sent := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(ctx, "INSERT INTO jobs (kind) VALUES ('sent while slow')")
		done <- err
	}()
	time.Sleep(hold / 4)
	var n int
	if err := d.QueryRow(ctx, "SELECT count(*) FROM jobs").Scan(&n); err != nil || n != 0 {
		t.Fatalf("the server saw the statement before its hold ended: %d rows, %v", n, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("statement through a slow proxy: %v", err)
	}
	if took := time.Since(sent); took < hold {
		t.Errorf("statement answered %s after it was sent, want at least the hold, %s", took, hold)
	}
	if err := d.QueryRow(ctx, "SELECT count(*) FROM jobs").Scan(&n); err != nil || n != 1 {
		t.Errorf("after the hold: %d rows, %v; want the one sent", n, err)
	}

	p.Slow(0)
	if _, err := c.Exec(ctx, "INSERT INTO jobs (kind) VALUES ('sent after')"); err != nil {
		t.Fatalf("statement after Slow(0): %v", err)
	}
	if st := p.Stats(); st.Open != 1 || st.Cut != 0 {
		t.Errorf("stats %+v; want the connection still open and none cut", st)
	}
}

func TestProxy_CutAfterCommitLeavesTheClientUnsureAlthoughTheStatementCommitted(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	direct, through, p := proxied(t)
	d := db.New(connect(t, ctx, direct))
	c := connect(t, ctx, through)
	q := db.New(c)

	// Two jobs, claimed through the proxy.
	if _, err := d.JobInsertMany(ctx, db.JobInsertManyParams{
		Queues: []string{"default", "default"}, Kinds: []string{"noop", "noop"},
		Payloads: [][]byte{json.RawMessage("{}"), json.RawMessage("{}")}, Priorities: []int16{0, 0},
		MaxAttempts: []int32{3, 3}, RunAts: []time.Time{{}, {}}, DelaysMs: []int64{0, 0},
	}); err != nil {
		t.Fatal(err)
	}
	claim := func(complete []db.JobCompleteAndClaimRow, max int32) ([]db.JobCompleteAndClaimRow, error) {
		p := db.JobCompleteAndClaimParams{Queue: "default", LeaseMs: 60_000, WorkerID: "w"}
		for range max {
			p.ClaimTokens = append(p.ClaimTokens, newToken())
		}
		for _, r := range complete {
			p.CompleteIDs = append(p.CompleteIDs, *r.ID)
			p.CompleteTokens = append(p.CompleteTokens, r.LeaseToken)
			p.CompleteResults = append(p.CompleteResults, []byte(`{"ok":true}`))
		}
		if p.CompleteIDs == nil {
			p.CompleteIDs, p.CompleteTokens, p.CompleteResults = []int64{}, []pgtype.UUID{}, [][]byte{}
		}
		return q.JobCompleteAndClaim(ctx, p)
	}

	var cuts atomic.Int32
	p.CutAfterCommit(CommitCut{Statement: "JobCompleteAndClaim", NonEmptyFirstArray: true, Times: 1,
		OnCut: func(CutEvent) { cuts.Add(1) }})
	// A claim that completes nothing is left alone...
	rows, err := claim(nil, 2)
	if err != nil || len(rows) != 2 || rows[0].ID == nil {
		t.Fatalf("claim through an armed proxy: %d rows, %v; want 2 jobs", len(rows), err)
	}
	// ...a completion is cut just after it commits.
	_, err = claim(rows[:1], 0)
	if err == nil {
		t.Fatal("the completion's answer arrived, want the connection cut")
	}
	job, gerr := d.JobGet(ctx, *rows[0].ID)
	if gerr != nil {
		t.Fatal(gerr)
	}
	if job.State != db.JobStateSucceeded {
		t.Errorf("the cut completion did not commit: job is %s", job.State)
	}
	time.Sleep(50 * time.Millisecond)
	if cuts.Load() != 1 || p.Armed() != 0 {
		t.Errorf("OnCut called %d times, %d cuts still armed; want 1 and 0", cuts.Load(), p.Armed())
	}
	var netErr interface{ Timeout() bool }
	if errors.As(err, &netErr) && netErr.Timeout() {
		t.Errorf("the client timed out instead of seeing its connection cut: %v", err)
	}
}

func TestFirstParamNonEmptyArray(t *testing.T) {
	bind := func(format uint16, val []byte) []byte {
		var b []byte
		b = binary.BigEndian.AppendUint16(b, 1) // one format code for all
		b = binary.BigEndian.AppendUint16(b, format)
		b = binary.BigEndian.AppendUint16(b, 1) // one parameter
		if val == nil {
			return binary.BigEndian.AppendUint32(b, 0xFFFFFFFF)
		}
		b = binary.BigEndian.AppendUint32(b, uint32(len(val)))
		return append(b, val...)
	}
	binArray := func(lengths ...uint32) []byte {
		b := binary.BigEndian.AppendUint32(nil, uint32(len(lengths)))
		b = binary.BigEndian.AppendUint32(b, 0)  // no nulls
		b = binary.BigEndian.AppendUint32(b, 20) // int8
		for _, n := range lengths {
			b = binary.BigEndian.AppendUint32(b, n)
			b = binary.BigEndian.AppendUint32(b, 1)
		}
		return b
	}
	for _, tc := range []struct {
		name string
		msg  []byte
		want bool
	}{
		{"binary, two elements", bind(1, append(binArray(2), make([]byte, 24)...)), true},
		{"binary, one dimension of length 0 (pgx's empty slice)", bind(1, binArray(0)), false},
		{"binary, no dimension", bind(1, binArray()), false},
		{"text, two elements", bind(0, []byte("{1,2}")), true},
		{"text, empty", bind(0, []byte("{}")), false},
		{"NULL", bind(1, nil), false},
		{"cut short", []byte{0, 1}, false},
	} {
		if got := firstParamNonEmptyArray(tc.msg); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestBackendParser_FindsReadyForQueryAcrossChunks(t *testing.T) {
	msg := func(typ byte, body string) []byte {
		b := []byte{typ}
		b = binary.BigEndian.AppendUint32(b, uint32(4+len(body)))
		return append(b, body...)
	}
	stream := append(append(msg('C', "UPDATE 1\x00"), msg('Z', "I")...), msg('Z', "I")...)
	for split := 1; split < len(stream); split++ {
		var p backendParser
		var ends []int
		offset := 0
		for _, chunk := range [][]byte{stream[:split], stream[split:]} {
			p.feed(chunk, func(end int, failed bool) { ends = append(ends, offset+end) })
			offset += len(chunk)
		}
		first := len(msg('C', "UPDATE 1\x00")) + len(msg('Z', "I"))
		if len(ends) != 2 || ends[0] != first || ends[1] != len(stream) {
			t.Fatalf("split at %d: ReadyForQuery ends at %v, want [%d %d]", split, ends, first, len(stream))
		}
	}
}

// newToken draws a fresh random lease token.
func newToken() pgtype.UUID { return pgtype.UUID{Bytes: uuid.New(), Valid: true} }
