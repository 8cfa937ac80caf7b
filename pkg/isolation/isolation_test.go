package isolation

import (
	"slices"
	"testing"

	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
)

// TestSpecDiffIsSemantic: the same policy written in another order, or with
// the protocol left to the API server's default, is the same policy; a
// dropped rule, a widened range or a lost policy type is not.
func TestSpecDiffIsSemantic(t *testing.T) {
	want := resources.BuildNetworkPolicy(testConfig(t, nil).Objects()).Spec
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
