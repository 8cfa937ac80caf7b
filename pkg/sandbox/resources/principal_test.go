package resources

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPrincipalLabelValue(t *testing.T) {
	got := map[string]string{}
	for _, p := range []string{"default", "system:serviceaccount:deer-flow:x"} {
		v := PrincipalLabelValue(p)
		got[p] = v[:2]
		if len(v) != 42 || v != PrincipalLabelValue(p) {
			t.Errorf("PrincipalLabelValue(%q) = %q: not 42 stable characters", p, v)
		}
	}
	if PrincipalLabelValue("a") == PrincipalLabelValue("b") {
		t.Error("two principals share a label value")
	}
	if diff := cmp.Diff(map[string]string{"default": "p-", "system:serviceaccount:deer-flow:x": "p-"}, got); diff != "" {
		t.Error(diff)
	}
}
