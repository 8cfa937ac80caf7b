package resources

import (
	"maps"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

const slotToken = "0123456789abcdef0123456789abcdef"

// TestSlot pins the Service a cold create writes before its workload:
// owned by nothing, selecting the token the workload will carry, labelled
// with the kind it is for (a ReplicaSet's), recording the principal.
func TestSlot(t *testing.T) {
	s := testSpec()
	s.Token = slotToken
	s.Caller = api.Caller{Principal: "alice"}
	want := func(extra, pin map[string]string) *corev1.Service {
		l := wantLabels()
		maps.Copy(l, map[string]string{"sandbox.deerflow.dev/token": slotToken, "sandbox.deerflow.dev/principal": PrincipalLabelValue("alice")})
		maps.Copy(l, extra)
		sel := map[string]string{"sandbox-id": "0123456789abcdef", "sandbox.deerflow.dev/token": slotToken}
		maps.Copy(sel, pin)
		return &corev1.Service{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
			ObjectMeta: metav1.ObjectMeta{Name: "sandbox-0123456789abcdef-svc", Namespace: "deer-flow", Labels: l,
				Annotations: map[string]string{"sandbox.deerflow.dev/principal": "alice"}},
			Spec: corev1.ServiceSpec{
				Type:     corev1.ServiceTypeNodePort,
				Selector: sel,
				Ports:    []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
			},
		}
	}
	cfg := testConfig(t, nil)
	got := map[string]*corev1.Service{"Pod": Slot(cfg.Objects(), s, "Pod"), "ReplicaSet": Slot(cfg.Objects(), s, "ReplicaSet")}
	// Each selects its pin too: the one Pod sandbox-<id>, or the Pods of
	// the one ReplicaSet sandbox-<id> (issue 45).
	rsPin := map[string]string{"sandbox.deerflow.dev/workload": "replicaset"}
	wants := map[string]*corev1.Service{"Pod": want(nil, map[string]string{"sandbox.deerflow.dev/pod": "sandbox-0123456789abcdef"}), "ReplicaSet": want(rsPin, rsPin)}
	if diff := cmp.Diff(wants, got); diff != "" {
		t.Errorf("Slot (-want +got):\n%s", diff)
	}
	if SelectedToken(got["Pod"]) != slotToken {
		t.Errorf("SelectedToken = %q", SelectedToken(got["Pod"]))
	}
}

// TestBind pins what binding changes of a Service: its sandbox owner (other
// owners stay), its selector (the workload's token), its principal; the
// rest, node port included, stays.
func TestBind(t *testing.T) {
	s := testSpec()
	s.Caller = api.Caller{Principal: "alice"}
	other := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "x", UID: "cm"}
	stale := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "old", UID: "old"}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-0123456789abcdef-svc", OwnerReferences: []metav1.OwnerReference{stale, other}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"sandbox-id": "0123456789abcdef"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 8080, NodePort: 31234}}},
	}
	pod := PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-0123456789abcdef", UID: "new"}})
	got := Bind(svc, pod, slotToken, s)
	want := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-0123456789abcdef-svc",
			OwnerReferences: []metav1.OwnerReference{pod, other},
			Labels:          map[string]string{"sandbox.deerflow.dev/principal": PrincipalLabelValue("alice")},
			Annotations:     map[string]string{"sandbox.deerflow.dev/principal": "alice"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"sandbox-id": "0123456789abcdef", "sandbox.deerflow.dev/token": slotToken},
			Ports: []corev1.ServicePort{{Name: "http", Port: 8080, NodePort: 31234}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Bind (-want +got):\n%s", diff)
	}
	if len(svc.OwnerReferences) != 2 || svc.OwnerReferences[0].UID != "old" {
		t.Errorf("Bind changed its argument: %v", svc.OwnerReferences)
	}
	rs := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "sandbox-0123456789abcdef", UID: "rs", BlockOwnerDeletion: ptr.To(false)}
	rsBound := Bind(svc, rs, slotToken, s)
	if l := rsBound.Labels["sandbox.deerflow.dev/workload"]; l != "replicaset" {
		t.Errorf("a ReplicaSet's bound Service is labelled workload=%q, want replicaset", l)
	}
	// A Service labelled for a ReplicaSet, bound to a Pod, says Pod.
	if l, ok := Bind(rsBound, pod, slotToken, s).Labels["sandbox.deerflow.dev/workload"]; ok {
		t.Errorf("a Pod's bound Service is labelled workload=%q, want no such label", l)
	}
}

