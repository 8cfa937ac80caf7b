// Package token makes and repairs the selector token that keeps a
// sandbox's Service to its own workload (keys.LabelToken; the token and
// the chain it belongs to are defined in docs/architecture.md). No caller
// chooses or learns a token, so no other principal's Pod, whatever id it
// carries, joins the Service. Sandboxes from before tokens get one on
// their next create (Pod, ReplicaSet, Reselect): their Service is updated
// in place, keeping its URL and node port.
package token

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"maps"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	typedappsv1 "k8s.io/client-go/kubernetes/typed/apps/v1"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// New is a fresh selector token: 32 lowercase hex digits, as the admission
// policy requires.
func New() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// Pod gives a Pod from before tokens one (a bare or claimed Pod).
func Pod(ctx context.Context, pods typedcorev1.PodInterface, pod *corev1.Pod) (*corev1.Pod, error) {
	if resources.Token(pod) != "" {
		return pod, nil
	}
	patched, err := pods.Patch(ctx, pod.Name, types.MergePatchType, patch(pod.UID, New()), metav1.PatchOptions{})
	if err != nil {
		return nil, api.Classify(err, "give the sandbox Pod its selector token")
	}
	return patched, nil
}

// ReplicaSet gives a ReplicaSet from before tokens one: in its Pod
// template (its selector cannot change, and need not: the Service selects
// by token), and on its current Pod (current finds it; nil when paused),
// which the template no longer changes.
func ReplicaSet(ctx context.Context, rss typedappsv1.ReplicaSetInterface, pods typedcorev1.PodInterface, rs *appsv1.ReplicaSet,
	current func(context.Context, *appsv1.ReplicaSet) (*corev1.Pod, error)) (*appsv1.ReplicaSet, error) {
	if resources.Token(rs) != "" {
		return rs, nil
	}
	token := New()
	p, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": rs.UID},
		"spec":     map[string]any{"template": map[string]any{"metadata": map[string]any{"labels": map[string]string{keys.LabelToken: token}}}},
	})
	patched, err := rss.Patch(ctx, rs.Name, types.MergePatchType, p, metav1.PatchOptions{})
	if err != nil {
		return nil, api.Classify(err, "give the sandbox ReplicaSet its selector token")
	}
	if resources.Paused(patched) {
		return patched, nil
	}
	pod, err := current(ctx, patched)
	if err != nil {
		return nil, err
	}
	if pod != nil && resources.Token(pod) == "" {
		if _, err := pods.Patch(ctx, pod.Name, types.MergePatchType, patch(pod.UID, token), metav1.PatchOptions{}); err != nil {
			return nil, api.Classify(err, "give the sandbox Pod its selector token")
		}
	}
	return patched, nil
}

// patch labels the object of uid (a precondition: the patch fails on any
// other) with token.
func patch(uid types.UID, token string) []byte {
	p, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": uid, "labels": map[string]string{keys.LabelToken: token}}})
	return p
}

// Reselect makes svc select its workload as want does (by its token), in
// place: the node port and cluster IP stay.
func Reselect(ctx context.Context, svcs typedcorev1.ServiceInterface, svc, want *corev1.Service) (*corev1.Service, error) {
	if maps.Equal(svc.Spec.Selector, want.Spec.Selector) {
		return svc, nil
	}
	c := svc.DeepCopy()
	c.Spec.Selector = want.Spec.Selector
	updated, err := svcs.Update(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		return nil, api.Classify(err, "select the sandbox's workload by its token")
	}
	return updated, nil
}
