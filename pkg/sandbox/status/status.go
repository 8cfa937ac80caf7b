// Package status reads a sandbox Pod's Kubernetes status as the provisioner
// reports it: whether it is ready, since when, and what it is stuck on. Pure
// functions of the objects, like the builders.
package status

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// Ready reports whether the Pod serves: running, not being deleted, and
// its Ready condition true.
func Ready(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ReadySince is when the Pod became ready (now if it does not say).
func ReadySince(pod *corev1.Pod) time.Time {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady && !c.LastTransitionTime.IsZero() {
			return c.LastTransitionTime.Time
		}
	}
	return time.Now()
}

// NotReadyReason says what a Pod is stuck on, in the terms kubectl shows.
func NotReadyReason(pod *corev1.Pod) string {
	if pod == nil {
		return "the Pod was deleted"
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return strings.TrimSpace(fmt.Sprintf("%s: %s", orDefault(c.Reason, "Unschedulable"), c.Message))
		}
	}
	for _, cs := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
			return strings.TrimSpace(fmt.Sprintf("container %s: %s: %s", cs.Name, w.Reason, w.Message))
		}
		if t := cs.State.Terminated; t != nil {
			return fmt.Sprintf("container %s terminated: %s (exit code %d)", cs.Name, t.Reason, t.ExitCode)
		}
	}
	if pod.Status.Reason != "" {
		return fmt.Sprintf("Pod is %s: %s %s", pod.Status.Phase, pod.Status.Reason, pod.Status.Message)
	}
	if pod.Spec.NodeName == "" {
		return "the Pod is not scheduled yet"
	}
	return fmt.Sprintf("the Pod is %s on node %s and not ready yet", orDefault(string(pod.Status.Phase), "Pending"), pod.Spec.NodeName)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// Stuck reports whether NotReadyReason could say no more than that the Pod
// is on its node and not ready: what the kubelet refused then (a runtime
// handler it lacks, a sandbox it cannot create) is only in its Events.
func Stuck(pod *corev1.Pod) bool {
	return pod != nil && pod.Spec.NodeName != "" && pod.Status.Phase == corev1.PodPending && pod.Status.Reason == "" &&
		strings.HasPrefix(NotReadyReason(pod), "the Pod is ")
}

// EventReason is the newest Warning among a Pod's Events, as
// "Reason: message", or "" when there is none.
func EventReason(events []corev1.Event) string {
	var newest *corev1.Event
	for i, e := range events {
		if e.Type != corev1.EventTypeWarning {
			continue
		}
		if newest == nil || lastSeen(e).After(lastSeen(*newest)) {
			newest = &events[i]
		}
	}
	if newest == nil {
		return ""
	}
	return strings.TrimSpace(newest.Reason + ": " + newest.Message)
}

func lastSeen(e corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case e.Series != nil:
		return e.Series.LastObservedTime.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.FirstTimestamp.Time
}
