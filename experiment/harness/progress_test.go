package harness

import (
	"bytes"
	"testing"
)

func TestProgress_WritesNotesAndTheLastLineOnTheirOwnLinesOffATerminal(t *testing.T) {
	var b bytes.Buffer
	p := NewProgress(&b, "burst 1x1", 10)
	p.Note("starting %d workers", 2)
	p.Finish("done in %s", "1s")
	if got, want := b.String(), "burst 1x1 starting 2 workers\nburst 1x1 done in 1s\n"; got != want {
		t.Errorf("wrote %q, want %q", got, want)
	}
	var tty bytes.Buffer
	q := &Progress{w: &tty, tty: true, label: "x"}
	q.Note("a")
	q.Finish("b")
	if got, want := tty.String(), "\rx a\x1b[K\rx b\x1b[K\n"; got != want {
		t.Errorf("on a terminal wrote %q, want %q", got, want)
	}
}
