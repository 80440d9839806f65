package pgurl_test

import (
	"testing"

	"github.com/relayq/relay/internal/pgurl"
)

func TestWithDatabase(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://u:p@h:5432/postgres?sslmode=disable", "postgres://u:p@h:5432/other?sslmode=disable"},
		{"postgresql://h/postgres", "postgresql://h/other"},
		{"host=h user=u dbname=postgres", "host=h user=u dbname=postgres dbname=other"},
	}
	for _, tt := range tests {
		got, err := pgurl.WithDatabase(tt.dsn, "other")
		if err != nil || got != tt.want {
			t.Errorf("WithDatabase(%q) = %q, %v; want %q", tt.dsn, got, err, tt.want)
		}
	}
	if _, err := pgurl.WithDatabase("  ", "other"); err == nil {
		t.Error("WithDatabase accepted an empty connection string")
	}
}

func TestRedact_NeverShowsAPassword(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://u:secret@h:5432/db?sslmode=disable&password=secret", "postgres://u:xxxxx@h:5432/db"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		{"host=h password=secret", "(from the connection string)"},
		{"postgres://u:secret@h:bad/db", "(unparsable URL)"},
	}
	for _, tt := range tests {
		if got := pgurl.Redact(tt.dsn); got != tt.want {
			t.Errorf("Redact(%q) = %q, want %q", tt.dsn, got, tt.want)
		}
	}
}
