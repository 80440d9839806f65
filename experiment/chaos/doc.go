// Package chaos is the fault-injection experiment: for each Scenario, a
// workload runs on several worker processes (`relaylab chaos-worker`, the
// worker library with the chaos job kinds of RunWorker) and the relay
// binary's API, while one kind of fault is injected: SIGKILL, SIGSTOP,
// network partitions through a fault proxy, terminated backends, server
// restarts, poison jobs, pool starvation, hostile requests, a transaction
// pooler. CheckHistory then checks the recorded history of every job (the
// tables of package schema, filled by triggers). Run runs one scenario;
// `relaylab chaos` is its command.
package chaos
