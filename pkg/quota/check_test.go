package quota

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestCheck counts through the list path (a counter that was never run has
// no cache): each limit refuses with its own scope, a look for room counts
// the create to come, and a sandbox of the same id that someone else made
// meanwhile means room.
func TestCheck(t *testing.T) {
	// sandboxes: alice has two (one of them by principal p1), bob one.
	var objs []runtime.Object
	for i, who := range []struct{ user, principal string }{{"alice", "p1"}, {"alice", "p2"}, {"bob", "p2"}} {
		s := api.Spec{ID: fmt.Sprintf("s%d", i), UserID: who.user, ThreadID: "t", Caller: api.Caller{Principal: who.principal}}
		svc := resources.BuildService(testConfig(t, nil).Objects(), s, resources.PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: resources.PodName(s.ID), UID: types.UID("pod-" + s.ID)}}))
		resources.RecordPrincipal(svc, s)
		objs = append(objs, svc)
	}
	type want struct {
		Refused bool
		Scope   string
	}
	tests := []struct {
		name  string
		quota config.QuotaConfig
		spec  api.Spec
		want  want
	}{
		{name: "no limit", spec: api.Spec{ID: "new", UserID: "carol", Caller: api.Caller{Principal: "p3"}}},
		{name: "room in total", quota: config.QuotaConfig{MaxSandboxes: 4}, spec: api.Spec{ID: "new", UserID: "carol", Caller: api.Caller{Principal: "p3"}}},
		{name: "the total is full", quota: config.QuotaConfig{MaxSandboxes: 3}, spec: api.Spec{ID: "new", UserID: "carol", Caller: api.Caller{Principal: "p3"}},
			want: want{Refused: true, Scope: "total"}},
		{name: "alice is full", quota: config.QuotaConfig{MaxSandboxesPerUser: 2}, spec: api.Spec{ID: "new", UserID: "alice", Caller: api.Caller{Principal: "p3"}},
			want: want{Refused: true, Scope: "user"}},
		{name: "bob is not", quota: config.QuotaConfig{MaxSandboxesPerUser: 2}, spec: api.Spec{ID: "new", UserID: "bob", Caller: api.Caller{Principal: "p3"}}},
		{name: "p2 is full", quota: config.QuotaConfig{MaxSandboxesPerPrincipal: 2}, spec: api.Spec{ID: "new", UserID: "carol", Caller: api.Caller{Principal: "p2"}},
			want: want{Refused: true, Scope: "principal"}},
		{name: "the id exists: room, whatever the count", quota: config.QuotaConfig{MaxSandboxes: 1}, spec: api.Spec{ID: "s0", UserID: "alice", Caller: api.Caller{Principal: "p1"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := New(tc.quota, "deer-flow", fake.NewClientset(objs...))
			err := c.Check(context.Background(), tc.spec, nil) // nil: the look for room before a create
			var qe *Error
			got := want{Refused: errors.As(err, &qe)}
			if qe != nil {
				got.Scope = qe.Scope
				if api.KindOf(err) != api.KindQuota {
					t.Errorf("refusal of kind %v, want KindQuota", api.KindOf(err))
				}
			} else if err != nil {
				t.Fatalf("Check: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Check (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCheckSkipsEndedPods: over the limit, a sandbox whose Pod has ended
// does not count, whichever of its Pod and Service owns the other (a cold
// Pod is owned by its Service since issue 49; earlier ones, and claimed
// pooled Pods, own it). A running one does.
func TestCheckSkipsEndedPods(t *testing.T) {
	cfg := testConfig(t, nil)
	for _, tc := range []struct {
		name        string
		serviceOwns bool
		phase       corev1.PodPhase
		wantRefused bool
	}{
		{name: "the Pod owns the Service, ended", phase: corev1.PodFailed},
		{name: "the Service owns the Pod, ended", serviceOwns: true, phase: corev1.PodSucceeded},
		{name: "the Service owns the Pod, running", serviceOwns: true, phase: corev1.PodRunning, wantRefused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := api.Spec{ID: "s0", UserID: "alice", ThreadID: "t", Caller: api.Caller{Principal: "p1"}}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: resources.PodName(s.ID), Namespace: "deer-flow", UID: "pod-s0",
				Labels: resources.Labels(s)}, Status: corev1.PodStatus{Phase: tc.phase}}
			svc := resources.BuildService(cfg.Objects(), s, resources.PodOwnerRef(pod))
			svc.UID = "svc-s0"
			if tc.serviceOwns {
				svc.OwnerReferences = nil
				pod.OwnerReferences = []metav1.OwnerReference{resources.ServiceOwnerRef(svc)}
			}
			c := New(config.QuotaConfig{MaxSandboxes: 1}, "deer-flow", fake.NewClientset(svc, pod))
			err := c.Check(context.Background(), api.Spec{ID: "new", UserID: "carol", Caller: api.Caller{Principal: "p3"}}, nil)
			var qe *Error
			got := errors.As(err, &qe)
			if err != nil && !got {
				t.Fatalf("Check: %v, neither room nor a quota refusal", err)
			}
			if got != tc.wantRefused {
				t.Errorf("refused: %v (%v), want %v", got, err, tc.wantRefused)
			}
		})
	}
}
