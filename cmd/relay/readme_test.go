package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayq/relay/internal/relaybin"
)

// TestREADME_TourWorksAsWritten runs `relay dev` as the README does, with
// no DATABASE_URL, then every line of the README's tour, in order, changing
// nothing but the ports and the `go run` of relay: the curl lines, then the
// export line that the banner printed and the relay enqueue line.
func TestREADME_TourWorksAsWritten(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a PostgreSQL server; skipped with -short")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatalf("the README's tour needs curl: %v", err)
	}
	tour := readmeTour(t)
	if len(tour.curl) < 10 {
		t.Fatalf("found %d curl lines in the README's tour, want the whole tour", len(tour.curl))
	}
	relay := relaybin.Path(t)

	ctx := testContext(t, 2*time.Minute)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var stdout, stderr syncBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(runCtx, []string{"relay", "dev", "--addr", "127.0.0.1:0", "--backoff-base", "50ms"},
			func(string) string { return "" }, strings.NewReader(""), &stdout, &stderr)
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
	// The banner is written at once.
	m := exportLineRE.FindStringSubmatch(stdout.String())
	if m == nil {
		t.Fatalf("the banner has no export DATABASE_URL=... line:\n%s", stdout.String())
	}
	export := m[1]

	for _, line := range tour.curl {
		cmdline := strings.ReplaceAll(line, "localhost:8080", addr)
		out, err := exec.CommandContext(ctx, "sh", "-c", cmdline).Output()
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		checkJSONObject(t, line, out)
		// Let the workers catch up, so that later lines (the list of
		// succeeded jobs) find what earlier ones started.
		time.Sleep(200 * time.Millisecond)
	}

	if len(tour.shell) != 2 {
		t.Fatalf("the README's tour has shell lines %q, want an export DATABASE_URL line and a relay enqueue line", tour.shell)
	}
	portRE := regexp.MustCompile(`127\.0\.0\.1:\d+/`)
	if want := portRE.ReplaceAllString(export, "127.0.0.1:PORT/"); tour.shell[0] != want {
		t.Errorf("the README's line is\n\t%s\nbut relay dev printed\n\t%s", tour.shell[0], export)
	}
	enqueue := strings.Replace(tour.shell[1], "go run ./cmd/relay ", relay+" ", 1)
	out, err := exec.CommandContext(ctx, "sh", "-c", export+"\n"+enqueue).Output()
	if err != nil {
		t.Fatalf("%s: %v", tour.shell[1], err)
	}
	checkJSONObject(t, tour.shell[1], out)

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

// checkJSONObject fails the test unless out, what line printed, is a JSON
// object without an error.
func checkJSONObject(t *testing.T, line string, out []byte) {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal(out, &body); err != nil {
		t.Fatalf("%s: not a JSON object: %q", line, out)
	}
	if msg, ok := body["error"]; ok {
		t.Errorf("%s: error %v", line, msg)
	}
}

// tourLines are the command lines of the README's "A curl tour" section.
type tourLines struct {
	curl  []string // of its first code block
	shell []string // of the other code blocks
}

// readmeTour returns the command lines of the README's tour: those of its
// code blocks that are neither comments nor blank.
func readmeTour(t *testing.T) tourLines {
	t.Helper()
	f, err := os.Open("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var tour tourLines
	inTour, inBlock, blocks := false, false, 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		switch {
		case strings.HasPrefix(line, "### A curl tour"):
			inTour = true
		case inTour && strings.HasPrefix(line, "```"):
			inBlock = !inBlock
			if inBlock {
				blocks++
			}
		case inTour && !inBlock && strings.HasPrefix(line, "#"):
			return tour
		case inTour && inBlock && (strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#")):
		case inTour && inBlock && blocks == 1:
			tour.curl = append(tour.curl, line)
		case inTour && inBlock:
			tour.shell = append(tour.shell, line)
		}
	}
	return tour
}

// readmeText returns the README with its lines joined by spaces, so that a
// sentence can be matched whatever its line breaks.
func readmeText(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(strings.Fields(string(b)), " ")
}

// TestREADME_ConnectionCountsFollowFromThePools checks the README's counts
// of idle connections against servingMinConns: each pool keeps that many,
// plus the one its start-up check opened; a worker adds its session; dev
// runs two pools and one worker.
func TestREADME_ConnectionCountsFollowFromThePools(t *testing.T) {
	text := readmeText(t)
	m := regexp.MustCompile("`relay serve` holds (\\d+), `relay work` (\\d+) and `relay dev` (\\d+)\\. Each pool keeps (\\d+) open").FindStringSubmatch(text)
	if m == nil {
		t.Fatal("the README does not say how many connections serve, work and dev hold, and each pool keeps")
	}
	n := make([]int, 4)
	for i := range n {
		n[i], _ = strconv.Atoi(m[i+1])
	}
	pool := servingMinConns + 1
	if want := []int{pool, pool + 1, 2*pool + 1, servingMinConns}; !slices.Equal(n, want) {
		t.Errorf("the README says serve %d, work %d, dev %d, each pool %d; servingMinConns = %d makes them %v",
			n[0], n[1], n[2], n[3], servingMinConns, want)
	}
}

// TestREADME_NamesOnlyMakeTargetsThatExist checks every `make TARGET` the
// README gives, in code or in a code block, against the Makefile.
func TestREADME_NamesOnlyMakeTargetsThatExist(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(makefile), -1) {
		targets[m[1]] = true
	}
	named := regexp.MustCompile("(?m)(?:`|^)make ([a-z][a-z0-9-]*)").FindAllStringSubmatch(string(readme), -1)
	if len(named) == 0 {
		t.Fatal("the README names no make target")
	}
	for _, m := range named {
		if !targets[m[1]] {
			t.Errorf("the README names make %s, which the Makefile does not have", m[1])
		}
	}
}
