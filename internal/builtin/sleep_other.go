//go:build !linux

package builtin

import (
	"context"
	"time"
)

// sleep waits for d, or returns the cause of ctx's cancellation if that
// comes first.
func sleep(ctx context.Context, d time.Duration) error { return timerSleep(ctx, d) }
