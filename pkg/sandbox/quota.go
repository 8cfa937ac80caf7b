package sandbox

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// quotaError is a quota refusal; contended says whether racing creates (not
// long-lived sandboxes) fill the limit, so that another round may succeed.
type quotaError struct {
	err       *Error
	scope     string // total or user
	contended bool
}

func (e *quotaError) Error() string { return e.err.Error() }
func (e *quotaError) Unwrap() error { return e.err }

// settled is how old a Pod must be to count as a long-lived sandbox rather
// than a racing create that may yet withdraw.
const settled = 3 * time.Second

// checkQuota counts sandboxes after this call's Pod exists. Counting after
// creating (not before) is what bounds the overshoot at zero across replicas:
// of any set of racing creates, the last Pod created sees all of them in its
// list (see countList), so the total admitted never exceeds the limit. The
// price is that racing creates at the limit can refuse each other; Create
// then retries a few rounds with random backoff. The caller deletes its Pod
// on refusal.
//
// With own nil it is the look for room a retry makes before it creates again:
// the Pod that the retry would create counts as one more, and a sandbox of
// this id that someone else created meanwhile means room (it is never
// refused).
func (m *Manager) checkQuota(ctx context.Context, s Spec, own *corev1.Pod) error {
	prospective := 0
	if own == nil {
		prospective = 1
	}
	if m.cfg.MaxSandboxesPerUser == 0 {
		// Fast path: every sandbox is a Pod in the namespace, so if the
		// namespace holds no more Pods than the limit, neither can the
		// sandboxes be over it. A list of one item tells the total through
		// remainingItemCount, at a fraction of the cost of listing every
		// sandbox; the full count runs only near the limit.
		page, err := m.countList(ctx, own, metav1.ListOptions{Limit: 1})
		if err != nil {
			return classify(err, "count sandboxes for the quota")
		}
		total := int64(len(page.Items) + prospective)
		if page.RemainingItemCount != nil {
			total += *page.RemainingItemCount
		}
		if (page.Continue == "" || page.RemainingItemCount != nil) && total <= int64(m.cfg.MaxSandboxes) {
			return nil
		}
	}
	list, err := m.countList(ctx, own, metav1.ListOptions{LabelSelector: selectorAll})
	if err != nil {
		return classify(err, "count sandboxes for the quota")
	}
	total, mine, settledTotal, settledMine := prospective, prospective, 0, 0
	user := LabelValue(s.UserID)
	cutoff := time.Now().Add(-settled)
	for i := range list.Items {
		p := &list.Items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // on its way out; the reaper removes ended Pods
		}
		if own == nil && p.Labels[LabelID] == s.ID {
			return nil
		}
		old := (own == nil || p.UID != own.UID) && p.CreationTimestamp.Time.Before(cutoff)
		total++
		if old {
			settledTotal++
		}
		if p.Labels[LabelUser] == user {
			mine++
			if old {
				settledMine++
			}
		}
	}
	if m.cfg.MaxSandboxes > 0 && total > m.cfg.MaxSandboxes {
		return &quotaError{scope: "total", contended: settledTotal < m.cfg.MaxSandboxes, err: &Error{Kind: KindQuota, Detail: fmt.Sprintf(
			"the provisioner's limit of %d sandboxes in total is reached; destroy a sandbox or raise MAX_SANDBOXES", m.cfg.MaxSandboxes)}}
	}
	if m.cfg.MaxSandboxesPerUser > 0 && mine > m.cfg.MaxSandboxesPerUser {
		return &quotaError{scope: "user", contended: settledMine < m.cfg.MaxSandboxesPerUser, err: &Error{Kind: KindQuota, Detail: fmt.Sprintf(
			"user %s has reached the limit of %d sandboxes per user; destroy one or raise MAX_SANDBOXES_PER_USER", s.UserID, m.cfg.MaxSandboxesPerUser)}}
	}
	return nil
}

// countList lists Pods as of no earlier than own's creation. That is all the
// zero-overshoot argument needs (of two racing creates, the one committed
// later sees the other), and unlike a consistent read it needs no round trip
// to etcd for its current revision nor waits for writes made after ours: the
// watch cache answers as soon as it holds our Pod. Should the cache lag too
// far behind, the consistent read that etcd can serve is the fallback. Without
// own, it is that consistent read.
func (m *Manager) countList(ctx context.Context, own *corev1.Pod, opts metav1.ListOptions) (*corev1.PodList, error) {
	pods := m.client.CoreV1().Pods(m.cfg.Namespace)
	if own != nil && own.ResourceVersion != "" {
		fresh := opts
		fresh.ResourceVersion, fresh.ResourceVersionMatch = own.ResourceVersion, metav1.ResourceVersionMatchNotOlderThan
		list, err := pods.List(ctx, fresh)
		if !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
			return list, err
		}
	}
	return pods.List(ctx, opts)
}