// TestPending: a Service holds its id for a workload still to come while
// it is a cold create's slot, or owned by a pooled Pod not yet claimed.
func TestPending(t *testing.T) {
	slot := &corev1.Service{Spec: corev1.ServiceSpec{Selector: ServiceSelector("a", slotToken)}}
	deerflows := &corev1.Service{Spec: corev1.ServiceSpec{Selector: ServiceSelector("a", "")}}
	owned := func(name string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name}}},
			Spec: corev1.ServiceSpec{Selector: ServiceSelector("a", slotToken)}}
	}
	got := map[string]bool{
		"slot":                      Pending(slot, "a"),
		"DeerFlow's, no owner":      Pending(deerflows, "a"),
		"owned by its Pod":          Pending(owned(PodName("a")), "a"),
		"owned by a pooled Pod":     Pending(owned("sandbox-pool-x-abcde"), "a"),
		"claimed owner of a pooled": ClaimedOwner(owned("sandbox-pool-x-abcde"), "a"),
		"claimed owner of its own":  ClaimedOwner(owned(PodName("a")), "a"),
	}
	want := map[string]bool{"slot": true, "DeerFlow's, no owner": false, "owned by its Pod": false, "owned by a pooled Pod": true,
		"claimed owner of a pooled": true, "claimed owner of its own": false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestBindKeepsThePin (issue 45): binding keeps the pin a slot was made
// with, so the Service still selects only its own workload; a Service made
// without one (DeerFlow's, or from before pins) gains none, since its
// workload may not carry it.
func TestBindKeepsThePin(t *testing.T) {
	s := testSpec()
	s.Token = slotToken
	ref := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: PodName(s.ID), UID: "u"}
	rsRef := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: PodName(s.ID), UID: "r"}
	cfg := testConfig(t, nil)
	base := map[string]string{"sandbox-id": s.ID, "sandbox.deerflow.dev/token": slotToken}
	with := func(k, v string) map[string]string {
		m := maps.Clone(base)
		m[k] = v
		return m
	}
	for _, tc := range []struct {
		name string
		svc  *corev1.Service
		ref  metav1.OwnerReference
		want map[string]string
	}{
		{"a Pod's slot", Slot(cfg.Objects(), s, "Pod"), ref, with("sandbox.deerflow.dev/pod", PodName(s.ID))},
		{"a ReplicaSet's slot", Slot(cfg.Objects(), s, "ReplicaSet"), rsRef, with("sandbox.deerflow.dev/workload", "replicaset")},
		{"a Service from before pins", &corev1.Service{Spec: corev1.ServiceSpec{Selector: maps.Clone(base)}}, ref, base},
		{"DeerFlow's Service", &corev1.Service{Spec: corev1.ServiceSpec{Selector: map[string]string{"sandbox-id": s.ID}}}, ref, base},
	} {
		if diff := cmp.Diff(tc.want, Bind(tc.svc, tc.ref, slotToken, s).Spec.Selector); diff != "" {
			t.Errorf("%s: Bind's selector (-want +got):\n%s", tc.name, diff)
		}
	}
}

// TestServicePin (issue 45): every Service the function makes selects a pin
// that no Pod but its workload's may carry: sandbox-<id>'s name, a
// ReplicaSet's mark, or the name of the warm pool's Pod it is claimed
// from (the claim writes that name on the Pod). A Pod of any other name
// has none to select.
func TestServicePin(t *testing.T) {
	s := testSpec()
	s.Token = slotToken
	pooled := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "sandbox-pool-warm-abcde", UID: "p"}
	for _, tc := range []struct {
		name  string
		owner metav1.OwnerReference
		want  map[string]string
	}{
		{"its bare Pod", metav1.OwnerReference{Kind: "Pod", Name: PodName(s.ID)}, map[string]string{"sandbox.deerflow.dev/pod": PodName(s.ID)}},
		{"a Pod's slot", metav1.OwnerReference{Kind: "Pod"}, map[string]string{"sandbox.deerflow.dev/pod": PodName(s.ID)}},
		{"its ReplicaSet", metav1.OwnerReference{Kind: "ReplicaSet", Name: PodName(s.ID)}, map[string]string{"sandbox.deerflow.dev/workload": "replicaset"}},
		{"a warm pool's Pod claimed", pooled, map[string]string{"sandbox.deerflow.dev/pod": "sandbox-pool-warm-abcde"}},
		{"a Pod of another name", metav1.OwnerReference{Kind: "Pod", Name: PodName("other")}, nil},
	} {
		if diff := cmp.Diff(tc.want, ServicePin(s.ID, tc.owner)); diff != "" {
			t.Errorf("ServicePin of %s (-want +got):\n%s", tc.name, diff)
		}
	}
	// A claimed pooled Pod's own Service (not wired: Headless mode, or a
	// Pod not wired yet) selects it by id, token and name.
	cfg := testConfig(t, map[string]string{"SANDBOX_SERVICE_TYPE": "Headless"})
	want := map[string]string{"sandbox-id": s.ID, "sandbox.deerflow.dev/token": slotToken, "sandbox.deerflow.dev/pod": "sandbox-pool-warm-abcde"}
	if diff := cmp.Diff(want, BuildService(cfg.Objects(), s, pooled).Spec.Selector); diff != "" {
		t.Errorf("a claimed pooled Pod's Service's selector (-want +got):\n%s", diff)
	}
}
