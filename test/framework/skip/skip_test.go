package skip

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTruthy(t *testing.T) {
	for _, v := range []string{"true", "TRUE", "True", "tRuE", "1", "t", "T", "yes", "YES", "Yes", "y", "on", "ON", " true ", "true\n"} {
		if !Truthy(v) {
			t.Errorf("Truthy(%q) = false, want true", v)
		}
	}
	for _, v := range []string{"", "false", "FALSE", "0", "no", "off", "n", "f", "2", "maybe", "truee"} {
		if Truthy(v) {
			t.Errorf("Truthy(%q) = true, want false", v)
		}
	}
}

// recorder is a testing.TB that records the first way a test was stopped
// (the embedded TB is nil: only these three are called).
type recorder struct {
	testing.TB
	stopped string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	if r.stopped == "" {
		r.stopped = "fatal: " + fmt.Sprintf(format, args...)
	}
}
func (r *recorder) Skipf(format string, args ...any) {
	if r.stopped == "" {
		r.stopped = "skip: " + fmt.Sprintf(format, args...)
	}
}

func TestUnavailable(t *testing.T) {
	tests := []struct {
		ci   string
		want string
	}{
		{ci: "true", want: "fatal: CI=true, so failing rather than skipping: no node (x)"},
		{ci: "1", want: "fatal: CI=1, so failing rather than skipping: no node (x)"},
		{ci: "Yes", want: "fatal: CI=Yes, so failing rather than skipping: no node (x)"},
		{ci: "", want: "skip: no node (x)"},
		{ci: "false", want: "skip: no node (x)"},
	}
	for _, tc := range tests {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{}
			Unavailable(r, "no node (%s)", "x")
			if diff := cmp.Diff(tc.want, r.stopped); diff != "" {
				t.Errorf("Unavailable under CI=%q (-want +got):\n%s", tc.ci, diff)
			}
		})
	}
}
