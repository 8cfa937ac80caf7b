package resources

import (
	"encoding/json"
	"maps"
	"slices"
	"sort"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/status"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Paused reports whether a ReplicaSet sandbox is scaled to zero.
func Paused(rs *appsv1.ReplicaSet) bool { return rs.Spec.Replicas != nil && *rs.Spec.Replicas == 0 }

// BuildReplicaSet returns the sandbox of a ReplicaSet template: a ReplicaSet
// sandbox-<id> of one Pod, which the ReplicaSet controller recreates when it
// is deleted or evicted. The Pod is BuildPod's, without
// activeDeadlineSeconds: a Pod ended by its deadline would only be replaced,
// so expiry is the reap deleting the ReplicaSet. Lifecycle annotations live
// on the ReplicaSet, which outlives its Pods.
func BuildReplicaSet(cfg config.Objects, s api.Spec) *appsv1.ReplicaSet {
	pod := BuildPodFor(cfg, s)
	pod.Spec.ActiveDeadlineSeconds = nil
	rsAnnotations := maps.Clone(pod.Annotations)
	idleAction, pausedTimeout := template.IdleDelete, time.Duration(0)
	if s.Resolved != nil {
		idleAction, pausedTimeout = s.Resolved.IdleAction, s.Resolved.PausedTimeout
	}
	rsAnnotations[keys.AnnotationIdleAction] = idleAction
	if idleAction == template.IdlePause {
		rsAnnotations[keys.AnnotationPausedTimeout] = strconv.FormatInt(int64(pausedTimeout/time.Second), 10)
		if s.AutoResume {
			rsAnnotations[keys.AnnotationAutoResume] = "true"
		}
	}
	podAnnotations := maps.Clone(pod.Annotations)
	delete(podAnnotations, keys.AnnotationLastActivity)
	delete(podAnnotations, keys.AnnotationExpiresAt)
	pod.Labels[keys.LabelWorkload] = keys.WorkloadReplicaSetValue
	delete(pod.Labels, keys.LabelPod) // its Pods are named by the ReplicaSet controller
	rs := &appsv1.ReplicaSet{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
		ObjectMeta: metav1.ObjectMeta{Name: PodName(s.ID), Namespace: cfg.Namespace, Labels: Labels(s), Annotations: rsAnnotations},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To(int32(1)),
			Selector: &metav1.LabelSelector{MatchLabels: ReplicaSetSelector(s.ID)},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels, Annotations: podAnnotations},
				Spec:       pod.Spec,
			},
		},
	}
	RecordPrincipal(rs, s)
	return rs
}

// ReplicaSetSelector selects the Pods of ReplicaSet sandbox id, and never a
// bare sandbox Pod of the same id.
func ReplicaSetSelector(id string) map[string]string {
	return map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: id, keys.LabelWorkload: keys.WorkloadReplicaSetValue}
}

// ReplicaSetOwnerRef makes the ReplicaSet the owner of the sandbox's Service.
func ReplicaSetOwnerRef(rs *appsv1.ReplicaSet) metav1.OwnerReference {
	return metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, BlockOwnerDeletion: ptr.To(false)}
}

// CurrentPod picks the ReplicaSet's current Pod out of its live Pods
// (controlled): Ready first, then the newest.
func CurrentPod(controlled []*corev1.Pod) *corev1.Pod {
	if len(controlled) == 0 {
		return nil
	}
	mine := slices.Clone(controlled)
	sort.Slice(mine, func(i, j int) bool {
		if status.Ready(mine[i]) != status.Ready(mine[j]) {
			return status.Ready(mine[i])
		}
		return mine[j].CreationTimestamp.Before(&mine[i].CreationTimestamp)
	})
	return mine[0]
}

// ControlledPods keeps the live Pods of pods that rs controls (by UID).
func ControlledPods(rs *appsv1.ReplicaSet, pods []corev1.Pod) []*corev1.Pod {
	var mine []*corev1.Pod
	for i := range pods {
		if p := &pods[i]; p.DeletionTimestamp == nil && metav1.IsControlledBy(p, rs) {
			mine = append(mine, p)
		}
	}
	return mine
}

// ScalePatch is the merge patch that pauses (replicas 0) or resumes
// (replicas 1) the sandbox ReplicaSet rs at now: paused-at set or removed;
// on resume the idle clock restarts (last activity now, expires-at
// again), so the reap does not pause it at once. The patch names rs's UID,
// which the API server refuses to change (so it applies to rs alone, not a
// ReplicaSet of the name made since), and with ifUnchanged its
// resourceVersion too.
func ScalePatch(rs *appsv1.ReplicaSet, replicas int32, ifUnchanged bool, now time.Time) []byte {
	now = now.UTC().Truncate(time.Second)
	ann := map[string]any{keys.AnnotationPausedAt: now.Format(time.RFC3339)}
	if replicas > 0 {
		ann = map[string]any{keys.AnnotationPausedAt: nil}
		if lt, ok := LifetimeOf(rs); ok {
			lt.LastActivity = now
			ann[keys.AnnotationLastActivity] = lt.LastActivity.Format(time.RFC3339)
			ann[keys.AnnotationExpiresAt] = lt.ExpiresAt().Format(time.RFC3339)
		}
	}
	meta := map[string]any{"annotations": ann, "uid": rs.UID}
	if ifUnchanged {
		meta["resourceVersion"] = rs.ResourceVersion
	}
	patch, _ := json.Marshal(map[string]any{"metadata": meta, "spec": map[string]any{"replicas": replicas}}) // maps of strings and numbers always marshal
	return patch
}
