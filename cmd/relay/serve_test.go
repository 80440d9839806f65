package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relayq/relay/internal/cli"
	"github.com/relayq/relay/internal/dbtest"
)

// unauthenticatedWarning is what serve logs when the API is open to the
// network without a token.
const unauthenticatedWarning = "the API accepts unauthenticated requests from the network"

// refusal is the error of a command that will not serve the API on addr
// without a token.
func refusal(command, addr string) string {
	return command + ": refusing to serve the API on " + addr +
		" without a token: set --api-token (or RELAY_API_TOKEN), listen on a loopback address, or pass --insecure-no-auth"
}

func TestServe_RefusesNonLoopbackAddressWithoutToken(t *testing.T) {
	// A refusal must come before any connection: with this URL, a command
	// that got as far as the database would fail differently.
	const unreachable = "postgres://127.0.0.1:1/x"
	dsn := dbtest.NewURL(t)
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		refuses string // the address named in the refusal; "" if the API starts
		// What a request without a token gets from a started API.
		wantStatus  int
		wantWarning bool
	}{
		{name: "127.0.0.1", args: []string{"--addr", "127.0.0.1:0"}, wantStatus: http.StatusOK},
		{name: "elsewhere in 127.0.0.0/8", args: []string{"--addr", "127.0.0.2:0"}, wantStatus: http.StatusOK},
		{name: "::1", args: []string{"--addr", "[::1]:0"}, wantStatus: http.StatusOK},
		{name: "localhost", args: []string{"--addr", "localhost:0"}, wantStatus: http.StatusOK},
		{name: "loopback RELAY_ADDR", env: map[string]string{"RELAY_ADDR": "127.0.0.1:0"}, wantStatus: http.StatusOK},

		{name: "0.0.0.0", args: []string{"--addr", "0.0.0.0:8080"}, refuses: "0.0.0.0:8080"},
		{name: "empty host", args: []string{"--addr", ":8080"}, refuses: ":8080"},
		{name: "::", args: []string{"--addr", "[::]:8080"}, refuses: "[::]:8080"},
		{name: "a non-loopback IP", args: []string{"--addr", "192.0.2.1:8080"}, refuses: "192.0.2.1:8080"},
		{name: "IPv4-mapped 0.0.0.0", args: []string{"--addr", "[::ffff:0.0.0.0]:8080"}, refuses: "[::ffff:0.0.0.0]:8080"},
		{name: "non-loopback RELAY_ADDR", env: map[string]string{"RELAY_ADDR": "0.0.0.0:8080"}, refuses: "0.0.0.0:8080"},
		{name: "empty token flag", args: []string{"--addr", "0.0.0.0:8080", "--api-token", ""}, refuses: "0.0.0.0:8080"},

		{name: "--api-token", args: []string{"--addr", "0.0.0.0:0", "--api-token", "s3cret"}, wantStatus: http.StatusUnauthorized},
		{name: "RELAY_API_TOKEN", args: []string{"--addr", "[::]:0"},
			env: map[string]string{"RELAY_API_TOKEN": "s3cret"}, wantStatus: http.StatusUnauthorized},
		{name: "--insecure-no-auth", args: []string{"--addr", "0.0.0.0:0", "--insecure-no-auth"},
			wantStatus: http.StatusOK, wantWarning: true},
		{name: "--insecure-no-auth on loopback", args: []string{"--addr", "127.0.0.1:0", "--insecure-no-auth"}, wantStatus: http.StatusOK},
		{name: "--insecure-no-auth with a token", args: []string{"--addr", "0.0.0.0:0", "--insecure-no-auth", "--api-token", "s3cret"},
			wantStatus: http.StatusUnauthorized},
	}
	for _, command := range []string{"serve", "dev"} {
		for _, tt := range tests {
			t.Run(command+"/"+tt.name, func(t *testing.T) {
				env := map[string]string{"DATABASE_URL": dsn}
				if tt.refuses != "" {
					env["DATABASE_URL"] = unreachable
				}
				for k, v := range tt.env {
					env[k] = v
				}
				args := append([]string{command}, tt.args...)
				if tt.refuses != "" {
					r := runRelay(testContext(t, 10*time.Second), env, "", args...)
					var u *cli.UsageError
					if !errors.As(r.err, &u) {
						t.Fatalf("error = %v (%T), want a usage error", r.err, r.err)
					}
					if got, want := r.err.Error(), refusal(command, tt.refuses); got != want {
						t.Errorf("error = %q, want %q", got, want)
					}
					if r.stdout != "" || r.stderr != "" {
						t.Errorf("printed stdout %q, stderr %q; want nothing (main prints the error)", r.stdout, r.stderr)
					}
					return
				}
				api := startAPI(t, env, args...)
				resp, _, err := apiRequest(testContext(t, 10*time.Second), http.MethodGet, "http://"+api.addr+"/v1/queues", "", "")
				if err != nil {
					t.Fatalf("request without a token: %v", err)
				}
				if resp.StatusCode != tt.wantStatus {
					t.Errorf("request without a token: %s, want %d", resp.Status, tt.wantStatus)
				}
				want := 0
				if tt.wantWarning {
					want = 1
				}
				if got := strings.Count(api.String(), unauthenticatedWarning); got != want {
					t.Errorf("logged the warning %q %d times, want %d:\n%s", unauthenticatedWarning, got, want, api.String())
				}
			})
		}
	}
}

