package pool

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/poolapi"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

const ns = "deer-flow"

var podsGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Namespace = ns
	return cfg
}

// pooled is a template with a pool of size and no DeerFlow mounts.
func pooled(t *testing.T, cfg *config.Config, size int) *template.Template {
	t.Helper()
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "warm", UID: "tmpl-uid", ResourceVersion: "3", Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplatePoolSize: strconv.Itoa(size), keys.TemplateDeerFlowMounts: "false"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "sandbox:1"}}}},
	}
	tmpl, err := template.FromPodTemplate(pt, cfg.Objects())
	if err != nil || tmpl.PoolError != "" {
		t.Fatalf("template: %v %s", err, tmpl.PoolError)
	}
	return tmpl
}

// poolPod is a pooled Pod of tmpl as its ReplicaSet would make it.
func poolPod(cfg *config.Config, tmpl *template.Template, name string, ready bool) *corev1.Pod {
	rs := Build(cfg.Objects(), tmpl)
	cond := corev1.ConditionFalse
	if ready {
		cond = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: types.UID("uid-" + name), ResourceVersion: "10",
			Labels: rs.Spec.Template.Labels, Annotations: rs.Spec.Template.Annotations,
			CreationTimestamp: metav1.NewTime(time.Now().Add(-2 * time.Minute)),
			OwnerReferences:   []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: "rs-uid", Controller: ptr.To(true)}}},
		Spec: rs.Spec.Template.Spec,
		Status: corev1.PodStatus{Phase: corev1.PodRunning, StartTime: ptr.To(metav1.NewTime(time.Now().Add(-100 * time.Second))),
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: cond}}},
	}
}

// clientset is a fake clientset whose Pod patches honour the
// resourceVersion they carry, as the API server does (the fake's own
// tracker ignores it), and bump it: what makes a claim conditional.
func clientset(objs ...runtime.Object) *fake.Clientset {
	cs := fake.NewClientset(objs...)
	var mu sync.Mutex
	cs.PrependReactor("patch", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		pa := a.(clienttesting.PatchAction)
		obj, err := cs.Tracker().Get(podsGVR, pa.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		cur := obj.(*corev1.Pod)
		var patch map[string]any
		if err := json.Unmarshal(pa.GetPatch(), &patch); err != nil {
			return true, nil, err
		}
		meta, _ := patch["metadata"].(map[string]any)
		if meta == nil {
			meta = map[string]any{}
			patch["metadata"] = meta
		}
		if rv, ok := meta["resourceVersion"]; ok && rv != cur.ResourceVersion {
			return true, nil, apierrors.NewConflict(podsGVR.GroupResource(), pa.GetName(), fmt.Errorf("resourceVersion %v, have %s", rv, cur.ResourceVersion))
		}
		n, _ := strconv.Atoi(cur.ResourceVersion)
		meta["resourceVersion"] = strconv.Itoa(n + 1)
		data, _ := json.Marshal(patch)
		return clienttesting.ObjectReaction(cs.Tracker())(clienttesting.NewPatchAction(podsGVR, pa.GetNamespace(), pa.GetName(), pa.GetPatchType(), data))
	})
	return cs
}

// readyPods is n Ready pooled Pods of tmpl, p0 to p<n-1>.
func readyPods(cfg *config.Config, tmpl *template.Template, n int) []runtime.Object {
	var objs []runtime.Object
	for i := range n {
		objs = append(objs, poolPod(cfg, tmpl, fmt.Sprintf("p%d", i), true))
	}
	return objs
}

type counts struct {
	mu sync.Mutex
	m  map[string]int
}

func (c *counts) observe(tmpl, result string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]int{}
	}
	c.m[tmpl+"/"+result]++
}

func claimFor(id string) poolapi.Claim {
	return poolapi.Claim{
		Labels:      map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: id, keys.LabelPooled: "true"},
		Annotations: map[string]string{keys.AnnotationUserID: "u", keys.AnnotationCreatedAt: "2026-01-01T00:00:00Z"},
		MaxLifetime: time.Hour,
	}
}

func newPool(cfg *config.Config, cs *fake.Clientset, c *counts, tmpl *template.Template) *Pool {
	p := New(cfg, cs, c.observe, nil)
	p.rm.Lands = 10 * time.Millisecond // a cut claim's patch lands at once in the fake
	// The claims under test do not also make the ReplicaSet in the background.
	p.ensured[tmpl.Name] = ensured{key: tmpl.ResourceVersion + "/" + hashOf(cfg, tmpl), at: time.Now().Add(time.Hour)}
	return p
}

