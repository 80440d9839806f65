package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/internal/dbtest"
)

// TestREADME_CurlTourWorksAsWritten runs every curl line of the README's
// tour, in order, against `relay dev`, changing nothing but the port.
func TestREADME_CurlTourWorksAsWritten(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("the README's tour needs curl: %v", err)
	}
	lines := readmeTour(t)
	if len(lines) < 10 {
		t.Fatalf("found %d curl lines in the README's tour, want the whole tour", len(lines))
	}

	ctx := testContext(t, 60*time.Second)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	dsn := dbtest.NewURL(t)
	getenv := func(k string) string {
		if k == "DATABASE_URL" {
			return dsn
		}
		return ""
	}
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"relay", "dev", "--addr", "127.0.0.1:0", "--backoff-base", "50ms"}, getenv,
			strings.NewReader(""), &stdout, &stderr)
	}()
	bannerRE := regexp.MustCompile(`curl -s (localhost:\d+)/v1/jobs -d`)
	var addr string
	for addr == "" {
		select {
		case err := <-done:
			t.Fatalf("relay dev exited early: %v\n%s", err, stderr.String())
		case <-ctx.Done():
			t.Fatalf("no banner\n%s", stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if m := bannerRE.FindStringSubmatch(stdout.String()); m != nil {
			addr = m[1]
		}
	}

	for _, line := range lines {
		cmdline := strings.ReplaceAll(line, "localhost:8080", addr)
		out, err := exec.CommandContext(ctx, "sh", "-c", cmdline).Output()
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		var body map[string]any
		if err := json.Unmarshal(out, &body); err != nil {
			t.Fatalf("%s: not a JSON object: %q", line, out)
		}
		if msg, ok := body["error"]; ok {
			t.Errorf("%s: error %v", line, msg)
		}
		// Let the workers catch up, so that later lines (the list of
		// succeeded jobs) find what earlier ones started.
		time.Sleep(200 * time.Millisecond)
	}

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("relay dev: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("relay dev did not stop")
	}
}

// readmeTour returns the curl lines of the README's "A curl tour" section.
func readmeTour(t *testing.T) []string {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	inTour, inBlock := false, false
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		switch {
		case strings.HasPrefix(line, "### A curl tour"):
			inTour = true
		case inTour && strings.HasPrefix(line, "```"):
			inBlock = !inBlock
		case inTour && !inBlock && strings.HasPrefix(line, "#"):
			return lines
		case inTour && inBlock && strings.HasPrefix(line, "curl "):
			lines = append(lines, line)
		}
	}
	return lines
}
