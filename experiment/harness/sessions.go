package harness

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/relayq/relay/experiment/labdb"
)

// Activities a session can be found in, besides its wait events: see
// ActivityOf.
const (
	// ActivityRunning is an active session with no wait event: running on
	// a CPU, or ready to and waiting for one.
	ActivityRunning = "running"
	// ActivityIdle is a session waiting for its client's next statement,
	// in or out of a transaction.
	ActivityIdle = "idle"
)

// ActivityOf names what a session of pg_stat_activity is doing: running,
// idle, or the wait event it is held up by ("IO:WALSync"). A session
// idle in a transaction counts as idle, since it too waits for its client.
func ActivityOf(state, waitEventType, waitEvent string) string {
	switch {
	case state == "idle" || state == "idle in transaction" || state == "idle in transaction (aborted)":
		return ActivityIdle
	case waitEventType == "":
		return ActivityRunning
	default:
		return waitEventType + ":" + waitEvent
	}
}

// Activity is how many sessions, on average over a span, were in one
// activity (ActivityOf).
type Activity struct {
	Activity string  `json:"activity"`
	Sessions float64 `json:"sessions"`
}

// SessionActivity is what the client sessions of one database did over a
// span, on average across the samples taken in it: how many were
// connected, and how many were in each activity, the most first.
type SessionActivity struct {
	Samples  int     `json:"samples"`
	Sessions float64 `json:"sessions"`
	// MaxSessions is the most sessions one sample counted.
	MaxSessions int        `json:"max_sessions"`
	Activities  []Activity `json:"activities"`
}

// Sum returns the average number of sessions in the activities for
// which match is true.
func (a SessionActivity) Sum(match func(activity string) bool) float64 {
	var sum float64
	for _, x := range a.Activities {
		if match(x.Activity) {
			sum += x.Sessions
		}
	}
	return Round3(sum)
}

// IsWALWait reports whether an activity (ActivityOf) is a wait on the
// write-ahead log: for it to be written or flushed, a commit's above all
// ("IO:WALSync", "LWLock:WALWrite"), for a new segment of it to be made
// ("IO:WALInitWrite"), or for room in its buffers.
func IsWALWait(activity string) bool {
	typ, event, ok := strings.Cut(activity, ":")
	return ok && (typ == "IO" || typ == "LWLock") && strings.HasPrefix(event, "WAL")
}

// SessionTrace samples, at a fixed interval, what the client sessions of
// one database other than the harness's own are doing (pg_stat_activity),
// so that what the backends of a burn-down did over its span, known only
// afterwards, can be read from it: how many ran at once, and what held
// the others up, such as waits for the WAL to be flushed at commit. Each
// sample counts the sessions in each activity.
type SessionTrace struct {
	t *trace[map[string]int]
}

// TraceSessions samples, at once and then every interval until Stop, the
// sessions of the database q is connected to whose application_name is
// not own (BurndownSessionActivity), and returns the first sample's
// error. Each sample is one statement on its own connection, which runs
// on the same server as what it watches: the interval is a few tens of
// milliseconds, not less.
func TraceSessions(q *labdb.Queries, own string, interval time.Duration) (*SessionTrace, error) {
	t, err := startTrace(interval, func(ctx context.Context) (map[string]int, error) {
		rows, err := q.BurndownSessionActivity(ctx, own)
		if err != nil {
			return nil, fmt.Errorf("sample the sessions' activity: %w", err)
		}
		activities := make(map[string]int, len(rows))
		for _, r := range rows {
			activities[ActivityOf(r.State, r.WaitEventType, r.WaitEvent)] += int(r.Sessions)
		}
		return activities, nil
	})
	if err != nil {
		return nil, err
	}
	return &SessionTrace{t}, nil
}

// Stop ends the trace and returns the error that ended it early, if one
// did. A nil trace does nothing.
func (s *SessionTrace) Stop() error {
	if s == nil {
		return nil
	}
	return s.t.stop()
}

// Over averages the samples taken between from and to, both included.
// ok is false where none was, or the trace is nil.
func (s *SessionTrace) Over(from, to time.Time) (out SessionActivity, ok bool) {
	if s == nil {
		return SessionActivity{}, false
	}
	sums := map[string]int{}
	var sessions, most, n int
	s.t.read(func(samples []timed[map[string]int]) {
		i := sort.Search(len(samples), func(i int) bool { return !samples[i].at.Before(from) })
		j := sort.Search(len(samples), func(i int) bool { return samples[i].at.After(to) })
		for _, x := range samples[i:max(i, j)] {
			n++
			inSample := 0
			for a, c := range x.v {
				sums[a] += c
				inSample += c
			}
			sessions += inSample
			most = max(most, inSample)
		}
	})
	if n == 0 {
		return SessionActivity{}, false
	}
	out = SessionActivity{Samples: n, Sessions: Round3(float64(sessions) / float64(n)), MaxSessions: most}
	for a, c := range sums {
		out.Activities = append(out.Activities, Activity{Activity: a, Sessions: Round3(float64(c) / float64(n))})
	}
	slices.SortFunc(out.Activities, func(x, y Activity) int {
		if c := cmp.Compare(y.Sessions, x.Sessions); c != 0 {
			return c
		}
		return cmp.Compare(x.Activity, y.Activity)
	})
	return out, true
}
