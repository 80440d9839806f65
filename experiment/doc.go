// Package experiment runs Relay's recorded experiments against real relay
// processes and a real PostgreSQL server, and records their raw results.
//
//   - Crash kills (SIGKILL) the worker process running a job and follows
//     the job until another worker has run it, several times; then freezes
//     (SIGSTOP) a worker past its lease and shows, from the frozen worker's
//     own log once it is thawed, that its stale acknowledgement is refused.
//   - Burst submits thousands of jobs through the HTTP API to one or more
//     worker processes and measures throughput and latency from the
//     database's timestamps, checking that every job ran exactly once.
//
// Each experiment creates databases of its own on the server it is given,
// migrates them, and drops them afterwards. Every process it starts is a
// `relay serve` or `relay work` process of the binary it is given (Procs,
// Proc), stopped on every exit path; on Linux the kernel also kills them
// if the experiment itself dies. Procs and Proc are meant for reuse by
// other harnesses that kill, pause and restart workers.
//
// Results are written as one JSON file per run (raw figures and the
// environment) and SVG charts beside it; see docs/experiments.md.
package experiment
