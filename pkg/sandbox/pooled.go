package sandbox

import (
	"context"
	"errors"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/poolapi"
	"github.com/deerflow-sandbox/provisioner/pkg/pooled"
	"github.com/deerflow-sandbox/provisioner/pkg/quota"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// WithPool serves creates of pooled templates from warm pools.
func WithPool(p poolapi.Pool) Option { return func(m *Manager) { m.pool = p } }

// createFromPool serves a create of a template with a pool from its warm
// pool when it can; handled false sends it the cold way, in the request.
func (m *Manager) createFromPool(ctx context.Context, s api.Spec, wait time.Duration, wrote *made) (sb api.Sandbox, handled bool, err error) {
	t := s.Resolved
	hash := resources.PoolPodTemplate(m.cfg.Objects(), s).Labels[keys.LabelPoolHash]
	if hash != resources.PoolPodTemplate(m.cfg.Objects(), resources.PoolSpec(m.cfg.Objects(), t)).Labels[keys.LabelPoolHash] {
		m.pool.Missed(t)
		return api.Sandbox{}, false, nil
	}
	// An id in use goes the cold way, which adopts or refuses it; but a
	// sandbox claimed before (DeerFlow creates again on every reuse) is
	// answered here: the cold way would find it only after making a Pod and
	// removing it, and claiming first would spend a pooled Pod. A Pod
	// sandbox-<id> without its Service (half made) is the cold way's to
	// repair. So both are read, beside the pool's list and the isolation
	// check, from the API server's watch cache (resourceVersion "0"), which
	// answers without a round trip to etcd. A stale answer only misses a
	// sandbox of this id made in the last moments, by a racing create: the
	// Service, which both write, still decides (ensureService: errOtherKind),
	// as for races no read can see. So the Service is not read at all when
	// the quota's Service cache (a watch in this replica) holds none of the
	// id, as for a new id: a round trip fewer for most creates.
	var (
		svc                              *corev1.Service
		ready                            []*corev1.Pod
		svcErr, podErr, readyErr, isoErr error
	)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		// A pool of allowlist sandboxes is never kept (template.pool), so
		// the proxy's address is not needed here.
		_, isoErr = m.isolation.Require(gctx, s.Caller.Principal, s.Egress.Mode)
		return nil
	})
	g.Go(func() error {
		ready, readyErr = m.pool.Ready(gctx, t, hash)
		return nil
	})
	g.Go(func() error {
		if name := resources.ServiceName(s.ID); !m.quota.Lacks(name) {
			svc, svcErr = m.client.CoreV1().Services(m.cfg.Namespace).Get(gctx, name, metav1.GetOptions{ResourceVersion: "0"})
		}
		return nil
	})
	g.Go(func() error {
		_, podErr = m.client.CoreV1().Pods(m.cfg.Namespace).Get(gctx, resources.PodName(s.ID), metav1.GetOptions{ResourceVersion: "0"})
		return nil
	})
	_ = g.Wait()
	if isoErr != nil {
		return api.Sandbox{}, true, isoErr
	}
	switch {
	case podErr == nil:
		return api.Sandbox{}, false, nil
	case !apierrors.IsNotFound(podErr):
		return api.Sandbox{}, true, api.Classify(podErr, "read the sandbox Pod")
	case svc == nil && svcErr == nil, apierrors.IsNotFound(svcErr):
	case svcErr != nil:
		return api.Sandbox{}, true, api.Classify(svcErr, "read the sandbox Service")
	default:
		if !resources.ClaimedOwner(svc, s.ID) {
			return api.Sandbox{}, false, nil
		}
		f, err := m.fetch(ctx, s.ID)
		if err != nil || f.pod == nil {
			return api.Sandbox{}, err != nil, err // its Pod is gone: the cold way replaces the Service
		}
		if err := resources.CheckOwner(f.pod, "Pod", s); err != nil {
			return api.Sandbox{}, true, err
		}
		if err := resources.CheckCapacity(f.pod, s); err != nil {
			return api.Sandbox{}, true, err
		}
		f.pod = reuse(ctx, m, f.pod, m.client.CoreV1().Pods(m.cfg.Namespace).Patch)
		if f.wire, err = m.pool.Rewire(ctx, f.svc, f.wire, f.pod); err != nil {
			return api.Sandbox{}, true, err
		}
		return m.answer(ctx, s.ID, f, wait)
	}
	meta := &metav1.ObjectMeta{Labels: resources.Labels(s), Annotations: resources.Annotations(s)}
	resources.RecordPrincipal(meta, s)
	meta.Labels[keys.LabelPooled] = "true"
	if readyErr != nil {
		return api.Sandbox{}, false, nil
	}
	cs := m.claims.Start(s)
	pod := m.pool.ClaimFrom(ctx, t, hash, ready, poolapi.Claim{Labels: meta.Labels, Annotations: meta.Annotations,
		MaxLifetime: s.MaxLifetime, Prepare: cs.Prepare, Uncertain: func() { cs.Uncertain = true }})
	if pod == nil {
		return m.giveUp(ctx, cs, s, wait)
	}
	*wrote = made{found: found{pod: pod, svc: cs.Svc, wire: cs.Wire}}
	m.recorder.Eventf(pod, corev1.EventTypeNormal, "SandboxCreated", "Created sandbox %s for user %s from the warm pool of template %s", s.ID, s.UserID, t.Name)
	return m.answer(ctx, s.ID, found{pod: pod, svc: cs.Svc, wire: cs.Wire}, wait)
}

// giveUp answers a create whose claim got no Pod: with the sandbox of a
// racing create that holds the id, with the quota's refusal, or by the
// cold way (handled false) when the pool had nothing to give. The Service
// this create made goes first: no Pod of this id will carry it.
func (m *Manager) giveUp(ctx context.Context, c *pooled.Create, s api.Spec, wait time.Duration) (api.Sandbox, bool, error) {
	err := c.Err
	if errors.Is(err, errOtherKind) {
		// A racing create of this id made its Service first: answer with its.
		a, rerr := m.reuseOtherKind(ctx, s)
		if rerr != nil {
			return api.Sandbox{}, true, rerr
		}
		return m.answer(ctx, s.ID, a.found, wait)
	}
	if c.Uncertain {
		return api.Sandbox{}, true, &api.Error{Kind: api.KindUnavailable,
			Detail: "the Kubernetes API server failed while a pooled sandbox was being claimed, and whether the claim landed cannot be told yet; retry"}
	}
	if derr := c.Drop(ctx); derr != nil {
		return api.Sandbox{}, true, errors.Join(err, derr)
	}
	var qe *quota.Error
	switch {
	case err == nil:
		return api.Sandbox{}, false, nil // the pool had nothing left: cold
	case errors.As(err, &qe) && qe.Contended:
		return api.Sandbox{}, false, nil // the cold way retries a contended quota
	case qe != nil:
		m.observer.QuotaRefused(qe.Scope)
	}
	return api.Sandbox{}, true, err
}
