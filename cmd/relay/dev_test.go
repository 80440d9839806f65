package main

import (
	"net"
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
			printDevBanner(&environment{stdout: &stdout}, tt.addr, tt.token, 4, "a database")
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
