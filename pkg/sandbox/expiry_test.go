package sandbox

import (
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestExpiryReason(t *testing.T) {
	base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(lastActivity time.Duration, phase corev1.PodPhase, annotated bool) *corev1.Pod {
		p := &corev1.Pod{Status: corev1.PodStatus{Phase: phase}}
		if annotated {
			p.ObjectMeta = metav1.ObjectMeta{Annotations: map[string]string{
				keys.AnnotationCreatedAt:    base.Format(time.RFC3339),
				keys.AnnotationLastActivity: base.Add(lastActivity).Format(time.RFC3339),
				keys.AnnotationIdleTimeout:  "600",  // 10 minutes
				keys.AnnotationMaxLifetime:  "3600", // 1 hour
			}}
		}
		return p
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		at   time.Duration
		want string
	}{
		{"fresh", pod(0, corev1.PodRunning, true), 5 * time.Minute, ""},
		{"idle", pod(0, corev1.PodRunning, true), 10 * time.Minute, "idle"},
		{"touched in time", pod(8*time.Minute, corev1.PodRunning, true), 15 * time.Minute, ""},
		{"over its lifetime although active", pod(59*time.Minute, corev1.PodRunning, true), time.Hour, "lifetime"},
		{"ended", pod(0, corev1.PodFailed, true), time.Minute, "ended"},
		{"not ours and running: never", pod(0, corev1.PodRunning, false), 100 * time.Hour, ""},
		{"not ours but ended", pod(0, corev1.PodSucceeded, false), time.Minute, "ended"},
	}
	got, want := map[string]string{}, map[string]string{}
	for _, tc := range tests {
		got[tc.name], want[tc.name] = expiryReason(tc.pod, base.Add(tc.at)), tc.want
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("expiryReason (-want +got):\n%s", diff)
	}
}
