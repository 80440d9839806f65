package pgurl_test

import (
	"strings"
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

func TestCheckURLText_RefusesAnAtAfterTheAuthority(t *testing.T) {
	tests := []struct {
		dsn  string
		want bool // refused
	}{
		{"postgres://u:p%2Fa%40ss@h:5432/db", false},
		{"postgres://u:pa@ss@h/db", false}, // left to CheckHosts, once parsed
		{"postgres://u@h/db?options=-c%20x=a/b@c&sslmode=disable", false},
		{"postgres://u:p@h/db#a/b@c", false},
		{"postgres:///db?host=/var/run/postgresql&user=u@x", false},
		{"host=h password=a/b@c", false},
		{"postgres://u:pa@zq/word@h/db", true},
		{"postgres://u:pa/zq@word@h/db", true},
		{"postgresql://u:pazq/word@h/db", true},
		{"postgres://u:p@h/zq@b", true},
		{" postgres://u:zq@h/db?sslmode=disable", true},
		{"postgresql://u:zq@h/db\n", true},
		{"\thost=h password=zq ", false},
	}
	for _, tt := range tests {
		err := pgurl.CheckURLText(tt.dsn)
		if (err != nil) != tt.want {
			t.Errorf("CheckURLText(%q) = %v, want refused %v", tt.dsn, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "zq") {
			t.Errorf("CheckURLText(%q) = %v, shows part of the URL", tt.dsn, err)
		}
	}
}

func TestHostPort(t *testing.T) {
	tests := []struct{ dsn, want string }{
		{"postgres://u:p@db.example:6543/postgres?sslmode=disable", "db.example:6543"},
		{"postgresql://h/postgres", "h:5432"},
		{"postgres://u@[::1]:5433/db", "[::1]:5433"},
		{"postgres://u@h:5433/db?host=other&port=7000", "other:7000"},
		{"postgres:///db?host=h", "h:5432"},
		{"host=h port=6543 dbname=db", "h:6543"},
		{"host = h  dbname=db", "h:5432"},
		{"host=h port=6543 host=later", "later:6543"},
		{"password='a b\\'c' host='h' port=1", "h:1"},
	}
	for _, tt := range tests {
		got, err := pgurl.HostPort(tt.dsn)
		if err != nil || got != tt.want {
			t.Errorf("HostPort(%q) = %q, %v; want %q", tt.dsn, got, err, tt.want)
		}
	}
}

func TestHostPort_RefusesWhatIsNotOneTCPServer(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u@h1,h2/db",
		"host=/var/run/postgresql dbname=db",
		"host='h",
		"host=h junk",
		"postgres://u@h:bad/db",
	} {
		if got, err := pgurl.HostPort(dsn); err == nil {
			t.Errorf("HostPort(%q) = %q, want an error", dsn, got)
		}
	}
}

func TestWithHostPort(t *testing.T) {
	tests := []struct{ dsn, hostport, want string }{
		{"postgres://u:p@h:5432/db?sslmode=disable", "127.0.0.1:40000", "postgres://u:p@127.0.0.1:40000/db?sslmode=disable"},
		{"postgresql://h/db", "[::1]:7", "postgresql://[::1]:7/db"},
		{"postgres://u@h/db?host=other&port=1&sslmode=disable", "p:2", "postgres://u@p:2/db?sslmode=disable"},
		{"host=h port=5432 dbname=db", "127.0.0.1:40000", "host=h port=5432 dbname=db host='127.0.0.1' port='40000'"},
	}
	for _, tt := range tests {
		got, err := pgurl.WithHostPort(tt.dsn, tt.hostport)
		if err != nil || got != tt.want {
			t.Errorf("WithHostPort(%q, %q) = %q, %v; want %q", tt.dsn, tt.hostport, got, err, tt.want)
			continue
		}
		if hp, err := pgurl.HostPort(got); err != nil || hp != tt.hostport {
			t.Errorf("HostPort(WithHostPort(%q, %q)) = %q, %v; want %q", tt.dsn, tt.hostport, hp, err, tt.hostport)
		}
	}
	for _, tt := range []struct{ dsn, hostport string }{
		{"postgres://h/db", "no-port"},
		{"  ", "h:1"},
	} {
		if _, err := pgurl.WithHostPort(tt.dsn, tt.hostport); err == nil {
			t.Errorf("WithHostPort(%q, %q) succeeded, want an error", tt.dsn, tt.hostport)
		}
	}
}
