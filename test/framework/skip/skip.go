// Package skip stops a test or benchmark whose real part (the real node,
// Knative, root) cannot be had: with the reason, as a skip on a developer's
// machine, and as a failure under CI (CI set to a true value: true, 1, yes,
// in any case), where a skip would pass off as green a test that never ran.
// .ci/run exports CI=true; hack/summarize-tests.sh reads CI the same way and
// fails on any skip; hack/verify-ci.sh keeps the three agreeing.
package skip

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// Unavailable skips tb with the reason, or fails it under CI.
func Unavailable(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if v := os.Getenv("CI"); Truthy(v) {
		tb.Fatalf("CI=%s, so failing rather than skipping: "+format, append([]any{v}, args...)...)
	}
	tb.Skipf(format, args...)
}

// Truthy says whether v, the value of CI, means "this is CI": what
// strconv.ParseBool calls true (1, t, true) and y, yes, on, in any case
// and around spaces. CI systems spell it differently (true, 1, True), and
// a spelling read as false here would let a skip pass as green.
func Truthy(v string) bool {
	v = strings.ToLower(strings.TrimSpace(v))
	if b, err := strconv.ParseBool(v); err == nil {
		return b
	}
	return v == "y" || v == "yes" || v == "on"
}
