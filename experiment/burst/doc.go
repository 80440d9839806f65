// Package burst is the burst experiment: it submits thousands of jobs
// through the HTTP API to one or more worker processes and measures
// throughput and latency from the database's timestamps, checking that
// every job ran exactly once. Run runs it; `relaylab burst` is its command.
package burst
