package isolation

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestRequireIngressWritesWhatIsMissing: a principal's first create writes
// its ingress policy; one deleted or widened by hand is restored by the next
// create after the TTL; a policy the function may not write refuses the
// create (fail closed, the sandbox would answer no one) and says what to
// apply, while a transient failure is not remembered. The fake clientset
// stands in for the API server.
func TestRequireIngressWritesWhatIsMissing(t *testing.T) {
	cfg := testConfig(t, map[string]string{"PROVISIONER_API_KEYS": "alice=abcdef0123456789abcd,bob=bcdef0123456789abcde",
		"PROVISIONER_PRINCIPAL_INGRESS": "alice=pods:tenant=alice"})
	build := func(p string) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{resources.BuildIngressPolicy(cfg.Objects(), p, cfg.IngressSources(p, true))}
	}
	want := build("alice")[0]
	widened := want.DeepCopy()
	widened.Spec.Ingress[0].From = nil // from everywhere
	relabelled := want.DeepCopy()
	relabelled.Labels["app.kubernetes.io/managed-by"] = "someone"
	tests := []struct {
		name    string
		objects []runtime.Object
		fail    error    // what the API server answers a write
		writes  []string // the verbs written
		refused string   // in the refusal's detail; "" admits
	}{
		{"missing: created", nil, nil, []string{"create"}, ""},
		{"in force: nothing written", []runtime.Object{want.DeepCopy()}, nil, nil, ""},
		{"widened by hand: restored", []runtime.Object{widened}, nil, []string{"update"}, ""},
		{"relabelled by hand: restored", []runtime.Object{relabelled}, nil, []string{"update"}, ""},
		{"the Role forbids the write", nil, apierrors.NewForbidden(schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}, want.Name, nil),
			[]string{"create"}, "config/201-role.yaml"},
		{"the admission policy refuses the write", []runtime.Object{widened}, apierrors.NewInvalid(schema.GroupKind{Group: "networking.k8s.io", Kind: "NetworkPolicy"}, want.Name, nil),
			[]string{"update"}, "config/801-admission-policy-networkpolicies.yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(append(tc.objects, sharedPolicies(cfg)...)...)
			var writes []string
			client.PrependReactor("*", "networkpolicies", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if a.GetVerb() == "get" {
					return false, nil, nil
				}
				writes = append(writes, a.GetVerb())
				return tc.fail != nil, nil, tc.fail
			})
			c := New(&cfg.IsolationConfig, &cfg.PodSecurityConfig, cfg.Namespace, 10*time.Second, resources.SharedPolicies(cfg.Objects()), client, WithIngress(build))
			_, err := c.Require(context.Background(), "alice", egress.Open)
			if diff := cmp.Diff(tc.writes, writes); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("Require: %v, want admitted", err)
			case tc.refused != "" && (api.KindOf(err) != api.KindUnavailable || !strings.Contains(api.DetailOf(err), tc.refused)):
				t.Fatalf("Require: %v (kind %v), want unavailable naming %q", err, api.KindOf(err), tc.refused)
			case tc.refused != "":
				return
			}
			live, err := client.NetworkingV1().NetworkPolicies(cfg.Namespace).Get(context.Background(), want.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want.Spec, live.Spec); diff != "" {
				t.Errorf("the live policy (-want +got):\n%s", diff)
			}
			// Within the TTL the verdict stands: nothing more is read.
			writes, reads := nil, len(client.Actions())
			if _, err := c.Require(context.Background(), "alice", egress.Open); err != nil || len(client.Actions()) != reads {
				t.Errorf("a second Require within the TTL: %v, %d more calls; want admitted with none", err, len(client.Actions())-reads)
			}
			// Another principal's policy is its own object and verdict.
			if _, err := c.Require(context.Background(), "bob", egress.Open); err != nil {
				t.Fatal(err)
			}
			bob, err := client.NetworkingV1().NetworkPolicies(cfg.Namespace).Get(context.Background(), build("bob")[0].Name, metav1.GetOptions{})
			if err != nil || bob.Spec.Ingress != nil {
				t.Errorf("bob's policy: %v %+v; want one that admits no one (he has no sources)", err, bob)
			}
		})
	}
}

// TestRequireIngressMeetsARacingReplica: two replicas' first creates of a
// principal both find its policy missing; the one whose create loses
// (AlreadyExists) reads the winner's, finds it the same, and admits the
// create instead of refusing it. The fake clientset stands in for the API
// server; the reactor plays the other replica's create landing first.
func TestRequireIngressMeetsARacingReplica(t *testing.T) {
	cfg := testConfig(t, nil)
	build := func(p string) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{resources.BuildIngressPolicy(cfg.Objects(), p, cfg.IngressSources(p, false))}
	}
	client := fake.NewClientset(sharedPolicies(cfg)...)
	raced := false
	client.PrependReactor("create", "networkpolicies", func(a k8stesting.Action) (bool, runtime.Object, error) {
		np := a.(k8stesting.CreateAction).GetObject().(*networkingv1.NetworkPolicy)
		if raced {
			return false, nil, nil
		}
		raced = true
		if err := client.Tracker().Add(np.DeepCopy()); err != nil { // the other replica's, first
			return true, nil, err
		}
		return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Group: "networking.k8s.io", Resource: "networkpolicies"}, np.Name)
	})
	c := New(&cfg.IsolationConfig, &cfg.PodSecurityConfig, cfg.Namespace, 10*time.Second, resources.SharedPolicies(cfg.Objects()), client, WithIngress(build))
	if _, err := c.Require(context.Background(), "default", egress.Open); err != nil || !raced {
		t.Fatalf("Require after losing the create to another replica: %v (raced %v), want admitted", err, raced)
	}
}

// TestRequireIngressForgetsTransientFailures: a failure to reach the API
// server is answered (unavailable) but not remembered, so the next create
// tries again at once.
func TestRequireIngressForgetsTransientFailures(t *testing.T) {
	cfg := testConfig(t, nil)
	build := func(p string) []*networkingv1.NetworkPolicy {
		return []*networkingv1.NetworkPolicy{resources.BuildIngressPolicy(cfg.Objects(), p, cfg.IngressSources(p, false))}
	}
	client := fake.NewClientset(sharedPolicies(cfg)...)
	down := true
	client.PrependReactor("create", "networkpolicies", func(k8stesting.Action) (bool, runtime.Object, error) {
		if down {
			return true, nil, apierrors.NewServiceUnavailable("etcd is down")
		}
		return false, nil, nil
	})
	c := New(&cfg.IsolationConfig, &cfg.PodSecurityConfig, cfg.Namespace, 10*time.Second, resources.SharedPolicies(cfg.Objects()), client, WithIngress(build))
	if _, err := c.Require(context.Background(), "default", egress.Open); api.KindOf(err) != api.KindUnavailable {
		t.Fatalf("Require while the API server fails: %v, want unavailable", err)
	}
	down = false
	if _, err := c.Require(context.Background(), "default", egress.Open); err != nil {
		t.Fatalf("Require once it is back: %v, want admitted at once", err)
	}
}
