// Package harness is what Relay's experiments share: fresh migrated
// databases on a server they are given (Database), the relay processes they
// start, kill, pause and restart (Procs, Proc), the environment and the
// figures they record (Environment, Percentiles), CPU samples, progress
// lines and the helpers that write results and charts.
//
// Every process an experiment starts is a `relay serve` or `relay work`
// process of the binary it is given, stopped on every exit path; on Linux
// the kernel also kills them if the experiment itself dies. Results are
// written as one JSON file per run (raw figures and the environment) with
// SVG charts beside it; see docs/experiments.md.
package harness
