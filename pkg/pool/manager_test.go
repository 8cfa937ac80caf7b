package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// TestManagerServesFromThePool drives sandbox.Manager with a pool over a
// fake clientset: a create claims the Ready pooled Pod and gives it a
// Service; get, list, a create again and destroy treat it as the sandbox;
// the other pooled Pod is no sandbox; a request the pool cannot serve, or
// one with the pool empty, starts cold.
func TestManagerServesFromThePool(t *testing.T) {
	cfg, tmpl, cs := claimCluster(t, true, false)
	var c counts
	p := newPool(cfg, cs, &c, tmpl)
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(p))
	ctx := alice
	spec := func(id string, mutate func(*api.CreateRequest)) api.Spec {
		return claimSpec(t, cfg, id, mutate)
	}

	sb, err := m.Create(ctx, spec("abc", nil), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Pooled || sb.URL == "" || sb.Status != "Running" {
		t.Fatalf("create: %+v; want a pooled, Running sandbox with a URL", sb)
	}
	claimed, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-pool-warm-aaaaa", metav1.GetOptions{})
	if err != nil || claimed.Annotations[keys.AnnotationPrincipal] != "alice" || claimed.Labels[keys.LabelPrincipal] != resources.PrincipalLabelValue("alice") {
		t.Fatalf("claimed Pod: %v %v; want it to record its principal alice", err, claimed.ObjectMeta)
	}
	// Another principal does not see it, nor can it take the id.
	bob := api.WithCaller(context.Background(), api.Caller{Principal: "bob"})
	if _, err := m.Get(bob, "abc", 0); api.KindOf(err) != api.KindNotFound {
		t.Errorf("get by another principal: %v; want not found", err)
	}
	if _, err := m.Create(bob, spec("abc", nil), 0); api.KindOf(err) != api.KindConflict {
		t.Errorf("create of the id by another principal: %v; want a conflict", err)
	}
	svc, err := cs.CoreV1().Services(ns).Get(ctx, "sandbox-abc-svc", metav1.GetOptions{})
	if err != nil || len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].Name != "sandbox-pool-warm-aaaaa" {
		t.Fatalf("Service: %v %+v; want owned by the claimed Pod", err, svc)
	}
	if got, err := m.Get(ctx, "abc", 0); err != nil || !got.Pooled || got.URL != sb.URL {
		t.Errorf("get: %+v %v", got, err)
	}
	again, err := m.Create(ctx, spec("abc", nil), 0)
	if err != nil || again.URL != sb.URL || !again.Pooled {
		t.Errorf("create again: %+v %v; want the same sandbox", again, err)
	}
	list, err := m.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "abc" {
		t.Errorf("list: %+v %v; want only abc (the unclaimed pooled Pod is no sandbox)", list, err)
	}
	// Nothing Ready left: cold, in the same call.
	cold, err := m.Create(ctx, spec("def", nil), 0)
	if err != nil || cold.Pooled {
		t.Errorf("create with the pool empty: %+v %v; want a cold sandbox", cold, err)
	}
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-def", metav1.GetOptions{}); err != nil {
		t.Errorf("cold Pod: %v", err)
	}
	// A request the pool cannot serve: cold, counted as a miss.
	shells, err := m.Create(ctx, spec("ghi", func(r *api.CreateRequest) { n := 2; r.MaxShellSessions = &n }), 0)
	if err != nil || shells.Pooled {
		t.Errorf("create with max_shell_sessions: %+v %v; want cold", shells, err)
	}
	if err := m.Destroy(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-pool-warm-aaaaa", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("claimed Pod after destroy: %v; want gone", err)
	}
	if _, err := m.Get(ctx, "abc", 0); api.KindOf(err) != api.KindNotFound {
		t.Errorf("get after destroy: %v; want not found", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m["warm/hit"] != 1 || c.m["warm/empty"] != 1 || c.m["warm/miss"] != 1 {
		t.Errorf("observed %v; want one hit, one empty, one miss", c.m)
	}
}

// TestClaimWhoseServiceFailsSpendsNoPod: a claim makes its Service before
// it touches a pooled Pod, so a Service that cannot be made leaves the Pod
// in the pool, unclaimed, and the create fails with a transient error.
func TestClaimWhoseServiceFailsSpendsNoPod(t *testing.T) {
	cfg, tmpl, cs := claimCluster(t, true)
	cs.PrependReactor("create", "services", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd is away")
	})
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
	if _, err := m.Create(alice, claimSpec(t, cfg, "abc", nil), 0); api.KindOf(err) != api.KindUnavailable {
		t.Fatalf("create with the Service refused: %v; want unavailable", err)
	}
	pod, err := cs.CoreV1().Pods(ns).Get(context.Background(), "sandbox-pool-warm-aaaaa", metav1.GetOptions{})
	if err != nil || pod.Labels[keys.LabelID] != "" || pod.Labels[keys.LabelPool] == "" {
		t.Errorf("pooled Pod after the failed create: %v %v; want it still in the pool, unclaimed", err, pod.GetLabels())
	}
}

