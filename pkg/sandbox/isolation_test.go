package sandbox

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestSpecDiffIsSemantic: the same policy written in another order, or with
// the protocol left to the API server's default, is the same policy; a
// dropped rule, a widened range or a lost policy type is not.
func TestSpecDiffIsSemantic(t *testing.T) {
	want := resources.BuildNetworkPolicy(testConfig(t, nil)).Spec
	tests := []struct {
		name   string
		mutate func(*networkingv1.NetworkPolicySpec)
		want   []string
	}{
		{"unchanged", func(*networkingv1.NetworkPolicySpec) {}, nil},
		{"reordered rules, peers, ports, ranges and types", func(s *networkingv1.NetworkPolicySpec) {
			slices.Reverse(s.Egress)
			slices.Reverse(s.Egress[0].To)
			slices.Reverse(s.Egress[0].Ports)
			slices.Reverse(s.Egress[0].To[0].IPBlock.Except)
			slices.Reverse(s.PolicyTypes)
		}, nil},
		{"protocol left to the default", func(s *networkingv1.NetworkPolicySpec) { s.Ingress[0].Ports[0].Protocol = nil }, nil},
		{"egress rule dropped", func(s *networkingv1.NetworkPolicySpec) { s.Egress = s.Egress[:1] }, []string{"egress rules"}},
		{"a private range let through", func(s *networkingv1.NetworkPolicySpec) {
			s.Egress[1].To[0].IPBlock.Except = s.Egress[1].To[0].IPBlock.Except[1:]
		}, []string{"egress rules"}},
		{"ingress from everywhere", func(s *networkingv1.NetworkPolicySpec) { s.Ingress[0].From = nil }, []string{"ingress rules"}},
		{"egress unrestricted", func(s *networkingv1.NetworkPolicySpec) {
			s.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		}, []string{"policyTypes"}},
		{"selects other Pods", func(s *networkingv1.NetworkPolicySpec) { s.PodSelector.MatchLabels = map[string]string{"app": "x"} }, []string{"podSelector"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			live := *want.DeepCopy()
			tc.mutate(&live)
			if diff := cmp.Diff(tc.want, specDiff(want, live)); diff != "" {
				t.Errorf("specDiff (-want +got):\n%s", diff)
			}
		})
	}
}

// TestIsolationRechecked: creates trust the last verdict on the shared
// NetworkPolicy for SANDBOX_NETWORK_POLICY_CHECK_TTL only; then a deleted or
// altered policy refuses them (naming it), and a restored one admits them.
// The fake clientset stands in for the API server; test/e2e does the same
// against a real one.
func TestIsolationRechecked(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_CHECK_TTL": "0s"})
	client := fake.NewClientset(resources.BuildNetworkPolicy(cfg))
	gets := 0
	client.PrependReactor("get", "networkpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
		gets++
		return false, nil, nil
	})
	m := NewManager(cfg, client)
	ctx := context.Background()
	nps := client.NetworkingV1().NetworkPolicies(cfg.Namespace)
	check := func(what string, wantRefused bool, wantDetail string) {
		t.Helper()
		err := m.requireIsolation(ctx)
		if !wantRefused {
			if err != nil {
				t.Fatalf("%s: %v, want creates admitted", what, err)
			}
			return
		}
		if api.KindOf(err) != api.KindUnavailable || !strings.Contains(api.DetailOf(err), "deer-flow/deer-flow-sandbox-isolation") || !strings.Contains(api.DetailOf(err), wantDetail) {
			t.Fatalf("%s: %v (kind %v), want unavailable naming the policy and %q", what, err, api.KindOf(err), wantDetail)
		}
	}
	check("present", false, "")
	if err := nps.Delete(ctx, cfg.NetworkPolicyName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	check("deleted", true, "does not exist")
	if _, err := nps.Create(ctx, resources.BuildNetworkPolicy(cfg), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("restored", false, "")
	altered := resources.BuildNetworkPolicy(cfg)
	altered.Spec.Egress = altered.Spec.Egress[:1]
	altered.ResourceVersion = "altered"
	if _, err := nps.Update(ctx, altered, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("altered", true, "egress rules")

	// Within the TTL the last verdict stands without a read.
	cfg.NetworkPolicyCheckTTL = 1 << 62
	before := gets
	check("altered, within the TTL", true, "egress rules")
	if gets != before {
		t.Errorf("a check within the TTL read the policy %d times, want 0", gets-before)
	}
}
