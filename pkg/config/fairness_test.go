package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestFairnessDefaultsAndRefusals: the per-principal limits load with
// their generous defaults, and a limit that would refuse every request (0,
// or a negative rate) stops start-up naming its variable.
func TestFairnessDefaultsAndRefusals(t *testing.T) {
	c, err := Load()
	if err != nil {
		t.Fatal(err)
	}
	want := FairnessConfig{PrincipalRequestsPerSecond: 100, PrincipalRequestBurst: 200, PrincipalMaxConcurrentRequests: 64}
	if diff := cmp.Diff(want, c.FairnessConfig); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	for _, tc := range []struct{ name, value string }{
		{"PRINCIPAL_REQUESTS_PER_SECOND", "0"},
		{"PRINCIPAL_REQUESTS_PER_SECOND", "-1"},
		{"PRINCIPAL_REQUEST_BURST", "0"},
		{"PRINCIPAL_MAX_CONCURRENT_REQUESTS", "0"},
	} {
		t.Run(tc.name+"="+tc.value, func(t *testing.T) {
			t.Setenv(tc.name, tc.value)
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), tc.name) {
				t.Errorf("Load() error = %v, want one naming %s", err, tc.name)
			}
		})
	}
}
