package shell

import (
	"os/exec"
	"testing"
)

func TestQuote_ReadsBackAsTheSameWordInAShell(t *testing.T) {
	tests := []struct {
		in, want string
	}{
		{"/tmp/relay-devdb-123", "/tmp/relay-devdb-123"},
		{"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable", "'postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable'"},
		{"/tmp/with space", "'/tmp/with space'"},
		{"it's $HOME", `'it'\''s $HOME'`},
		{"", "''"},
	}
	for _, tt := range tests {
		got := Quote(tt.in)
		if got != tt.want {
			t.Errorf("Quote(%q) = %s, want %s", tt.in, got, tt.want)
		}
		out, err := exec.Command("sh", "-c", "printf %s "+got).Output()
		if err != nil {
			t.Fatalf("sh: %v", err)
		}
		if string(out) != tt.in {
			t.Errorf("sh reads Quote(%q) = %s as %q", tt.in, got, out)
		}
	}
}