// TestClaimWritesItsServiceFirst: the Service is written before the claim
// patch (the order that keeps the refill's start off the Service create),
// owned by the Pod the claim then takes; when that Pod was taken by
// another claim meanwhile, the Service goes with the Pod claimed instead;
// when no Pod is left, the Service goes and the create is cold.
func TestClaimWritesItsServiceFirst(t *testing.T) {
	tests := []struct {
		name      string
		takeFirst bool // another replica claims the first Pod tried, just before us
		pods      int
		wantPod   string // "" for a cold create
	}{
		{name: "one Pod", pods: 1, wantPod: "sandbox-pool-warm-aaaaa"},
		{name: "the first Pod taken, the second claimed", pods: 2, takeFirst: true},
		{name: "the only Pod taken: cold", pods: 1, takeFirst: true, wantPod: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, tmpl, cs := claimCluster(t, []bool{true, true}[:tt.pods]...)
			var (
				mu    sync.Mutex
				order []string
				taken string
			)
			cs.PrependReactor("*", "*", func(a clienttesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				switch {
				case a.GetVerb() == "create" && a.GetResource().Resource == "services":
					order = append(order, "create Service")
				case a.GetVerb() == "update" && a.GetResource().Resource == "services":
					order = append(order, "update Service")
				case a.GetVerb() == "patch" && a.GetResource().Resource == "pods":
					name := a.(clienttesting.PatchAction).GetName()
					if tt.takeFirst && taken == "" {
						// Another replica's claim lands first: the Pod now
						// carries another id, and our conditional patch fails.
						taken = name
						obj, _ := cs.Tracker().Get(podsGVR, ns, name)
						pod := obj.(*corev1.Pod).DeepCopy()
						delete(pod.Labels, keys.LabelPool)
						pod.Labels[keys.LabelID], pod.ResourceVersion = "other", "99"
						if err := cs.Tracker().Update(podsGVR, pod, ns); err != nil {
							t.Error(err)
						}
					}
					order = append(order, "claim "+name)
				}
				return false, nil, nil
			})
			m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
			sb, err := m.Create(alice, claimSpec(t, cfg, "abc", nil), 0)
			if err != nil {
				t.Fatal(err)
			}
			want := tt.wantPod
			if tt.takeFirst && tt.pods > 1 {
				want = map[string]string{"sandbox-pool-warm-aaaaa": "sandbox-pool-warm-bbbbb", "sandbox-pool-warm-bbbbb": "sandbox-pool-warm-aaaaa"}[taken]
			}
			svc, err := cs.CoreV1().Services(ns).Get(context.Background(), "sandbox-abc-svc", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			owner := "sandbox-abc"
			if want != "" {
				owner = want
			}
			if sb.Pooled != (want != "") || len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].Name != owner {
				t.Errorf("pooled %v, Service owned by %v; want pooled %v, owned by %s", sb.Pooled, svc.OwnerReferences, want != "", owner)
			}
			var wantOrder []string
			switch {
			case want == "":
				// Then the cold way's: its slot, and the slot bound to its Pod.
				wantOrder = []string{"create Service", "claim " + taken, "create Service", "update Service"}
			case taken != "":
				// Made again for the Pod claimed instead: an unwired Pod's
				// Service selects that Pod's name (its pin), which no
				// update may change (issue 45).
				wantOrder = []string{"create Service", "claim " + taken, "create Service", "claim " + want}
			default:
				wantOrder = []string{"create Service", "claim " + want}
			}
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff(wantOrder, order); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestClaimWaitsForItsServicesSlice: between the Service and the claim,
// a claim waits until the EndpointSlice controller's first slice of the
// Service is there (a stand-in writes it here, 50 ms after the Service),
// so that the controller's next sync, for the claimed Pod, does not find
// its cache stale and retry a second later; without a slice it claims
// after a short bound all the same.
func TestClaimWaitsForItsServicesSlice(t *testing.T) {
	for _, written := range []bool{true, false} {
		t.Run(fmt.Sprintf("slice written %v", written), func(t *testing.T) {
			cfg, tmpl, cs := claimCluster(t, true)
			var (
				mu    sync.Mutex
				order []string
			)
			note := func(what string) {
				mu.Lock()
				defer mu.Unlock()
				order = append(order, what)
			}
			cs.PrependReactor("create", "services", func(a clienttesting.Action) (bool, runtime.Object, error) {
				note("Service")
				if written {
					name := a.(clienttesting.CreateAction).GetObject().(*corev1.Service).Name
					go func() {
						time.Sleep(50 * time.Millisecond)
						note("slice")
						es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name + "-x1", Namespace: ns,
							Labels: map[string]string{discoveryv1.LabelServiceName: name}}, AddressType: discoveryv1.AddressTypeIPv4}
						if _, err := cs.DiscoveryV1().EndpointSlices(ns).Create(context.Background(), es, metav1.CreateOptions{}); err != nil {
							t.Error(err)
						}
					}()
				}
				return false, nil, nil
			})
			cs.PrependReactor("patch", "pods", func(clienttesting.Action) (bool, runtime.Object, error) {
				note("claim")
				return false, nil, nil
			})
			m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
			if sb, err := m.Create(alice, claimSpec(t, cfg, "abc", nil), 0); err != nil || !sb.Pooled {
				t.Fatalf("create: %+v %v; want it from the pool", sb, err)
			}
			want := []string{"Service", "claim"}
			if written {
				want = []string{"Service", "slice", "claim"}
			}
			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff(want, order); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestQuotaRefusalSpendsNoPooledPod: the quota counts the claim's Service
// before its Pod is claimed, so a refused create leaves the pool whole.
func TestQuotaRefusalSpendsNoPooledPod(t *testing.T) {
	cfg, tmpl, cs := claimCluster(t, true, true)
	cfg.MaxSandboxes = 1
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
	if _, err := m.Create(alice, claimSpec(t, cfg, "abc", nil), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(alice, claimSpec(t, cfg, "def", nil), 0); api.KindOf(err) != api.KindQuota {
		t.Fatalf("second create over MAX_SANDBOXES=1: %v; want refused", err)
	}
	l, err := cs.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: keys.LabelPool})
	if err != nil || len(l.Items) != 1 {
		t.Errorf("pooled Pods after the refusal: %v %d; want the one not claimed", err, len(l.Items))
	}
	if _, err := cs.CoreV1().Services(ns).Get(context.Background(), "sandbox-def-svc", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Service of the refused create: %v; want removed", err)
	}
}

// TestCreateMeetsAClaimInFlight: a create of an id whose Service a pooled
// create has written, before that claim's patch, answers with the pooled
// sandbox once the claim lands; the same Service left for longer than a
// claim can take (its replica stopped between the writes) is replaced.
func TestCreateMeetsAClaimInFlight(t *testing.T) {
	tests := []struct {
		name   string
		age    time.Duration // of the Service the claim left
		lands  bool          // the claim's patch lands while the create waits
		pooled bool          // the create answers with the pooled sandbox
	}{
		{name: "the claim lands", age: 0, lands: true, pooled: true},
		{name: "a leftover is replaced", age: 6 * time.Minute, pooled: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, tmpl, cs := claimCluster(t, true)
			s := claimSpec(t, cfg, "abc", nil)
			pod, _ := inFlight(t, cfg, cs, s, tt.age)
			if tt.lands {
				go func() {
					time.Sleep(100 * time.Millisecond)
					// What the pooled create's claim writes (as the one in
					// flight would, for the same user and thread).
					patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
						"labels": map[string]any{keys.LabelPool: nil, keys.LabelID: "abc", keys.LabelPooled: "true",
							keys.LabelPrincipal: resources.PrincipalLabelValue("alice")},
						"annotations": map[string]any{keys.AnnotationPrincipal: "alice", keys.AnnotationUserID: s.UserID, keys.AnnotationThreadID: s.ThreadID}}})
					if _, err := cs.CoreV1().Pods(ns).Patch(context.Background(), pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
						t.Error(err)
					}
				}()
			}
			// Asks for more CPU than a pooled Pod has: the cold way.
			m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
			sb, err := m.Create(alice, claimSpec(t, cfg, "abc", func(r *api.CreateRequest) { r.CPU = "2" }), 0)
			if err != nil {
				t.Fatal(err)
			}
			got, err := cs.CoreV1().Services(ns).Get(context.Background(), "sandbox-abc-svc", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			wantOwner := "sandbox-abc"
			if tt.pooled {
				wantOwner = pod.Name
			}
			if sb.Pooled != tt.pooled || got.OwnerReferences[0].Name != wantOwner {
				t.Errorf("pooled %v, Service owned by %s; want pooled %v, owned by %s", sb.Pooled, got.OwnerReferences[0].Name, tt.pooled, wantOwner)
			}
			if _, err := cs.CoreV1().Pods(ns).Get(context.Background(), "sandbox-abc", metav1.GetOptions{}); apierrors.IsNotFound(err) == !tt.pooled {
				t.Errorf("cold Pod sandbox-abc: %v; want it only when the leftover was replaced", err)
			}
		})
	}
}

// TestReapSparesAClaimInFlight: the reap takes a Service without a live
// sandbox Pod for an orphan, but not one a pooled create wrote before its
// claim's patch; once older than any claim can take, it goes.
func TestReapSparesAClaimInFlight(t *testing.T) {
	for _, tt := range []struct {
		age    time.Duration
		reaped bool
	}{{0, false}, {6 * time.Minute, true}} {
		t.Run(tt.age.String(), func(t *testing.T) {
			cfg, tmpl, cs := claimCluster(t, true)
			_, svc := inFlight(t, cfg, cs, claimSpec(t, cfg, "abc", nil), tt.age)
			m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
			r, err := m.Reap(api.WithCaller(context.Background(), api.Caller{Principal: "admin", Admin: true}))
			if err != nil {
				t.Fatal(err)
			}
			_, gerr := cs.CoreV1().Services(ns).Get(context.Background(), svc.Name, metav1.GetOptions{})
			if len(r.Removed) == 1 != tt.reaped || apierrors.IsNotFound(gerr) != tt.reaped {
				t.Errorf("reaped %+v, Service %v; want reaped %v", r.Removed, gerr, tt.reaped)
			}
		})
	}
}

// inFlight writes the Service a pooled create of s makes before its claim
// (pooled.Create), age old, owned by the cluster's first pooled Pod,
// which it returns unclaimed.
func inFlight(t *testing.T, cfg *config.Config, cs *fake.Clientset, s api.Spec, age time.Duration) (*corev1.Pod, *corev1.Service) {
	t.Helper()
	pod, err := cs.CoreV1().Pods(ns).Get(context.Background(), "sandbox-pool-warm-aaaaa", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc := resources.BuildService(cfg.Objects(), s, resources.PodOwnerRef(pod))
	svc.UID, svc.CreationTimestamp = "svc-uid", metav1.NewTime(time.Now().Add(-age))
	if _, err := cs.CoreV1().Services(ns).Create(context.Background(), svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pod, svc
}

var alice = api.WithCaller(context.Background(), api.Caller{Principal: "alice"})

// claimCluster is a cluster with the pooled template warm and a pooled
// Pod per entry of ready (Ready or not), in ClusterIP mode without the
// shared NetworkPolicy.
func claimCluster(t *testing.T, ready ...bool) (*config.Config, *template.Template, *fake.Clientset) {
	t.Helper()
	t.Setenv("SANDBOX_SERVICE_TYPE", "ClusterIP")
	t.Setenv("SANDBOX_NETWORK_POLICY", "false")
	cfg := testConfig(t)
	tmpl := pooled(t, cfg, len(ready))
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "warm", Namespace: ns, UID: tmpl.UID, ResourceVersion: tmpl.ResourceVersion, Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplatePoolSize: strconv.Itoa(len(ready)), keys.TemplateDeerFlowMounts: "false"}},
		Template: tmpl.Pod,
	}
	objs := []runtime.Object{pt}
	for i, r := range ready {
		objs = append(objs, poolPod(cfg, tmpl, []string{"sandbox-pool-warm-aaaaa", "sandbox-pool-warm-bbbbb"}[i], r))
	}
	return cfg, tmpl, clientset(objs...)
}

