// Package adapter is the lab's adapter of River (riverqueue/river), the
// reference system that Relay's experiments are compared with: River's own
// migrations (Migrate), the job kinds the lab runs (NoopArgs, SleepArgs),
// a bulk insert of them (Insert) and a River client that works one queue
// until it is told to stop (Work). Command relaylab-river exposes each to
// the lab, which drives it as a separate process, as it drives relay.
//
// It lives in a module of its own, experiment/river, so that River enters
// neither the product's module graph nor the lab's main module.
package adapter
