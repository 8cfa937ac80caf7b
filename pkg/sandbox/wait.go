package sandbox

import (
	"context"
	"fmt"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// watchPod follows one Pod by watch, from the version we already hold, until
// done says stop, the Pod is deleted (nil is passed to done), or ctx ends.
// Watches the server closes are resumed; nothing here polls.
func (m *Manager) watchPod(ctx context.Context, pod *corev1.Pod, done func(*corev1.Pod) bool) (*corev1.Pod, error) {
	pods := m.client.CoreV1().Pods(m.cfg.Namespace)
	current := pod
	rv := pod.ResourceVersion
	for {
		w, err := pods.Watch(ctx, metav1.ListOptions{
			FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
			ResourceVersion: rv,
		})
		if err != nil {
			if ctx.Err() != nil {
				return current, ctx.Err()
			}
			return current, api.Classify(err, "watch the sandbox Pod")
		}
		expired := false
		for !expired {
			select {
			case <-ctx.Done():
				w.Stop()
				return current, ctx.Err()
			case ev, ok := <-w.ResultChan():
				if !ok {
					expired = true
					break
				}
				switch ev.Type {
				case watch.Error:
					// Usually "resource version too old": start over from a fresh read.
					w.Stop()
					fresh, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
					if apierrors.IsNotFound(err) || (err == nil && fresh.UID != pod.UID) {
						if done(nil) {
							return nil, nil
						}
					} else if err != nil {
						return current, api.Classify(err, "read the sandbox Pod")
					} else {
						current, rv = fresh, fresh.ResourceVersion
						if done(current) {
							return current, nil
						}
					}
					expired = true
				case watch.Deleted:
					w.Stop()
					if done(nil) {
						return nil, nil
					}
				case watch.Added, watch.Modified:
					p, ok := ev.Object.(*corev1.Pod)
					if !ok || p.UID != pod.UID {
						continue
					}
					current, rv = p, p.ResourceVersion
					if done(current) {
						w.Stop()
						return current, nil
					}
				}
			}
		}
	}
}

// waitGone waits, bounded by SANDBOX_TERMINATING_WAIT, for a terminating Pod
// to disappear, so that a create right after a delete recreates the sandbox
// instead of answering with the dying one.
func (m *Manager) waitGone(ctx context.Context, pod *corev1.Pod) error {
	wctx, cancel := context.WithTimeout(ctx, m.cfg.TerminatingWait)
	defer cancel()
	_, err := m.watchPod(wctx, pod, func(p *corev1.Pod) bool { return p == nil })
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return api.Classify(ctx.Err(), "wait for the old sandbox Pod to terminate")
	}
	if wctx.Err() != nil {
		return &api.Error{Kind: api.KindConflict, Detail: fmt.Sprintf(
			"sandbox %s is still terminating after %s; retry when it is gone", pod.Labels[keys.LabelID], m.cfg.TerminatingWait)}
	}
	return err
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
		last, err = m.watchReplicaSetPod(wctx, f.rs, settled)
	} else {
		last, err = m.watchPod(wctx, f.pod, settled)
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
		if r := m.eventReason(ctx, last); r != "" {
			sb.Reason = r
		}
	}
	if f.rs != nil && last == nil {
		sb.Reason = "the ReplicaSet has not created its Pod yet"
	}
	sb.WaitTimedOut = err != nil
	return sb, nil
}

// watchReplicaSetPod follows the Pods of a ReplicaSet sandbox (list, then
// watch, by label) until its current Pod satisfies done or ctx ends. A
// deleted Pod is not the end: the ReplicaSet makes another.
func (m *Manager) watchReplicaSetPod(ctx context.Context, rs *appsv1.ReplicaSet, done func(*corev1.Pod) bool) (*corev1.Pod, error) {
	selector := metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: resources.ReplicaSetSelector(rs.Labels[keys.LabelID])})
	pods := m.client.CoreV1().Pods(m.cfg.Namespace)
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return pods.List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	// The informer's store is the Pods as of each event: the current one is
	// picked from it afresh.
	var (
		store   cache.Store
		current *corev1.Pod
	)
	check := func(watch.Event) (bool, error) {
		var all []corev1.Pod
		for _, o := range store.List() {
			all = append(all, *o.(*corev1.Pod))
		}
		current = replicaSetPod(rs, all)
		return current != nil && done(current), nil
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(s cache.Store) (bool, error) {
		store = s
		return check(watch.Event{})
	}, check)
	if err != nil && ctx.Err() == nil {
		return current, api.Classify(err, "watch the sandbox's Pods")
	}
	return current, err
}

// eventReason is what the kubelet last warned about pod, "" when it said
// nothing or its Events cannot be read (the answer keeps the Pod's own).
func (m *Manager) eventReason(ctx context.Context, pod *corev1.Pod) string {
	events, err := m.client.CoreV1().Events(pod.Namespace).List(ctx, metav1.ListOptions{
		FieldSelector: "involvedObject.uid=" + string(pod.UID) + ",type=" + corev1.EventTypeWarning})
	if err != nil {
		return ""
	}
	return status.EventReason(events.Items)
}
