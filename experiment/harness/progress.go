package harness

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Progress draws a progress line on a terminal (redrawn in place), or
// writes plain lines now and then when its writer is not a terminal. A nil
// *Progress, or one on a nil writer, draws nothing. Its methods are safe
// for concurrent use.
type Progress struct {
	w     io.Writer
	tty   bool
	label string
	total int

	mu         sync.Mutex
	start      time.Time
	lastPrint  time.Time
	finalShown bool
}

// plainEvery is how often a Progress that is not on a terminal writes a line.
const plainEvery = 2 * time.Second

// barWidth is the width of the bar, in characters.
const barWidth = 30

// NewProgress returns a Progress of total steps labelled label, on w.
func NewProgress(w io.Writer, label string, total int) *Progress {
	return &Progress{w: w, tty: isTerminal(w), label: label, total: total, start: time.Now()}
}

// isTerminal reports whether w is a character device, such as a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Restart sets the bar's clock, from which its elapsed time and rate are
// measured, to now: for a bar whose steps begin after the setup it has
// reported.
func (p *Progress) Restart() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.start = time.Now()
	p.mu.Unlock()
}

// Update shows done of total steps, with note after the figures.
func (p *Progress) Update(done int, note string) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if !p.tty {
		switch {
		case done == p.total && p.total > 0:
			if p.finalShown {
				return
			}
			p.finalShown = true
		case now.Sub(p.lastPrint) < plainEvery:
			return
		}
	}
	p.lastPrint = now
	elapsed := now.Sub(p.start).Seconds()
	line := p.label
	if p.total > 0 {
		frac := min(max(float64(done)/float64(p.total), 0), 1)
		filled := int(frac * barWidth)
		line += fmt.Sprintf(" [%s%s] %d/%d", strings.Repeat("#", filled), strings.Repeat(".", barWidth-filled), done, p.total)
		if elapsed > 0 && p.total >= 100 {
			line += fmt.Sprintf(" %.0f/s", float64(done)/elapsed)
		}
	}
	line += fmt.Sprintf(" %.1fs", elapsed)
	if note != "" {
		line += " " + note
	}
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\x1b[K", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// Note shows a line of text: on a terminal it replaces the progress line,
// elsewhere it is written as is.
func (p *Progress) Note(format string, args ...any) { p.show(false, format, args...) }

// Finish ends the progress line with a last message.
func (p *Progress) Finish(format string, args ...any) { p.show(true, format, args...) }

// show writes a message in place of the progress line, and on a terminal
// ends that line when last is set.
func (p *Progress) show(last bool, format string, args ...any) {
	if p == nil || p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	msg := fmt.Sprintf(format, args...)
	switch {
	case !p.tty:
		fmt.Fprintf(p.w, "%s %s\n", p.label, msg)
	case last:
		fmt.Fprintf(p.w, "\r%s %s\x1b[K\n", p.label, msg)
	default:
		fmt.Fprintf(p.w, "\r%s %s\x1b[K", p.label, msg)
	}
}
