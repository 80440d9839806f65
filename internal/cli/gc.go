package cli

// DefaultGCPercent is the garbage collector's target (GOGC) the relay
// binary runs with unless GOGC is set in its environment: the heap may
// grow to five times its live data between two collections, instead of
// Go's default of twice. A worker's live data is small and its allocation
// rate high (every round decodes the jobs it claims), so collections were
// about a fifth of its CPU at Go's default. At 200 slots emptying a queue
// of no-op jobs, its peak resident memory went from 24 to 36 MB, and its
// CPU per job fell by a quarter or more (docs/experiments.md, "The
// worker's garbage collector"). A handler that keeps large payloads live
// raises the live heap, and with it the peak, five times over: set
// GOGC=100 there. The lab's River adapter runs at the same target, so that
// the burn-down compares the two queues rather than their runtimes'
// settings.
const DefaultGCPercent = 400

// GCPercent returns the garbage collector's target a command sets at
// start, and false if GOGC in the environment (read with lookup) decides
// it.
func GCPercent(lookup func(string) (string, bool)) (int, bool) {
	if _, set := lookup("GOGC"); set {
		return 0, false
	}
	return DefaultGCPercent, true
}
