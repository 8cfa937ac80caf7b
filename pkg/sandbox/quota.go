package sandbox

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// checkQuota counts sandboxes after this call's Pod exists. Counting after
// creating (not before) is what bounds the overshoot at zero across replicas:
// of any set of racing creates, the last Pod created sees all of them in its
// consistent list, so the total admitted never exceeds the limit. The price is
// that a burst at the limit may refuse a create that would have fit; the
// client retries. The caller deletes its Pod when this refuses.
func (m *Manager) checkQuota(ctx context.Context, s Spec) error {
	list, err := m.client.CoreV1().Pods(m.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selectorAll})
	if err != nil {
		return classify(err, "count sandboxes for the quota")
	}
	total, mine := 0, 0
	user := LabelValue(s.UserID)
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // on its way out; the reaper removes ended Pods
		}
		total++
		if p.Labels[LabelUser] == user {
			mine++
		}
	}
	if m.cfg.MaxSandboxes > 0 && total > m.cfg.MaxSandboxes {
		m.observer.QuotaRefused("total")
		return &Error{Kind: KindQuota, Detail: fmt.Sprintf(
			"the provisioner's limit of %d sandboxes in total is reached; destroy a sandbox or raise MAX_SANDBOXES", m.cfg.MaxSandboxes)}
	}
	if m.cfg.MaxSandboxesPerUser > 0 && mine > m.cfg.MaxSandboxesPerUser {
		m.observer.QuotaRefused("user")
		return &Error{Kind: KindQuota, Detail: fmt.Sprintf(
			"user %s has reached the limit of %d sandboxes per user; destroy one or raise MAX_SANDBOXES_PER_USER", s.UserID, m.cfg.MaxSandboxesPerUser)}
	}
	return nil
}
