//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/router"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

const (
	routerPolicy  = "sandbox-router-resume"
	routerAccount = "system:serviceaccount:deer-flow:sandbox-router"
)

// TestAdmissionLetsTheRouterOnlyResume: the router's account (config/'s
// Role, copied into the test's namespace) may patch a sandbox ReplicaSet
// that is paused and resumes on traffic back to one replica, as
// resources.ScalePatch builds the patch (pkg/router/wake.go sends it), and
// nothing else: the policy sandbox-router-resume refuses the same patch on
// a sandbox that does not resume on traffic, replicas other than 0 → 1, a
// pause, and any change to the Pod template, the labels or another
// annotation. The allowed patch is made for real; the refused ones as
// server-side dry runs, after a positive dry run of the allowed one.
func TestAdmissionLetsTheRouterOnlyResume(t *testing.T) {
	ns, _ := serviceAccountNamespace(t)
	ctx := context.Background()
	router := routerIn(t, ns)
	rss := client().AppsV1().ReplicaSets(ns)
	a := newAdmission(t, ns, nil)
	paused := func(id string, autoResume bool) *appsv1.ReplicaSet {
		t.Helper()
		rs := a.replicaSet(id, nil)
		rs.Spec.Replicas = ptr.To[int32](0)
		rs.Annotations[keys.AnnotationPausedAt] = time.Now().UTC().Format(time.RFC3339)
		if autoResume {
			rs.Annotations[keys.AnnotationAutoResume] = "true"
		}
		created, err := rss.Create(ctx, rs, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return created
	}
	patch := func(rs *appsv1.ReplicaSet, p []byte, dry bool) error {
		opts := metav1.PatchOptions{}
		if dry {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err := router.AppsV1().ReplicaSets(ns).Patch(ctx, rs.Name, types.MergePatchType, p, opts)
		return err
	}
	with := func(p []byte, edit func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(p, &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		out, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	wakes := paused("wakes", true)
	resume := resources.ScalePatch(wakes, 1, false, time.Now())
	// The policy is in force once the positive dry run passes and a
	// refused one is refused by it.
	eventually(t, 30*time.Second, routerPolicy+" in force", func() (bool, error) {
		if err := patch(wakes, resume, true); err != nil {
			return false, err
		}
		err := patch(wakes, with(resume, func(m map[string]any) { m["spec"] = map[string]any{"replicas": 2} }), true)
		return refusedBy(err, routerPolicy, ""), nil
	})
	stays := paused("stays", false)
	cases := []struct {
		name  string
		rs    *appsv1.ReplicaSet
		patch []byte
	}{
		{"a sandbox that does not resume on traffic", stays, resources.ScalePatch(stays, 1, false, time.Now())},
		{"two replicas", wakes, with(resume, func(m map[string]any) { m["spec"] = map[string]any{"replicas": 2} })},
		{"a pause", wakes, resources.ScalePatch(wakes, 0, false, time.Now())},
		{"another image", wakes, with(resume, func(m map[string]any) {
			m["spec"].(map[string]any)["template"] = map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "sandbox", "image": "elsewhere.invalid/x"}}}}
		})},
		{"another label", wakes, with(resume, func(m map[string]any) {
			m["metadata"].(map[string]any)["labels"] = map[string]any{"extra": "x"}
		})},
		{"another annotation", wakes, with(resume, func(m map[string]any) {
			m["metadata"].(map[string]any)["annotations"].(map[string]any)[keys.AnnotationPrincipal] = "mallory"
		})},
	}
	for _, c := range cases {
		if err := patch(c.rs, c.patch, true); !refusedBy(err, routerPolicy, "") {
			t.Errorf("%s: the router's patch = %v; want it refused by %s", c.name, err, routerPolicy)
		}
	}
	// Its Role grants no delete: Forbidden, whatever the policy would say.
	if err := router.AppsV1().ReplicaSets(ns).Delete(ctx, wakes.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) {
		t.Errorf("the router's delete of a sandbox ReplicaSet = %v; want Forbidden", err)
	}
	// The positive control, for real.
	if err := patch(wakes, resume, false); err != nil {
		t.Fatalf("the router's resume: %v", err)
	}
	got, err := rss.Get(ctx, wakes.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if *got.Spec.Replicas != 1 || got.Annotations[keys.AnnotationPausedAt] != "" {
		t.Errorf("after the router's resume: %d replicas, paused-at %q; want 1 and none", *got.Spec.Replicas, got.Annotations[keys.AnnotationPausedAt])
	}
}

// TestRouterAnswersARefusedResume: a request that wakes a paused sandbox
// whose next Pod a ResourceQuota refuses is answered 503 with the
// ReplicaSet controller's reason as soon as the controller reports it,
// well within the hold, and nothing is left held. The router is
// pkg/router's Handler in this process (no router Deployment on kwok),
// with informers of the test's namespace as cmd/router makes them and
// config/'s Role and policy for its account; the sandbox's objects are
// those the function builds. Once the quota goes, the same ReplicaSet gets
// its Pod: the refusal was the quota's.
func TestRouterAnswersARefusedResume(t *testing.T) {
	ns := namespace(t)
	ctx := context.Background()

	quotas := client().CoreV1().ResourceQuotas(ns)
	if _, err := quotas.Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-pods"},
		Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the quota's status is counted", func() (bool, error) {
		q, err := quotas.Get(ctx, "no-pods", metav1.GetOptions{})
		return err == nil && q.Status.Hard != nil, err
	})

	a := newAdmission(t, ns, nil)
	const id = "quota-wake"
	spec := a.spec(id, nil, "")
	spec.Caller = api.Caller{Principal: "alice"}
	rs := resources.BuildReplicaSet(a.cfg.Objects(), spec)
	rs.Spec.Replicas = ptr.To[int32](0)
	rs.Annotations[keys.AnnotationPausedAt] = time.Now().UTC().Format(time.RFC3339)
	rs.Annotations[keys.AnnotationAutoResume] = "true"
	rs, err := client().AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client().CoreV1().Services(ns).Create(ctx, a.service(id, corev1.ServiceTypeClusterIP, resources.ReplicaSetOwnerRef(rs)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	factory := informers.NewSharedInformerFactoryWithOptions(client(), 0, informers.WithNamespace(ns))
	pods := factory.Core().V1().Pods().Informer()
	if err := pods.AddIndexers(cache.Indexers{router.IDIndex: router.IndexByID}); err != nil {
		t.Fatal(err)
	}
	services := factory.Core().V1().Services().Lister().Services(ns)
	replicaSets := factory.Apps().V1().ReplicaSets().Lister().ReplicaSets(ns)
	stop := make(chan struct{})
	defer close(stop)
	factory.Start(stop)
	factory.WaitForCacheSync(stop)
	key := access.Key(strings.Repeat("k", 40))
	h := router.New(router.Options{
		Resolver: router.Cache{Pods: pods.GetIndexer(), Services: services, Wires: services, ReplicaSets: replicaSets},
		Key:      key, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), WakeHold: 30 * time.Second,
		Waker: router.Scaler{Client: routerIn(t, ns), Namespace: ns},
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	ann := rs.Spec.Template.Annotations // the tokens' sandbox, as the router reads it
	if ann[keys.AnnotationPrincipal] == "" {
		ann = rs.Annotations
	}
	sb := access.Sandbox{Principal: ann[keys.AnnotationPrincipal], ID: id, CreatedAt: ann[keys.AnnotationCreatedAt]}
	if sb.Principal == "" || sb.CreatedAt == "" {
		t.Fatalf("the ReplicaSet names no principal or created-at for its tokens: %v", ann)
	}
	req, err := http.NewRequest("GET", srv.URL+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(router.HeaderSandboxID, id)
	req.Header.Set(router.HeaderSandboxPort, strconv.Itoa(int(rs.Spec.Template.Spec.Containers[0].Ports[0].ContainerPort)))
	req.Header.Set(router.HeaderTrafficToken, key.Token(access.Traffic, sb))
	start := time.Now()
	resp, err := (&http.Client{Timeout: 45 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("the waking request: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	t.Logf("the waking request: %d after %s: %s", resp.StatusCode, took.Round(time.Millisecond), body)
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), "could not be resumed") || !strings.Contains(string(body), "quota") {
		t.Errorf("the waking request = %d %s; want 503 with the controller's reason (the quota)", resp.StatusCode, body)
	}
	if took > 15*time.Second {
		t.Errorf("answered after %s; want as soon as the controller reports the refusal, well within the 30 s hold", took)
	}
	// The positive control: without the quota the resume it started makes
	// the Pod.
	if err := quotas.Delete(ctx, "no-pods", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the resumed ReplicaSet has its Pod once the quota is gone", func() (bool, error) {
		got, err := client().AppsV1().ReplicaSets(ns).Get(ctx, rs.Name, metav1.GetOptions{})
		return err == nil && got.Status.Replicas == 1, err
	})
}

// routerIn is a client as the router's account, with config/'s Role and
// RoleBinding for it copied into ns and its admission policy applied.
func routerIn(t *testing.T, ns string) kubernetes.Interface {
	t.Helper()
	var rbac []*unstructured.Unstructured
	for _, o := range readObjects(t, filepath.Join("..", "..", "config", "310-router.yaml")) {
		if k := o.GetKind(); k == "Role" || k == "RoleBinding" {
			o.SetNamespace(ns)
			rbac = append(rbac, o)
		}
	}
	applyServerSide(t, append(rbac, readObjects(t, filepath.Join("..", "..", "config", "802-admission-policy-router.yaml"))...))
	rc := rest.CopyConfig(kc.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: routerAccount}
	return kubernetes.NewForConfigOrDie(rc)
}
