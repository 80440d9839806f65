// Package pgurl reads and rewrites PostgreSQL connection strings: the URL
// form (postgres://...) and the keyword/value form (host=... dbname=...).
package pgurl

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
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
