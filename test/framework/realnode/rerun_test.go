package realnode

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSplitRule: a POSTROUTING rule as iptables-save lists it becomes the
// arguments that delete it, the bridge plugin's quoted comment one of them.
func TestSplitRule(t *testing.T) {
	line := `POSTROUTING -s 10.88.0.5/32 -m comment --comment "name: \"real-node\" id: \"0123abcd\"" -j CNI-7d0e1a2b3c4d5e6f7a8b9c0d`
	want := []string{"POSTROUTING", "-s", "10.88.0.5/32", "-m", "comment", "--comment", `name: "real-node" id: "0123abcd"`, "-j", "CNI-7d0e1a2b3c4d5e6f7a8b9c0d"}
	if got := splitRule(line); !slices.Equal(got, want) {
		t.Fatalf("splitRule:\n got %q\nwant %q", got, want)
	}
}

// TestHeartbeatSince: a Ready condition an earlier kubelet wrote does not
// count; one written in the second Up began (times have whole seconds) does.
func TestHeartbeatSince(t *testing.T) {
	since := time.Date(2026, 11, 26, 10, 0, 0, 700_000_000, time.UTC)
	at := func(d time.Duration) corev1.NodeCondition {
		return corev1.NodeCondition{Type: corev1.NodeReady, LastHeartbeatTime: metav1.NewTime(since.Truncate(time.Second).Add(d))}
	}
	if heartbeatSince(at(-time.Second), since) {
		t.Error("a heartbeat a second before Up counted")
	}
	if !heartbeatSince(at(0), since) || !heartbeatSince(at(3*time.Second), since) {
		t.Error("a heartbeat from Up's second or later did not count")
	}
}
