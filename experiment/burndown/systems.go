package burndown

import (
	"context"
	"debug/buildinfo"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/experiment/harness"
	"github.com/relayq/relay/experiment/labdb"
	"github.com/relayq/relay/internal/builtin"
)

// The systems a burn-down can run: Relay itself, and River, the reference
// it is compared with, through the lab's adapter (relaylab-river).
const (
	SystemRelay = "relay"
	SystemRiver = "river"
)

// DefaultSystems are the systems a burn-down runs, each configuration on
// each in turn.
var DefaultSystems = []string{SystemRelay, SystemRiver}

// riverModule is the module whose version Result.River records.
const riverModule = "github.com/riverqueue/river"

// system is what the burn-down needs of one queue: how to get a database
// full of no-op jobs, which process works them, and how to read their
// progress and their span from the database.
type system struct {
	name string
	// bin is the binary of every process the system's burn-down runs.
	bin string
	// table is the queue's table, whose writes the counters read.
	table string
	// newDatabase creates the database of one configuration.
	newDatabase func(ctx context.Context, adminURL string) (*harness.Database, error)
	// prepare makes the database ready for the workers, with procs, whose
	// environment names the database. Nil: newDatabase did.
	prepare func(ctx context.Context, procs *harness.Procs) error
	// fill inserts jobs no-op jobs on queue, with procs; atOnce, in one
	// transaction, so that workers already running find every job at
	// once.
	fill func(ctx context.Context, d *harness.Database, procs *harness.Procs, jobs int, atOnce bool) error
	// forgetWarmUp deletes the finished jobs of queue, and says how many.
	forgetWarmUp func(ctx context.Context, q *labdb.Queries) (int64, error)
	// workArgs are the arguments of a worker process named id that runs
	// slots jobs at once.
	workArgs func(id string, slots int) []string
	// drained says whether every job of queue is in a final state, by
	// looking for one that is not.
	drained func(ctx context.Context, q *labdb.Queries) (bool, error)
	// finished counts the jobs of queue in a final state.
	finished func(ctx context.Context, q *labdb.Queries) (int64, error)
	// span reads how the jobs of queue ended, and when.
	span func(ctx context.Context, q *labdb.Queries) (span, error)
}

// span is how the jobs of a burn-down ended: how many succeeded at all and
// how many took more than one attempt, out of total, and from when to when
// on the database's clock.
type span struct {
	Succeeded, Retried, Total int64
	FirstClaim, LastFinish    time.Time
}

// relaySystem runs relay work processes from the relay binary bin.
func relaySystem(bin string) system {
	return system{
		name:  SystemRelay,
		bin:   bin,
		table: "jobs",
		newDatabase: func(ctx context.Context, adminURL string) (*harness.Database, error) {
			return harness.CreateDatabase(ctx, adminURL, "relay_exp_burndown_")
		},
		// On one session, which reports its statistics before the fill
		// returns (BurndownFlushStats): a session reports them as it goes
		// idle, but no more often than once a second, and otherwise up to
		// 10 s later, which would count the end of the fill in the
		// burn-down's inserts, commits and WAL. River's fill is a process
		// of its own, whose session reports them as it ends.
		fill: func(ctx context.Context, d *harness.Database, _ *harness.Procs, jobs int, atOnce bool) error {
			conn, err := d.Pool.Acquire(ctx)
			if err != nil {
				return fmt.Errorf("connect for the fill: %w", err)
			}
			defer conn.Release()
			if err := fillRelay(ctx, conn, jobs, atOnce); err != nil {
				return err
			}
			if err := labdb.New(conn).BurndownFlushStats(ctx); err != nil {
				return fmt.Errorf("report the fill's statistics: %w", err)
			}
			return nil
		},
		forgetWarmUp: func(ctx context.Context, q *labdb.Queries) (int64, error) {
			return q.BurndownForgetWarmUp(ctx, queue)
		},
		workArgs: func(id string, slots int) []string {
			return []string{"work", "--id", id, "--queue", queue, "--slots", strconv.Itoa(slots), "--log-format", "json"}
		},
		drained: func(ctx context.Context, q *labdb.Queries) (bool, error) {
			return q.ExperimentQueueDrained(ctx, queue)
		},
		finished: func(ctx context.Context, q *labdb.Queries) (int64, error) {
			p, err := q.ExperimentQueueProgress(ctx, queue)
			return p.Finished, err
		},
		span: func(ctx context.Context, q *labdb.Queries) (span, error) {
			s, err := q.BurndownSpan(ctx, queue)
			return span{s.Succeeded, s.Retried, s.Total, s.FirstClaim, s.LastFinish}, err
		},
	}
}

