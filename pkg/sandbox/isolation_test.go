package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestIsolationRechecked: creates trust the last verdict on the shared
// NetworkPolicy for SANDBOX_NETWORK_POLICY_CHECK_TTL only; then a deleted or
// altered policy refuses them (naming it), and a restored one admits them.
// The fake clientset stands in for the API server; test/e2e does the same
// against a real one.
func TestIsolationRechecked(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_CHECK_TTL": "0s"})
	client := fake.NewClientset(sharedPolicies(cfg)...)
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
		_, err := m.isolation.Require(ctx, "default", egress.Open)
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
	if _, err := nps.Create(ctx, resources.BuildNetworkPolicy(cfg.Objects()), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	check("restored", false, "")
	altered := resources.BuildEgressPolicies(cfg.Objects())[0] // open's: DNS and the internet
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
