package sandbox

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
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
func (m *Manager) checkQuota(ctx context.Context, s Spec, own workloadObject) error {
	prospective := 0
	if own == nil {
		prospective = 1
	}
	if m.cfg.MaxSandboxesPerUser == 0 {
		// Fast path: every sandbox is a Pod or a ReplicaSet in the namespace,
		// so if the namespace holds no more of both than the limit, neither
		// can the sandboxes be over it. A list of one item tells the total
		// through remainingItemCount, at a fraction of the cost of listing
		// every sandbox; the full count runs only near the limit.
		var pods *corev1.PodList
		var rss *appsv1.ReplicaSetList
		g, gctx := errgroup.WithContext(ctx)
		one := metav1.ListOptions{Limit: 1}
		g.Go(func() (err error) {
			pods, err = listFresh(gctx, own, one, m.client.CoreV1().Pods(m.cfg.Namespace).List)
			return err
		})
		g.Go(func() (err error) {
			rss, err = listFresh(gctx, own, one, m.client.AppsV1().ReplicaSets(m.cfg.Namespace).List)
			return err
		})
		if err := g.Wait(); err != nil {
			return classify(err, "count sandboxes for the quota")
		}
		total, exact := int64(len(pods.Items)+len(rss.Items)+prospective), true
		for _, meta := range []metav1.ListMeta{pods.ListMeta, rss.ListMeta} {
			if meta.RemainingItemCount != nil {
				total += *meta.RemainingItemCount
			} else if meta.Continue != "" {
				exact = false
			}
		}
		if exact && total <= int64(m.cfg.MaxSandboxes) {
			return nil
		}
	}
	var pods *corev1.PodList
	var rss *appsv1.ReplicaSetList
	g, gctx := errgroup.WithContext(ctx)
	all := metav1.ListOptions{LabelSelector: selectorAll}
	g.Go(func() (err error) {
		pods, err = listFresh(gctx, own, all, m.client.CoreV1().Pods(m.cfg.Namespace).List)
		return err
	})
	g.Go(func() (err error) {
		rss, err = listFresh(gctx, own, all, m.client.AppsV1().ReplicaSets(m.cfg.Namespace).List)
		return err
	})
	if err := g.Wait(); err != nil {
		return classify(err, "count sandboxes for the quota")
	}
	// One entry per sandbox: a bare Pod, or a ReplicaSet (paused or not;
	// its Pods are not counted again).
	var sandboxes []metav1.Object
	for i := range pods.Items {
		p := &pods.Items[i]
		if podID(p) == "" || p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue // on its way out; the reaper removes ended Pods
		}
		sandboxes = append(sandboxes, p)
	}
	for i := range rss.Items {
		if rs := &rss.Items[i]; replicaSetID(rs) != "" && rs.DeletionTimestamp == nil {
			sandboxes = append(sandboxes, rs)
		}
	}
	total, mine, settledTotal, settledMine := prospective, prospective, 0, 0
	user := LabelValue(s.UserID)
	cutoff := time.Now().Add(-settled)
	for _, o := range sandboxes {
		if own == nil && o.GetLabels()[LabelID] == s.ID {
			return nil
		}
		created := o.GetCreationTimestamp()
		old := (own == nil || o.GetUID() != own.GetUID()) && created.Time.Before(cutoff)
		total++
		if old {
			settledTotal++
		}
		if o.GetLabels()[LabelUser] == user {
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

// listFresh lists as of no earlier than own's creation. That is all the
// zero-overshoot argument needs (of two racing creates, the one committed
// later sees the other), and unlike a consistent read it needs no round trip
// to etcd for its current revision nor waits for writes made after ours: the
// watch cache answers as soon as it holds our object. Should the cache lag
// too far behind, the consistent read that etcd can serve is the fallback.
// Without own, it is that consistent read. Resource versions are etcd's
// revisions, shared by every kind, so a ReplicaSet list can be as fresh as a
// Pod.
func listFresh[T any](ctx context.Context, own metav1.Object, opts metav1.ListOptions, list func(context.Context, metav1.ListOptions) (T, error)) (T, error) {
	if own != nil && own.GetResourceVersion() != "" {
		fresh := opts
		fresh.ResourceVersion, fresh.ResourceVersionMatch = own.GetResourceVersion(), metav1.ResourceVersionMatchNotOlderThan
		l, err := list(ctx, fresh)
		if !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
			return l, err
		}
	}
	return list(ctx, opts)
}
