// Package crash is the crash experiment: it kills (SIGKILL) the worker
// process running a job and follows the job until another worker has run
// it, several times; then it freezes (SIGSTOP) a worker past its lease and
// shows, from the frozen worker's own log once it is thawed, that its stale
// acknowledgement is refused. Run runs it; `relaylab crash` is its command.
package crash