func claimSpec(t *testing.T, cfg *config.Config, id string, mutate func(*api.CreateRequest)) api.Spec {
	t.Helper()
	req := api.CreateRequest{SandboxID: id, Template: "warm", UserID: ptr.To("u1")}
	if mutate != nil {
		mutate(&req)
	}
	s, err := req.Validate(cfg.Objects(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestClaimThatLandedUnseen: the claim's patch lands but its answer is a
// 500 (the API server failed after writing). The claim reads the Pod back:
// it carries the claim, so it is this create's sandbox, also when the
// patch lands only after that read (it reads again once a cut write must
// have landed, the Pod being at the version the patch was conditional
// on). When that read
// fails too, nothing can tell whether the Pod is claimed: the create
// answers 503 and its Service stays, so the quota still counts a Pod that
// may be claimed (the reap removes the Service if no claim landed).
func TestClaimThatLandedUnseen(t *testing.T) {
	tests := []struct {
		name        string
		failRead    bool
		landsLate   bool     // the patch reaches the store only once the first read back has answered
		wantKind    api.Kind // -1: answered 200
		wantPooled  bool
		wantService bool
	}{
		{name: "the read back finds the claim", wantKind: -1, wantPooled: true, wantService: true},
		{name: "the patch lands after the first read back", landsLate: true, wantKind: -1, wantPooled: true, wantService: true},
		{name: "the read back fails too", failRead: true, wantKind: api.KindUnavailable, wantService: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, tmpl, cs := claimCluster(t, true)
			var (
				patched atomic.Bool
				late    atomic.Pointer[clienttesting.Action]
			)
			cs.PrependReactor("patch", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if patched.Load() {
					return false, nil, nil
				}
				patched.Store(true)
				if tt.landsLate {
					late.Store(&a)
				} else if _, _, err := clienttesting.ObjectReaction(cs.Tracker())(a); err != nil {
					return true, nil, err
				}
				return true, nil, apierrors.NewInternalError(errors.New("injected after the write"))
			})
			cs.PrependReactor("get", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
				if tt.failRead && patched.Load() {
					return true, nil, apierrors.NewServiceUnavailable("injected")
				}
				if p := late.Swap(nil); p != nil {
					// Answered as the store was before the patch landed.
					handled, obj, err := clienttesting.ObjectReaction(cs.Tracker())(a)
					if _, _, perr := clienttesting.ObjectReaction(cs.Tracker())(*p); perr != nil {
						t.Error(perr)
					}
					return handled, obj, err
				}
				return false, nil, nil
			})
			m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
			sb, err := m.Create(alice, claimSpec(t, cfg, "abc", nil), 0)
			kind := api.Kind(-1)
			if err != nil {
				kind = api.KindOf(err)
			}
			_, serr := cs.CoreV1().Services(ns).Get(context.Background(), "sandbox-abc-svc", metav1.GetOptions{})
			got := []any{kind, sb.Pooled, serr == nil}
			if diff := cmp.Diff([]any{tt.wantKind, tt.wantPooled, tt.wantService}, got); diff != "" {
				t.Errorf("error kind, pooled, Service kept (-want +got):\n%s\nerror: %v", diff, err)
			}
		})
	}
}

