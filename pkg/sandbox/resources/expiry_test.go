package resources

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

func TestExpiresAtIsTheEarlierDeadline(t *testing.T) {
	c := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	if got := ExpiresAt(c, c.Add(50*time.Minute), 20*time.Minute, time.Hour); !got.Equal(c.Add(time.Hour)) {
		t.Errorf("lifetime cap not applied: %s", got)
	}
	if got := ExpiresAt(c, c.Add(10*time.Minute), 20*time.Minute, time.Hour); !got.Equal(c.Add(30 * time.Minute)) {
		t.Errorf("idle deadline not applied: %s", got)
	}
}

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
		got[tc.name], want[tc.name] = ExpiryReason(tc.pod, base.Add(tc.at)), tc.want
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ExpiryReason (-want +got):\n%s", diff)
	}
}