func hashOf(cfg *config.Config, tmpl *template.Template) string {
	return Build(cfg.Objects(), tmpl).Spec.Template.Labels[keys.LabelPoolHash]
}

func TestClaimHandsOutOnlyReadyUnclaimedPodsOfTheShape(t *testing.T) {
	cfg := testConfig(t)
	tmpl := pooled(t, cfg, 5)
	hash := hashOf(cfg, tmpl)
	unready := poolPod(cfg, tmpl, "unready", false)
	pending := poolPod(cfg, tmpl, "pending", true)
	pending.Status.Phase = corev1.PodPending
	old := poolPod(cfg, tmpl, "old-shape", true)
	old.Labels[keys.LabelPoolHash] = "0000000000000000"
	deleting := poolPod(cfg, tmpl, "deleting", true)
	deleting.DeletionTimestamp = ptr.To(metav1.Now())
	deleting.Finalizers = []string{"test/keep"}
	ready := poolPod(cfg, tmpl, "ready", true)
	cs := clientset(unready, pending, old, deleting, ready)
	var c counts
	p := newPool(cfg, cs, &c, tmpl)

	got := p.Claim(context.Background(), tmpl, hash, claimFor("abc"))
	if got == nil {
		t.Fatal("claim of a pool with one Ready Pod: got none")
	}
	if got.Name != "ready" {
		t.Fatalf("claimed %s, want the one Ready Pod of the current shape", got.Name)
	}
	// The claim made it the sandbox, out of the pool's selector and owner.
	stored, err := cs.CoreV1().Pods(ns).Get(context.Background(), "ready", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantLabels := map[string]string{}
	for k, v := range ready.Labels {
		wantLabels[k] = v
	}
	delete(wantLabels, keys.LabelPool)
	delete(wantLabels, keys.LabelPoolHash)
	wantLabels[keys.LabelID], wantLabels[keys.LabelPooled] = "abc", "true"
	// Its pin, its own name, which its Service selects (issue 45): the
	// claim writes it with the id and token.
	wantLabels[keys.LabelPod] = "ready"
	if diff := cmp.Diff(wantLabels, stored.Labels); diff != "" {
		t.Errorf("labels (-want +got):\n%s", diff)
	}
	if stored.Annotations[keys.AnnotationUserID] != "u" || stored.Annotations[keys.AnnotationCreatedAt] == "" {
		t.Errorf("annotations %v: want the claim's", stored.Annotations)
	}
	if len(stored.OwnerReferences) != 0 {
		t.Errorf("owner references %v: want none (out of the pool ReplicaSet)", stored.OwnerReferences)
	}
	// Started 100 s ago: the deadline is that plus the lifetime (and a second).
	if d := ptr.Deref(stored.Spec.ActiveDeadlineSeconds, 0); d < 3700 || d > 3702 {
		t.Errorf("activeDeadlineSeconds %d, want about 3701 (time in the pool + max lifetime)", d)
	}
	// Nothing else may be handed out: the rest are unready, old or going.
	if again := p.Claim(context.Background(), tmpl, hash, claimFor("def")); again != nil {
		t.Errorf("second claim got %s; want none", again.Name)
	}
	if diff := cmp.Diff(map[string]int{"warm/hit": 1, "warm/empty": 1}, c.m); diff != "" {
		t.Errorf("observed (-want +got):\n%s", diff)
	}
}

func TestConcurrentClaimsNeverShareAPod(t *testing.T) {
	cfg := testConfig(t)
	tmpl := pooled(t, cfg, 5)
	cs := clientset(readyPods(cfg, tmpl, 5)...)
	var c counts
	p := newPool(cfg, cs, &c, tmpl)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		claimed []string
	)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if pod := p.Claim(context.Background(), tmpl, hashOf(cfg, tmpl), claimFor(fmt.Sprintf("id%d", i))); pod != nil {
				mu.Lock()
				claimed = append(claimed, pod.Name+"="+pod.Labels[keys.LabelID])
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Strings(claimed)
	if len(claimed) != 5 {
		t.Fatalf("claims %v: want 5 (one per pooled Pod)", claimed)
	}
	// Each Pod is the sandbox of the one claim that won it.
	for _, cl := range claimed {
		name, id, _ := strings.Cut(cl, "=")
		pod, err := cs.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Labels[keys.LabelID] != id {
			t.Errorf("pod %s is sandbox %s, but the claim %s was answered with it", name, pod.Labels[keys.LabelID], id)
		}
	}
	if diff := cmp.Diff(map[string]int{"warm/hit": 5, "warm/empty": 15}, c.m); diff != "" {
		t.Errorf("observed (-want +got):\n%s", diff)
	}
}

// TestClaimsOfOneReplicaDoNotRace: racing claims in one replica pass over
// the Pods the others are taking, so none spends a write on a Pod it then
// loses: 8 claims on a pool of 8 make 8 patches and get 8 Pods. A Pod is
// passed over for a while after its claim too, as the watch cache may
// still list it as claimable; a Pod whose claim failed is let go at once.
func TestClaimsOfOneReplicaDoNotRace(t *testing.T) {
	cfg := testConfig(t)
	tmpl := pooled(t, cfg, 8)
	hash := hashOf(cfg, tmpl)
	cs := clientset(readyPods(cfg, tmpl, 8)...)
	var c counts
	p := newPool(cfg, cs, &c, tmpl)
	ready, err := p.Ready(context.Background(), tmpl, hash)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		claimed = map[string]bool{}
	)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every claim works from the same list, as racing claims from
			// one watch-cache answer do.
			if pod := p.ClaimFrom(context.Background(), tmpl, hash, ready, claimFor(fmt.Sprintf("id%d", i))); pod != nil {
				mu.Lock()
				claimed[pod.Name] = true
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	patches := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "patch" {
			patches++
		}
	}
	if len(claimed) != 8 || patches != 8 {
		t.Errorf("8 racing claims on 8 Pods: %d Pods claimed with %d patches, want 8 and 8", len(claimed), patches)
	}
	// The same stale list offered again: every Pod is passed over, no write.
	if pod := p.ClaimFrom(context.Background(), tmpl, hash, ready, claimFor("late")); pod != nil {
		t.Errorf("a claim from the stale list got %s, claimed a moment ago", pod.Name)
	}
	// A Pod whose claim did not take it is let go at once: here one the
	// API server did not have yet (the claim finds it gone), which a
	// later claim then takes.
	late := poolPod(cfg, tmpl, "p-late", true)
	if pod := p.ClaimFrom(context.Background(), tmpl, hash, []*corev1.Pod{late}, claimFor("next")); pod != nil {
		t.Fatalf("claim of a Pod the API server lacks: got %s", pod.Name)
	}
	if _, err := cs.CoreV1().Pods(ns).Create(context.Background(), late, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if pod := p.ClaimFrom(context.Background(), tmpl, hash, []*corev1.Pod{late}, claimFor("next")); pod == nil || pod.Name != "p-late" {
		t.Errorf("claim of the Pod once it exists: got %v, want p-late (not held by the failed claim)", pod)
	}
}

// TestClaimLooksAgainWhenTheCacheOffersNothing: Ready lists from the API
// server's watch cache, which may not yet show a Pod that turned Ready a
// moment ago; a claim that finds nothing there looks once more with a
// current list before the create goes cold.
func TestClaimLooksAgainWhenTheCacheOffersNothing(t *testing.T) {
	cfg := testConfig(t)
	tmpl := pooled(t, cfg, 2)
	cs := clientset(poolPod(cfg, tmpl, "just-ready", true))
	var c counts
	p := newPool(cfg, cs, &c, tmpl)
	if pod := p.ClaimFrom(context.Background(), tmpl, hashOf(cfg, tmpl), nil, claimFor("abc")); pod == nil || pod.Name != "just-ready" {
		t.Fatalf("claim from an empty stale list: got %v, want just-ready from the second look", pod)
	}
	if pod := p.ClaimFrom(context.Background(), tmpl, hashOf(cfg, tmpl), nil, claimFor("def")); pod != nil {
		t.Errorf("claim of a pool with nothing left: got %s", pod.Name)
	}
	if diff := cmp.Diff(map[string]int{"warm/hit": 1, "warm/empty": 1}, c.m); diff != "" {
		t.Errorf("observed (-want +got):\n%s", diff)
	}
}

func TestBuild(t *testing.T) {
	cfg := testConfig(t)
	tmpl := pooled(t, cfg, 3)
	rs := Build(cfg.Objects(), tmpl)
	if rs.Name != "sandbox-pool-warm" || ptr.Deref(rs.Spec.Replicas, 0) != 3 {
		t.Errorf("name %s replicas %d, want sandbox-pool-warm of 3", rs.Name, ptr.Deref(rs.Spec.Replicas, 0))
	}
	if diff := cmp.Diff(map[string]string{"app": "deer-flow-sandbox", keys.LabelPool: "warm"}, rs.Spec.Selector.MatchLabels); diff != "" {
		t.Errorf("selector (-want +got):\n%s", diff)
	}
	l := rs.Spec.Template.Labels
	if l["app"] != "deer-flow-sandbox" || l[keys.LabelID] != "" || l[keys.LabelUser] != "" || l[keys.LabelPoolHash] == "" {
		t.Errorf("Pod labels %v: want app=deer-flow-sandbox (isolation), no id or user, a shape hash", l)
	}
	for _, k := range []string{keys.AnnotationCreatedAt, keys.AnnotationExpiresAt, keys.AnnotationUserID} {
		if _, ok := rs.Spec.Template.Annotations[k]; ok {
			t.Errorf("Pod annotation %s set on a pooled Pod; a claim sets it", k)
		}
	}
	if rs.Spec.Template.Spec.ActiveDeadlineSeconds != nil {
		t.Error("a pooled Pod has an activeDeadlineSeconds; it would count time in the pool")
	}
	if diff := cmp.Diff([]metav1.OwnerReference{{APIVersion: "v1", Kind: "PodTemplate", Name: "warm", UID: "tmpl-uid", BlockOwnerDeletion: ptr.To(false)}}, rs.OwnerReferences); diff != "" {
		t.Errorf("owner (-want +got):\n%s", diff)
	}
	// A long template name still makes a valid, stable name.
	long := *tmpl
	long.Name = "a-template-name-that-is-longer-than-forty-characters-by-far"
	if n := Name(long.Name); len(n) > 63 || n != Name(long.Name) {
		t.Errorf("Name(%q) = %q", long.Name, n)
	}
	// The admission policy admits a pool's ReplicaSet only as
	// sandbox-pool-<the pool label it selects>.
	for _, tp := range []*template.Template{tmpl, &long} {
		got := Build(cfg.Objects(), tp)
		if want := "sandbox-pool-" + got.Spec.Selector.MatchLabels[keys.LabelPool]; got.Name != want {
			t.Errorf("template %s: ReplicaSet %s, want %s (named for the pool it selects)", tp.Name, got.Name, want)
		}
	}
}

func TestEnsure(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	tests := []struct {
		name   string
		have   *appsv1.ReplicaSet
		size   int
		want   *int32 // nil: no ReplicaSet
		verbs  []string
		reason string
	}{{
		name: "absent, made", size: 2, want: ptr.To(int32(2)), verbs: []string{"get", "create"},
	}, {
		name: "resized", size: 4, have: func() *appsv1.ReplicaSet {
			rs := Build(cfg.Objects(), pooled(t, cfg, 2))
			rs.ResourceVersion = "5"
			return rs
		}(), want: ptr.To(int32(4)), verbs: []string{"get", "update"},
	}, {
		name: "unchanged, left alone", size: 2, have: Build(cfg.Objects(), pooled(t, cfg, 2)), want: ptr.To(int32(2)), verbs: []string{"get"},
	}, {
		name: "no pool any more, deleted", size: 0, have: Build(cfg.Objects(), pooled(t, cfg, 2)), want: nil, verbs: []string{"get", "delete"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.have != nil {
				objs = append(objs, tc.have)
			}
			cs := clientset(objs...)
			p := New(cfg, cs, nil, nil)
			tmpl := pooled(t, cfg, max(tc.size, 1))
			tmpl.PoolSize = tc.size
			if err := p.ensure(ctx, tmpl, nil, false); err != nil {
				t.Fatal(err)
			}
			var verbs []string
			for _, a := range cs.Actions() {
				verbs = append(verbs, a.GetVerb())
			}
			if diff := cmp.Diff(tc.verbs, verbs); diff != "" {
				t.Errorf("API calls (-want +got):\n%s", diff)
			}
			rs, err := cs.AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-pool-warm", metav1.GetOptions{})
			switch {
			case tc.want == nil && !apierrors.IsNotFound(err):
				t.Errorf("ReplicaSet still there (%v)", err)
			case tc.want != nil && err != nil:
				t.Fatal(err)
			case tc.want != nil && *rs.Spec.Replicas != *tc.want:
				t.Errorf("replicas %d, want %d", *rs.Spec.Replicas, *tc.want)
			}
		})
	}
}

func TestEnsureReshapeDropsOldPodsButNotClaimedOnes(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	tmpl := pooled(t, cfg, 2)
	old := Build(cfg.Objects(), tmpl)
	old.Spec.Template.Labels[keys.LabelPoolHash] = "0ld"
	stale := poolPod(cfg, tmpl, "stale", true)
	stale.Labels[keys.LabelPoolHash] = "0ld"
	current := poolPod(cfg, tmpl, "current", true)
	cs := clientset(old, stale, current)
	p := New(cfg, cs, nil, nil)
	if err := p.ensure(ctx, tmpl, nil, false); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, "stale", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pooled Pod of the old shape still there (%v)", err)
	}
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, "current", metav1.GetOptions{}); err != nil {
		t.Errorf("pooled Pod of the current shape: %v", err)
	}
	rs, _ := cs.AppsV1().ReplicaSets(ns).Get(ctx, old.Name, metav1.GetOptions{})
	if rs.Spec.Template.Labels[keys.LabelPoolHash] != hashOf(cfg, tmpl) {
		t.Errorf("ReplicaSet's Pod template not reshaped")
	}
}

