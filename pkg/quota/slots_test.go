package quota

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
)

// TestSlotsBoundedBy: the quota may skip waiting for its own Service's
// watch event only when the cached Services plus every etcd revision
// since the cache's newest could not exceed the limit.
func TestSlotsBoundedBy(t *testing.T) {
	tests := []struct {
		name   string
		cached int    // sandbox Services in the cache
		seen   uint64 // the newest version its handlers reported
		own    string // the create's own Service's version
		limit  int
		want   bool
	}{
		{name: "room for every write since", cached: 3, seen: 100, own: "105", limit: 8, want: true},
		{name: "one write too many could have been a sandbox", cached: 3, seen: 100, own: "106", limit: 8, want: false},
		{name: "own already seen: the cache alone", cached: 8, seen: 120, own: "105", limit: 8, want: true},
		{name: "own already seen, over", cached: 9, seen: 120, own: "105", limit: 8, want: false},
		{name: "no version seen yet", cached: 0, seen: 0, own: "5", limit: 500, want: false},
		{name: "no limit", cached: 0, seen: 100, own: "101", limit: 0, want: false},
		{name: "a version that is no revision", cached: 0, seen: 100, own: "abc", limit: 500, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var objs []runtime.Object
			for i := range tt.cached {
				id := fmt.Sprintf("s%d", i)
				objs = append(objs, resources.BuildService(testConfig(t, nil), api.Spec{ID: id}, resources.PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: resources.PodName(id)}})))
			}
			s := newSlots(fake.NewClientset(objs...), "deer-flow")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go s.run(ctx)
			if !s.synced(ctx, 5*time.Second) || s.size() != tt.cached {
				t.Fatalf("the cache did not fill: %d of %d", s.size(), tt.cached)
			}
			s.mu.Lock()
			s.rv = tt.seen // the fake keeps no versions
			s.mu.Unlock()
			own := &corev1.Service{ObjectMeta: metav1.ObjectMeta{ResourceVersion: tt.own}}
			if got := s.boundedBy(own, tt.limit); got != tt.want {
				t.Errorf("boundedBy = %v, want %v", got, tt.want)
			}
		})
	}
}
