//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
)

// TestSharedNetworkPolicy: one policy selects every sandbox and exists before
// the first one; its shape follows the settings; a create writes a Pod and a
// Service and nothing else (no per-sandbox policy).
func TestSharedNetworkPolicy(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
	}{
		{"default", nil},
		{"NodePort with node addresses", map[string]string{"SANDBOX_INGRESS_NODE_CIDRS": "192.168.1.10/32,192.168.1.11/32"}},
		{"deny-all egress", map[string]string{"SANDBOX_EGRESS_MODE": "deny-all"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t)
			f := start(t, ns, tc.env)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			t.Setenv("K8S_NAMESPACE", ns)
			cfg, err := config.Load()
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			got, err := client().NetworkingV1().NetworkPolicies(ns).Get(ctx, cfg.NetworkPolicyName, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the shared policy does not exist before the first sandbox: %v", err)
			}
			if diff := cmp.Diff(sandbox.BuildNetworkPolicy(cfg).Spec, got.Spec); diff != "" {
				t.Errorf("shared policy (-want +got):\n%s", diff)
			}

			proxy.Reset()
			expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "iso1"}), 200, "create")
			writes, events := map[string]int{}, 0
			for k, n := range proxy.Counts() {
				verb, resource, _ := strings.Cut(k, " ")
				switch {
				case resource == "events":
					events += n // sent asynchronously, off the create's path
				case verb == "POST" || verb == "PUT" || verb == "PATCH" || verb == "DELETE":
					writes[k] += n
				}
			}
			if diff := cmp.Diff(map[string]int{"POST pods": 1, "POST services": 1}, writes); diff != "" {
				t.Errorf("synchronous writes of one create (-want +got):\n%s", diff)
			}
			t.Logf("one create: synchronous writes %v; Kubernetes Event writes counted separately so far: %d", writes, events)
			l, err := client().NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
			if err != nil || len(l.Items) != 1 {
				t.Errorf("NetworkPolicies after a create: %d (%v), want only the shared one", len(l.Items), err)
			}
		})
	}
}

// TestNoSandboxWithoutIsolation: a function that may not create the shared
// policy refuses creates until it exists, leaves nothing behind, and then
// works without a restart once the operator applies it.
func TestNoSandboxWithoutIsolation(t *testing.T) {
	ns := namespace(t)
	f := start(t, ns, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "false"})
	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "open1"})
	if r.Code != 503 || !strings.Contains(r.Detail(), "NetworkPolicy") {
		t.Errorf("create without the shared policy: %d %s, want 503 naming the NetworkPolicy", r.Code, r.Raw)
	}
	if p, s := pods(t, ns, ""), services(t, ns, ""); len(p) != 0 || len(s) != 0 {
		t.Errorf("a refused create left %d Pods and %d Services", len(p), len(s))
	}
	t.Setenv("K8S_NAMESPACE", ns)
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client().NetworkingV1().NetworkPolicies(ns).Create(context.Background(), sandbox.BuildNetworkPolicy(cfg), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "open1"}), 200, "create once the policy exists")
}
