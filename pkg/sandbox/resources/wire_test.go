package resources

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

const wireToken = "0123456789abcdef0123456789abcdef"

func wiredPod() *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-pool-warm-abcde", UID: "pod-uid",
		Labels: map[string]string{keys.LabelPool: "warm", keys.LabelToken: wireToken, keys.LabelPod: "sandbox-pool-warm-abcde"}}}
}

// TestBuildWireSelectsTheTokenAndThePin (issue 45): a wire selects its
// Pod's token and its Pod's own name, which the API server keeps unique:
// a Pod given that token (read from a Pod list) does not match it.
func TestBuildWireSelectsTheTokenAndThePin(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_SERVICE_TYPE": "NodePort"}).Objects()
	pod := wiredPod()
	w := BuildWire(cfg, pod, wireToken)
	want := map[string]string{keys.LabelToken: wireToken, keys.LabelPod: pod.Name}
	if diff := cmp.Diff(want, w.Spec.Selector); diff != "" {
		t.Errorf("BuildWire's selector (-want +got):\n%s", diff)
	}
	stray := map[string]string{keys.LabelToken: wireToken, keys.LabelPod: "sandbox-stray", keys.LabelID: "stray"}
	if labels.SelectorFromSet(w.Spec.Selector).Matches(labels.Set(stray)) {
		t.Errorf("wire %v matches a Pod given its token: %v", w.Spec.Selector, stray)
	}
	if !labels.SelectorFromSet(w.Spec.Selector).Matches(labels.Set(pod.Labels)) {
		t.Errorf("wire %v does not match its own Pod: %v", w.Spec.Selector, pod.Labels)
	}
}

// TestWiresTrustsOnlyTheWireAsBuilt: a wire is trusted with a sandbox's URL
// only as BuildWire makes it for that Pod (with the node port the API
// server gives it); any edit, or another Pod, is not.
func TestWiresTrustsOnlyTheWireAsBuilt(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_SERVICE_TYPE": "NodePort"}).Objects()
	built := func() *corev1.Service {
		w := BuildWire(cfg, wiredPod(), wireToken)
		w.Spec.Ports[0].NodePort = 30510
		return w
	}
	tests := []struct {
		name   string
		mutate func(*corev1.Service, *corev1.Pod)
		want   bool
	}{
		{"as built", func(*corev1.Service, *corev1.Pod) {}, true},
		{"no node port yet", func(w *corev1.Service, _ *corev1.Pod) { w.Spec.Ports[0].NodePort = 0 }, false},
		{"another token selected", func(w *corev1.Service, _ *corev1.Pod) { w.Spec.Selector[keys.LabelToken] = "f" + wireToken[1:] }, false},
		{"a selector widened", func(w *corev1.Service, _ *corev1.Pod) { w.Spec.Selector[keys.LabelApp] = keys.LabelAppValue }, false},
		{"owned by another Pod", func(w *corev1.Service, _ *corev1.Pod) { w.OwnerReferences[0].UID = "other" }, false},
		{"another port", func(w *corev1.Service, _ *corev1.Pod) { w.Spec.Ports[0].TargetPort = intstr.FromInt32(9090) }, false},
		{"another type", func(w *corev1.Service, _ *corev1.Pod) { w.Spec.Type = corev1.ServiceTypeClusterIP }, false},
		{"not labelled a wire", func(w *corev1.Service, _ *corev1.Pod) { w.Labels[keys.LabelComponent] = "sandbox" }, false},
		{"being deleted", func(w *corev1.Service, _ *corev1.Pod) { w.DeletionTimestamp = &metav1.Time{} }, false},
		{"a Pod without a token", func(_ *corev1.Service, p *corev1.Pod) { delete(p.Labels, keys.LabelToken) }, false},
		// The pin (issue 45): a wire selects its own Pod's name, which
		// that Pod carries.
		{"another Pod's name selected", func(w *corev1.Service, _ *corev1.Pod) { w.Spec.Selector[keys.LabelPod] = "sandbox-pool-warm-zzzzz" }, false},
		{"a Pod without its pin", func(_ *corev1.Service, p *corev1.Pod) { delete(p.Labels, keys.LabelPod) }, false},
		// Made before pins, it selects the token alone: still the Pod's
		// wire (found, answered, removed with it), pinned Pod or not.
		{"a wire from before pins", func(w *corev1.Service, _ *corev1.Pod) { delete(w.Spec.Selector, keys.LabelPod) }, true},
		{"a wire from before pins of a Pod from before pins", func(w *corev1.Service, p *corev1.Pod) {
			delete(w.Spec.Selector, keys.LabelPod)
			delete(p.Labels, keys.LabelPod)
		}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, p := built(), wiredPod()
			tc.mutate(w, p)
			if got := Wires(cfg, w, p); got != tc.want {
				t.Errorf("Wires = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestExposingAnswersOnlyThroughAWireThatWires: a sandbox claimed wired is
// reached through its wire while that wire wires its Pod, and through
// nothing (no URL) otherwise; any other sandbox through its own Service.
func TestExposingAnswersOnlyThroughAWireThatWires(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_SERVICE_TYPE": "NodePort"}).Objects()
	pod := wiredPod()
	wire := BuildWire(cfg, pod, wireToken)
	wire.Spec.Ports[0].NodePort = 30510
	own := BuildService(cfg, testSpec(), PodOwnerRef(pod))
	ref := Reference(BuildService(cfg, testSpec(), PodOwnerRef(pod)), wire)
	edited := wire.DeepCopy()
	edited.Spec.Selector = map[string]string{keys.LabelApp: keys.LabelAppValue}
	tests := []struct {
		name            string
		svc, wire, want *corev1.Service
		pod             *corev1.Pod
	}{
		{"a sandbox Service of its own", own, nil, own, pod},
		{"claimed wired", ref, wire, wire, pod},
		{"its wire gone", ref, nil, nil, pod},
		{"its wire edited", ref, edited, nil, pod},
		{"its Pod gone", ref, wire, nil, nil},
		{"no Service", nil, nil, nil, pod},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Exposing(cfg, tc.svc, tc.wire, tc.pod)); diff != "" {
				t.Errorf("Exposing (-want +got):\n%s", diff)
			}
		})
	}
	if ref.Spec.ClusterIP != corev1.ClusterIPNone || URLService(ref) != wire.Name || ref.Spec.Selector != nil || !Names(ref, pod) {
		t.Errorf("Reference: %+v; want headless, naming the wire, selecting nothing, owned by its Pod", ref)
	}
	orphaned := ref.DeepCopy()
	orphaned.OwnerReferences = nil // its Pod deleted with --cascade=orphan
	if OwnerlessReference(ref) || !OwnerlessReference(orphaned) || Names(orphaned, pod) || OwnerlessReference(own) {
		t.Errorf("OwnerlessReference: %v for the reference, %v without its owner (naming its Pod: %v), %v for a Service of its own; want false, true (false), false",
			OwnerlessReference(ref), OwnerlessReference(orphaned), Names(orphaned, pod), OwnerlessReference(own))
	}
}