// An API token that begins or ends with white space, or holds a control
// character, cannot be presented: HTTP trims the white space around a
// header's value and refuses control characters in it, so every request
// would get a 401. Such a token, as a RELAY_API_TOKEN read from a file
// that ends in a newline, is a usage error, named without the token
// itself; a token with white space inside, which a request can present,
// is served.
func TestServe_RefusesATokenNoRequestCanPresent(t *testing.T) {
	const unreachable = "postgres://127.0.0.1:1/x"
	const want = "--api-token (or RELAY_API_TOKEN) begins or ends with white space, or holds a control character: " +
		"no request can present it in its Authorization header"
	refused := []struct {
		name  string
		token string
		inEnv bool
	}{
		{"a newline at the end of RELAY_API_TOKEN", "s3cret\n", true},
		{"a space at the end", "s3cret ", false},
		{"a space at the start", " s3cret", false},
		{"a tab at the end", "s3cret\t", false},
		{"a no-break space at the end", "s3cret\u00a0", false},
		{"a carriage return inside", "s3c\rret", true},
		{"an escape inside", "s3c\x1bret", false},
		{"DEL inside", "s3c\x7fret", false},
	}
	for _, command := range []string{"serve", "dev"} {
		for _, tt := range refused {
			t.Run(command+"/"+tt.name, func(t *testing.T) {
				env := map[string]string{"DATABASE_URL": unreachable}
				args := []string{command, "--addr", "127.0.0.1:0"}
				if tt.inEnv {
					env["RELAY_API_TOKEN"] = tt.token
				} else {
					args = append(args, "--api-token", tt.token)
				}
				r := runRelay(testContext(t, 10*time.Second), env, "", args...)
				var u *cli.UsageError
				if !errors.As(r.err, &u) {
					t.Fatalf("error = %v (%T), want a usage error", r.err, r.err)
				}
				if got := r.err.Error(); got != command+": "+want {
					t.Errorf("error = %q, want %q", got, command+": "+want)
				}
				if strings.Contains(r.err.Error(), strings.TrimSpace(tt.token)) {
					t.Errorf("error %q shows the token", r.err)
				}
			})
		}
	}

	t.Run("white space inside", func(t *testing.T) {
		const token = "s3c ret\tnow"
		env := map[string]string{"DATABASE_URL": dbtest.NewURL(t)}
		api := startAPI(t, env, "serve", "--addr", "127.0.0.1:0", "--api-token", token)
		ctx := testContext(t, 10*time.Second)
		for _, tc := range []struct {
			token string
			want  int
		}{{token, http.StatusOK}, {"s3c", http.StatusUnauthorized}, {"", http.StatusUnauthorized}} {
			resp, _, err := apiRequest(ctx, http.MethodGet, "http://"+api.addr+"/v1/queues", tc.token, "")
			if err != nil {
				t.Fatalf("request with token %q: %v", tc.token, err)
			}
			if resp.StatusCode != tc.want {
				t.Errorf("request with token %q: %s, want %d", tc.token, resp.Status, tc.want)
			}
		}
	})
}

func TestServe_RefusesAnAddressItCannotResolveWithoutToken(t *testing.T) {
	for _, command := range []string{"serve", "dev"} {
		t.Run(command, func(t *testing.T) {
			env := map[string]string{"DATABASE_URL": "postgres://127.0.0.1:1/x"}
			// .invalid never resolves (RFC 6761).
			r := runRelay(testContext(t, 10*time.Second), env, "", command, "--addr", "relay.invalid:8080")
			var u *cli.UsageError
			if !errors.As(r.err, &u) {
				t.Fatalf("error = %v (%T), want a usage error", r.err, r.err)
			}
			msg := r.err.Error()
			prefix := command + ": refusing to serve the API on relay.invalid:8080 without a token: cannot resolve relay.invalid"
			suffix := "; set --api-token (or RELAY_API_TOKEN), listen on a loopback address, or pass --insecure-no-auth"
			if !strings.HasPrefix(msg, prefix) || !strings.HasSuffix(msg, suffix) || strings.Contains(msg, "\n") {
				t.Errorf("error = %q, want one line starting %q and ending %q", msg, prefix, suffix)
			}
		})
	}
}

