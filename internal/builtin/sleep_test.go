package builtin

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestSleep_NeverEndsEarly(t *testing.T) {
	for _, d := range []time.Duration{time.Millisecond, 10 * time.Millisecond, 25 * time.Millisecond} {
		for range 5 {
			start := time.Now()
			if err := sleep(t.Context(), d); err != nil {
				t.Fatalf("sleep(%s): %v", d, err)
			}
			if took := time.Since(start); took < d {
				t.Errorf("sleep(%s) returned after %s", d, took)
			}
		}
	}
}

func TestSleep_ReturnsTheCauseOfAnEarlierCancellation(t *testing.T) {
	cause := errors.New("stop")
	ctx, cancel := context.WithCancelCause(t.Context())
	cancel(cause)
	if err := sleep(ctx, time.Hour); !errors.Is(err, cause) {
		t.Errorf("sleep on a cancelled context = %v, want %v", err, cause)
	}
}
