package resources

import (
	"strings"
	"testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestValidateIDBoundary(t *testing.T) {
	ok := strings.Repeat("a", api.MaxIDLen)
	if err := api.ValidateID(ok); err != nil {
		t.Errorf("api.ValidateID(%d chars) = %v", len(ok), err)
	}
	if got := len(ServiceName(ok)); got != 63 {
		t.Errorf("longest id gives a Service name of %d characters, want 63", got)
	}
	if err := api.ValidateID(ok + "a"); err == nil {
		t.Errorf("ValidateID accepted %d characters", len(ok)+1)
	}
}

// TestNames pins which Service belongs to a workload: its own, a slot that
// selects its token, or one that names no workload and selects no token
// (DeerFlow's provisioner's); never another's.
func TestNames(t *testing.T) {
	slot := func(token string) *corev1.Service {
		return &corev1.Service{Spec: corev1.ServiceSpec{Selector: ServiceSelector("x", token)}}
	}
	owned := func(kind, apiVersion string, uid types.UID) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{OwnerReferences: []metav1.OwnerReference{{Kind: kind, APIVersion: apiVersion, UID: uid}}}}
	}
	tests := []struct {
		name string
		svc  *corev1.Service
		want bool
	}{
		{"owned by the Pod", owned("Pod", "v1", "pod-1"), true},
		{"owned by the ReplicaSet", owned("ReplicaSet", "apps/v1", "pod-1"), true},
		{"owned by another Pod", owned("Pod", "v1", "pod-2"), false},
		{"owned by no workload", &corev1.Service{}, true},
		{"owned by something else only", owned("ConfigMap", "v1", "cm-1"), true},
		{"a slot selecting its token", slot("tok-1"), true},
		{"a slot selecting another token", slot("tok-2"), false},
	}
	w := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{UID: "pod-1", Labels: map[string]string{keys.LabelToken: "tok-1"}}}
	got := map[string]bool{}
	want := map[string]bool{}
	for _, tt := range tests {
		got[tt.name], want[tt.name] = Names(tt.svc, w), tt.want
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Names (-want +got):\n%s", diff)
	}
}
