package main

import (
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

func TestDevBanner_ShowsCurlLinesThatReachTheAPI(t *testing.T) {
	const tokenNote = "set RELAY_API_TOKEN to it where you run curl"
	tests := []struct {
		name     string
		addr     *net.TCPAddr
		token    string
		wantCurl string
	}{
		{"loopback without a token", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}, "",
			`curl -s localhost:8080/v1/jobs -d`},
		{"every interface with a token", &net.TCPAddr{IP: net.IPv6unspecified, Port: 8080}, "s3cret",
			`curl -s -H "Authorization: Bearer $RELAY_API_TOKEN" localhost:8080/v1/jobs -d`},
		{"another loopback address", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 8080}, "",
			`curl -s 127.0.0.2:8080/v1/jobs -d`},
		{"IPv6 loopback", &net.TCPAddr{IP: net.IPv6loopback, Port: 8080}, "",
			`curl -s [::1]:8080/v1/jobs -d`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout strings.Builder
			printDevBanner(&environment{stdout: &stdout}, devBanner{addr: tt.addr, token: tt.token, slots: 4, where: "a database"})
			if !strings.Contains(stdout.String(), tt.wantCurl) {
				t.Errorf("banner does not contain %q:\n%s", tt.wantCurl, stdout.String())
			}
			if got, want := strings.Contains(stdout.String(), tokenNote), tt.token != ""; got != want {
				t.Errorf("banner says %q: %v, want %v:\n%s", tokenNote, got, want, stdout.String())
			}
			if tt.token != "" && strings.Contains(stdout.String(), tt.token) {
				t.Errorf("banner prints the token:\n%s", stdout.String())
			}
		})
	}
}

// exportLineRE matches the banner's line that sets DATABASE_URL.
var exportLineRE = regexp.MustCompile(`(?m)^  (export DATABASE_URL=.*)$`)

func TestDevBanner_GivesTheThrowawayDatabaseURLAsAShellLine(t *testing.T) {
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	const dsn = "postgres://postgres@127.0.0.1:40123/postgres?sslmode=disable"
	var stdout strings.Builder
	printDevBanner(&environment{stdout: &stdout}, devBanner{addr: addr, slots: 4, where: "a throwaway PostgreSQL", dsn: dsn, throwaway: true})
	m := exportLineRE.FindStringSubmatch(stdout.String())
	if m == nil {
		t.Fatalf("no export DATABASE_URL=... line in the banner:\n%s", stdout.String())
	}
	out, err := exec.Command("sh", "-c", m[1]+` && printf %s "$DATABASE_URL"`).Output()
	if err != nil {
		t.Fatalf("sh -c %q: %v", m[1], err)
	}
	if string(out) != dsn {
		t.Errorf("%s sets DATABASE_URL to %q, want %q", m[1], out, dsn)
	}
}

func TestDevBanner_DoesNotPrintAGivenDatabaseURL(t *testing.T) {
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}
	const dsn = "postgres://app:s3cret@db.example.com/app"
	var stdout strings.Builder
	printDevBanner(&environment{stdout: &stdout}, devBanner{addr: addr, slots: 4, where: "the database at postgres://app:xxxxx@db.example.com/app", dsn: dsn})
	if strings.Contains(stdout.String(), "s3cret") || exportLineRE.MatchString(stdout.String()) {
		t.Errorf("the banner prints the given database URL:\n%s", stdout.String())
	}
	if !strings.Contains(stdout.String(), "set DATABASE_URL there") {
		t.Errorf("the banner does not say to set DATABASE_URL in another terminal:\n%s", stdout.String())
	}
}
