// Package schema holds the SQL that `relay experiment chaos` adds to the
// database of a run, after Relay's migrations: the tables that record the
// run's history and the triggers that fill them (see chaos.sql). It is
// listed in sqlc.yaml so that sqlc can type queries/chaos.sql, and is never
// part of Relay's own schema.
package schema

import _ "embed"

// Chaos is chaos.sql: plain statements, each safe to run twice, to execute
// in one go (pgx's simple protocol takes several statements at once).
//
//go:embed chaos.sql
var Chaos string
