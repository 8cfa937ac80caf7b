package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

// TestCreateLeavesNothingWhenTheCountFails injects errors into the quota's
// count with client-go's fake clientset (a stand-in for the API server; the
// real one is in test/e2e): a create whose count was refused or failed
// removes its Pod and Service, so nothing lingers that no count admitted.
func TestCreateLeavesNothingWhenTheCountFails(t *testing.T) {
	olderPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: resources.PodName("older"), Namespace: "deer-flow", UID: "pod-older", Labels: resources.Labels(api.Spec{ID: "older"})}}
	olderSvc := resources.BuildService(testConfig(t, nil).Objects(), api.Spec{ID: "older"}, resources.PodOwnerRef(olderPod))
	olderSvc.CreationTimestamp = metav1.NewTime(time.Now().Add(-time.Hour))
	existing := []runtime.Object{olderPod, olderSvc}
	tests := []struct {
		name     string
		env      map[string]string
		objects  []runtime.Object
		cache    bool   // the Service cache runs (Manager.Run)
		failList string // the resource whose list fails
		wantKind api.Kind
	}{
		{name: "without the cache, the Services list fails", failList: "services", wantKind: api.KindUnavailable},
		{name: "without the cache, refused", env: map[string]string{"MAX_SANDBOXES": "1"}, objects: existing, wantKind: api.KindQuota},
		{name: "refused from the cache, which lists nothing more", env: map[string]string{"MAX_SANDBOXES": "1"}, objects: existing, cache: true,
			wantKind: api.KindQuota},
		{name: "at the limit, the ended Pods list fails", env: map[string]string{"MAX_SANDBOXES": "1"}, objects: existing, cache: true,
			failList: "pods", wantKind: api.KindUnavailable},
		{name: "per user, refused from the cache", env: map[string]string{"MAX_SANDBOXES_PER_USER": "1"}, objects: []runtime.Object{
			olderPod, func() *corev1.Service { s := olderSvc.DeepCopy(); s.Labels[keys.LabelUser] = "u"; return s }()}, cache: true, wantKind: api.KindQuota},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"}
			for k, v := range tc.env {
				env[k] = v
			}
			client := fake.NewClientset(tc.objects...)
			// The fake keeps no resourceVersions; the cache's freshness needs
			// them, increasing like etcd's revision.
			var rv atomic.Int64
			rv.Store(100)
			client.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				if o, err := meta.Accessor(a.(k8stesting.CreateAction).GetObject()); err == nil {
					o.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
				}
				return false, nil, nil
			})
			m := NewManager(testConfig(t, env), client)
			ctx, cancel := context.WithTimeout(api.WithCaller(context.Background(), api.Caller{Principal: "default"}), 10*time.Second)
			defer cancel()
			if tc.cache {
				m.Run(ctx)
				if !m.quota.Synced(ctx, 5*time.Second) {
					t.Fatal("the Service cache did not sync")
				}
				// Run starts the template watch too: its first list must be
				// over before the reactors below are added and count lists.
				if !cache.WaitForCacheSync(ctx.Done(), m.templates.HasSynced) {
					t.Fatal("the template watch did not sync")
				}
			}
			var lists []string
			client.PrependReactor("list", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
				lists = append(lists, a.GetResource().Resource)
				if a.GetResource().Resource == tc.failList {
					return true, nil, apierrors.NewServiceUnavailable("injected")
				}
				return false, nil, nil
			})
			_, err := m.Create(ctx, api.Spec{ID: "new1", UserID: "u", ThreadID: "t", IdleTimeout: time.Hour, MaxLifetime: time.Hour}, 0)
			if api.KindOf(err) != tc.wantKind {
				t.Fatalf("create: %v (kind %v), want kind %v", err, api.KindOf(err), tc.wantKind)
			}
			left := standing(t, client)
			var want []string
			for _, o := range tc.objects {
				switch o := o.(type) {
				case *corev1.Pod:
					want = append(want, "Pod "+o.Name)
				case *corev1.Service:
					want = append(want, "Service "+o.Name)
				}
			}
			if diff := cmp.Diff(want, left); diff != "" {
				t.Errorf("objects after the create (-want +got):\n%s", diff)
			}

			if tc.cache && slices.Contains(lists, "services") {
				t.Errorf("a count with the cache running listed Services: %v", lists)
			}
		})
	}
}

