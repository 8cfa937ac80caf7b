package sandbox

import (
	"context"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// Get returns one sandbox. Only the absence of its workload and its Service
// is "not found"; any failure to ask is a transient error, never a 404,
// because DeerFlow deletes its record of a sandbox on 404. A Get counts as
// activity. With wait > 0 it waits (by watch) until the Pod is Ready.
func (m *Manager) Get(ctx context.Context, id string, wait time.Duration) (api.Sandbox, error) {
	f, release, err := m.lookup(ctx, id, wait)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer release()
	switch {
	case f.rs != nil:
		f.rs = touch(ctx, m, f.rs, m.client.AppsV1().ReplicaSets(m.cfg.Namespace).Patch)
	case f.pod != nil:
		f.pod = touch(ctx, m, f.pod, m.client.CoreV1().Pods(m.cfg.Namespace).Patch)
	}
	if wait > 0 && f.workload() != nil {
		return m.waitReady(ctx, id, f, wait)
	}
	return m.view(id, f), nil
}

// lookup is what every operation on one existing sandbox starts with: a
// valid id, a wait token when it will wait, and what exists of the
// sandbox; nothing at all is "not found", and so is another principal's
// sandbox (fetchVisible). The caller calls release.
func (m *Manager) lookup(ctx context.Context, id string, wait time.Duration) (found, func(), error) {
	if err := api.ValidateID(id); err != nil {
		return found{}, nil, err
	}
	c, _ := api.CallerFrom(ctx)
	release, err := m.admitWait(c.Principal, wait)
	if err != nil {
		return found{}, nil, err
	}
	f, _, err := m.fetchVisible(ctx, id)
	if err == nil && f.pod == nil && f.rs == nil && f.svc == nil {
		err = &api.Error{Kind: api.KindNotFound, Detail: "sandbox " + id + " not found"}
	}
	if err != nil {
		release()
		return found{}, nil, err
	}
	return f, release, nil
}

// fetch reads a sandbox's Pod and Service concurrently; nil means absent.
// An object with the name but not the sandbox labels is absent too, and so
// is one being deleted. The ReplicaSet is read only when the sandbox can be
// one: no bare Pod, or a Service owned by a ReplicaSet. So a bare Pod
// sandbox (every DeerFlow sandbox) costs the two reads it did before
// templates; a ReplicaSet sandbox costs that one more, and one more for its
// current Pod unless paused.
func (m *Manager) fetch(ctx context.Context, id string) (found, error) {
	f, err := m.fetchObjects(ctx, id)
	if err != nil {
		return found{}, err
	}
	return chained(f), nil
}

// chained keeps the Service of what was found only when it belongs to the
// workload found: owned by it (by UID), for the same principal. A Service
// that no workload owns is DeerFlow's provisioner's (adopted by the next
// create) and counts when it records the same principal. Any other
// Service is not this sandbox's: never answered, never deleted for it.
func chained(f found) found {
	w := f.workload()
	if w == nil || f.svc == nil {
		return f
	}
	if !resources.Names(f.svc, w) || api.PrincipalOf(f.svc) != api.PrincipalOf(w) {
		f.svc = nil
	}
	return f
}

func (m *Manager) fetchObjects(ctx context.Context, id string) (found, error) {
	var f found
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		pod, err := m.client.CoreV1().Pods(m.cfg.Namespace).Get(gctx, resources.PodName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && (pod.DeletionTimestamp != nil || !resources.IsSandbox(pod, id))) {
			return nil // a terminating Pod is already gone to our callers
		}
		f.pod = pod
		return api.Classify(err, "read the sandbox Pod")
	})
	g.Go(func() error {
		svc, err := m.client.CoreV1().Services(m.cfg.Namespace).Get(gctx, resources.ServiceName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && !resources.IsSandbox(svc, id)) {
			return nil
		}
		f.svc = svc
		return api.Classify(err, "read the sandbox Service")
	})
	if err := g.Wait(); err != nil {
		return found{}, err
	}
	if f.pod != nil && f.svc != nil {
		// The Service names its workload: a Pod sandbox-<id> it does not
		// name is not this sandbox's. Beside a claimed pooled Pod it is a
		// stray (a failed create of the id, maybe another principal's);
		// otherwise the Service is an older Pod's, which the GC removes.
		if ref := resources.SandboxOwner(f.svc.OwnerReferences); ref != nil && ref.Kind == "Pod" && ref.UID != f.pod.UID {
			if resources.ClaimedOwner(f.svc, id) {
				f.stray, f.pod = f.pod, nil
			} else {
				f.svc = nil
			}
		}
	}
	if f.pod == nil && f.svc != nil && resources.ClaimedOwner(f.svc, id) {
		// Claimed from a warm pool: its Pod keeps the name the pool gave it,
		// and its URL may be its wire's (read beside it).
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error {
			pod, err := m.client.CoreV1().Pods(m.cfg.Namespace).Get(gctx, resources.SandboxOwner(f.svc.OwnerReferences).Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && (pod.DeletionTimestamp != nil || resources.PodID(pod) != id)) {
				f.ending = err == nil && pod.DeletionTimestamp != nil && resources.PodID(pod) == id
				return nil
			}
			f.pod = pod
			return api.Classify(err, "read the sandbox Pod")
		})
		if name := resources.URLService(f.svc); name != "" {
			g.Go(func() error {
				wire, err := m.client.CoreV1().Services(m.cfg.Namespace).Get(gctx, name, metav1.GetOptions{})
				if apierrors.IsNotFound(err) {
					return nil
				}
				f.wire = wire
				return api.Classify(err, "read the sandbox's Service")
			})
		}
		if err := g.Wait(); err != nil {
			return found{}, err
		}
		return f, nil
	}
	if f.pod != nil && resources.OwnerKind(f.svc) != "ReplicaSet" {
		return f, nil
	}
	rs, err := m.client.AppsV1().ReplicaSets(m.cfg.Namespace).Get(ctx, resources.PodName(id), metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && (rs.DeletionTimestamp != nil || !resources.IsSandbox(rs, id))) {
		if f.pod == nil && f.svc == nil {
			return m.claimedByLabel(ctx, id)
		}
		return f, nil
	}
	if err != nil {
		return found{}, api.Classify(err, "read the sandbox ReplicaSet")
	}
	// A bare Pod beside a ReplicaSet (creates of both kinds racing) is not
	// this sandbox's Pod; destroy removes it too.
	f.rs, f.stray, f.pod = rs, f.pod, nil
	if !resources.Paused(rs) {
		if f.pod, err = m.currentPodOf(ctx, rs); err != nil {
			return found{}, err
		}
	}
	return f, nil
}

// claimedByLabel finds, when nothing else of id exists, a Pod claimed from
// a pool for id that lost its Service: a destroy that failed between its
// two deletes, one that raced the claim, or a claim whose patch landed
// after its client gave up. Found by its labels (its name is its pool's),
// it is a leftover that destroy and the reap remove. Only a miss pays this
// list.
func (m *Manager) claimedByLabel(ctx context.Context, id string) (found, error) {
	// From the API server's watch cache (resourceVersion "0"): a miss
	// costs no round trip to etcd, and a Pod missed by a stale answer is
	// the reap's to remove.
	l, err := m.client.CoreV1().Pods(m.cfg.Namespace).List(ctx, metav1.ListOptions{ResourceVersion: "0",
		LabelSelector: resources.SelectorAllWith(labels.Set{keys.LabelID: id, keys.LabelPooled: "true"})})
	if err != nil {
		return found{}, api.Classify(err, "look for a claimed Pod of the sandbox")
	}
	for i := range l.Items {
		if p := &l.Items[i]; p.DeletionTimestamp == nil && resources.PodID(p) == id {
			return found{pod: p}, nil
		}
	}
	return found{}, nil
}