func TestIsLoopbackHost_TrustsANameOnlyIfEveryAddressIsLoopback(t *testing.T) {
	lookupFails := errors.New("no such host")
	tests := []struct {
		host    string
		addrs   []string // what the name resolves to; nil: no lookup, or a failed one with wantErr
		want    bool
		wantErr bool
	}{
		{host: "", want: false},
		{host: "0.0.0.0", want: false},
		{host: "::", want: false},
		{host: "192.0.2.1", want: false},
		{host: "fe80::1%lo", want: false},
		{host: "::ffff:192.0.2.1", want: false},
		{host: "127.0.0.1", want: true},
		{host: "127.255.255.254", want: true},
		{host: "::1", want: true},
		{host: "::ffff:127.0.0.1", want: true},
		{host: "localhost", want: true},
		{host: "LocalHost.", want: true},
		{host: "relay.test", addrs: []string{"127.0.0.1", "::1"}, want: true},
		{host: "relay.test", addrs: []string{"127.0.0.1", "192.0.2.1"}, want: false},
		{host: "relay.test", addrs: []string{"192.0.2.1"}, want: false},
		{host: "relay.test", addrs: []string{}, wantErr: true},
		{host: "relay.test", addrs: nil, wantErr: true},
	}
	for _, tt := range tests {
		name := tt.host
		switch {
		case name == "":
			name = "empty host"
		case tt.addrs != nil:
			name += " resolving to [" + strings.Join(tt.addrs, " ") + "]"
		case tt.wantErr:
			name += " not resolving"
		}
		t.Run(name, func(t *testing.T) {
			lookup := func(ctx context.Context, host string) ([]string, error) {
				if _, ok := ctx.Deadline(); !ok {
					t.Errorf("looked up %q without a deadline", host)
				}
				switch {
				case tt.addrs != nil:
					return tt.addrs, nil
				case !tt.wantErr:
					t.Errorf("looked up %q, which needs no lookup", host)
				}
				return nil, lookupFails
			}
			got, err := isLoopbackHost(t.Context(), tt.host, lookup)
			if (err != nil) != tt.wantErr {
				t.Fatalf("error = %v, want an error: %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Errorf("isLoopbackHost(%q) = %v, want %v", tt.host, got, tt.want)
			}
		})
	}
}

// apiLog is the stderr of a running API, with the address it serves on.
type apiLog struct {
	*syncBuffer
	addr string // host:port to send requests to
}

// startAPI runs `relay args...` (serve or dev) until the API serves, and
// stops it when the test ends, failing the test unless it stops cleanly.
func startAPI(t *testing.T, env map[string]string, args ...string) apiLog {
	t.Helper()
	api, stop := startStoppableAPI(t, env, args...)
	t.Cleanup(stop)
	return api
}

// startStoppableAPI is startAPI, with the function that stops the API and
// fails the test unless it stops cleanly, for the test to call; only its
// first call does anything.
func startStoppableAPI(t *testing.T, env map[string]string, args ...string) (apiLog, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(testContext(t, 60*time.Second))
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, append([]string{"relay"}, args...), func(k string) string { return env[k] },
			strings.NewReader(""), &stdout, &stderr)
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("relay %s: %v\nstderr:\n%s", strings.Join(args, " "), err, stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Errorf("relay %s did not stop within 30s", strings.Join(args, " "))
			}
		})
	}
	t.Cleanup(stop)

	servingRE := regexp.MustCompile(`msg="serving the API" addr=(\S+)`)
	for {
		if m := servingRE.FindStringSubmatch(stderr.String()); m != nil {
			host, port, err := net.SplitHostPort(m[1])
			if err != nil {
				t.Fatalf("serving on %q: %v", m[1], err)
			}
			if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
				host = "127.0.0.1"
			}
			return apiLog{&stderr, net.JoinHostPort(host, port)}, stop
		}
		select {
		case err := <-done:
			done <- err // for the cleanup
			t.Fatalf("relay %s exited early: %v\nstderr:\n%s", strings.Join(args, " "), err, stderr.String())
		case <-ctx.Done():
			t.Fatalf("relay %s not serving after 60s\nstderr:\n%s", strings.Join(args, " "), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestServe_SendsTheNotificationsOwedAsItStops posts two one-job requests
// to relay serve with notifications spaced an hour apart: the second job
// is owed its notification, and relay serve sends it as it stops, rather
// than leave the job to its workers' next poll.
func TestServe_SendsTheNotificationsOwedAsItStops(t *testing.T) {
	t.Parallel()
	dsn := dbtest.NewURL(t)
	pool := dbtest.Connect(t, dsn)
	listener, _ := dbtest.Listen(t, pool, "default")
	api, stop := startStoppableAPI(t, map[string]string{"DATABASE_URL": dsn},
		"serve", "--addr", "127.0.0.1:0", "--announce-every", "1h")
	for i, want := range []int{1, 0} {
		resp, body, err := apiRequest(testContext(t, 10*time.Second), http.MethodPost, "http://"+api.addr+"/v1/jobs", "", `{"kind":"noop"}`)
		if err != nil || resp.StatusCode != http.StatusCreated {
			t.Fatalf("post job %d: %v, %v: %s", i+1, resp, err, body)
		}
		if got := len(dbtest.Heard(t, t.Context(), listener)); got != want {
			t.Fatalf("heard %d notifications after job %d, want %d", got, i+1, want)
		}
	}
	stop()
	if got := len(dbtest.Heard(t, t.Context(), listener)); got != 1 {
		t.Errorf("heard %d notifications as relay serve stopped, want 1 for the second job", got)
	}
}
