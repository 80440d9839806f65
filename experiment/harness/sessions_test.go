package harness

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/dbtest"
)

func TestActivityOf(t *testing.T) {
	tests := []struct {
		state, waitEventType, waitEvent string
		want                            string
	}{
		{"active", "", "", ActivityRunning},
		{"active", "IO", "WALSync", "IO:WALSync"},
		{"active", "Lock", "transactionid", "Lock:transactionid"},
		{"idle", "Client", "ClientRead", ActivityIdle},
		{"idle in transaction", "Client", "ClientRead", ActivityIdle},
		{"idle in transaction (aborted)", "Client", "ClientRead", ActivityIdle},
	}
	for _, tt := range tests {
		if got := ActivityOf(tt.state, tt.waitEventType, tt.waitEvent); got != tt.want {
			t.Errorf("ActivityOf(%q, %q, %q) = %q, want %q", tt.state, tt.waitEventType, tt.waitEvent, got, tt.want)
		}
	}
}

func TestIsWALWait(t *testing.T) {
	tests := []struct {
		activity string
		want     bool
	}{
		{"IO:WALSync", true},
		{"IO:WALWrite", true},
		{"IO:WALInitWrite", true},
		{"LWLock:WALWrite", true},
		{"LWLock:WALInsert", true},
		{"IO:DataFileExtend", false},
		{"LWLock:BufferContent", false},
		{"Lock:transactionid", false},
		{"Client:WALSenderWaitForWAL", false},
		{ActivityRunning, false},
		{ActivityIdle, false},
	}
	for _, tt := range tests {
		if got := IsWALWait(tt.activity); got != tt.want {
			t.Errorf("IsWALWait(%q) = %v, want %v", tt.activity, got, tt.want)
		}
	}
}

// TestSessionTrace_OverAveragesTheSamplesInTheSpan checks which samples a
// span averages, those taken in it, its ends included, and what it
// reports for them.
func TestSessionTrace_OverAveragesTheSamplesInTheSpan(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 17, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tr := &SessionTrace{&trace[map[string]int]{samples: []timed[map[string]int]{
		{at(0), map[string]int{ActivityIdle: 4}},
		{at(20), map[string]int{ActivityRunning: 2, "IO:WALSync": 1, ActivityIdle: 2}},
		{at(40), map[string]int{ActivityRunning: 1, "IO:WALSync": 1, ActivityIdle: 2}},
		{at(60), map[string]int{ActivityRunning: 2, "LWLock:WALWrite": 1}},
	}}}
	tests := []struct {
		name     string
		from, to time.Time
		want     SessionActivity
		ok       bool
	}{
		{
			name: "the samples strictly inside",
			from: at(10), to: at(50),
			want: SessionActivity{Samples: 2, Sessions: 4.5, MaxSessions: 5, Activities: []Activity{
				{ActivityRunning, 1.5}, {"IO:WALSync", 1}, {ActivityIdle, 2},
			}},
			ok: true,
		},
		{
			name: "a sample on either end counts",
			from: at(40), to: at(60),
			want: SessionActivity{Samples: 2, Sessions: 3.5, MaxSessions: 4, Activities: []Activity{
				{ActivityRunning, 1.5}, {ActivityIdle, 1}, {"IO:WALSync", 0.5}, {"LWLock:WALWrite", 0.5},
			}},
			ok: true,
		},
		{name: "no sample in the span", from: at(21), to: at(39)},
		{name: "after the last sample", from: at(61), to: at(100)},
		{name: "an inverted span", from: at(60), to: at(0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := tr.Over(tt.from, tt.to)
			if ok != tt.ok {
				t.Fatalf("Over(%v, %v) ok = %v, want %v", tt.from, tt.to, ok, tt.ok)
			}
			// Equal averages are in no particular order.
			if ok {
				if diff := cmp.Diff(tt.want, got, sortActivities); diff != "" {
					t.Errorf("Over(%v, %v) (-want +got):\n%s", tt.from, tt.to, diff)
				}
			}
		})
	}
	if got, _ := tr.Over(at(0), at(60)); got.Sum(IsWALWait) != 0.75 {
		t.Errorf("WAL waits over the whole trace %v, want 0.75", got.Sum(IsWALWait))
	}
	var none *SessionTrace
	if _, ok := none.Over(at(0), at(60)); ok {
		t.Errorf("a nil trace read a span")
	}
}

// sortActivities compares lists of activities in any order.
var sortActivities = cmp.Transformer("sorted", func(in []Activity) map[string]float64 {
	out := make(map[string]float64, len(in))
	for _, a := range in {
		out[a.Activity] = a.Sessions
	}
	return out
})

// TestTraceSessions_SeesAnotherSessionWaitAndNotItsOwn traces a database
// on which one session sleeps in pg_sleep while the trace's own pool has
// sessions of its own, and checks that the trace sees the sleeper's wait
// and leaves its own sessions out.
func TestTraceSessions_SeesAnotherSessionWaitAndNotItsOwn(t *testing.T) {
	ctx := context.Background()
	url := dbtest.NewURL(t)
	own, err := OpenPool(ctx, url, ApplicationName, 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	// A second session of the trace's own, idle throughout.
	held, err := own.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()

	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["application_name"] = "sleeper"
	sleeper, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer sleeper.Close(ctx)

	tr, err := TraceSessions(labdb.New(own), ApplicationName, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Stop()
	from := time.Now()
	if _, err := sleeper.Exec(ctx, "SELECT pg_sleep(0.5)"); err != nil {
		t.Fatal(err)
	}
	to := time.Now()
	if err := tr.Stop(); err != nil {
		t.Fatalf("the trace ended early: %v", err)
	}
	got, ok := tr.Over(from, to)
	if !ok {
		t.Fatal("no sample over the sleep")
	}
	// Once the sleep began, every sample saw the sleeper asleep; only a
	// sample taken in the moment before it could see it otherwise.
	if s := got.Sum(func(a string) bool { return a == "Timeout:PgSleep" }); s < 0.8 || s > 1 {
		t.Errorf("the sleeper was asleep in %v of the samples on average, want nearly all: %+v", s, got)
	}
	if got.Sessions != 1 {
		t.Errorf("%v sessions on average, want the sleeper's alone: %+v", got.Sessions, got)
	}
}
