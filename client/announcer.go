package client

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/relayq/relay/db"
)

// announcer spaces the notifications of the jobs an Enqueuer stores
// (see Enqueuer): what is spaced is the notifying commits of the
// Enqueuer's statements, whatever their queues.
type announcer struct {
	dbtx    db.DBTX
	every   time.Duration
	timeout time.Duration // bounds each sending
	logger  *slog.Logger

	mu sync.Mutex
	// last is when the latest notifying statement began.
	last time.Time
	// owed holds the queues owed a notification, with the earliest run_at
	// of their jobs stored unannounced.
	owed dueQueues
	// sending is set from when a sending of what is owed is scheduled on
	// timer until it has ended, when it is closed.
	timer   *time.Timer
	sending chan struct{}
	// closed is set by Close: every group is announced by its commit.
	closed bool
}

func newAnnouncer(dbtx db.DBTX, every, timeout time.Duration, logger *slog.Logger) *announcer {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &announcer{dbtx: dbtx, every: every, timeout: timeout, logger: logger}
}

// lead reports whether a group of jobs may be announced by its own
// commit: the latest notifying statement began every or more ago, and
// nothing is owed or being sent. If so, it counts the group's statement
// as the latest.
func (a *announcer) lead() bool {
	if a.every <= 0 {
		return true
	}
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return true
	}
	if len(a.owed) > 0 || a.sending != nil || now.Sub(a.last) < a.every {
		return false
	}
	a.last = now
	return true
}

// owe records jobs stored unannounced that have committed, or whose
// statement's outcome is unknown (stored nil), and schedules the
// notification of their queues; once the announcer is closed, it sends it
// at once.
func (a *announcer) owe(jobs []Job, stored []db.Job) {
	a.mu.Lock()
	for i, job := range jobs {
		var due time.Time // unknown: announce, and let the database's clock decide
		if stored != nil {
			due = stored[i].RunAt
		}
		a.owed.add(job.Queue, due)
	}
	if !a.closed {
		a.schedule()
		a.mu.Unlock()
		return
	}
	owed := a.owed
	a.owed = nil
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	a.announce(ctx, owed)
}

// schedule has what is owed sent every after the latest notifying
// statement began, unless a sending is scheduled or running. a.mu is
// held.
func (a *announcer) schedule() {
	if len(a.owed) == 0 || a.sending != nil {
		return
	}
	a.sending = make(chan struct{})
	a.timer = time.AfterFunc(time.Until(a.last.Add(a.every)), a.send)
}

// send announces every queue owed, in one statement, then schedules what
// came to be owed meanwhile.
func (a *announcer) send() {
	a.mu.Lock()
	owed := a.owed
	a.owed, a.last = nil, time.Now()
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), a.timeout)
	defer cancel()
	a.announce(ctx, owed)
	a.mu.Lock()
	close(a.sending)
	a.sending = nil
	a.schedule()
	a.mu.Unlock()
}

// announce sends the notification of the queues of owed.
func (a *announcer) announce(ctx context.Context, owed dueQueues) {
	if err := owed.announce(ctx, a.dbtx); err != nil {
		a.logger.Warn("announce jobs failed; their workers find them at their next poll", "queues", len(owed), "err", err)
	}
}

// Close sends what is owed at once, and from then on has each group
// announced by its own commit. It returns once a sending already running
// has ended too, or ctx has (Enqueuer.Close bounds it by StoreTimeout).
func (a *announcer) Close(ctx context.Context) {
	a.mu.Lock()
	a.closed = true
	if a.sending != nil && a.timer.Stop() {
		close(a.sending) // stopped before it ran: nothing else waits for it
		a.sending = nil
	}
	owed, running := a.owed, a.sending
	a.owed = nil
	a.mu.Unlock()
	a.announce(ctx, owed)
	if running != nil {
		select {
		case <-running:
		case <-ctx.Done():
		}
	}
}
