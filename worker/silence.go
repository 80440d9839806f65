package worker

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayq/relay/db"
)

// silentProbes is how many TCP keepalive probes the server sends to a
// silent connection before it ends it (see silence).
const silentProbes = 4

// silence are the TCP settings under which the server ends a connection
// once it has been silent for about a lease: keepalive probes after a
// third of the lease without a word from the client, then every sixth of
// it, silentProbes of them, and a user timeout of a lease, which on Linux
// ends the connection a lease after its last word from the client,
// whether the server was probing or sending (a notification, a result).
// The probes are in whole seconds, at least one; the timeout in
// milliseconds, within an int32.
type silence struct {
	idleSeconds, intervalSeconds, count, userTimeoutMs int32
}

// silenceOf returns the silence of lease.
func silenceOf(lease time.Duration) silence {
	seconds := func(d time.Duration) int32 {
		return int32(min(max((d+time.Second-1)/time.Second, 1), math.MaxInt32))
	}
	return silence{
		idleSeconds:     seconds(lease / 3),
		intervalSeconds: seconds(lease / 6),
		count:           silentProbes,
		userTimeoutMs:   int32(min(lease.Milliseconds(), math.MaxInt32)),
	}
}

// settings returns the silence as server settings, by name.
func (s silence) settings() map[string]int32 {
	return map[string]int32{
		"tcp_keepalives_idle":     s.idleSeconds,
		"tcp_keepalives_interval": s.intervalSeconds,
		"tcp_keepalives_count":    s.count,
		"tcp_user_timeout":        s.userTimeoutMs,
	}
}

// setsItself reports whether params, a connection's settings, set the
// server setting name, as a parameter or among its options.
func setsItself(params map[string]string, name string) bool {
	_, set := params[name]
	return set || strings.Contains(params["options"], name)
}

// endWhenSilent returns WorkerSessionEndWhenSilent's parameters: the
// silence of lease, each setting left out (nil) where params, the session
// connection's settings, set it. The worker, for its part, gives its
// session up once a lease has passed without an answer to its ping.
func endWhenSilent(lease time.Duration, params map[string]string) db.WorkerSessionEndWhenSilentParams {
	s := silenceOf(lease)
	p := db.WorkerSessionEndWhenSilentParams{
		IdleSeconds:     &s.idleSeconds,
		IntervalSeconds: &s.intervalSeconds,
		Count:           &s.count,
		UserTimeoutMs:   &s.userTimeoutMs,
	}
	for name, setting := range map[string]**int32{
		"tcp_keepalives_idle":     &p.IdleSeconds,
		"tcp_keepalives_interval": &p.IntervalSeconds,
		"tcp_keepalives_count":    &p.Count,
		"tcp_user_timeout":        &p.UserTimeoutMs,
	} {
		if setsItself(params, name) {
			*setting = nil
		}
	}
	return p
}

// EndSilentConnections gives the connections of cfg, a worker's pool, the
// TCP settings under which the server ends a connection once it has been
// silent for about lease, the worker's Config.Lease, each unless cfg's URL
// sets it: keepalive probes after a third of the lease, every sixth of
// it, and tcp_user_timeout of a lease. Without them the server keeps the
// connections of a worker whose host vanished without a word (power lost,
// a network cut that sends no reset) until its own TCP keepalive gives
// up, two hours and more by default, each holding one of its
// max_connections. It leaves cfg as it is where statements run unprepared
// (a default_query_exec_mode other than cache_statement, as behind a
// transaction-mode pooler, which would refuse the settings when a
// connection starts, and whose connections to the server are its own).
// relay work does this for its pool; the worker's session sets the same
// settings itself.
func EndSilentConnections(cfg *pgxpool.Config, lease time.Duration) {
	if cfg.ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
		return
	}
	for name, value := range silenceOf(lease).settings() {
		if !setsItself(cfg.ConnConfig.RuntimeParams, name) {
			cfg.ConnConfig.RuntimeParams[name] = strconv.Itoa(int(value))
		}
	}
}
