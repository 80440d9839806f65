package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
	"github.com/relayq/relay/internal/dbtest"
	"github.com/relayq/relay/internal/jsonb"
)

func ptr[T any](v T) *T { return &v }

// newJob validates req as of now, of kind "k" unless it names one.
func newJob(t testing.TB, req client.Request) client.Job {
	t.Helper()
	if req.Kind == "" {
		req.Kind = "k"
	}
	j, err := client.Validate(req, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// connect opens a connection of its own to pool's database, closed when
// the test ends.
func connect(t testing.TB, pool *pgxpool.Pool) *pgx.Conn {
	t.Helper()
	conn, err := pgx.ConnectConfig(t.Context(), pool.Config().ConnConfig)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestValidate_AppliesTheDefaults(t *testing.T) {
	job, err := client.Validate(client.Request{Kind: "email"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want := client.Job{Queue: "default", Kind: "email", Payload: json.RawMessage(`{}`), MaxAttempts: 25}
	if diff := cmp.Diff(want, job); diff != "" {
		t.Errorf("job (-want +got):\n%s", diff)
	}
}

func TestValidate_RefusesEachBadFieldByName(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	tooDeep := client.MaxPayloadDepth + 1
	tooDeepMsg := fmt.Sprintf("payload must not nest arrays and objects more than %d deep", client.MaxPayloadDepth)
	tests := []struct {
		name  string
		req   client.Request
		field string
		msg   string
	}{
		{"no kind", client.Request{}, "kind", "kind is required"},
		{"long kind", client.Request{Kind: strings.Repeat("k", 129)}, "kind", "kind must be at most 128 bytes"},
		{"kind with NUL", client.Request{Kind: "a\x00b"}, "kind", `kind must not contain NUL characters (\u0000)`},
		{"kind not UTF-8", client.Request{Kind: "a\xffb"}, "kind", "kind must be valid UTF-8"},
		{"kind with a newline", client.Request{Kind: "send\nemail"}, "kind", "kind must not contain control characters (U+000A at byte 4)"},
		{"kind with an escape", client.Request{Kind: "\x1b[31mred"}, "kind", "kind must not contain control characters (U+001B at byte 0)"},
		{"kind with DEL", client.Request{Kind: "k\x7f"}, "kind", "kind must not contain control characters (U+007F at byte 1)"},
		{"kind with a C1 control", client.Request{Kind: "é\u0085"}, "kind", "kind must not contain control characters (U+0085 at byte 2)"},
		{"empty queue", client.Request{Kind: "k", Queue: ptr("")}, "queue", "queue must not be empty"},
		{"queue with NUL", client.Request{Kind: "k", Queue: ptr("\x00")}, "queue", `queue must not contain NUL characters (\u0000)`},
		{"queue with a tab", client.Request{Kind: "k", Queue: ptr("a\tb")}, "queue", "queue must not contain control characters (U+0009 at byte 1)"},
		{"queue with a carriage return", client.Request{Kind: "k", Queue: ptr("q\r")}, "queue", "queue must not contain control characters (U+000D at byte 1)"},
		{"queue with a C1 control", client.Request{Kind: "k", Queue: ptr("\u009bq")}, "queue", "queue must not contain control characters (U+009B at byte 0)"},
		{"payload not JSON", client.Request{Kind: "k", Payload: json.RawMessage(`{not json`)}, "payload", "payload is not valid JSON"},
		{"payload of two values", client.Request{Kind: "k", Payload: json.RawMessage(`{"a":1} {"b":2}`)}, "payload", "payload is not valid JSON"},
		{"payload trailing text", client.Request{Kind: "k", Payload: json.RawMessage(`123abc`)}, "payload", "payload is not valid JSON"},
		{"payload of blanks", client.Request{Kind: "k", Payload: json.RawMessage(`   `)}, "payload", "payload is not valid JSON"},
		{"payload nested too deep", client.Request{Kind: "k", Payload: json.RawMessage(strings.Repeat("[", tooDeep) + strings.Repeat("]", tooDeep))}, "payload", tooDeepMsg},
		{"payload nested too deep for encoding/json", client.Request{Kind: "k", Payload: json.RawMessage(strings.Repeat("[", 10001) + strings.Repeat("]", 10001))}, "payload", tooDeepMsg},
		{"payload nested too deep in a string's company", client.Request{Kind: "k", Payload: json.RawMessage(`{"s":"[{\\\"",` + strings.Repeat(`{"a":`, tooDeep-1) + "1" + strings.Repeat("}", tooDeep-1) + "}")}, "payload", tooDeepMsg},
		{"payload jsonb cannot hold", client.Request{Kind: "k", Payload: json.RawMessage(`"\u0000"`)}, "payload", "payload "},
		{"payload key given twice", client.Request{Kind: "k", Payload: json.RawMessage(`{"amount":100,"amount":1}`)}, "payload", `payload contains the key "amount" twice in one object, at byte 14`},
		{"payload key given twice, escaped", client.Request{Kind: "k", Payload: json.RawMessage(`[{"ok":{"a":1,"\u0061":2}}]`)}, "payload", `payload contains the key "a" twice in one object, at byte 14`},
		{"priority too high", client.Request{Kind: "k", Priority: ptr(int64(32768))}, "priority", "priority must be an integer from -32768 to 32767"},
		{"zero max attempts", client.Request{Kind: "k", MaxAttempts: ptr(int64(0))}, "max_attempts", "max_attempts must be an integer from 1 to 1000"},
		{"run_at and delay", client.Request{Kind: "k", RunAt: &now, Delay: ptr(time.Second)}, "delay", "delay must not be given together with run_at"},
		{"run_at before 1970", client.Request{Kind: "k", RunAt: ptr(time.Date(1969, 1, 1, 0, 0, 0, 0, time.UTC))}, "run_at", "run_at must not be before 1970"},
		{"run_at beyond a year", client.Request{Kind: "k", RunAt: ptr(now.Add(client.MaxDelay + time.Second))}, "run_at", "run_at must be at most 8760h0m0s from now"},
		{"negative delay", client.Request{Kind: "k", Delay: ptr(-time.Second)}, "delay", "delay must not be negative"},
		{"empty idempotency key", client.Request{Kind: "k", IdempotencyKey: ptr("")}, "idempotency_key", "idempotency_key must not be empty"},
		{"long idempotency key", client.Request{Kind: "k", IdempotencyKey: ptr(strings.Repeat("i", 256))}, "idempotency_key", "idempotency_key must be at most 255 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := client.Validate(tt.req, now)
			var fe *client.FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("err = %v, want a *FieldError", err)
			}
			if fe.Field != tt.field || !strings.HasPrefix(fe.Error(), tt.msg) {
				t.Errorf("refused %q: %q, want %q: %q…", fe.Field, fe.Error(), tt.field, tt.msg)
			}
		})
	}
}

// TestInsert_StoresAPayloadNestedAsDeepAsValidateAccepts: a payload whose
// arrays and objects nest MaxPayloadDepth deep is valid, and jsonb holds it.
func TestInsert_StoresAPayloadNestedAsDeepAsValidateAccepts(t *testing.T) {
	pool := dbtest.New(t)
	for name, payload := range map[string]string{
		"arrays":  strings.Repeat("[", client.MaxPayloadDepth) + strings.Repeat("]", client.MaxPayloadDepth),
		"objects": strings.Repeat(`{"a":`, client.MaxPayloadDepth) + "1" + strings.Repeat("}", client.MaxPayloadDepth),
	} {
		t.Run(name, func(t *testing.T) {
			job := newJob(t, client.Request{Payload: json.RawMessage(payload)})
			stored, _, err := client.Insert(t.Context(), pool, job)
			if err != nil {
				t.Fatal(err)
			}
			if !jsonb.Equal(stored.Payload, job.Payload) {
				t.Errorf("stored a payload of %d bytes, want the %d given", len(stored.Payload), len(payload))
			}
		})
	}
}

// TestValidate_AcceptsNamesOfPrintableCharacters: the control characters
// refused are those of Unicode's Cc category; spaces, format characters
// and the rest of Unicode are names like any other.
func TestValidate_AcceptsNamesOfPrintableCharacters(t *testing.T) {
	for _, name := range []string{"send email", "e\u0301té", "\u00a0nbsp", "zero\u200bwidth", "日本語", "\U0001F600"} {
		if _, err := client.Validate(client.Request{Kind: name, Queue: &name}, time.Now()); err != nil {
			t.Errorf("kind and queue %q: %v", name, err)
		}
	}
}

// TestCheckName_AcceptsControlCharactersThatValidateRefuses: jobs stored
// before Validate refused control characters in their names can still be
// looked for by name, as can jobs whose names the database holds in more
// bytes than Validate allows; what PostgreSQL cannot hold is refused as
// before.
func TestCheckName_AcceptsControlCharactersThatValidateRefuses(t *testing.T) {
	for _, name := range []string{"send\nemail", "\x1b[31mred", "k\x7f", "é\u0085", "a\tb", strings.Repeat("é", 128)} {
		if err := client.CheckName(client.FieldQueue, name); err != nil {
			t.Errorf("CheckName(%q) = %v, want nil", name, err)
		}
		if _, err := client.Validate(client.Request{Kind: name}, time.Now()); err == nil {
			t.Errorf("Validate accepted the kind %q", name)
		}
	}
	for name, want := range map[string]string{
		"":                       "queue must not be empty",
		"a\x00b":                 `queue must not contain NUL characters (\u0000)`,
		"a\xffb":                 "queue must be valid UTF-8",
		strings.Repeat("q", 129): "queue must be at most 128 characters",
		strings.Repeat("é", 129): "queue must be at most 128 characters",
	} {
		var fe *client.FieldError
		if err := client.CheckName(client.FieldQueue, name); !errors.As(err, &fe) || fe.Error() != want {
			t.Errorf("CheckName(%q) = %v, want %q", name, err, want)
		}
	}
}

func TestFieldError_SpellsFieldsAsItsCallerNamesThem(t *testing.T) {
	_, err := client.Validate(client.Request{Kind: "k", RunAt: ptr(time.Now()), Delay: ptr(time.Second)}, time.Now())
	var fe *client.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("err = %v, want a *FieldError", err)
	}
	flag := func(f string) string { return "--" + strings.ReplaceAll(f, "_", "-") }
	if got, want := fe.Message(flag), "--delay must not be given together with --run-at"; got != want {
		t.Errorf("Message = %q, want %q", got, want)
	}
}

func TestInsert_ReplaysTheSameJobAndRefusesADifferentOneUnderAKey(t *testing.T) {
	pool := dbtest.New(t)
	ctx := t.Context()
	job := func(payload string) client.Job {
		j, err := client.Validate(client.Request{Kind: "k", Payload: json.RawMessage(payload), IdempotencyKey: ptr("once")}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return j
	}
	first, replayed, err := client.Insert(ctx, pool, job(`{"a":1,"b":2}`))
	if err != nil || replayed {
		t.Fatalf("first insert: replayed %v, err %v", replayed, err)
	}
	again, replayed, err := client.Insert(ctx, pool, job(`{"b":2,"a":1}`))
	if err != nil || !replayed || again.ID != first.ID {
		t.Errorf("the same job again: job %d, replayed %v, err %v; want job %d replayed", again.ID, replayed, err, first.ID)
	}
	other, _, err := client.Insert(ctx, pool, job(`{"a":2}`))
	if !errors.Is(err, client.ErrIdempotencyConflict) || other.ID != first.ID {
		t.Errorf("a different job under the key: job %d, err %v; want job %d and ErrIdempotencyConflict", other.ID, err, first.ID)
	}
}

func TestInsert_InTheCallersTransactionCommitsOrRollsBackWithIt(t *testing.T) {
	pool := dbtest.New(t)
	ctx := t.Context()
	job, err := client.Validate(client.Request{Kind: "k"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, commit := range []bool{false, true} {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		stored, _, err := client.Insert(ctx, tx, job)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := client.InsertMany(ctx, tx, []client.Job{job, job})
		if err != nil {
			t.Fatal(err)
		}
		if commit {
			err = tx.Commit(ctx)
		} else {
			err = tx.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range append(ids, stored.ID) {
			_, err := db.New(pool).JobGet(ctx, id)
			if found := err == nil; found != commit {
				t.Errorf("commit %v: job %d found %v (err %v)", commit, id, found, err)
			}
		}
	}
}

// TestInsert_AnnouncesEachReadyJobOnceItCommits listens as a worker of the
// default queue does and checks what it hears of each way of storing a
// job: one notification per commit that stores ready jobs in the queue,
// sent once they are committed and never before; none for jobs that run
// later, or for an idempotent replay. A statement of Insert's or
// InsertMany's that commits on its own is announced by them after its
// commit, and the jobs stored through a client.Tx by its Commit; the
// jobs of any other transaction, and InsertAll's, at their commit by the
// trigger; either way exactly once.
func TestInsert_AnnouncesEachReadyJobOnceItCommits(t *testing.T) {
	pool := dbtest.New(t)
	ctx := t.Context()
	job := newJob
	insert := func(t *testing.T, dbtx db.DBTX, j client.Job) {
		t.Helper()
		if _, _, err := client.Insert(ctx, dbtx, j); err != nil {
			t.Fatal(err)
		}
	}
	exec := func(t *testing.T, dbtx db.DBTX, sql string) {
		t.Helper()
		if _, err := dbtx.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	many := func(t *testing.T, dbtx db.DBTX, jobs ...client.Job) {
		t.Helper()
		if _, err := client.InsertMany(ctx, dbtx, jobs); err != nil {
			t.Fatal(err)
		}
	}
	all := func(t *testing.T, dbtx db.DBTX, jobs ...client.Job) {
		t.Helper()
		if _, err := client.InsertAll(ctx, dbtx, jobs); err != nil {
			t.Fatal(err)
		}
	}
	// byHand runs store on a connection of pool inside a transaction
	// begun and committed by hand, calling uncommitted before the COMMIT.
	byHand := func(t *testing.T, uncommitted func(), store func(conn *pgxpool.Conn)) {
		t.Helper()
		conn, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Release()
		exec(t, conn, "BEGIN")
		store(conn)
		uncommitted()
		exec(t, conn, "COMMIT")
	}
	// begin begins a client.Tx on pool, rolled back when the test ends
	// unless it has ended by then.
	begin := func(t *testing.T) *client.Tx {
		t.Helper()
		tx, err := client.Begin(ctx, pool)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tx.Rollback(context.Background()) })
		return tx
	}
	commit := func(t *testing.T, tx pgx.Tx) {
		t.Helper()
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		// do stores jobs; before its commit, if it has one, it calls
		// uncommitted, by when nothing may have been heard.
		do    func(t *testing.T, uncommitted func())
		heard int
	}{
		{name: "through a pool", heard: 1, do: func(t *testing.T, _ func()) {
			insert(t, pool, job(t, client.Request{}))
		}},
		{name: "on a pool's connection, then a plain insert on it", heard: 2, do: func(t *testing.T, _ func()) {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Release()
			insert(t, conn, job(t, client.Request{}))
			// Insert's setting ends with its statement: an insert of
			// someone else's on the same connection is announced by the
			// trigger.
			exec(t, conn, `INSERT INTO jobs (kind) VALUES ('plain')`)
		}},
		{name: "on a connection of its own", heard: 1, do: func(t *testing.T, _ func()) {
			insert(t, connect(t, pool), job(t, client.Request{}))
		}},
		{name: "in the caller's transaction", heard: 1, do: func(t *testing.T, uncommitted func()) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			insert(t, tx, job(t, client.Request{}))
			uncommitted()
			commit(t, tx)
		}},
		{name: "on a connection in a transaction begun by hand", heard: 1, do: func(t *testing.T, uncommitted func()) {
			byHand(t, uncommitted, func(conn *pgxpool.Conn) { insert(t, conn, job(t, client.Request{})) })
		}},
		{name: "several at once through a pool", heard: 1, do: func(t *testing.T, _ func()) {
			if _, err := client.InsertAll(ctx, pool, []client.Job{
				job(t, client.Request{}), job(t, client.Request{}),
				job(t, client.Request{Queue: ptr("other")}), job(t, client.Request{Delay: ptr(time.Hour)}),
			}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "InsertMany through a pool, on two queues and with a delayed job", heard: 1, do: func(t *testing.T, _ func()) {
			many(t, pool, job(t, client.Request{}), job(t, client.Request{}),
				job(t, client.Request{Queue: ptr("other")}), job(t, client.Request{Delay: ptr(time.Hour)}))
		}},
		{name: "InsertMany on a connection in a transaction begun by hand", heard: 1, do: func(t *testing.T, uncommitted func()) {
			byHand(t, uncommitted, func(conn *pgxpool.Conn) { many(t, conn, job(t, client.Request{}), job(t, client.Request{})) })
		}},
		{name: "InsertMany through a pool, only jobs to run in an hour", heard: 0, do: func(t *testing.T, _ func()) {
			many(t, pool, job(t, client.Request{Delay: ptr(time.Hour)}), job(t, client.Request{RunAt: ptr(time.Now().Add(time.Hour))}))
		}},
		{name: "several at once in the caller's transaction", heard: 1, do: func(t *testing.T, uncommitted func()) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			all(t, tx, job(t, client.Request{}), job(t, client.Request{}))
			uncommitted()
			commit(t, tx)
		}},
		{name: "in a Tx, announced once it has committed", heard: 1, do: func(t *testing.T, uncommitted func()) {
			tx := begin(t)
			insert(t, tx, job(t, client.Request{}))
			insert(t, tx, job(t, client.Request{}))
			uncommitted()
			commit(t, tx)
		}},
		{name: "in a Tx, whose commit alone announces nothing", heard: 0, do: func(t *testing.T, uncommitted func()) {
			tx := begin(t)
			insert(t, tx, job(t, client.Request{}))
			many(t, tx, job(t, client.Request{}))
			// Someone else's insert after them in the transaction is left
			// to the poll too.
			exec(t, tx, `INSERT INTO jobs (kind) VALUES ('plain')`)
			uncommitted()
			// The transaction inside, committed without Tx.Commit's
			// announcement.
			commit(t, tx.Tx)
		}},
		{name: "in a Tx, then through the pgx.Tx inside", heard: 2, do: func(t *testing.T, uncommitted func()) {
			tx := begin(t)
			insert(t, tx, job(t, client.Request{}))
			// Given the pgx.Tx inside, Insert sets relay.announce back:
			// the commit notifies, and Commit announces the first job.
			insert(t, tx.Tx, job(t, client.Request{}))
			uncommitted()
			commit(t, tx)
		}},
		{name: "in a Tx on a connection of its own, several at once", heard: 1, do: func(t *testing.T, uncommitted func()) {
			tx, err := client.BeginTx(ctx, connect(t, pool), pgx.TxOptions{IsoLevel: pgx.Serializable})
			if err != nil {
				t.Fatal(err)
			}
			defer tx.Rollback(context.Background())
			many(t, tx, job(t, client.Request{Delay: ptr(time.Hour)}), job(t, client.Request{Queue: ptr("other")}), job(t, client.Request{}))
			uncommitted()
			commit(t, tx)
		}},
		{name: "in a Tx, whole jobs at once", heard: 1, do: func(t *testing.T, uncommitted func()) {
			tx := begin(t)
			all(t, tx, job(t, client.Request{}), job(t, client.Request{Delay: ptr(time.Hour)}))
			uncommitted()
			commit(t, tx)
		}},
		{name: "in a Tx, only jobs to run in an hour", heard: 0, do: func(t *testing.T, uncommitted func()) {
			tx := begin(t)
			insert(t, tx, job(t, client.Request{Delay: ptr(time.Hour)}))
			all(t, tx, job(t, client.Request{Delay: ptr(time.Hour)}))
			many(t, tx, job(t, client.Request{Delay: ptr(time.Hour)}))
			uncommitted()
			commit(t, tx)
		}},
		{name: "in a Tx rolled back", heard: 0, do: func(t *testing.T, uncommitted func()) {
			tx := begin(t)
			insert(t, tx, job(t, client.Request{}))
			uncommitted()
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "in a Tx whose commit fails", heard: 0, do: func(t *testing.T, uncommitted func()) {
			tx := begin(t)
			insert(t, tx, job(t, client.Request{}))
			if _, err := tx.Exec(ctx, `SELECT 1/0`); err == nil {
				t.Fatal("division by zero succeeded")
			}
			uncommitted()
			if err := tx.Commit(ctx); !errors.Is(err, pgx.ErrTxCommitRollback) {
				t.Errorf("Commit of a failed transaction: %v, want %v", err, pgx.ErrTxCommitRollback)
			}
		}},
		{name: "only jobs to run in an hour, at once", heard: 0, do: func(t *testing.T, _ func()) {
			if _, err := client.InsertAll(ctx, pool, []client.Job{job(t, client.Request{Delay: ptr(time.Hour)})}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "a job to run in an hour", heard: 0, do: func(t *testing.T, _ func()) {
			insert(t, pool, job(t, client.Request{Delay: ptr(time.Hour)}))
		}},
		{name: "an idempotent replay", heard: 1, do: func(t *testing.T, _ func()) {
			j := job(t, client.Request{IdempotencyKey: ptr("once")})
			insert(t, pool, j)
			insert(t, pool, j)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			listener, channels := dbtest.Listen(t, pool, "default")
			count := func() int {
				n := 0
				for _, heard := range dbtest.Heard(t, ctx, listener) {
					if heard.Channel != channels.AvailableChannel || heard.Payload != "default" {
						t.Errorf("notification %q on %s, want %q on %s", heard.Payload, heard.Channel, "default", channels.AvailableChannel)
						continue
					}
					n++
				}
				return n
			}
			tc.do(t, func() {
				if n := count(); n != 0 {
					t.Errorf("heard %d notifications before the commit, want none", n)
				}
			})
			if n := count(); n != tc.heard {
				t.Errorf("heard %d notifications, want %d", n, tc.heard)
			}
		})
	}
}

func TestInsertMany_RefusesWhatABatchCannotHold(t *testing.T) {
	pool := dbtest.New(t)
	job, err := client.Validate(client.Request{Kind: "k"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	keyed := job
	keyed.IdempotencyKey = ptr("key")
	for name, jobs := range map[string][]client.Job{
		"none":              nil,
		"too many":          make([]client.Job, client.MaxBatchJobs+1),
		"an idempotent job": {job, keyed},
	} {
		if _, err := client.InsertMany(t.Context(), pool, jobs); err == nil {
			t.Errorf("InsertMany, %s: no error", name)
		}
		if _, err := client.InsertAll(t.Context(), pool, jobs); err == nil {
			t.Errorf("InsertAll, %s: no error", name)
		}
	}
}

// TestInsertManyAndAll_AFullBatchComesBackJobForJobInTheOrderGiven stores
// a batch as large as one can be, each job numbered in its payload, and
// reads each returned id back: the id at position i is the job given at
// position i.
func TestInsertManyAndAll_AFullBatchComesBackJobForJobInTheOrderGiven(t *testing.T) {
	pool := dbtest.New(t)
	ctx := t.Context()
	jobs := make([]client.Job, client.MaxBatchJobs)
	for i := range jobs {
		job, err := client.Validate(client.Request{
			Kind:     fmt.Sprintf("k%d", i%7),
			Queue:    ptr(fmt.Sprintf("q%d", i%3)),
			Priority: ptr(int64(i % 5)),
			Payload:  json.RawMessage(fmt.Sprintf(`{"n":%d}`, i)),
		}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		jobs[i] = job
	}
	insertAll := func(ctx context.Context, pool *pgxpool.Pool, jobs []client.Job) ([]int64, error) {
		stored, err := client.InsertAll(ctx, pool, jobs)
		ids := make([]int64, len(stored))
		for i, j := range stored {
			ids[i] = j.ID
		}
		return ids, err
	}
	for name, insert := range map[string]func(context.Context, *pgxpool.Pool, []client.Job) ([]int64, error){
		"InsertMany": func(ctx context.Context, pool *pgxpool.Pool, jobs []client.Job) ([]int64, error) {
			return client.InsertMany(ctx, pool, jobs)
		},
		"InsertAll": insertAll,
	} {
		ids, err := insert(ctx, pool, jobs)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(ids) != len(jobs) {
			t.Fatalf("%s: %d ids for %d jobs", name, len(ids), len(jobs))
		}
		rows, err := db.New(pool).JobGetMany(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		byID := make(map[int64]db.Job, len(rows))
		for _, r := range rows {
			byID[r.ID] = r
		}
		wrong := 0
		for i, id := range ids {
			got, want := byID[id], jobs[i]
			if got.Queue != want.Queue || got.Kind != want.Kind || got.Priority != want.Priority || !jsonb.Equal(got.Payload, want.Payload) {
				if wrong++; wrong <= 3 {
					t.Errorf("%s: id %d at position %d is the job %s %s %s, want %s %s %s", name, id, i,
						got.Queue, got.Kind, got.Payload, want.Queue, want.Kind, want.Payload)
				}
			}
		}
		if wrong > 0 {
			t.Errorf("%s: %d of %d ids are another job's", name, wrong, len(ids))
		}
	}
}

// TestInsertAll_ReturnsTheJobsWholeInTheOrderGiven stores jobs that differ
// in every field a request sets, and checks each returned job against its
// request and against the stored row.
func TestInsertAll_ReturnsTheJobsWholeInTheOrderGiven(t *testing.T) {
	pool := dbtest.New(t)
	ctx := t.Context()
	now := time.Now()
	at := now.Add(time.Hour).Truncate(time.Microsecond)
	var jobs []client.Job
	for _, r := range []client.Request{
		{Kind: "c", Queue: ptr("q3"), Payload: json.RawMessage(`{"n":3}`), Priority: ptr(int64(3)), MaxAttempts: ptr(int64(3))},
		{Kind: "a", Delay: ptr(90 * time.Second)},
		{Kind: "b", Queue: ptr("q1"), RunAt: &at},
	} {
		job, err := client.Validate(r, now)
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, job)
	}
	stored, err := client.InsertAll(ctx, pool, jobs)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != len(jobs) {
		t.Fatalf("%d jobs returned for %d", len(stored), len(jobs))
	}
	for i, got := range stored {
		want := jobs[i]
		if got.Kind != want.Kind || got.Queue != want.Queue || got.Priority != want.Priority ||
			got.MaxAttempts != want.MaxAttempts || !jsonb.Equal(got.Payload, want.Payload) || got.State != db.JobStateAvailable {
			t.Errorf("job %d: %+v, want %+v", i, got, want)
		}
		if want.RunAt != nil && !got.RunAt.Equal(*want.RunAt) {
			t.Errorf("job %d runs at %s, want %s", i, got.RunAt, *want.RunAt)
		}
		if delay := got.RunAt.Sub(got.CreatedAt); want.DelayMs > 0 && delay != time.Duration(want.DelayMs)*time.Millisecond {
			t.Errorf("job %d runs %s after it was created, want %dms", i, delay, want.DelayMs)
		}
		row, err := db.New(pool).JobGet(ctx, got.ID)
		if err != nil || !row.RunAt.Equal(got.RunAt) || row.Kind != got.Kind {
			t.Errorf("job %d as stored: %+v, %v; returned %+v", i, row, err, got)
		}
	}
}

// TestInsertManyAndAll_FailWhereATriggerDropsJobs stores three jobs, the
// second of which a BEFORE INSERT trigger of the user's drops, through
// each kind of DBTX, and jobs ready now as well as delayed ones (whose
// statement goes without an announcement behind it): neither insert
// answers ids or jobs that no longer line up with those given. Each fails
// with a JobsDroppedError that says that two of three were stored, and
// committed where the statement committed on its own; in the caller's
// transaction they are not, and its rollback leaves none.
func TestInsertManyAndAll_FailWhereATriggerDropsJobs(t *testing.T) {
	pool := dbtest.New(t)
	dbtest.DropJobsOfKind(t, pool)
	ctx := t.Context()
	inserts := map[string]func(db.DBTX, []client.Job) (int, error){
		"InsertMany": func(dbtx db.DBTX, jobs []client.Job) (int, error) {
			ids, err := client.InsertMany(ctx, dbtx, jobs)
			return len(ids), err
		},
		"InsertAll": func(dbtx db.DBTX, jobs []client.Job) (int, error) {
			stored, err := client.InsertAll(ctx, dbtx, jobs)
			return len(stored), err
		},
	}
	// Each opens what the jobs are inserted through, and returns it with
	// the rollback that ends it: nil where the statement commits on its
	// own.
	dbtxs := map[string]func(t *testing.T) (db.DBTX, func(context.Context) error){
		"pool": func(*testing.T) (db.DBTX, func(context.Context) error) { return pool, nil },
		"connection": func(t *testing.T) (db.DBTX, func(context.Context) error) {
			return connect(t, pool), nil
		},
		"pgx.Tx": func(t *testing.T) (db.DBTX, func(context.Context) error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx, tx.Rollback
		},
		"client.Tx": func(t *testing.T) (db.DBTX, func(context.Context) error) {
			tx, err := client.Begin(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx, tx.Rollback
		},
	}
	n := 0
	for insertName, insert := range inserts {
		for dbtxName, open := range dbtxs {
			for _, delay := range []time.Duration{0, time.Hour} {
				n++
				queue := fmt.Sprintf("q%d", n)
				t.Run(fmt.Sprintf("%s/%s/delay %s", insertName, dbtxName, delay), func(t *testing.T) {
					var jobs []client.Job
					for _, kind := range []string{"first", dbtest.DroppedKind, "third"} {
						jobs = append(jobs, newJob(t, client.Request{Kind: kind, Queue: ptr(queue), Delay: ptr(delay)}))
					}
					dbtx, end := open(t)
					got, err := insert(dbtx, jobs)
					var dropped *client.JobsDroppedError
					if !errors.As(err, &dropped) || !errors.Is(err, client.ErrJobsDropped) {
						t.Fatalf("%d returned for %d jobs, error %v; want a JobsDroppedError", got, len(jobs), err)
					}
					if got != 0 {
						t.Errorf("%d returned with the error, want none", got)
					}
					committed := end == nil
					if want := (client.JobsDroppedError{Stored: 2, Sent: 3, Committed: committed}); *dropped != want {
						t.Errorf("error %+v, want %+v", *dropped, want)
					}
					if end != nil {
						if err := end(ctx); err != nil {
							t.Fatal(err)
						}
					}
					var kinds []string
					rows, err := db.New(pool).JobListByQueue(ctx, db.JobListByQueueParams{Queue: queue, MaxJobs: 10})
					if err != nil {
						t.Fatal(err)
					}
					for _, r := range rows {
						kinds = append(kinds, r.Kind)
					}
					want := []string{"first", "third"}
					if !committed {
						want = nil
					}
					if !cmp.Equal(kinds, want) {
						t.Errorf("jobs stored: %v, want %v", kinds, want)
					}
				})
			}
		}
	}
}

// TestInsert_AJobATriggerDropsFailsWithAJobsDroppedError inserts jobs
// that a BEFORE INSERT trigger of the user's drops, without an idempotency
// key and with one, ready now (the announcement of one without a key sent
// behind the insert) and delayed, through a pool, a connection and the
// caller's transactions: each insert fails with a JobsDroppedError that
// says that none was stored, a job with a key too, whose key no job
// holds (not ErrIdempotencyRace, which says to try again, and would say
// it for ever). A transaction of the caller's goes on and commits, and
// none of the jobs is stored.
func TestInsert_AJobATriggerDropsFailsWithAJobsDroppedError(t *testing.T) {
	pool := dbtest.New(t)
	dbtest.DropJobsOfKind(t, pool)
	ctx := t.Context()
	// Each opens what the jobs are inserted through, and returns it with
	// the commit that ends it: nil where the statement commits on its own.
	dbtxs := []struct {
		name string
		open func(t *testing.T) (db.DBTX, func(context.Context) error)
	}{
		{"pool", func(*testing.T) (db.DBTX, func(context.Context) error) { return pool, nil }},
		{"connection", func(t *testing.T) (db.DBTX, func(context.Context) error) { return connect(t, pool), nil }},
		{"pgx.Tx", func(t *testing.T) (db.DBTX, func(context.Context) error) {
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx, tx.Commit
		}},
		{"client.Tx", func(t *testing.T) (db.DBTX, func(context.Context) error) {
			tx, err := client.Begin(ctx, pool)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			return tx, tx.Commit
		}},
	}
	for _, d := range dbtxs {
		t.Run(d.name, func(t *testing.T) {
			dbtx, commit := d.open(t)
			for _, key := range []*string{nil, ptr("dropped-" + d.name)} {
				for _, delay := range []time.Duration{0, time.Hour} {
					job := newJob(t, client.Request{Kind: dbtest.DroppedKind, Delay: ptr(delay), IdempotencyKey: key})
					stored, _, err := client.Insert(ctx, dbtx, job)
					var dropped *client.JobsDroppedError
					want := client.JobsDroppedError{Stored: 0, Sent: 1, Committed: commit == nil}
					if !errors.As(err, &dropped) || *dropped != want || stored.ID != 0 {
						t.Errorf("key %v, delay %s: job %d, error %v; want %+v", show(key), delay, stored.ID, err, want)
					}
				}
			}
			if commit != nil {
				if err := commit(ctx); err != nil {
					t.Errorf("commit the transaction: %v", err)
				}
			}
			if n := dbtest.CountJobs(t, pool); n != 0 {
				t.Errorf("%d jobs stored, want none", n)
			}
		})
	}
}

// TestInsert_ADroppedKeyedJobInATransactionBegunByHandIsARace inserts a
// job with an idempotency key that a trigger drops on a connection on
// which the caller began a transaction by hand, where Insert can set no
// savepoint to send the insert that would tell a dropped job from a key
// taken: it fails with ErrIdempotencyRace, as for a key whose job changed
// as it ran, and leaves the transaction usable.
func TestInsert_ADroppedKeyedJobInATransactionBegunByHandIsARace(t *testing.T) {
	pool := dbtest.New(t)
	dbtest.DropJobsOfKind(t, pool)
	ctx := t.Context()
	conn := connect(t, pool)
	if _, err := conn.Exec(ctx, "BEGIN"); err != nil {
		t.Fatal(err)
	}
	job := newJob(t, client.Request{Kind: dbtest.DroppedKind, IdempotencyKey: ptr("by-hand")})
	if _, _, err := client.Insert(ctx, conn, job); !errors.Is(err, client.ErrIdempotencyRace) {
		t.Errorf("error %v, want ErrIdempotencyRace", err)
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		t.Errorf("commit: %v", err)
	}
}

// show prints an optional string.
func show(s *string) string {
	if s == nil {
		return "none"
	}
	return strconv.Quote(*s)
}

// TestInsert_AKeyWhoseJobIsDeletedAsItIsReadIsTakenAnew inserts a job
// under an idempotency key held by a job that is deleted right after the
// insert found the key taken, before Insert reads the job holding it
// (dbtest.FreeKeyAfterEachInsert), through a pool and the caller's
// transactions. Where nothing takes the key meanwhile, Insert stores its
// job, and through a pool announces it once, after its commit. Where a job the same as Insert's takes the key again before each
// insert (dbtest.TakeKeyBeforeEachInsert), Insert's own insert finds it
// taken, by a unique violation, and Insert replays that job. Where the
// key changes hands at every insert, so that it is taken and no job
// holds it when read, Insert gives up with ErrIdempotencyRace. A
// transaction of the caller's goes on and commits in each case: the
// unique violation did not fail it.
func TestInsert_AKeyWhoseJobIsDeletedAsItIsReadIsTakenAnew(t *testing.T) {
	const key = "vanishing"
	for _, tc := range []struct {
		name string
		// takenBy is the kind of the job that takes the key before each
		// insert: none where nothing does.
		takenBy  string
		replayed bool
		race     bool
	}{
		{name: "free", takenBy: ""},
		{name: "taken again by the same job", takenBy: "k", replayed: true},
		{name: "taken at every insert", takenBy: "holder", race: true},
	} {
		for _, through := range []string{"pool", "pgx.Tx", "client.Tx"} {
			t.Run(tc.name+"/"+through, func(t *testing.T) {
				pool := dbtest.New(t)
				ctx := t.Context()
				holder, _, err := client.Insert(ctx, pool, newJob(t, client.Request{Kind: "holder", IdempotencyKey: ptr(key)}))
				if err != nil {
					t.Fatal(err)
				}
				dbtest.FreeKeyAfterEachInsert(t, pool, key, "holder")
				if tc.takenBy != "" {
					dbtest.TakeKeyBeforeEachInsert(t, pool, key, tc.takenBy)
				}
				var dbtx db.DBTX = pool
				var commit func(context.Context) error
				switch through {
				case "pgx.Tx":
					tx, err := pool.Begin(ctx)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
					dbtx, commit = tx, tx.Commit
				case "client.Tx":
					tx, err := client.Begin(ctx, pool)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
					dbtx, commit = tx, tx.Commit
				}

				// announced says whether Insert stores a job through a pool,
				// which is its to announce once committed.
				announced := through == "pool" && tc.takenBy == ""
				var listener *pgx.Conn
				if announced {
					listener, _ = dbtest.Listen(t, pool, "default")
				}
				stored, replayed, err := client.Insert(ctx, dbtx, newJob(t, client.Request{Kind: "k", IdempotencyKey: ptr(key)}))
				switch {
				case tc.race:
					if !errors.Is(err, client.ErrIdempotencyRace) {
						t.Fatalf("job %d, replayed %t, error %v; want ErrIdempotencyRace", stored.ID, replayed, err)
					}
				case err != nil:
					t.Fatal(err)
				case replayed != tc.replayed || stored.Kind != "k" || stored.ID == holder.ID || stored.IdempotencyKey == nil || *stored.IdempotencyKey != key:
					t.Fatalf("job %d of kind %s, key %s, replayed %t; want a job of kind k under key %q, replayed %t, not the deleted job %d",
						stored.ID, stored.Kind, show(stored.IdempotencyKey), replayed, key, tc.replayed, holder.ID)
				}
				if commit != nil {
					if err := commit(ctx); err != nil {
						t.Fatalf("commit the transaction: %v", err)
					}
				}
				if announced {
					if heard := dbtest.Heard(t, ctx, listener); len(heard) != 1 {
						t.Errorf("heard %d notifications of the job stored, want 1", len(heard))
					}
				}
				held, err := db.New(pool).JobGetByIdempotencyKey(ctx, db.JobGetByIdempotencyKeyParams{Queue: "default", IdempotencyKey: ptr(key)})
				switch {
				case tc.race:
					if !errors.Is(err, pgx.ErrNoRows) {
						t.Errorf("key held by job %d of kind %s (error %v), want by none", held.ID, held.Kind, err)
					}
				case err != nil || held.ID != stored.ID:
					t.Errorf("key held by job %d (error %v), want by job %d", held.ID, err, stored.ID)
				}
			})
		}
	}
}

// TestInsert_WaitsForATransactionStoringAJobUnderItsKey holds an
// idempotency key in a transaction of its own, which stored a job under
// it and is still open, and inserts a job under the same key through a
// pool: Insert waits for that transaction, and once it commits, returns
// its job, replayed, or ErrIdempotencyConflict for a different job; once
// it rolls back, stores its own job. A ctx that ends while Insert waits
// fails it with ErrOutcomeUnknown: the insert was sent, and may yet store
// the job once the transaction rolls back.
func TestInsert_WaitsForATransactionStoringAJobUnderItsKey(t *testing.T) {
	pool := dbtest.New(t)
	for _, tc := range []struct {
		name     string
		kind     string // of the job Insert inserts under the key held by a job of kind "k"
		cancel   bool   // Insert's ctx while it waits
		commit   bool
		replayed bool
		err      error
	}{
		{name: "the same job, committed", kind: "k", commit: true, replayed: true},
		{name: "a different job, committed", kind: "other", commit: true, err: client.ErrIdempotencyConflict},
		{name: "rolled back", kind: "other", commit: false},
		{name: "ctx ends first", kind: "k", cancel: true, err: client.ErrOutcomeUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			key := ptr(tc.name)
			tx, err := pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			holder, _, err := client.Insert(ctx, tx, newJob(t, client.Request{Kind: "k", IdempotencyKey: key}))
			if err != nil {
				t.Fatal(err)
			}

			type result struct {
				job      db.Job
				replayed bool
				err      error
			}
			done := make(chan result, 1)
			insertCtx, cancel := context.WithCancel(ctx)
			defer cancel()
			go func() {
				job, replayed, err := client.Insert(insertCtx, pool, newJob(t, client.Request{Kind: tc.kind, IdempotencyKey: key}))
				done <- result{job, replayed, err}
			}()
			dbtest.WaitBlocks(t, pool, tx, "Insert")
			select {
			case r := <-done:
				t.Fatalf("Insert returned job %d, replayed %t, error %v before the transaction holding its key ended", r.job.ID, r.replayed, r.err)
			default:
			}
			var got result
			if tc.cancel {
				cancel()
				got = <-done
			}
			if tc.commit {
				err = tx.Commit(ctx)
			} else {
				err = tx.Rollback(ctx)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.cancel {
				got = <-done
			}

			switch {
			case tc.err != nil:
				if !errors.Is(got.err, tc.err) {
					t.Errorf("job %d, replayed %t, error %v; want %v", got.job.ID, got.replayed, got.err, tc.err)
				}
			case got.err != nil:
				t.Errorf("error %v", got.err)
			case tc.commit && (got.job.ID != holder.ID || got.replayed != tc.replayed):
				t.Errorf("job %d, replayed %t; want job %d, replayed %t", got.job.ID, got.replayed, holder.ID, tc.replayed)
			case !tc.commit && (got.job.ID == holder.ID || got.replayed || got.job.Kind != tc.kind):
				t.Errorf("job %d of kind %s, replayed %t; want a new job of kind %s", got.job.ID, got.job.Kind, got.replayed, tc.kind)
			}
		})
	}
}
