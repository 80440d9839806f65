// Package pgurl reads and rewrites PostgreSQL connection strings: the URL
// form (postgres://...) and the keyword/value form (host=... dbname=...).
package pgurl

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// isURL reports whether dsn is in the URL form.
func isURL(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// WithDatabase returns dsn pointing at another database on the same server.
func WithDatabase(dsn, database string) (string, error) {
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse the database URL: %w", err)
		}
		u.Path = "/" + database
		return u.String(), nil
	}
	if strings.TrimSpace(dsn) == "" {
		return "", errors.New("empty database URL")
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	return dsn + " dbname=" + database, nil
}

// HostPort returns the host:port dsn connects to over TCP, as pgx reads
// it (the port 5432 if dsn names none). It fails if dsn names several
// hosts, or a Unix-domain socket (as it does when it names no host).
func HostPort(dsn string) (string, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", fmt.Errorf("parse the connection string: %w", err)
	}
	if strings.HasPrefix(cfg.Host, "/") {
		return "", fmt.Errorf("the connection string names the Unix-domain socket %s, not a TCP host", cfg.Host)
	}
	for _, f := range cfg.Fallbacks {
		// pgx adds fallbacks of the same server for sslmode=prefer.
		if f.Host != cfg.Host || f.Port != cfg.Port {
			return "", errors.New("the connection string names several hosts")
		}
	}
	return net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), nil
}

// WithHostPort returns dsn pointing at another server, hostport
// ("host:port"), with the same database, credentials and options.
func WithHostPort(dsn, hostport string) (string, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return "", fmt.Errorf("split %q into host and port: %w", hostport, err)
	}
	if isURL(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("parse the database URL: %w", err)
		}
		u.Host = net.JoinHostPort(host, port)
		if q := u.Query(); q.Has("host") || q.Has("port") {
			q.Del("host")
			q.Del("port")
			u.RawQuery = q.Encode()
		}
		return u.String(), nil
	}
	if strings.TrimSpace(dsn) == "" {
		return "", errors.New("empty database URL")
	}
	// Keyword/value form: a later keyword overrides an earlier one.
	return dsn + " host=" + quoteValue(host) + " port=" + quoteValue(port), nil
}

// quoteValue quotes a value of the keyword/value form.
func quoteValue(v string) string {
	r := strings.NewReplacer(`\`, `\\`, `'`, `\'`)
	return "'" + r.Replace(v) + "'"
}

// Redact shows a URL for logs and messages: its password hidden and its
// query (which may hold one too) left out. The keyword/value form is not
// shown at all.
func Redact(dsn string) string {
	if !isURL(dsn) {
		return "(from the connection string)"
	}
	u, err := url.Parse(dsn)
	if err != nil {
		return "(unparsable URL)"
	}
	u.RawQuery = ""
	return u.Redacted()
}

// CheckURLText checks the text of dsn before it is parsed. It returns an
// error if dsn, in the URL form, holds an '@' after a '/' that follows its
// "//", as when a password holding a '/' and
// an '@' is not escaped: the URL's authority, user information and host,
// then ends at that '/', and the rest of the password is read as the
// database's name, or as a port that pgx's error shows, or a fragment of
// the password as the host, which a connection would look up and name in
// its error. An '@' in a database's name is written as %40 as well. It
// also returns an error if dsn is a URL with white space before or after
// it, as one read from a file is: pgx takes a URL after white space for
// the keyword/value form, and the server's error then shows it, password
// and all. Run it before the URL is parsed; the error shows no part of dsn.
func CheckURLText(dsn string) error {
	if trimmed := strings.TrimSpace(dsn); trimmed != dsn && isURL(trimmed) {
		return errors.New("the URL begins or ends with white space, as when read from a file that ends in a newline: remove it")
	}
	if !isURL(dsn) {
		return nil
	}
	rest := dsn[strings.Index(dsn, "://")+len("://"):]
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	slash := strings.IndexByte(rest, '/')
	if slash >= 0 && strings.Contains(rest[slash:], "@") {
		return errors.New("an '@' follows a '/' in the URL, as when a '/' and an '@' in the password are not escaped: write '/' as %2F and '@' as %40")
	}
	return nil
}

// CheckHosts returns an error if a host of cfg holds an '@', as when a
// URL's password holds one unescaped: pgx, as libpq, ends a URL's user
// information at its first '@' and takes the rest of the password for the
// host, which the error of every connection to it would then show. The
// error shows no host.
func CheckHosts(cfg *pgconn.Config) error {
	hosts := []string{cfg.Host}
	for _, f := range cfg.Fallbacks {
		hosts = append(hosts, f.Host)
	}
	for _, h := range hosts {
		if strings.Contains(h, "@") {
			return errors.New("a host holds '@', as when an '@' in the password is not escaped: write it as %40")
		}
	}
	return nil
}

// CheckExecMode returns an error naming mode, a connection's pgx
// default_query_exec_mode, if Relay's statements cannot run in it: exec
// and simple_protocol choose each argument's type from its Go type alone,
// without asking the server, and send a jsonb document, which Relay's
// statements take as bytes, as bytea, which the server refuses ("invalid
// input syntax for type json"): every enqueue would fail, blamed on its
// payload. The other modes, cache_statement (pgx's default),
// cache_describe and describe_exec, learn the types from the server.
func CheckExecMode(mode pgx.QueryExecMode) error {
	var name string
	switch mode {
	case pgx.QueryExecModeExec:
		name = "exec"
	case pgx.QueryExecModeSimpleProtocol:
		name = "simple_protocol"
	default:
		return nil
	}
	return fmt.Errorf("default_query_exec_mode=%s cannot run Relay's statements, which need their arguments' types from the server: "+
		"use cache_statement (pgx's default), cache_describe or describe_exec", name)
}