// TestClaimReadsTheIDsServiceOnlyIfItMayExist: with the quota's Service
// cache in sync (a limit is set, as by default), a pooled create of an id
// the cache holds no Service for does not read that Service: its own
// Service create decides, as it does against a racing create. A create
// again of the claimed id reads it and answers with the same sandbox,
// spending no other pooled Pod (whether the cache has seen the Service
// yet or not: unseen, the Service create meets it).
func TestClaimReadsTheIDsServiceOnlyIfItMayExist(t *testing.T) {
	t.Setenv("MAX_SANDBOXES", "10")
	cfg, tmpl, cs := claimCluster(t, true, true)
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
	ctx, cancel := context.WithTimeout(alice, 10*time.Second)
	defer cancel()
	m.Run(ctx)
	// The cache is in sync once its first list is applied, which its
	// reflector does before it watches.
	watching := func(context.Context) (bool, error) {
		for _, a := range cs.Actions() {
			if a.GetVerb() == "watch" && a.GetResource().Resource == "services" {
				return true, nil
			}
		}
		return false, nil
	}
	if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 5*time.Second, true, watching); err != nil {
		t.Fatalf("the quota's Service cache never watched: %v", err)
	}
	reads := func() int {
		n := 0
		for _, a := range cs.Actions() {
			if g, ok := a.(clienttesting.GetAction); ok && a.GetResource().Resource == "services" && g.GetName() == resources.ServiceName("abc") {
				n++
			}
		}
		return n
	}
	sb, err := m.Create(ctx, claimSpec(t, cfg, "abc", nil), 0)
	if err != nil || !sb.Pooled {
		t.Fatalf("create: %+v %v; want a pooled sandbox", sb, err)
	}
	if n := reads(); n != 0 {
		t.Errorf("the create of a new id read its Service %d times; want none (the cache holds none)", n)
	}
	again, err := m.Create(ctx, claimSpec(t, cfg, "abc", nil), 0)
	if err != nil || again.URL != sb.URL || !again.Pooled {
		t.Errorf("create again: %+v %v; want the same sandbox", again, err)
	}
	if reads() == 0 {
		t.Error("the create again never read the id's Service")
	}
	pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelID + "=abc"})
	if err != nil || len(pods.Items) != 1 {
		t.Errorf("Pods of the id: %v %v; want the one claimed", pods, err)
	}
}
