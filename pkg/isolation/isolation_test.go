package isolation

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	networkingclient "k8s.io/client-go/kubernetes/typed/networking/v1"
	nodeclient "k8s.io/client-go/kubernetes/typed/node/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestSpecDiffIsSemantic: the same policy written in another order, or with
// the protocol left to the API server's default, is the same policy; a
// dropped rule, a widened range or a lost policy type is not.
func TestSpecDiffIsSemantic(t *testing.T) {
	want := resources.BuildEgressPolicies(testConfig(t, nil).Objects())[0].Spec // open: the one with rules
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
		{"protocol left to the default", func(s *networkingv1.NetworkPolicySpec) { s.Egress[1].Ports[0].Protocol = nil }, nil},
		{"egress rule dropped", func(s *networkingv1.NetworkPolicySpec) { s.Egress = s.Egress[:1] }, []string{"egress rules"}},
		{"a private range let through", func(s *networkingv1.NetworkPolicySpec) {
			s.Egress[1].To[0].IPBlock.Except = s.Egress[1].To[0].IPBlock.Except[1:]
		}, []string{"egress rules"}},
		{"ingress from everywhere", func(s *networkingv1.NetworkPolicySpec) { s.Ingress = []networkingv1.NetworkPolicyIngressRule{{}} }, []string{"ingress rules"}},
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

// TestStaleChecksRunSideBySide: a create that finds both verdicts stale
// reads the policy and the RuntimeClass at once, so it waits for one round
// trip, not two; of two refusals it answers the policy's. Each read waits
// until the other has begun: checks made one after the other would leave
// the first waiting until its bound, and the test says so. The fake
// clientset stands in for the API server; its reactors run one at a time,
// so the reads meet in meetingClient, before the fake.
func TestStaleChecksRunSideBySide(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_RUNTIME_CLASS": "gvisor", "SANDBOX_USER_NAMESPACE": "false", "SANDBOX_NETWORK_POLICY_CHECK_TTL": "0s"})
	tests := []struct {
		name    string
		objects []runtime.Object
		want    string // in the refusal's detail; "" admits
	}{
		{"both in force", append(sharedPolicies(cfg), &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: GVisorHandler}), ""},
		{"the class missing", sharedPolicies(cfg), "SANDBOX_RUNTIME_CLASS"},
		{"both missing: the policy's refusal", nil, "NetworkPolicy"},
	}
	// Both entry points: a create's Require, and Ensure at start-up (a
	// cold replica waits for it before it serves).
	entries := map[string]func(*Checker) error{
		"Require": func(c *Checker) error { _, err := c.Require(context.Background(), "default", egress.Open); return err },
		"Ensure":  func(c *Checker) error { return c.Ensure(context.Background()) },
	}
	for _, tt := range tests {
		for entry, check := range entries {
			t.Run(entry+"/"+tt.name, func(t *testing.T) {
				began := map[string]chan struct{}{"networkpolicies": make(chan struct{}), "runtimeclasses": make(chan struct{})}
				var (
					mu    sync.Mutex
					alone []string
				)
				// Several policies are read: the first read of a kind opens its gate.
				opened := map[string]*sync.Once{"networkpolicies": {}, "runtimeclasses": {}}
				meet := func(resource, other string) {
					opened[resource].Do(func() { close(began[resource]) })
					select {
					case <-began[other]:
					case <-time.After(5 * time.Second):
						mu.Lock()
						alone = append(alone, resource)
						mu.Unlock()
					}
				}
				client := meetingClient{fake.NewClientset(tt.objects...), meet}
				c := New(&cfg.IsolationConfig, &cfg.PodSecurityConfig, cfg.Namespace, 10*time.Second, resources.SharedPolicies(cfg.Objects()), client)
				err := check(c)
				if len(alone) > 0 {
					t.Errorf("%v read with no other read under way: the checks ran one after the other", alone)
				}
				switch {
				case tt.want == "" && err != nil:
					t.Errorf("Require: %v, want admitted", err)
				case tt.want != "" && (api.KindOf(err) != api.KindUnavailable || !strings.Contains(api.DetailOf(err), tt.want)):
					t.Errorf("Require: %v (kind %v), want unavailable naming %q", err, api.KindOf(err), tt.want)
				}
			})
		}
	}
}

