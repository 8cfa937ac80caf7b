package sandbox

import (
	"context"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/follow"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// ensureReplicaSet creates the ReplicaSet or adopts the existing one (for
// the same user and thread); a paused one is resumed, so DeerFlow's create
// on a paused sandbox brings it back.
//
// Its caller (fill) has claimed the sandbox's ids first, as for ensurePod.
func (m *Manager) ensureReplicaSet(ctx context.Context, s api.Spec) (*appsv1.ReplicaSet, bool, error) {
	want := resources.BuildReplicaSet(m.cfg.Objects(), s)
	rss := m.client.AppsV1().ReplicaSets(m.cfg.Namespace)
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		created, err := rss.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return created, false, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, false, m.undoUncertain(ctx, err, want, m.createFailed(err, "ReplicaSet", s))
		}
		existing, err := rss.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, false, api.Classify(err, "read the existing sandbox ReplicaSet")
		}
		existing, err = m.reuseReplicaSet(ctx, existing, s)
		return existing, true, err
	}
	return nil, false, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " is being created and deleted concurrently; retry"}
}

// reuseReplicaSet hands an existing ReplicaSet sandbox to a create: only to
// its own user and thread, with enough capacity, resumed if paused.
func (m *Manager) reuseReplicaSet(ctx context.Context, rs *appsv1.ReplicaSet, s api.Spec) (*appsv1.ReplicaSet, error) {
	if err := resources.CheckOwner(rs, "ReplicaSet", s); err != nil {
		return nil, err
	}
	if rs.DeletionTimestamp != nil {
		return nil, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " is being deleted; retry in a moment"}
	}
	if err := resources.CheckCapacity(rs, s); err != nil {
		return nil, err
	}
	if resources.Paused(rs) {
		return m.scale(ctx, rs, 1, false)
	}
	return rs, nil
}

// scale pauses (0) or resumes (1) a ReplicaSet sandbox with one patch that
// also records when it was paused, or that resuming is activity. The patch
// carries the ReplicaSet's UID, so it never acts on a ReplicaSet deleted and
// created again under the name meanwhile (perhaps another principal's): the
// API server refuses a patch that would change the UID. A request to pause
// or resume states the outcome it wants, so its patch applies whatever
// else changed since (the controller's status writes would make a
// resourceVersion precondition fail for nothing); the reap's patch
// (ifUnchanged) carries the resourceVersion it judged too, so a sandbox
// used since is not paused.
func (m *Manager) scale(ctx context.Context, rs *appsv1.ReplicaSet, replicas int32, ifUnchanged bool) (*appsv1.ReplicaSet, error) {
	patch := resources.ScalePatch(rs, replicas, ifUnchanged, time.Now())
	out, err := m.client.AppsV1().ReplicaSets(m.cfg.Namespace).Patch(ctx, rs.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		if apierrors.IsConflict(err) || api.UIDChanged(err) {
			return nil, &api.Error{Kind: api.KindConflict, Err: err, Detail: "sandbox " + rs.Labels[keys.LabelID] + " changed while being paused or resumed; retry"}
		}
		return nil, api.Classify(err, "scale the sandbox ReplicaSet")
	}
	return out, nil
}

// currentPodOf finds the current Pod of one ReplicaSet sandbox (one call).
func (m *Manager) currentPodOf(ctx context.Context, rs *appsv1.ReplicaSet) (*corev1.Pod, error) {
	pods, err := m.replicaSetPods(ctx, rs)
	return resources.CurrentPod(pods), err
}

// replicaSetPods lists the live Pods that rs controls (one call, by label),
// from the API server's storage: never a cached answer that may miss one
// its controller just made.
func (m *Manager) replicaSetPods(ctx context.Context, rs *appsv1.ReplicaSet) ([]*corev1.Pod, error) {
	list, err := m.client.CoreV1().Pods(m.cfg.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: resources.ReplicaSetSelector(rs.Labels[keys.LabelID])})})
	if err != nil {
		return nil, api.Classify(err, "list the sandbox's Pods")
	}
	return resources.ControlledPods(rs, list.Items), nil
}

// drainWait bounds a pause's wait for the controller to mark the Pod for
// deletion (milliseconds): answered before, the Pod still took traffic that
// the router should have woken the sandbox for, and its deletion cut it.
var drainWait = 10 * time.Second

// awaitDrained holds a watch, so takes a wait token; none free, no wait.
func (m *Manager) awaitDrained(ctx context.Context, rs *appsv1.ReplicaSet) {
	c, _ := api.CallerFrom(ctx)
	if release, err := m.admitWait(c.Principal, drainWait); err == nil {
		defer release()
		_, _ = follow.Drained(ctx, m.client.CoreV1().Pods(m.cfg.Namespace), rs, drainWait) // late: paused all the same
	}
}

// Pause scales a ReplicaSet sandbox to zero: its Pod goes, its Service, URL
// and data stay, and it reports Paused. Pausing a paused sandbox is a no-op.
func (m *Manager) Pause(ctx context.Context, id string) (api.Sandbox, error) {
	sb, err := m.setPaused(ctx, id, true, 0)
	m.audit.Record(ctx, "pause", id, api.Outcome(err), err)
	return sb, err
}

// Resume scales a paused ReplicaSet sandbox back to one Pod, at the same
// URL. With wait > 0 it waits for the Pod to be Ready.
func (m *Manager) Resume(ctx context.Context, id string, wait time.Duration) (api.Sandbox, error) {
	sb, err := m.setPaused(ctx, id, false, wait)
	m.audit.Record(ctx, "resume", id, api.Outcome(err), err)
	return sb, err
}

func (m *Manager) setPaused(ctx context.Context, id string, pause bool, wait time.Duration) (api.Sandbox, error) {
	f, release, err := m.lookup(ctx, id, wait)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer release()
	switch {
	case f.rs == nil && f.pod != nil:
		return api.Sandbox{}, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " is a bare Pod, which cannot be paused or resumed; create sandboxes from a template of kind ReplicaSet for that"}
	case f.rs == nil:
		return api.Sandbox{}, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " has only its Service left, nothing to pause or resume; create it again"}
	}
	if resources.Paused(f.rs) != pause {
		replicas, verb, event := int32(1), "resumed", "SandboxResumed"
		if pause {
			replicas, verb, event = 0, "paused", "SandboxPaused"
		}
		if f.rs, err = m.scale(ctx, f.rs, replicas, false); err != nil {
			return api.Sandbox{}, err
		}
		m.recorder.Eventf(f.rs, corev1.EventTypeNormal, event, "Sandbox %s %s", id, verb)
	}
	if pause {
		m.awaitDrained(ctx, f.rs)
		f.pod = nil
	} else if wait > 0 {
		return m.waitReady(ctx, id, f, wait)
	}
	return m.view(id, f), nil
}
