// Package sleep waits for a while, unless a context ends first: the backoff
// of a retry, and the wait for a cut write to land (remove.WriteLands).
package sleep

import (
	"context"
	"time"
)

// For waits d, or answers ctx's error when it ends first. A d of zero or
// less does not wait, and answers ctx's error only if it has ended.
func For(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
