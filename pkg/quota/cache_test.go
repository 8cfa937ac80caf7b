package quota

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// revisions makes the fake clientset give every create the next
// resourceVersion from 100, as etcd gives every write the next revision
// (the fake keeps none).
func revisions(client *fake.Clientset) {
	var rv atomic.Int64
	rv.Store(100)
	client.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o, err := meta.Accessor(a.(k8stesting.CreateAction).GetObject()); err == nil {
			o.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
		}
		return false, nil, nil
	})
}

// TestSlotsBoundedBy: the quota may skip waiting for its own Service's
// watch event only when the cached Services plus every etcd revision
// since the cache's newest could not exceed the limit. Every version here
// comes from a write sequence (one revision per write, as etcd's) and
// reaches the cache through its watch, as in a replica: sandbox Services,
// then, while the cache is stopped (it has not seen them yet), other
// writes and the create's own Service.
func TestSlotsBoundedBy(t *testing.T) {
	tests := []struct {
		name   string
		cached int // sandbox Services written before, and seen by, the cache
		// ownAt, when not 0, makes the create's own Service the ownAt-th of
		// those the cache saw; otherwise it is written after the cache
		// stopped, following other (non-sandbox) writes.
		ownAt  int
		others int
		limit  int
		want   bool
	}{
		{name: "room for every write since", cached: 3, others: 4, limit: 8, want: true}, // 3 cached + 5 revisions since
		{name: "one write too many could have been a sandbox", cached: 3, others: 5, limit: 8, want: false},
		{name: "own already seen: the cache alone", cached: 8, ownAt: 5, limit: 8, want: true},
		{name: "own already seen, over", cached: 9, ownAt: 5, limit: 8, want: false},
		{name: "no version seen yet", cached: 0, others: 0, limit: 500, want: false},
		{name: "no limit", cached: 1, others: 0, limit: 0, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewClientset()
			revisions(client)
			ctx := context.Background()
			svc := func(id string) *corev1.Service {
				s, err := client.CoreV1().Services("deer-flow").Create(ctx, resources.BuildService(testConfig(t, nil).Objects(), api.Spec{ID: id},
					resources.PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: resources.PodName(id)}})), metav1.CreateOptions{})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			var own *corev1.Service
			for i := range tt.cached {
				if s := svc(fmt.Sprintf("s%d", i)); i+1 == tt.ownAt {
					own = s
				}
			}
			s := newServiceCache(client, "deer-flow")
			rctx, stop := context.WithCancel(ctx)
			stopped := make(chan struct{})
			go func() { s.run(rctx); close(stopped) }()
			if !s.synced(ctx, 5*time.Second) || s.size() != tt.cached {
				t.Fatalf("the cache did not fill: %d of %d", s.size(), tt.cached)
			}
			stop()
			<-stopped
			if own == nil {
				for i := range tt.others {
					if _, err := client.CoreV1().ConfigMaps("deer-flow").Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("other-%d", i)}}, metav1.CreateOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				own = svc("own")
			}
			if got := s.boundedBy(own, tt.limit); got != tt.want {
				s.mu.Lock()
				seen := s.rv
				s.mu.Unlock()
				t.Errorf("boundedBy = %v, want %v (cache: %d Services, newest version seen %d; own version %s)", got, tt.want, s.size(), seen, own.ResourceVersion)
			}
		})
	}
}

// TestSlotsBoundedByNeedsARevision: a resourceVersion is opaque to
// clients; one that is no number (not etcd's revision) never lets a create
// skip its wait, however much room the cache shows.
func TestSlotsBoundedByNeedsARevision(t *testing.T) {
	client := fake.NewClientset()
	revisions(client)
	if _, err := client.CoreV1().Services("deer-flow").Create(context.Background(), resources.BuildService(testConfig(t, nil).Objects(), api.Spec{ID: "s0"},
		resources.PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: resources.PodName("s0")}})), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := newServiceCache(client, "deer-flow")
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go s.run(ctx)
	if !s.synced(ctx, 5*time.Second) {
		t.Fatal("the cache did not fill")
	}
	got := map[string]bool{}
	for _, v := range []string{"abc", "", "-1", "102"} {
		got[v] = s.boundedBy(&corev1.Service{ObjectMeta: metav1.ObjectMeta{ResourceVersion: v}}, 500)
	}
	if diff := cmp.Diff(map[string]bool{"abc": false, "": false, "-1": false, "102": true}, got); diff != "" {
		t.Errorf("boundedBy by own version (-want +got):\n%s", diff)
	}
}
