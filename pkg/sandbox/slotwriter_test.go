package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
)

// TestASlotHasOneWriter: a create that finds the slot of a racing create of
// the same sandbox (made a moment ago, owning nothing yet) writes nothing
// under it. It waits until that create binds the slot (and answers with
// its sandbox), gives it up (and makes the id anew), or the deadline nears
// (a conflict to retry, nothing written). A destroy of the id waits the
// same way and deletes nothing while the slot is pending; a slot left by a
// create that ended long ago is no one's and goes. (When both creates
// wrote, each could remove the slot while the other's Pod stood: a Pod the
// quota did not count, which TestQuotaHoldsUnderFaults caught on a real
// API server.) The fake clientset stands in for the API server.
func TestASlotHasOneWriter(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	const id = "oneslot1"
	alice := api.Caller{Principal: "alice"}
	type outcome struct {
		Err        api.Kind // the operation's error kind, 0 for none
		PodCreates int      // Pod creates the operation sent
		Pod        string   // "racer's", "new" or "none": the Pod of the id after it
		SlotKept   bool     // the racer's slot still stands, owned by no workload (its Pod may own it)
	}
	tests := []struct {
		name     string
		destroy  bool
		age      time.Duration // the slot's age when the operation starts
		racer    func(t *testing.T, client *fake.Clientset, slot *corev1.Service) (podCreates int32)
		deadline time.Duration
		want     outcome
	}{
		{name: "its create writes the Pod that owns it: the waiting create answers with that sandbox", deadline: 5 * time.Second,
			racer: ownRacer, want: outcome{Pod: "racer's", SlotKept: true}},
		{name: "its create binds it (a ReplicaSet's way, or the previous version's): the waiting create answers with that sandbox", deadline: 5 * time.Second,
			racer: bindRacer, want: outcome{Pod: "racer's"}},
		{name: "its create gives it up: the waiting create makes the id anew", deadline: 5 * time.Second,
			racer: dropRacer, want: outcome{PodCreates: 1, Pod: "new"}},
		{name: "its create never answers: a conflict, nothing written", deadline: 1500 * time.Millisecond,
			want: outcome{Err: api.KindConflict, Pod: "none", SlotKept: true}},
		{name: "its create's replica was killed: the waiting create takes the id over once the slot is past its window", age: 5 * time.Second, deadline: 5 * time.Second,
			want: outcome{PodCreates: 1, Pod: "new"}},
		{name: "a destroy while its create never answers: a conflict, nothing deleted", destroy: true, deadline: 1500 * time.Millisecond,
			want: outcome{Err: api.KindConflict, Pod: "none", SlotKept: true}},
		{name: "a destroy while its create writes the Pod that owns it: both go", destroy: true, deadline: 5 * time.Second,
			racer: ownRacer, want: outcome{Pod: "none"}},
		{name: "a destroy while its create binds it: both go", destroy: true, deadline: 5 * time.Second,
			racer: bindRacer, want: outcome{Pod: "none"}},
		{name: "a destroy while its create gives it up: nothing to delete", destroy: true, deadline: 5 * time.Second,
			racer: dropRacer, want: outcome{Pod: "none"}},
		{name: "a destroy of a slot left long ago: it goes", destroy: true, age: time.Hour, deadline: 5 * time.Second,
			want: outcome{Pod: "none"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			apiServerWrites(t, client)
			var podCreates atomic.Int32
			client.PrependReactor("create", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				podCreates.Add(1)
				return false, nil, nil
			})
			m := NewManager(cfg, client)
			bg := context.Background()

			// The racer's slot, as its create wrote it.
			rs := ownerSpec(id)
			rs.Caller, rs.Token = alice, token.New()
			slot := resources.Slot(cfg.Objects(), rs, "Pod")
			slot.CreationTimestamp = metav1.NewTime(time.Now().Add(-tc.age))
			slot, err := client.CoreV1().Services("deer-flow").Create(bg, slot, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var racerCreates atomic.Int32
			racerDone := make(chan struct{})
			go func() {
				defer close(racerDone)
				if tc.racer != nil {
					time.Sleep(300 * time.Millisecond)
					racerCreates.Store(tc.racer(t, client, slot))
				}
			}()

			ctx, cancel := context.WithTimeout(api.WithCaller(bg, alice), tc.deadline)
			defer cancel()
			if tc.destroy {
				err = m.Destroy(ctx, id)
			} else {
				_, err = m.Create(ctx, ownerSpec(id), 0)
			}
			<-racerDone
			got := outcome{Err: domainKind(t, err)}
			got.PodCreates = int(podCreates.Load() - racerCreates.Load())
			got.Pod = "none"
			if pod, err := client.CoreV1().Pods("deer-flow").Get(bg, resources.PodName(id), metav1.GetOptions{}); err == nil {
				got.Pod = "new"
				if pod.Labels[keys.LabelToken] == rs.Token {
					got.Pod = "racer's"
				}
			}
			if svc, err := client.CoreV1().Services("deer-flow").Get(bg, slot.Name, metav1.GetOptions{}); err == nil {
				got.SlotKept = svc.UID == slot.UID && resources.SandboxOwner(svc.OwnerReferences) == nil
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("after the %s (-want +got):\n%s", map[bool]string{true: "destroy", false: "create"}[tc.destroy], diff)
			}
		})
	}
}

// bindRacer is the racing create going on: its Pod, then its slot bound
// to it.
func bindRacer(t *testing.T, client *fake.Clientset, slot *corev1.Service) int32 {
	bg := context.Background()
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	s := ownerSpec(slot.Labels[keys.LabelID])
	s.Caller, s.Token = api.Caller{Principal: "alice"}, resources.SelectedToken(slot)
	pod, err := client.CoreV1().Pods("deer-flow").Create(bg, resources.BuildPodFor(cfg.Objects(), s), metav1.CreateOptions{})
	if err != nil {
		t.Error(err)
		return 1
	}
	// A destroy that saw the Pod may have removed the slot first: the
	// create's bind then finds it gone (and starts over), as it would.
	if _, err := client.CoreV1().Services("deer-flow").Update(bg, resources.Bind(slot, resources.PodOwnerRef(pod), s.Token, s), metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
	}
	return 1
}

// ownRacer is the racing create going on: its Pod, owned by its slot from
// its create, as a cold Pod create writes it (no bind follows).
func ownRacer(t *testing.T, client *fake.Clientset, slot *corev1.Service) int32 {
	cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
	s := ownerSpec(slot.Labels[keys.LabelID])
	s.Caller, s.Token = api.Caller{Principal: "alice"}, resources.SelectedToken(slot)
	pod := resources.BuildPodFor(cfg.Objects(), s)
	pod.OwnerReferences = []metav1.OwnerReference{resources.ServiceOwnerRef(slot)}
	if _, err := client.CoreV1().Pods("deer-flow").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		t.Error(err)
	}
	return 1
}

// dropRacer is the racing create refused: it removes its slot.
func dropRacer(t *testing.T, client *fake.Clientset, slot *corev1.Service) int32 {
	if err := client.CoreV1().Services("deer-flow").Delete(context.Background(), slot.Name, metav1.DeleteOptions{}); err != nil {
		t.Error(err)
	}
	return 0
}

// domainKind is the kind of err, a domain error (api.Error), or 0 for
// none; any other error ends the test.
func domainKind(t *testing.T, err error) api.Kind {
	t.Helper()
	var de *api.Error
	switch {
	case errors.As(err, &de):
		return de.Kind
	case err != nil:
		t.Fatalf("not a domain error: %v", err)
	}
	return 0
}