// TestDescribe: a pool's ready count comes from its ReplicaSet's status,
// and describing writes nothing, not even to remove a pool nobody asks
// for (Keep does that, from the reap).
func TestDescribe(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	tmpl := pooled(t, cfg, 3)
	have := Build(cfg.Objects(), tmpl)
	have.Status.ReadyReplicas = 2
	orphan := Build(cfg.Objects(), pooled(t, cfg, 1))
	orphan.Name = Name("gone")
	cs := clientset(have, orphan)
	p := New(cfg, cs, nil, nil)
	sums := []template.Summary{template.Summarize(tmpl)}
	p.Describe(ctx, sums, []*template.Template{tmpl})
	if diff := cmp.Diff(&template.Pool{Size: 3, Ready: 2}, sums[0].Pool); diff != "" {
		t.Errorf("pool (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string(nil), writes(cs)); diff != "" {
		t.Errorf("writes of a describe (-want +got):\n%s", diff)
	}
}

// TestKeep: the pool of a template is made at its size, and the pool of a
// template that is gone is deleted.
func TestKeep(t *testing.T) {
	cfg := testConfig(t)
	ctx := context.Background()
	tmpl := pooled(t, cfg, 3)
	orphan := Build(cfg.Objects(), pooled(t, cfg, 1))
	orphan.Name = Name("gone")
	cs := clientset(orphan)
	p := New(cfg, cs, nil, nil)
	if err := p.keep(ctx, []*template.Template{tmpl}); err != nil {
		t.Fatal(err)
	}
	rs, err := cs.AppsV1().ReplicaSets(ns).Get(ctx, Name("warm"), metav1.GetOptions{})
	if err != nil || *rs.Spec.Replicas != 3 {
		t.Errorf("the pool of warm: %v %v, want 3 replicas", rs, err)
	}
	if _, err := cs.AppsV1().ReplicaSets(ns).Get(ctx, orphan.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pool of a template that is gone still there (%v)", err)
	}
}

// writes lists the writes cs was asked for, as "verb resource".
func writes(cs *fake.Clientset) []string {
	var out []string
	for _, a := range cs.Actions() {
		switch a.GetVerb() {
		case "get", "list", "watch":
		default:
			out = append(out, a.GetVerb()+" "+a.GetResource().Resource)
		}
	}
	return out
}

// TestClaimSurvivesStatusWrites: a conflict caused by another writer (the
// kubelet updating status) rather than a claim does not send the create
// the cold way while the Pod is still free: not after one such write, nor
// after as many as a look tries (maxClaimTries, all conflicts), when the
// second look tries the Pod again.
func TestClaimSurvivesStatusWrites(t *testing.T) {
	for _, writes := range []int{1, maxClaimTries} {
		t.Run(fmt.Sprintf("%d status writes", writes), func(t *testing.T) {
			cfg := testConfig(t)
			tmpl := pooled(t, cfg, 1)
			cs := clientset(poolPod(cfg, tmpl, "only", true))
			var mu sync.Mutex
			left := writes
			// Before each of the first writes patches, the status changes.
			cs.PrependReactor("patch", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				if left == 0 {
					return false, nil, nil
				}
				left--
				obj, _ := cs.Tracker().Get(podsGVR, ns, "only")
				pod := obj.(*corev1.Pod).DeepCopy()
				n, _ := strconv.Atoi(pod.ResourceVersion)
				pod.ResourceVersion = strconv.Itoa(n + 1)
				if err := cs.Tracker().Update(podsGVR, pod, ns); err != nil {
					t.Error(err)
				}
				return false, nil, nil
			})
			var c counts
			p := newPool(cfg, cs, &c, tmpl)
			if got := p.Claim(context.Background(), tmpl, hashOf(cfg, tmpl), claimFor("abc")); got == nil || got.Labels[keys.LabelID] != "abc" {
				t.Fatalf("claim after %d status writes: %v; want the Pod claimed", writes, got)
			}
			if diff := cmp.Diff(map[string]int{tmpl.Name + "/" + ResultHit: 1}, c.m); diff != "" {
				t.Errorf("claim results (-want +got):\n%s", diff)
			}
		})
	}
}

