//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
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
	router := kubernetes.NewForConfigOrDie(rc)
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