// fillRelay inserts jobs no-op jobs on queue through conn; atOnce, in one
// transaction.
func fillRelay(ctx context.Context, conn *pgxpool.Conn, jobs int, atOnce bool) error {
	job := harness.Job(queue, builtin.KindNoop, json.RawMessage(`{}`), 25)
	if !atOnce {
		return harness.InsertJobs(ctx, conn, job, jobs)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		return fmt.Errorf("begin the fill: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := harness.InsertJobs(ctx, tx, job, jobs); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit the fill: %w", err)
	}
	return nil
}

// riverSystem runs River through relaylab-river, the binary bin: River's
// own migrations and bulk insert, then `relaylab-river work` processes
// with workArgs added to their command lines (River's fetch settings,
// say; none: the adapter's tuned defaults).
func riverSystem(bin string, workArgs []string) system {
	return system{
		name:  SystemRiver,
		bin:   bin,
		table: "river_job",
		newDatabase: func(ctx context.Context, adminURL string) (*harness.Database, error) {
			return harness.CreateEmptyDatabase(ctx, adminURL, "relay_exp_burndown_river_")
		},
		prepare: func(ctx context.Context, procs *harness.Procs) error {
			if err := procs.Run(ctx, "river-migrate", "migrate", "--log-format", "json"); err != nil {
				return fmt.Errorf("migrate River's schema: %w", err)
			}
			return nil
		},
		// At once: in one statement of InsertManyFast.
		fill: func(ctx context.Context, _ *harness.Database, procs *harness.Procs, jobs int, atOnce bool) error {
			args := []string{"insert", "--jobs", strconv.Itoa(jobs), "--kind", "noop", "--queue", queue, "--log-format", "json"}
			if atOnce {
				args = append(args, "--batch", strconv.Itoa(max(jobs, 1)))
			}
			if err := procs.Run(ctx, "river-insert", args...); err != nil {
				return fmt.Errorf("insert River's jobs: %w", err)
			}
			return nil
		},
		forgetWarmUp: func(ctx context.Context, q *labdb.Queries) (int64, error) {
			return q.BurndownRiverForgetWarmUp(ctx, queue)
		},
		workArgs: func(id string, slots int) []string {
			args := []string{"work", "--id", id, "--queue", queue, "--workers", strconv.Itoa(slots), "--log-format", "json"}
			return append(args, workArgs...)
		},
		drained: func(ctx context.Context, q *labdb.Queries) (bool, error) {
			return q.ExperimentRiverQueueDrained(ctx, queue)
		},
		finished: func(ctx context.Context, q *labdb.Queries) (int64, error) {
			p, err := q.ExperimentRiverQueueProgress(ctx, queue)
			return p.Finished, err
		},
		span: func(ctx context.Context, q *labdb.Queries) (span, error) {
			s, err := q.BurndownRiverSpan(ctx, queue)
			return span{s.Succeeded, s.Retried, s.Total, s.FirstClaim, s.LastFinish}, err
		},
	}
}

// RiverInfo is what a result records of the River it ran.
type RiverInfo struct {
	// Binary is the relaylab-river binary, and Version the version of
	// River it was built with.
	Binary  string `json:"binary"`
	Version string `json:"version"`
	// WorkArgs are the flags added to every `relaylab-river work`.
	WorkArgs []string `json:"work_args,omitempty"`
	// FetchCooldown, FetchPollInterval and MaxConns are the settings the
	// first worker reported it ran with.
	FetchCooldown     string `json:"fetch_cooldown"`
	FetchPollInterval string `json:"fetch_poll_interval"`
	MaxConns          int64  `json:"max_conns"`
}

// riverVersion returns the version of River that bin was built with.
func riverVersion(bin string) (string, error) {
	bi, err := buildinfo.ReadFile(bin)
	if err != nil {
		return "", fmt.Errorf("read the build information of %s: %w", bin, err)
	}
	for _, dep := range bi.Deps {
		if dep.Path == riverModule {
			return dep.Version, nil
		}
	}
	return "", fmt.Errorf("%s was not built with %s", bin, riverModule)
}

// riverSettings fills in info from the log of a River worker: the line
// in which it says what it works with.
func riverSettings(info *RiverInfo, p *harness.Proc) error {
	lines, err := p.Logs()
	if err != nil {
		return err
	}
	for _, l := range lines {
		if l.Msg == "working" {
			info.FetchCooldown = l.Str("fetch_cooldown")
			info.FetchPollInterval = l.Str("fetch_poll_interval")
			info.MaxConns, _ = l.Int("max_conns")
			return nil
		}
	}
	return fmt.Errorf("%s never logged its settings (\"working\")", p.Name)
}