// TestClaimsAtOnceShareTheirLists: claims of one pool that ask while its
// list of Pods is under way share it: eight claims at once cost the API
// server one list, not eight, and each gets every claimable Pod. The fake
// clientset stands in for the API server; a list waits (in slowLists,
// before the fake, whose reactors run one at a time) until released, which
// is once the claims have had time to ask, or at once when all eight lists
// have arrived (the failure).
func TestClaimsAtOnceShareTheirLists(t *testing.T) {
	cfg := testConfig(t)
	tmpl := pooled(t, cfg, 3)
	cs := clientset(readyPods(cfg, tmpl, 3)...)
	sl := &slowLists{Interface: cs, entered: make(chan struct{}), release: make(chan struct{})}
	p := New(cfg, sl, nil, nil)
	p.ensured[tmpl.Name] = ensured{key: tmpl.ResourceVersion + "/" + hashOf(cfg, tmpl), at: time.Now().Add(time.Hour)}
	const claims = 8
	got := make([]int, claims)
	var wg sync.WaitGroup
	ready := func(i int) {
		defer wg.Done()
		pods, err := p.Ready(context.Background(), tmpl, hashOf(cfg, tmpl))
		if err != nil {
			t.Error(err)
		}
		got[i] = len(pods)
	}
	wg.Add(claims)
	go ready(0)
	<-sl.entered
	for i := 1; i < claims; i++ {
		go ready(i)
	}
	_ = wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 500*time.Millisecond, true, func(context.Context) (bool, error) {
		return sl.lists.Load() == claims, nil
	})
	close(sl.release)
	wg.Wait()
	if n := sl.lists.Load(); n != 1 {
		t.Errorf("%d claims at once listed the pool's Pods %d times; want once", claims, n)
	}
	if diff := cmp.Diff([]int{3, 3, 3, 3, 3, 3, 3, 3}, got); diff != "" {
		t.Errorf("claimable Pods each claim got (-want +got):\n%s", diff)
	}
}

// slowLists counts the lists of Pods made through it; each waits until
// release, and the first closes entered.
type slowLists struct {
	kubernetes.Interface
	lists            atomic.Int32
	entered, release chan struct{}
}

func (s *slowLists) CoreV1() typedcorev1.CoreV1Interface { return slowCore{s.Interface.CoreV1(), s} }

type slowCore struct {
	typedcorev1.CoreV1Interface
	s *slowLists
}

func (c slowCore) Pods(ns string) typedcorev1.PodInterface {
	return slowPods{c.CoreV1Interface.Pods(ns), c.s}
}

type slowPods struct {
	typedcorev1.PodInterface
	s *slowLists
}

func (p slowPods) List(ctx context.Context, o metav1.ListOptions) (*corev1.PodList, error) {
	if p.s.lists.Add(1) == 1 {
		close(p.s.entered)
	}
	<-p.s.release
	return p.PodInterface.List(ctx, o)
}
