package sandbox

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

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// A sandbox's Service selects its workload by id and by a token
// (keys.LabelToken): 128 random bits, written by the create that made the
// workload, or by the claim of a pooled Pod. No caller chooses or learns
// it, so no other principal's Pod, whatever id it carries, joins the
// Service. Sandboxes from before tokens get one on their next create
// (tokenPod, tokenReplicaSet, reselect): their Service is updated in
// place, keeping its URL and node port.

// newToken is a fresh selector token: 32 lowercase hex digits, as the
// admission policy requires.
func newToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// tokenPod gives a Pod from before tokens one (a bare or claimed Pod).
func (m *Manager) tokenPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	if resources.Token(pod) != "" {
		return pod, nil
	}
	patched, err := m.client.CoreV1().Pods(m.cfg.Namespace).Patch(ctx, pod.Name, types.MergePatchType, tokenPatch(pod.UID, newToken()), metav1.PatchOptions{})
	if err != nil {
		return nil, api.Classify(err, "give the sandbox Pod its selector token")
	}
	return patched, nil
}

// tokenReplicaSet gives a ReplicaSet from before tokens one: in its Pod
// template (its selector cannot change, and need not: the Service selects
// by token), and on its current Pod, which the template no longer changes.
func (m *Manager) tokenReplicaSet(ctx context.Context, rs *appsv1.ReplicaSet) (*appsv1.ReplicaSet, error) {
	if resources.Token(rs) != "" {
		return rs, nil
	}
	token := newToken()
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"uid": rs.UID},
		"spec":     map[string]any{"template": map[string]any{"metadata": map[string]any{"labels": map[string]string{keys.LabelToken: token}}}},
	})
	patched, err := m.client.AppsV1().ReplicaSets(m.cfg.Namespace).Patch(ctx, rs.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return nil, api.Classify(err, "give the sandbox ReplicaSet its selector token")
	}
	if !resources.Paused(patched) {
		pod, err := m.podsOf(ctx, patched)
		if err != nil {
			return nil, err
		}
		if pod != nil && resources.Token(pod) == "" {
			if _, err := m.client.CoreV1().Pods(m.cfg.Namespace).Patch(ctx, pod.Name, types.MergePatchType, tokenPatch(pod.UID, token), metav1.PatchOptions{}); err != nil {
				return nil, api.Classify(err, "give the sandbox Pod its selector token")
			}
		}
	}
	return patched, nil
}

// tokenPatch labels the object of uid (a precondition: the patch fails on
// any other) with token.
func tokenPatch(uid types.UID, token string) []byte {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": uid, "labels": map[string]string{keys.LabelToken: token}}})
	return patch
}

// reselect makes the Service of a workload select it as want does (by its
// token), in place: the node port and cluster IP stay.
func (m *Manager) reselect(ctx context.Context, svc, want *corev1.Service) (*corev1.Service, bool, error) {
	if maps.Equal(svc.Spec.Selector, want.Spec.Selector) {
		return svc, false, nil
	}
	c := svc.DeepCopy()
	c.Spec.Selector = want.Spec.Selector
	updated, err := m.client.CoreV1().Services(m.cfg.Namespace).Update(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		return nil, false, api.Classify(err, "select the sandbox's workload by its token")
	}
	return updated, false, nil
}