// TestCreateAgainWritesNoService: DeerFlow creates a sandbox again each
// time it reuses it. With a limit set (the default), the quota's Service cache shows the
// id's Service, so the create of it again writes no Service (whose refusal
// would cost the API server's admission and NodePort allocator) and is
// answered with the sandbox that exists; without the cache (no limit) it
// writes one, refused as AlreadyExists, as before. Client-go's fake
// clientset stands in for the API server.
func TestCreateAgainWritesNoService(t *testing.T) {
	for _, tc := range []struct {
		name           string
		env            map[string]string
		wantSvcCreates int
	}{
		{name: "with a limit: the cache answers", env: map[string]string{"MAX_SANDBOXES": "5", "SANDBOX_NETWORK_POLICY_ENSURE": "true"}, wantSvcCreates: 0},
		{name: "without a limit: no cache", env: map[string]string{"MAX_SANDBOXES": "0", "SANDBOX_NETWORK_POLICY_ENSURE": "true"}, wantSvcCreates: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			apiServerWrites(t, client)
			// Registered before the informers start (a reactor added while
			// they list is a data race): counts once the first create is done.
			var counting atomic.Bool
			var svcCreates atomic.Int32
			client.PrependReactor("create", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
				if counting.Load() {
					svcCreates.Add(1)
				}
				return false, nil, nil
			})
			m := NewManager(testConfig(t, tc.env), client)
			ctx, cancel := context.WithTimeout(api.WithCaller(context.Background(), api.Caller{Principal: "default"}), 10*time.Second)
			defer cancel()
			m.Run(ctx)
			s := api.Spec{ID: "again1", UserID: "u", ThreadID: "t", IdleTimeout: time.Hour, MaxLifetime: time.Hour}
			first, err := m.Create(ctx, s, 0)
			if err != nil {
				t.Fatal(err)
			}
			if m.quota.Synced(ctx, 5*time.Second) {
				// The cache holds the Service once its watch event came.
				_ = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
					return m.quota.Holds(resources.ServiceName(s.ID)), nil
				})
			}
			counting.Store(true)
			again, err := m.Create(ctx, s, 0)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(first, again); diff != "" {
				t.Errorf("the create again answered another sandbox (-first +again):\n%s", diff)
			}
			if n := int(svcCreates.Load()); n != tc.wantSvcCreates {
				t.Errorf("the create again wrote %d Services, want %d", n, tc.wantSvcCreates)
			}
		})
	}
}

// TestContendedQuotaAnswersItsRefusal: a create that racing creates keep
// refusing (the limit held by a sandbox seconds old, which may yet
// withdraw) retries a few rounds, and when the request's deadline ends
// them it answers the quota's refusal (429), not a timeout that blames the
// API server (504), and leaves nothing. Client-go's fake clientset stands
// in for the API server, each Service create slowed as on a busy one.
func TestContendedQuotaAnswersItsRefusal(t *testing.T) {
	young := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: resources.PodName("young"), Namespace: "deer-flow", UID: "pod-young",
		Labels: resources.Labels(api.Spec{ID: "young"}), ResourceVersion: "50"}}
	youngSvc := resources.BuildService(testConfig(t, nil).Objects(), api.Spec{ID: "young"}, resources.PodOwnerRef(young))
	youngSvc.CreationTimestamp, youngSvc.ResourceVersion = metav1.Now(), "51"
	for _, slow := range []time.Duration{0, 300 * time.Millisecond} {
		t.Run(fmt.Sprintf("Service creates take %s", slow), func(t *testing.T) {
			client := fake.NewClientset(young, youngSvc)
			apiServerWrites(t, client)
			client.PrependReactor("create", "services", func(k8stesting.Action) (bool, runtime.Object, error) {
				time.Sleep(slow)
				return false, nil, nil
			})
			m := NewManager(testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true", "MAX_SANDBOXES": "1"}), client)
			run, stop := context.WithCancel(context.Background())
			defer stop()
			m.Run(run)
			if !m.quota.Synced(run, 5*time.Second) || !cache.WaitForCacheSync(run.Done(), m.templates.HasSynced) {
				t.Fatal("the caches did not sync")
			}
			ctx, cancel := context.WithTimeout(api.WithCaller(context.Background(), api.Caller{Principal: "default"}), 700*time.Millisecond)
			defer cancel()
			_, err := m.Create(ctx, api.Spec{ID: "new1", UserID: "u", ThreadID: "t", IdleTimeout: time.Hour, MaxLifetime: time.Hour}, 0)
			if api.KindOf(err) != api.KindQuota {
				t.Errorf("create against a contended limit: %v (kind %v), want the quota's refusal", err, api.KindOf(err))
			}
			if diff := cmp.Diff([]string{"Pod " + young.Name, "Service " + youngSvc.Name}, standing(t, client)); diff != "" {
				t.Errorf("objects after the create (-want +got):\n%s", diff)
			}
		})
	}
}
