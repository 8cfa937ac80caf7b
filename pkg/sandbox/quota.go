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
	scope     string // total, user or principal
	contended bool
}

func (e *quotaError) Error() string { return e.err.Error() }
func (e *quotaError) Unwrap() error { return e.err }

// settled is how old a Pod must be to count as a long-lived sandbox rather
// than a racing create that may yet withdraw.
const settled = 3 * time.Second

// checkQuota counts sandboxes after this call's workload and Service exist.
// Counting after creating (not before) is what bounds the overshoot at zero
// across replicas: of any set of racing creates, the one that wrote last
// sees all the others in its lists (see listFresh), so the total admitted
// never exceeds the limit. The price is that racing creates at the limit can
// refuse each other; Create then retries a few rounds with random backoff.
// The caller deletes what it made on refusal.
//
// How fresh each list must be, with two kinds of sandbox. A list "after X"
// holds every object written before X. A bare Pod create lists Pods after
// its Pod; a ReplicaSet create lists ReplicaSets after its ReplicaSet and
// Pods after its Service (written after its ReplicaSet). Of a Pod create P
// and a ReplicaSet create R racing: if P's Pod was written before R's
// Service, R's Pod list holds it; otherwise R's Service (and before it R's
// ReplicaSet) was written before P's Pod, so P sees R if it counts
// ReplicaSet sandboxes after its Pod, through their ReplicaSets or through
// their Services. P's quick count takes the Services (labelled
// LabelWorkload): the API server's cache answers a list "after" an object
// only once it has seen a write of its own resource at least as new, or
// etcd's progress report, which it asks for every 100 ms. Services are
// written by every create, P's own among them a moment later; ReplicaSets
// mostly are not, and a list of them after P's Pod waited ~30 ms (p50) on
// this machine's test cluster. DeerFlow's creates (bare Pods) so pay no
// such wait; the full count (near the limit, or with a per-user limit)
// reads the ReplicaSets themselves.
//
// The per-principal limit is counted from the same lists as the per-user
// one (every sandbox's objects carry LabelPrincipal from their creation),
// so the same argument bounds its overshoot at zero.
//
// ownSvc yields this call's Service once it is written (the count runs
// beside its create; a ReplicaSet create's Pod lists wait for it). With own
// nil it is the look for room a retry makes
// before it creates again: the Pod that the retry would create counts as one
// more, and a sandbox of this id that someone else created meanwhile means
// room (it is never refused).
func (m *Manager) checkQuota(ctx context.Context, s Spec, own workloadObject, ownSvc func() (*corev1.Service, error)) error {
	prospective := 0
	if own == nil {
		prospective = 1
	}
	_, bareKind := own.(*corev1.Pod)
	// podsAfter is what the Pod lists must be fresher than.
	podsAfter := func() (metav1.Object, error) {
		if own == nil || bareKind {
			return own, nil
		}
		return ownSvc()
	}
	listPods := func(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error) {
		after, err := podsAfter()
		if err != nil {
			return nil, err
		}
		return listFresh(ctx, after, opts, m.client.CoreV1().Pods(m.cfg.Namespace).List)
	}
	if m.cfg.MaxSandboxesPerUser == 0 && m.cfg.MaxSandboxesPerPrincipal == 0 {
		// Fast path: every sandbox is a Pod or a ReplicaSet in the namespace
		// (a running ReplicaSet sandbox shows in both: an over-count, which
		// only sends the check to the full count sooner), so if the namespace
		// holds no more than the limit, neither can the sandboxes be over it.
		// A list of one item tells the total through remainingItemCount, at a
		// fraction of the cost of listing every sandbox.
		var pods *corev1.PodList
		var others int64
		othersExact := true
		g, gctx := errgroup.WithContext(ctx)
		one := metav1.ListOptions{Limit: 1}
		g.Go(func() (err error) {
			pods, err = listPods(gctx, one)
			return err
		})
		g.Go(func() error {
			if bareKind {
				// Served once the cache holds a Service written after our Pod:
				// our own, whose create is under way.
				l, err := listFresh(gctx, own, metav1.ListOptions{LabelSelector: selectorReplicaSetServices},
					m.client.CoreV1().Services(m.cfg.Namespace).List)
				if err != nil {
					return err
				}
				others = int64(len(l.Items))
				return nil
			}
			l, err := listFresh(gctx, own, one, m.client.AppsV1().ReplicaSets(m.cfg.Namespace).List)
			if err != nil {
				return err
			}
			others, othersExact = count(l.ListMeta, len(l.Items))
			return nil
		})
		if err := g.Wait(); err != nil {
			return classify(err, "count sandboxes for the quota")
		}
		podCount, podsExact := count(pods.ListMeta, len(pods.Items))
		if podsExact && othersExact && podCount+others+int64(prospective) <= int64(m.cfg.MaxSandboxes) {
			return nil
		}
	}
	var pods *corev1.PodList
	var rss *appsv1.ReplicaSetList
	g, gctx := errgroup.WithContext(ctx)
	all := metav1.ListOptions{LabelSelector: selectorAll}
	g.Go(func() (err error) {
		pods, err = listPods(gctx, all)
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
	ours, settledOurs := prospective, 0
	user, principal := LabelValue(s.UserID), PrincipalLabelValue(s.Caller.Principal)
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
		if o.GetLabels()[LabelPrincipal] == principal {
			ours++
			if old {
				settledOurs++
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
	if m.cfg.MaxSandboxesPerPrincipal > 0 && ours > m.cfg.MaxSandboxesPerPrincipal {
		return &quotaError{scope: "principal", contended: settledOurs < m.cfg.MaxSandboxesPerPrincipal, err: &Error{Kind: KindQuota, Detail: fmt.Sprintf(
			"%s has reached the limit of %d sandboxes per principal; destroy one or raise MAX_SANDBOXES_PER_PRINCIPAL", s.Caller.Principal, m.cfg.MaxSandboxesPerPrincipal)}}
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

// count is the number of items a list of limited length stands for, and
// whether that number is known.
func count(meta metav1.ListMeta, items int) (int64, bool) {
	switch {
	case meta.RemainingItemCount != nil:
		return int64(items) + *meta.RemainingItemCount, true
	case meta.Continue != "":
		return 0, false
	default:
		return int64(items), true
	}
}
