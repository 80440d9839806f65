package pgbouncer

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// server is what PgBouncer needs to know of the server behind it.
type server struct {
	host     string // a host name, an address or a unix socket directory
	port     uint16
	user     string
	password string
	sslmode  string // PgBouncer's server_tls_sslmode
}

// parseServer reads the server's address and login from its URL, the way
// pgx would connect to it.
func parseServer(serverURL string) (server, error) {
	cfg, err := pgconn.ParseConfig(serverURL)
	if err != nil {
		return server{}, fmt.Errorf("parse the server's URL: %w", err)
	}
	s := server{host: cfg.Host, port: cfg.Port, user: cfg.User, password: cfg.Password, sslmode: "disable"}
	if cfg.TLSConfig != nil {
		// verify-ca and verify-full too: PgBouncer is given no
		// certificate to verify the server's with.
		s.sslmode = "require"
	}
	for _, f := range cfg.Fallbacks {
		// pgx adds a fallback of the same server for sslmode=prefer and
		// allow.
		if f.Host != cfg.Host || f.Port != cfg.Port {
			return server{}, errors.New("the server's URL names several hosts; want one")
		}
		if (f.TLSConfig == nil) != (cfg.TLSConfig == nil) {
			s.sslmode = "prefer"
		}
	}
	// Neither PgBouncer's configuration file nor its auth file has a way
	// to write these.
	if strings.ContainsAny(s.host, " \t") || strings.ContainsAny(s.host+s.user+s.password, "'\"\\\n\r\x00") {
		return server{}, errors.New("the server's host, user or password holds a character PgBouncer's files cannot carry (a quote, a backslash, a line break, or a space in the host)")
	}
	if s.user == "" {
		return server{}, errors.New("the server's URL names no user")
	}
	return s, nil
}

// userinfo returns the user and password clients of the bouncer log in
// with.
func (s server) userinfo() *url.Userinfo {
	if s.password == "" {
		return url.User(s.user)
	}
	return url.UserPassword(s.user, s.password)
}

// writeAuthFile hands the directory to the user PgBouncer runs as and
// writes the auth file there. PgBouncer logs in to the server with the
// password it finds there, and checks clients' against it.
func (b *Bouncer) writeAuthFile(s server) error {
	if b.cred != nil {
		if err := os.Chown(b.dir, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
			return fmt.Errorf("hand %s to uid %d: %w", b.dir, b.cred.Uid, err)
		}
	}
	return b.writeFile("userlist.txt", "\""+s.user+"\" \""+s.password+"\"\n")
}

// writeConfig writes pgbouncer.ini for the current port.
func (b *Bouncer) writeConfig(s server, opts Options) error {
	authType := "trust"
	if s.password != "" {
		authType = "scram-sha-256"
	}
	conf := fmt.Sprintf(`;; A private PgBouncer, started by Relay's internal/pgbouncer.
[databases]
;; Every database name passes through to the server.
* = host=%s port=%d

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir = %s
pidfile = %s
auth_type = %s
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = %d
server_tls_sslmode = %s
server_login_retry = %d
query_timeout = %d
;; Sent by some drivers at connect; PgBouncer refuses what it does not know.
ignore_startup_parameters = extra_float_digits
`,
		s.host, s.port,
		b.port, b.dir, filepath.Join(b.dir, "pgbouncer.pid"),
		authType, filepath.Join(b.dir, "userlist.txt"),
		opts.PoolMode, opts.PoolSize, opts.MaxClientConn,
		s.sslmode, serverLoginRetry, int(opts.QueryTimeout/time.Second))
	if b.version[0] > 1 || b.version[0] == 1 && b.version[1] >= 21 {
		// 1.18 does not know the setting, and refuses to start with it.
		conf += ";; Off, as before 1.21, so that every version pools as Debian 12's 1.18 does.\nmax_prepared_statements = 0\n"
	}
	return b.writeFile("pgbouncer.ini", conf)
}

// writeFile writes a file of b.dir that only PgBouncer's user may read.
func (b *Bouncer) writeFile(name, content string) error {
	path := filepath.Join(b.dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if b.cred != nil {
		if err := os.Chown(path, int(b.cred.Uid), int(b.cred.Gid)); err != nil {
			return fmt.Errorf("hand %s to uid %d: %w", path, b.cred.Uid, err)
		}
	}
	return nil
}
