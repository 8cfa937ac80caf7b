package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestTemplateAllowListsRefuseBadEntries(t *testing.T) {
	tests := []struct{ name, value, want string }{
		{"SANDBOX_TEMPLATE_TOLERATIONS", "gpu", "key[=value]:Effect"},
		{"SANDBOX_TEMPLATE_ANNOTATIONS", "sandbox.deerflow.dev/expires-at", "bookkeeping"},
		{"SANDBOX_TEMPLATE_ANNOTATIONS", "*", "prefix"},
		{"SANDBOX_TEMPLATE_ANNOTATIONS", "a*b", "prefix"},
		{"SANDBOX_TEMPLATE_PRIORITY_CLASSES", "High", "SANDBOX_TEMPLATE_PRIORITY_CLASSES"},
		{"SANDBOX_NETWORK_POLICY_CHECK_TTL", "2m", "between 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			t.Setenv(tt.name, tt.value)
			_, err := Load()
			if err == nil || !strings.Contains(err.Error(), tt.name) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load with %s=%q: %v, want an error naming it and saying %q", tt.name, tt.value, err, tt.want)
			}
		})
	}
}

func TestAnnotationAllowed(t *testing.T) {
	allow := []string{"example.com/*", "kubectl.kubernetes.io/default-container"}
	got := map[string]bool{}
	for _, k := range []string{"example.com/team", "example.com/", "example.org/team", "kubectl.kubernetes.io/default-container",
		"kubectl.kubernetes.io/default-containers", "io.katacontainers.config.hypervisor.kernel_params"} {
		got[k] = AnnotationAllowed(allow, k)
	}
	want := map[string]bool{"example.com/team": true, "example.com/": true, "example.org/team": false, "kubectl.kubernetes.io/default-container": true,
		"kubectl.kubernetes.io/default-containers": false, "io.katacontainers.config.hypervisor.kernel_params": false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AnnotationAllowed (-want +got):\n%s", diff)
	}
}
