package server

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/relayq/relay/client"
	"github.com/relayq/relay/db"
)

// DefaultAnnounceEvery is the least time between two notifications the
// API sends a queue's workers for the one-job requests it stores
// (Config.AnnounceEvery).
const DefaultAnnounceEvery = 2 * time.Millisecond

// announcer spaces the notifications that tell a queue's workers of the
// jobs the enqueuer stores. PostgreSQL wakes every listening session of a
// database at each commit that notifies, whatever the channel, and each
// woken session reads the notifications in a transaction of its own; with
// the listeners of many queues, those wake-ups cost the server more than
// the inserts (docs/experiments.md, "Every listener hears every queue").
//
// A group of jobs whose queues were not notified within every is
// announced by its own commit, as an insert is: a job posted alone waits
// for no one. A group that comes sooner is stored unannounced, and once
// it has committed its queues are owed a notification, sent every after
// the latest one, in one statement for all the groups stored meanwhile.
// The workers' claims take every job ready when they run, so one
// notification serves them all. A job so stored waits for its workers at
// most every longer than one announced by its commit; if the
// notification cannot be sent (the server is shutting down, or the
// database is unreachable), its workers find it at their next poll.
type announcer struct {
	dbtx   db.DBTX
	every  time.Duration
	logger *slog.Logger

	mu     sync.Mutex
	queues map[string]*announcements
}

// announcements is what the announcer knows of one queue.
type announcements struct {
	// last is when the latest notification was sent, or the commit that
	// carries it began.
	last time.Time
	// owed is set while jobs stored unannounced wait for a notification,
	// due holds the earliest run_at among them, and timer sends it.
	owed  bool
	due   time.Time
	timer *time.Timer
}

// maxIdleQueues is how many queues the announcer remembers before it
// forgets those with nothing owed, whose spacing has passed: queue names
// come from requests, and a name seen once must not stay in memory.
const maxIdleQueues = 1024

func newAnnouncer(dbtx db.DBTX, every time.Duration, logger *slog.Logger) *announcer {
	return &announcer{dbtx: dbtx, every: every, logger: logger, queues: map[string]*announcements{}}
}

// lead reports whether a group of jobs on queues may be announced by its
// own commit: none of them was notified within every, nor is owed a
// notification. If so, it counts them notified now.
func (a *announcer) lead(queues []string) bool {
	if a.every <= 0 {
		return true
	}
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, q := range queues {
		if s := a.queues[q]; s != nil && (s.owed || now.Sub(s.last) < a.every) {
			return false
		}
	}
	if len(a.queues)+len(queues) > maxIdleQueues {
		a.forgetIdle(now)
	}
	for _, q := range queues {
		a.state(q).last = now
	}
	return true
}

// owe records jobs stored unannounced that have committed, or whose
// statement's outcome is unknown, and has their queues notified every
// after each one's latest notification.
func (a *announcer) owe(jobs []client.Job, stored []db.Job) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i, job := range jobs {
		var due time.Time // unknown: announce, and let the database's clock decide
		if stored != nil {
			due = stored[i].RunAt
		}
		s := a.state(job.Queue)
		if !s.owed || due.Before(s.due) {
			s.due = due
		}
		s.owed = true
		if s.timer == nil {
			queue := job.Queue
			s.timer = time.AfterFunc(time.Until(s.last.Add(a.every)), func() { a.send(queue) })
		}
	}
}

// send notifies queue's workers of the jobs it is owed for.
func (a *announcer) send(queue string) {
	a.mu.Lock()
	s := a.queues[queue]
	due := s.due
	s.owed, s.timer, s.last = false, nil, time.Now()
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), dbTimeout)
	defer cancel()
	if err := client.Announce(ctx, a.dbtx, map[string]time.Time{queue: due}); err != nil {
		a.logger.Warn("announce jobs failed; the queue's workers find them at their next poll", "queue", queue, "err", err)
	}
}

// state returns queue's announcements, made if new. a.mu is held.
func (a *announcer) state(queue string) *announcements {
	s := a.queues[queue]
	if s == nil {
		s = &announcements{}
		a.queues[queue] = s
	}
	return s
}

// forgetIdle forgets the queues with nothing owed whose spacing has
// passed: a group on one of them leads, as on a queue never seen. a.mu is
// held.
func (a *announcer) forgetIdle(now time.Time) {
	for q, s := range a.queues {
		if !s.owed && now.Sub(s.last) >= a.every {
			delete(a.queues, q)
		}
	}
}
