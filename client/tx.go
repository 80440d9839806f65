package client

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayq/relay/db"
)

// Beginner is what a Tx begins on and announces its jobs through once it
// has committed: a *pgxpool.Pool, a *pgxpool.Conn or a *pgx.Conn.
type Beginner interface {
	db.DBTX
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Tx is a transaction of the caller's whose jobs are announced to their
// queues' workers after it commits, rather than by its commit.
//
// A commit that notifies listeners holds a lock of the whole server from
// before its WAL flush until it ends, so such commits go one at a time and
// share no flush (migrations/00016). An application that stores jobs in
// many concurrent transactions of its own, with its other writes, pays
// for that in every one of them. Begun with Begin or BeginTx, the
// transaction works as any pgx.Tx, and Insert, InsertMany and InsertAll
// given it store their jobs without notifying at commit. Commit commits,
// then announces their queues in a statement of its own, which holds that
// lock only briefly. That is a second round trip: worth it where many
// such transactions commit at once, and the more so the slower the
// server's flush, and a cost to a program that commits one at a time
// (docs/experiments.md, "Transactions that announce their jobs after they
// commit").
//
// A job stored through it sets relay.announce for the rest of the
// transaction, so a job the transaction stores after that by a statement
// of its own (an INSERT INTO jobs of the application's) is not notified
// at commit either: Commit announces it only if it shares a queue with a
// job stored through the Tx, and otherwise the workers find it at their
// next poll. (Insert, InsertMany and InsertAll given the pgx.Tx inside
// set relay.announce back, and their jobs, and those stored after them,
// are notified at commit, as in any transaction.) If the announcement
// fails, as when ctx ends first, the jobs are stored all the same, Commit
// does not fail, and the workers find them at their next poll. A job
// whose run_at is still ahead when the transaction commits is not
// announced, as at an insert's commit, nor is one InsertMany stored with
// a delay, whose run_at it does not learn. A queue is announced even if
// every job stored in it through the Tx was undone by a rollback to a
// savepoint: its workers wake and find nothing new.
//
// A Tx is not for concurrent use, as a pgx.Tx is not.
type Tx struct {
	pgx.Tx
	announceOn db.DBTX
	// due holds the queues of the jobs stored through the Tx.
	due dueQueues
}

// Begin begins a transaction on b whose jobs are announced after it
// commits: see Tx.
func Begin(ctx context.Context, b Beginner) (*Tx, error) {
	return BeginTx(ctx, b, pgx.TxOptions{})
}

// BeginTx begins a transaction on b, with opts, whose jobs are announced
// after it commits: see Tx.
func BeginTx(ctx context.Context, b Beginner, opts pgx.TxOptions) (*Tx, error) {
	tx, err := b.BeginTx(ctx, opts)
	if err != nil {
		return nil, fmt.Errorf("begin a transaction: %w", err)
	}
	return &Tx{Tx: tx, announceOn: b}, nil
}

// Commit commits the transaction and then announces the queues of the
// jobs stored through it (JobAnnounceMany). It returns the commit's error
// alone: a failed announcement leaves the jobs to the workers' next poll.
// A commit sent whose answer was lost (a timeout, a connection failed, a
// pooler's own error) fails with an error that wraps ErrOutcomeUnknown,
// and not the context's: the transaction may have committed, and Commit
// announces its jobs all the same, through what it was begun on, as an
// Enqueuer does those of a group whose answer was lost (if it did not
// commit, the workers told find nothing new; if ctx has ended, the
// announcement fails as above). Any other error says that it did not
// commit, pgx.ErrTxCommitRollback for a transaction that an earlier error
// had failed, and announces nothing.
func (tx *Tx) Commit(ctx context.Context) error {
	wasOpen := !tx.Conn().IsClosed()
	if err := tx.Tx.Commit(ctx); err != nil {
		switch {
		case errors.Is(err, pgx.ErrTxCommitRollback), errors.Is(err, pgx.ErrTxClosed), !wasOpen:
			// Answered, or never sent: a connection closed before the
			// commit took the transaction with it.
			return err
		case errors.Is(err, pgconn.ErrConnClosed):
			// pgx reports a connection that failed as it read the answer
			// of a statement without parameters, such as the commit, as
			// closed, and as safe to retry; it was open as Commit began,
			// so the commit was sent.
			err = &answerLostError{cause: err}
		default:
			err = outcome(err)
		}
		if !errors.Is(err, ErrOutcomeUnknown) {
			return err
		}
		// The commit may have landed: its jobs are owed their
		// announcement, as a committed transaction's are.
		tx.announce(ctx)
		return err
	}
	// Committed: the jobs are stored whatever the announcement's fate.
	tx.announce(ctx)
	return nil
}

// announce announces the queues of the jobs stored through the Tx, once,
// and forgets them: a failed announcement leaves the jobs to the workers'
// next poll.
func (tx *Tx) announce(ctx context.Context) {
	due := tx.due
	tx.due = nil
	_ = due.announce(ctx, tx.announceOn)
}
