package harness

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestStartTrace_SamplesAtOnceOnEveryTickAndAtStop runs a trace of a
// counter and checks that it took a first sample before returning, more
// on the ticks, and a last one at stop, in order.
func TestStartTrace_SamplesAtOnceOnEveryTickAndAtStop(t *testing.T) {
	var n atomic.Int64
	tr, err := startTrace(5*time.Millisecond, func(context.Context) (int64, error) { return n.Add(1), nil })
	if err != nil {
		t.Fatal(err)
	}
	var first int
	tr.read(func(s []timed[int64]) { first = len(s) })
	if first < 1 {
		t.Fatalf("no sample taken at once")
	}
	time.Sleep(50 * time.Millisecond)
	before := time.Now()
	if err := tr.stop(); err != nil {
		t.Fatal(err)
	}
	if err := tr.stop(); err != nil {
		t.Fatalf("a second stop: %v", err)
	}
	tr.read(func(s []timed[int64]) {
		if len(s) < 3 {
			t.Fatalf("%d samples over 50 ms every 5 ms, want a first, some on the ticks and a last", len(s))
		}
		for i, x := range s {
			if x.v != int64(i+1) || (i > 0 && x.at.Before(s[i-1].at)) {
				t.Fatalf("sample %d is %d at %v, want %d, in the order taken", i, x.v, x.at, i+1)
			}
		}
		if last := s[len(s)-1].at; last.Before(before) {
			t.Errorf("last sample at %v, before stop was called at %v", last, before)
		}
	})
}

// TestStartTrace_AFailedSampleEndsIt checks that a first sample that fails
// starts no trace, and that a later one ends the trace with its error.
func TestStartTrace_AFailedSampleEndsIt(t *testing.T) {
	boom := errors.New("boom")
	if tr, err := startTrace(time.Millisecond, func(context.Context) (int, error) { return 0, boom }); tr != nil || !errors.Is(err, boom) {
		t.Errorf("a failed first sample gave %v, %v; want no trace and its error", tr, err)
	}
	var n atomic.Int64
	tr, err := startTrace(time.Millisecond, func(context.Context) (int64, error) {
		if n.Add(1) == 3 {
			return 0, boom
		}
		return n.Load(), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	if err := tr.stop(); !errors.Is(err, boom) {
		t.Errorf("stop = %v, want the third sample's error", err)
	}
	tr.read(func(s []timed[int64]) {
		if len(s) != 2 {
			t.Errorf("%d samples kept, want the 2 before the failure", len(s))
		}
	})
}
