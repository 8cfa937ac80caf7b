package sandbox

import (
	"context"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/follow"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/status"
	corev1 "k8s.io/api/core/v1"
)

// answer is a create's answer: the sandbox once Ready with wait > 0, at
// once otherwise (in Headless mode both once its name resolves).
func (m *Manager) answer(ctx context.Context, id string, f found, wait time.Duration) (api.Sandbox, bool, error) {
	if wait > 0 {
		sb, err := m.waitReady(ctx, id, f, wait)
		return sb, true, err
	}
	if m.cfg.ServiceType == config.ServiceHeadless && (f.rs == nil || !resources.Paused(f.rs)) {
		// The name's wait holds a watch, as a wait for Ready does: it takes
		// one of this replica's wait tokens, and is left out when none is
		// free rather than refusing a create that asked for no wait.
		c, _ := api.CallerFrom(ctx)
		if release, err := m.admitWait(c.Principal, m.nameWait); err == nil {
			m.awaitName(ctx, f.svc, f.pod, m.nameWait)
			release()
		}
	}
	return m.view(id, f), true, nil
}

// waitReady waits up to wait for the sandbox's Pod to become Ready. When
// the wait ends first it still answers, with the reason the Pod is not
// ready. A paused sandbox is answered at once: there is no Pod to wait for.
func (m *Manager) waitReady(ctx context.Context, id string, f found, wait time.Duration) (api.Sandbox, error) {
	if wait > m.cfg.MaxReadyWait {
		wait = m.cfg.MaxReadyWait
	}
	if f.rs != nil && resources.Paused(f.rs) {
		return m.view(id, f), nil
	}
	if f.pod != nil && status.Ready(f.pod) {
		m.awaitName(ctx, f.svc, f.pod, wait)
		return m.view(id, f), nil
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	settled := func(p *corev1.Pod) bool {
		return p == nil || status.Ready(p) || p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded
	}
	var (
		last *corev1.Pod
		err  error
	)
	if f.rs != nil {
		last, err = follow.ReplicaSetPod(wctx, m.client.CoreV1().Pods(m.cfg.Namespace), f.rs, func(p *corev1.Pod) bool { return p != nil && settled(p) })
	} else {
		last, err = follow.Pod(wctx, m.client.CoreV1().Pods(m.cfg.Namespace), f.pod, settled)
	}
	if err != nil && wctx.Err() == nil {
		return api.Sandbox{}, err
	}
	if ctx.Err() != nil {
		return api.Sandbox{}, api.Classify(ctx.Err(), "wait for the sandbox to become ready")
	}
	f.pod = last
	sb := m.view(id, f)
	if last != nil && status.Ready(last) {
		m.observer.CreateToReady(status.ReadySince(last).Sub(last.CreationTimestamp.Time))
		deadline, _ := wctx.Deadline()
		m.awaitName(ctx, f.svc, last, time.Until(deadline))
		return sb, nil
	}
	sb.Reason = status.NotReadyReason(last)
	if status.Stuck(last) {
		// The kubelet says why in an Event only (a runtime handler the
		// node lacks, say): one read, on the timed-out path alone.
		if r := follow.WarningReason(ctx, m.client.CoreV1().Events(last.Namespace), last); r != "" {
			sb.Reason = r
		}
	}
	if f.rs != nil && last == nil {
		sb.Reason = "the ReplicaSet has not created its Pod yet"
	}
	sb.WaitTimedOut = err != nil
	return sb, nil
}

// awaitName holds an answer until cluster DNS can answer the sandbox's
// name, in Headless mode only (follow.AwaitName says why).
func (m *Manager) awaitName(ctx context.Context, svc *corev1.Service, pod *corev1.Pod, bound time.Duration) {
	if m.cfg.ServiceType == config.ServiceHeadless {
		follow.AwaitName(ctx, m.client.DiscoveryV1().EndpointSlices(m.cfg.Namespace), svc, pod, bound)
	}
}
