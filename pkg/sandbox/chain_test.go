package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
)

// TestColdPodIsOwnedByItsService (issue 49): a cold create writes two
// objects, its slot and then a Pod that names the slot as its owner from
// its own create; nothing binds them afterwards. Such a sandbox, found
// again, is whole, however old its Service (it is not a leftover slot):
// its create answers with it and writes nothing new, another principal's
// create of the id is refused and removes nothing, and a destroy removes
// both. A Pod whose Service is gone (the GC not there yet) makes way for a
// new sandbox. Sandboxes of the previous version, whose Service the Pod
// owns, are still found, reused and destroyed. The fake clientset stands
// in for the API server (apiServerWrites); it has no garbage collector.
func TestColdPodIsOwnedByItsService(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	const id = "chain1"
	alice, bob := api.Caller{Principal: "alice"}, api.Caller{Principal: "bob"}
	// whole writes a sandbox of alice's as a create of this version (the
	// Service owns the Pod) or of the previous one (the Pod owns the
	// Service), made an hour ago, or with a Pod whose Service is gone.
	type before string
	const (
		none     before = ""
		owning   before = "Service owns Pod"
		previous before = "Pod owns Service"
		orphaned before = "Pod of a Service gone"
	)
	whole := func(t *testing.T, client *fake.Clientset, b before) (podUID string) {
		t.Helper()
		bg := context.Background()
		s := ownerSpec(id)
		s.Caller, s.Token = alice, token.New()
		pod := resources.BuildPodFor(cfg.Objects(), s)
		switch b {
		case owning, orphaned:
			svc := resources.Slot(cfg.Objects(), s, "Pod")
			svc.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
			svc, err := client.CoreV1().Services("deer-flow").Create(bg, svc, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pod.OwnerReferences = []metav1.OwnerReference{resources.ServiceOwnerRef(svc)}
			if b == orphaned {
				if err := client.CoreV1().Services("deer-flow").Delete(bg, svc.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		}
		pod.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
		pod, err := client.CoreV1().Pods("deer-flow").Create(bg, pod, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if b == previous {
			svc := resources.BuildService(cfg.Objects(), s, resources.PodOwnerRef(pod))
			svc.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
			if _, err := client.CoreV1().Services("deer-flow").Create(bg, svc, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		return string(pod.UID)
	}
	type outcome struct {
		Err api.Kind // 0: none
		// Writes sent. Without a quota no cache says the Service exists, so
		// a create of an existing id tries the slot's create first (refused:
		// it exists, nothing written).
		Writes  []string
		Objects []string
		Chain   string // chain: which of the Service and the Pod owns the other
		SamePod bool   // the Pod left is the one written before
	}
	both := []string{"Pod " + resources.PodName(id), "Service " + resources.ServiceName(id)}
	tests := []struct {
		name    string
		before  before
		caller  api.Caller
		destroy bool
		want    outcome
	}{
		{name: "a cold create: the slot, then the Pod it owns", caller: alice,
			want: outcome{Writes: []string{"create services", "create pods"}, Objects: both, Chain: "Service owns Pod"}},
		{name: "a create of a sandbox whose Service owns its Pod, an hour old: that sandbox, nothing written but its activity", before: owning, caller: alice,
			want: outcome{Writes: []string{"create services", "patch pods"}, Objects: both, Chain: "Service owns Pod", SamePod: true}},
		{name: "another principal's create of that id: refused, nothing removed", before: owning, caller: bob,
			want: outcome{Err: api.KindConflict, Writes: []string{"create services"}, Objects: both, Chain: "Service owns Pod", SamePod: true}},
		{name: "a destroy of it: both go", before: owning, caller: alice, destroy: true,
			want: outcome{Writes: []string{"delete pods", "delete services"}}},
		{name: "a Pod whose Service is gone: it goes, the create makes the id anew", before: orphaned, caller: alice,
			want: outcome{Writes: []string{"create services", "create pods", "delete pods", "create pods"}, Objects: both, Chain: "Service owns Pod"}},
		{name: "the previous version's sandbox (its Pod owns its Service): reused as it is", before: previous, caller: alice,
			want: outcome{Writes: []string{"create services", "patch pods"}, Objects: both, Chain: "Pod owns Service", SamePod: true}},
		{name: "the previous version's sandbox: destroyed, both go", before: previous, caller: alice, destroy: true,
			want: outcome{Writes: []string{"delete pods", "delete services"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(sharedPolicies(cfg)...)
			apiServerWrites(t, client)
			m := NewManager(cfg, client)
			var podUID string
			if tc.before != none {
				podUID = whole(t, client, tc.before)
			}
			client.ClearActions()
			ctx, cancel := context.WithTimeout(api.WithCaller(context.Background(), tc.caller), 10*time.Second)
			defer cancel()
			var err error
			if tc.destroy {
				err = m.Destroy(ctx, id)
			} else {
				s := ownerSpec(id)
				if tc.caller != alice {
					s.UserID = "bobs-user"
				}
				_, err = m.Create(ctx, s, 0)
			}
			got := outcome{Err: domainKind(t, err), Writes: writesOf(client.Actions()), Objects: objectsLeft(t, client)}
			pod, perr := client.CoreV1().Pods("deer-flow").Get(ctx, resources.PodName(id), metav1.GetOptions{})
			svc, serr := client.CoreV1().Services("deer-flow").Get(ctx, resources.ServiceName(id), metav1.GetOptions{})
			if perr == nil && serr == nil {
				got.Chain = chain(svc, pod)
				got.SamePod = string(pod.UID) == podUID
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nerror: %v", diff, err)
			}
		})
	}
}

// The Service a fresh create answers with is its slot as created: it
// selects the Pod's token and pin and records the caller, as the bind did.
func TestColdCreateAnswersWithItsSlot(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	client := fake.NewClientset(sharedPolicies(cfg)...)
	apiServerWrites(t, client)
	m := NewManager(cfg, client)
	ctx := api.WithCaller(context.Background(), api.Caller{Principal: "alice"})
	if _, err := m.Create(ctx, ownerSpec("chain2"), 0); err != nil {
		t.Fatal(err)
	}
	pod, err := client.CoreV1().Pods("deer-flow").Get(ctx, resources.PodName("chain2"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := client.CoreV1().Services("deer-flow").Get(ctx, resources.ServiceName("chain2"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := resources.ServiceSelector("chain2", resources.Token(pod))
	want[keys.LabelPod] = pod.Name
	if diff := cmp.Diff(want, svc.Spec.Selector); diff != "" {
		t.Errorf("the Service's selector (-want +got):\n%s", diff)
	}
	if api.PrincipalOf(svc) != "alice" || len(svc.OwnerReferences) != 0 || !resources.Names(svc, pod) {
		t.Errorf("the Service: principal %q, owners %v, names the Pod %v; want alice's, none, true", api.PrincipalOf(svc), svc.OwnerReferences, resources.Names(svc, pod))
	}
	if got := pod.OwnerReferences; len(got) != 1 || got[0].UID != svc.UID || got[0].Kind != "Service" || *got[0].BlockOwnerDeletion {
		t.Errorf("the Pod's owners: %+v; want its Service alone, by UID, not blocking its deletion", got)
	}
}
