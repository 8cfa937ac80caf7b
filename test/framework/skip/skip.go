// Package skip stops a test or benchmark whose real part (the real node,
// Knative, root) cannot be had: with the reason, as a skip on a developer's
// machine, and as a failure under CI=true, where a skip would pass off as
// green a test that never ran.
package skip

import (
	"os"
	"testing"
)

// Unavailable skips tb with the reason, or fails it under CI=true.
func Unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("CI") == "true" {
		tb.Fatalf("CI=true, so failing rather than skipping: "+format, args...)
	}
	tb.Skipf(format, args...)
}
