//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// shippedNetworkPolicies are config/701-networkpolicy-sandboxes.yaml as it
// is on disk, moved to ns: what an operator applies (the shared policy and
// each egress mode's), written independently of the builder the function
// uses.
func shippedNetworkPolicies(t *testing.T, ns string) []*networkingv1.NetworkPolicy {
	t.Helper()
	objs := readObjects(t, filepath.Join("..", "..", "config", "701-networkpolicy-sandboxes.yaml"))
	if len(objs) != 3 {
		t.Fatalf("config/701-networkpolicy-sandboxes.yaml holds %d objects, want 3 (the shared policy, open's and allowlist's)", len(objs))
	}
	var out []*networkingv1.NetworkPolicy
	for _, o := range objs {
		var np networkingv1.NetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &np); err != nil {
			t.Fatal(err)
		}
		np.Namespace = ns
		out = append(out, &np)
	}
	return out
}

// shippedNetworkPolicy is the shared one of them, which every sandbox
// depends on.
func shippedNetworkPolicy(t *testing.T, ns string) *networkingv1.NetworkPolicy {
	t.Helper()
	return shippedNetworkPolicies(t, ns)[0]
}

// applyShippedPolicies creates every shipped policy in ns.
func applyShippedPolicies(t *testing.T, ns string) {
	t.Helper()
	for _, np := range shippedNetworkPolicies(t, ns) {
		if _, err := client().NetworkingV1().NetworkPolicies(ns).Create(context.Background(), np, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSharedNetworkPolicy: one policy selects every sandbox and exists before
// the first one; its shape follows the settings, compared with the shipped
// manifest (and, for other settings, with the changes written out here, not
// with the builder the function itself used). It admits no one: the first
// create of a principal writes the policy that admits that principal's
// backends (and, for DeerFlow's key, the one for sandboxes that record no
// principal); every later create writes a Pod and a Service and nothing else
// (no per-sandbox policy).
func TestSharedNetworkPolicy(t *testing.T) {
	backend := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "deer-flow-backend"}}}
	cases := []struct {
		name    string
		env     map[string]string
		want    func(byName map[string]*networkingv1.NetworkPolicySpec) // the shipped policies as these settings make them
		sources []networkingv1.NetworkPolicyPeer                        // whom DeerFlow's sandboxes admit
	}{
		{"default", nil, func(map[string]*networkingv1.NetworkPolicySpec) {}, []networkingv1.NetworkPolicyPeer{backend}},
		{"NodePort with node addresses", map[string]string{"SANDBOX_INGRESS_NODE_CIDRS": "192.168.1.10/32,192.168.1.11/32"}, func(map[string]*networkingv1.NetworkPolicySpec) {},
			[]networkingv1.NetworkPolicyPeer{backend, {IPBlock: &networkingv1.IPBlock{CIDR: "192.168.1.10/32"}}, {IPBlock: &networkingv1.IPBlock{CIDR: "192.168.1.11/32"}}}},
		// isolated by default (deny-all is its old name): open's policy
		// selects only sandboxes labelled open, so one from before modes
		// keeps no egress.
		{"deny-all egress", map[string]string{"SANDBOX_EGRESS_MODE": "deny-all"}, func(byName map[string]*networkingv1.NetworkPolicySpec) {
			open := byName["deer-flow-sandbox-isolation-egress-open"]
			open.PodSelector = metav1.LabelSelector{MatchLabels: map[string]string{"app": "deer-flow-sandbox", "sandbox.deerflow.dev/egress": "open"}}
		}, []networkingv1.NetworkPolicyPeer{backend}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := namespace(t)
			f := start(t, ns, tc.env)
			ctx := context.Background()
			shipped := shippedNetworkPolicies(t, ns)
			byName := map[string]*networkingv1.NetworkPolicySpec{}
			for _, np := range shipped {
				byName[np.Name] = &np.Spec
			}
			tc.want(byName)
			for _, np := range shipped {
				got, err := client().NetworkingV1().NetworkPolicies(ns).Get(ctx, np.Name, metav1.GetOptions{})
				if err != nil {
					t.Fatalf("the policy %s does not exist before the first sandbox: %v", np.Name, err)
				}
				if diff := cmp.Diff(np.Spec, got.Spec); diff != "" {
					t.Errorf("%s (-want +got):\n%s", np.Name, diff)
				}
				if len(got.Spec.Ingress) != 0 {
					t.Errorf("%s admits %+v; want no one", np.Name, got.Spec.Ingress)
				}
			}

			writesOf := func(id string) map[string]int {
				proxy.Reset()
				expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": id}), 200, "create "+id)
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
				t.Logf("create %s: synchronous writes %v; Kubernetes Event writes counted separately so far: %d", id, writes, events)
				return writes
			}
			// The principal's first create: its ingress policy and the
			// legacy one, then the slot and the Pod it owns (no bind:
			// issue 49).
			if diff := cmp.Diff(map[string]int{"POST networkpolicies": 2, "POST services": 1, "POST pods": 1}, writesOf("iso1")); diff != "" {
				t.Errorf("synchronous writes of the first create (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[string]int{"POST services": 1, "POST pods": 1}, writesOf("iso2")); diff != "" {
				t.Errorf("synchronous writes of a later create (-want +got):\n%s", diff)
			}
			l, err := client().NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
			if err != nil || len(l.Items) != len(shipped)+2 {
				t.Fatalf("NetworkPolicies after two creates: %d (%v), want the %d shipped and DeerFlow's key's two", len(l.Items), err, len(shipped))
			}
			for _, np := range l.Items {
				if _, ok := byName[np.Name]; ok {
					continue
				}
				if len(np.Spec.Ingress) != 1 {
					t.Errorf("%s admits %+v, want one rule", np.Name, np.Spec.Ingress)
					continue
				}
				if diff := cmp.Diff(tc.sources, np.Spec.Ingress[0].From); diff != "" {
					t.Errorf("whom %s admits (-want +got):\n%s", np.Name, diff)
				}
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
	applyShippedPolicies(t, ns)
	// Within SANDBOX_NETWORK_POLICY_CHECK_TTL of the refusal.
	eventually(t, 5*time.Second, "a create once the policy exists", func() (bool, error) {
		r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "open1"})
		return r.Code == 200, fmt.Errorf("%d %s", r.Code, r.Raw)
	})
}

// TestIsolationPolicyRechecked: the shared policy is not checked once and
// trusted for ever. Deleted, creates get 503 naming it within seconds (the
// default SANDBOX_NETWORK_POLICY_CHECK_TTL, 2 s); restored, they work again;
// altered (its internet egress rule dropped), 503 again. No restart between.
func TestIsolationPolicyRechecked(t *testing.T) {
	ns := namespace(t)
	ctx := context.Background()
	nps := client().NetworkingV1().NetworkPolicies(ns)
	applyShippedPolicies(t, ns)
	shipped := shippedNetworkPolicy(t, ns)
	f := start(t, ns, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "false"})
	n, admitted := 0, 0
	createOnce := func() function.Response {
		n++
		r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": fmt.Sprintf("recheck%d", n)})
		if r.Code == 200 {
			admitted++
		}
		return r
	}
	expectCode(t, createOnce(), 200, "create with the policy in force")

	// until creates until one answers as want says, and reports how long
	// that took after the change.
	until := func(what string, changed time.Time, want func(function.Response) bool) {
		t.Helper()
		var last function.Response
		eventually(t, 6*time.Second, what, func() (bool, error) {
			last = createOnce()
			return want(last), fmt.Errorf("%d %s", last.Code, last.Raw)
		})
		t.Logf("%s after %s: %d %s", what, time.Since(changed).Round(10*time.Millisecond), last.Code, last.Detail())
		if d := time.Since(changed); d > 4*time.Second {
			t.Errorf("%s took %s, want within a few seconds (TTL 2 s)", what, d)
		}
	}
	refused := func(detail string) func(function.Response) bool {
		return func(r function.Response) bool {
			return r.Code == 503 && strings.Contains(r.Detail(), "NetworkPolicy "+ns+"/deer-flow-sandbox-isolation") && strings.Contains(r.Detail(), detail)
		}
	}
	ok := func(r function.Response) bool { return r.Code == 200 }

	if err := nps.Delete(ctx, shipped.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	until("creates refused once the policy is deleted", time.Now(), refused("does not exist"))
	if _, err := nps.Create(ctx, shippedNetworkPolicy(t, ns), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until("creates admitted once it is restored", time.Now(), ok)

	got, err := nps.Get(ctx, shipped.Name+"-egress-open", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got.Spec.Egress = got.Spec.Egress[:1] // open sandboxes' DNS only: the internet rule dropped
	if _, err := nps.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	until("creates refused once the policy is altered", time.Now(), refused("egress rules"))
	// Creates admitted within the TTL of a change made their sandboxes;
	// the refused ones left nothing.
	if p := pods(t, ns, "app=deer-flow-sandbox"); len(p) != admitted {
		t.Errorf("%d sandbox Pods after %d creates of which %d were admitted: refused creates made Pods", len(p), n, admitted)
	}
}