// meetingClient calls meet(this resource, the other) before each Get of a
// NetworkPolicy or a RuntimeClass.
type meetingClient struct {
	kubernetes.Interface
	meet func(resource, other string)
}

func (c meetingClient) NetworkingV1() networkingclient.NetworkingV1Interface {
	return meetingNetworking{c.Interface.NetworkingV1(), c.meet}
}

func (c meetingClient) NodeV1() nodeclient.NodeV1Interface {
	return meetingNode{c.Interface.NodeV1(), c.meet}
}

type meetingNetworking struct {
	networkingclient.NetworkingV1Interface
	meet func(resource, other string)
}

func (n meetingNetworking) NetworkPolicies(ns string) networkingclient.NetworkPolicyInterface {
	return meetingPolicies{n.NetworkingV1Interface.NetworkPolicies(ns), n.meet}
}

type meetingPolicies struct {
	networkingclient.NetworkPolicyInterface
	meet func(resource, other string)
}

func (p meetingPolicies) Get(ctx context.Context, name string, o metav1.GetOptions) (*networkingv1.NetworkPolicy, error) {
	p.meet("networkpolicies", "runtimeclasses")
	return p.NetworkPolicyInterface.Get(ctx, name, o)
}

type meetingNode struct {
	nodeclient.NodeV1Interface
	meet func(resource, other string)
}

func (n meetingNode) RuntimeClasses() nodeclient.RuntimeClassInterface {
	return meetingClasses{n.NodeV1Interface.RuntimeClasses(), n.meet}
}

type meetingClasses struct {
	nodeclient.RuntimeClassInterface
	meet func(resource, other string)
}

func (r meetingClasses) Get(ctx context.Context, name string, o metav1.GetOptions) (*nodev1.RuntimeClass, error) {
	r.meet("runtimeclasses", "networkpolicies")
	return r.RuntimeClassInterface.Get(ctx, name, o)
}

// TestEnsureBringsSharedPoliciesInLine: a local cluster's function
// (SANDBOX_NETWORK_POLICY_ENSURE, as make run sets it) that finds the shared
// policies made by a run with another egress mode updates them in place and
// admits creates; any other function refuses and leaves them as they are.
// The fake clientset stands in for the API server.
func TestEnsureBringsSharedPoliciesInLine(t *testing.T) {
	earlier := sharedPolicies(testConfig(t, map[string]string{"SANDBOX_EGRESS_MODE": "isolated"}))
	tests := []struct {
		name   string
		ensure string
		admit  bool
	}{
		{"make run's function", "true", true},
		{"an operator's function", "false", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": tc.ensure, "SANDBOX_EGRESS_MODE": "open"})
			client := fake.NewClientset(earlier...)
			want := resources.SharedPolicies(cfg.Objects())
			c := New(&cfg.IsolationConfig, &cfg.PodSecurityConfig, cfg.Namespace, 10*time.Second, want, client)
			_, err := c.Require(context.Background(), "default", egress.Open)
			if tc.admit && err != nil {
				t.Fatalf("Require: %v, want admitted", err)
			}
			if !tc.admit && (api.KindOf(err) != api.KindUnavailable || !strings.Contains(api.DetailOf(err), "not what this function's settings make of it")) {
				t.Fatalf("Require: %v, want unavailable naming the policy that differs", err)
			}
			changed := 0
			for i, np := range want {
				live, err := client.NetworkingV1().NetworkPolicies(cfg.Namespace).Get(context.Background(), np.Name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				before := earlier[i].(*networkingv1.NetworkPolicy)
				if len(specDiff(before.Spec, np.Spec)) > 0 {
					changed++
				}
				wantSpec := before.Spec
				if tc.admit {
					wantSpec = np.Spec
				}
				if parts := specDiff(wantSpec, live.Spec); len(parts) > 0 {
					t.Errorf("%s: its %v differ from what the function should have left", np.Name, parts)
				}
			}
			if changed == 0 {
				t.Fatal("the two egress modes make the same shared policies: the test compares nothing")
			}
		})
	}
}
