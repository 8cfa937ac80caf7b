package status

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStuckAndEventReason(t *testing.T) {
	at := func(min int) metav1.Time { return metav1.NewTime(time.Date(2026, 1, 1, 0, min, 0, 0, time.UTC)) }
	creating := &corev1.Pod{Spec: corev1.PodSpec{NodeName: "real"}, Status: corev1.PodStatus{Phase: corev1.PodPending,
		ContainerStatuses: []corev1.ContainerStatus{{Name: "sandbox", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}}}}}
	pulling := creating.DeepCopy()
	pulling.Status.ContainerStatuses[0].State.Waiting = &corev1.ContainerStateWaiting{Reason: "ErrImagePull", Message: "not found"}
	unscheduled := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}
	noHandler := corev1.Event{Type: corev1.EventTypeWarning, Reason: "FailedCreatePodSandBox", LastTimestamp: at(2),
		Message: `Failed to create pod sandbox: rpc error: code = Unknown desc = unable to get OCI runtime for sandbox "x": no runtime for "nosuch" is configured`}
	tests := []struct {
		name       string
		pod        *corev1.Pod
		events     []corev1.Event
		wantStuck  bool
		wantReason string
	}{
		{name: "created on its node, nothing said: the kubelet's newest warning", pod: creating, wantStuck: true,
			events: []corev1.Event{
				{Type: corev1.EventTypeNormal, Reason: "Scheduled", LastTimestamp: at(3)},
				{Type: corev1.EventTypeWarning, Reason: "FailedCreatePodSandBox", Message: "older", LastTimestamp: at(1)},
				noHandler,
			},
			wantReason: noHandler.Reason + ": " + noHandler.Message},
		{name: "no warning: nothing to add", pod: creating, wantStuck: true, events: []corev1.Event{{Type: corev1.EventTypeNormal, Reason: "Pulled"}}},
		{name: "the container says why itself", pod: pulling, wantStuck: false, events: []corev1.Event{noHandler}, wantReason: noHandler.Reason + ": " + noHandler.Message},
		{name: "not scheduled", pod: unscheduled, wantStuck: false},
		{name: "deleted", pod: nil, wantStuck: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := struct {
				Stuck  bool
				Reason string
			}{Stuck(tc.pod), EventReason(tc.events)}
			want := struct {
				Stuck  bool
				Reason string
			}{tc.wantStuck, tc.wantReason}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
