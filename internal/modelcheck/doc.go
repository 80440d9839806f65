// Package modelcheck checks Relay's job state machine against a reference
// model, on a real database.
//
// The Model is the state machine of docs/failure-semantics.md written again
// in plain Go, from the documentation rather than from the SQL: what a
// claim takes, which acknowledgements the fence accepts, where each
// accepted one moves a job, what a reclaim takes back, who may hold a
// worker id. The Driver plays a handful of simulated workers against a
// database through the statements of db.Queries only, one operation at a
// time in a random interleaving chosen by a seed: claims, heartbeats,
// completions, failures, releases (at shutdown and of jobs claimed ahead), reclaims, cancels,
// retries, enqueues, session ends and registrations, lookups of lost
// claims, and acknowledgements from zombies that hold tokens no longer
// current. Leases last tens to hundreds of milliseconds, so they run out
// between steps.
//
// Each operation runs in a transaction that first reads now(), which
// PostgreSQL fixes for the whole transaction and which every fence in the
// statements uses; the model decides with that same instant, so every
// outcome is exact although real time passes. After every step the driver
// compares the whole jobs table, the worker ids and the recorded sessions
// with the model, and checks promises that do not rely on the model: no
// job is claimed while an earlier claim of it still holds a live lease
// under a live session, no acknowledgement is accepted but from a job's
// newest claim within its lease, and a running job asked to cancel keeps
// its claim and its mark until it ends cancelled or succeeded.
//
// Concurrent adds what one operation at a time cannot reach: workers
// running at once, racing their claims, heartbeats and reclaims, and an
// operator's cancels and retries. No model predicts its outcomes, so it
// checks only what must hold whatever the interleaving: every claim ends
// exactly once, an acknowledgement of a claim known to have ended is
// refused, an accepted one came within the lease its holder was given, a
// job asked to cancel is claimed again only after a retry, a retry
// restarts the attempts and refuses every claim before it, and every job
// ends as its history says.
//
// The tests run a few seeds in the normal suite; `make modelcheck` runs
// seeds one after another for minutes. A failure names its seed, step and
// the operations that led to it. A seed fixes every choice the driver
// makes; the outcomes that depend on how much time passed between steps
// (whether a lease ran out) may differ on replay, but the model judges
// each by the database's own clock, so a replay fails the same way unless
// the failure needed a particular timing.
package modelcheck
