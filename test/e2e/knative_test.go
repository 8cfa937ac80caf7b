//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/events"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

const serviceAccount = "system:serviceaccount:deer-flow:sandbox-provisioner"

// moduleDir finds a module's source in the module cache, downloading it
// through the module proxy if needed.
func moduleDir(t *testing.T, module string) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	if err != nil {
		t.Fatalf("go mod download %s: %v", module, err)
	}
	var info struct{ Dir, Error string }
	if err := json.Unmarshal(out, &info); err != nil || info.Dir == "" {
		t.Fatalf("go mod download %s: %s %v", module, info.Error, err)
	}
	return info.Dir
}

// readObjects decodes every YAML document in files.
func readObjects(t *testing.T, files ...string) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	for _, file := range files {
		f, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(f, 4096)
		for {
			var u unstructured.Unstructured
			err := dec.Decode(&u.Object)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if len(u.Object) > 0 {
				objs = append(objs, &u)
			}
		}
		f.Close()
	}
	return objs
}

// applyServerSide applies objs with server-side apply, as
// `kubectl apply --server-side` would, and fails on any error.
func applyServerSide(t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	dyn := dynamic.NewForConfigOrDie(kc.Config)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(kc.Client.Discovery()))
	ctx := context.Background()
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		var mapping *meta.RESTMapping
		var err error
		// A CRD applied a moment ago takes a little while to be served.
		deadline := time.Now().Add(30 * time.Second)
		for {
			mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err == nil || time.Now().After(deadline) {
				break
			}
			mapper.Reset()
			time.Sleep(200 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("no resource for %s: %v", gvk, err)
		}
		raw, err := json.Marshal(o.Object)
		if err != nil {
			t.Fatal(err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(mapping.Resource).Namespace(o.GetNamespace())
		}
		force := true
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, raw, metav1.PatchOptions{FieldManager: "e2e", Force: &force}); err != nil {
			t.Fatalf("server-side apply of %s %s/%s: %v", gvk.Kind, o.GetNamespace(), o.GetName(), err)
		}
	}
}

func configFiles(t *testing.T) []string {
	files, err := filepath.Glob(filepath.Join("..", "..", "config", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in config/: %v", err)
	}
	// kustomization.yaml is not an object: it lists the others (a test in
	// test/manifests checks that it lists every one).
	files = slices.DeleteFunc(files, func(f string) bool { return filepath.Base(f) == "kustomization.yaml" })
	sort.Strings(files)
	return files
}

// installKnativeCRDs applies the CRDs of the Knative objects config/ ships
// (Serving's, and Eventing's Broker, Trigger, PingSource and EventPolicy),
// taken from the Knative modules, server-side. EventPolicy has one version,
// v1alpha1 (in v0.42.1 as in hack/lib.sh's KNATIVE_EVENTING_VERSION), so its
// CRD's conversion webhook, absent here, is never called.
func installKnativeCRDs(t *testing.T) {
	t.Helper()
	serving := moduleDir(t, "knative.dev/serving@v0.42.2")
	eventing := moduleDir(t, "knative.dev/eventing@v0.42.1")
	crdFiles, err := filepath.Glob(filepath.Join(serving, "config", "core", "300-resources", "*.yaml"))
	if err != nil || len(crdFiles) == 0 {
		t.Fatalf("no Knative Serving CRDs in %s", serving)
	}
	for _, name := range []string{"broker.yaml", "trigger.yaml", "pingsource.yaml", "eventpolicy.yaml"} {
		crdFiles = append(crdFiles, filepath.Join(eventing, "config", "core", "resources", name))
	}
	applyServerSide(t, readObjects(t, crdFiles...))
}

// TestManifestsApplyServerSide installs Knative's CRDs from the Knative
// modules and applies all of config/ server-side to the real API server.
func TestManifestsApplyServerSide(t *testing.T) {
	installKnativeCRDs(t)

	objs := readObjects(t, configFiles(t)...)
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	for _, k := range []string{"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding", "Service", "Broker", "EventPolicy", "Trigger", "PingSource",
		"NetworkPolicy", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "LimitRange", "ResourceQuota"} {
		if kinds[k] == 0 {
			t.Errorf("config/ has no %s", k)
		}
	}
	if want := len(events.RequestTypes) - 1; kinds["Trigger"] != want { // the PingSource's type needs none
		t.Errorf("config/ has %d Triggers, want one per request type (%d)", kinds["Trigger"], want)
	}
	applyServerSide(t, objs)
}

// TestRBACWithConfigRole runs the provisioner as the ServiceAccount from
// config/, bound to the Role from config/: everything works, and anything
// outside the Role is denied.
func TestRBACWithConfigRole(t *testing.T) {
	var rbac []string
	for _, f := range configFiles(t) {
		base := filepath.Base(f)
		if strings.HasPrefix(base, "1") || strings.HasPrefix(base, "2") || base == "701-networkpolicy-sandboxes.yaml" {
			rbac = append(rbac, f)
		}
	}
	applyServerSide(t, readObjects(t, rbac...))
	ctx := context.Background()
	eventually(t, 30*time.Second, "default ServiceAccount in deer-flow", func() (bool, error) {
		_, err := client().CoreV1().ServiceAccounts("deer-flow").Get(ctx, "default", metav1.GetOptions{})
		return err == nil, err
	})

	// The namespace enforces Pod Security baseline, which forbids hostPath:
	// run in PVC mode, as config/400-service.yaml does, with claims bound to
	// volumes (kwok mounts nothing; the scheduler only needs them bound).
	bindClaims(t, "deer-flow", "deer-flow-skills", "deer-flow-user-data")
	// A ResourceQuota refuses Pods until its controller has counted usage.
	quotaCounted(t, "deer-flow")

	proxy.Impersonate(serviceAccount)
	defer proxy.Impersonate("")
	// No SANDBOX_NETWORK_POLICY_ENSURE: the Role may only read the shared
	// policy, which config/ ships. The runtime class as config/ sets it: the
	// ClusterRole lets the function read that class, and no other.
	f := start(t, "deer-flow", map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "false",
		"SKILLS_PVC_NAME": "deer-flow-skills", "USERDATA_PVC_NAME": "deer-flow-user-data", "SANDBOX_RUNTIME_CLASS": "gvisor", "SANDBOX_USER_NAMESPACE": "false"})

	cr := mustDo(t, f, "POST", "/api/sandboxes?wait=15s", map[string]any{"sandbox_id": "rbac1", "thread_id": "t"})
	expectCode(t, cr, 200, "create as the ServiceAccount")
	if cr.Body["status"] != "Running" {
		t.Errorf("create with wait as the ServiceAccount: %s", cr.Raw)
	}
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "rbac1", "thread_id": "t"}), 200, "idempotent create")
	expectCode(t, mustDo(t, f, "GET", "/api/sandboxes/rbac1", nil), 200, "get")
	expectCode(t, mustDo(t, f, "GET", "/api/sandboxes", nil), 200, "list")
	expectCode(t, mustDo(t, f, "POST", "/api/reap", nil), 200, "reap")
	// Repair path: a Pod whose Service is gone gets a Service bound to it
	// (update). The Pod is made one of the previous version's first, owned
	// by nothing: one created since issue 49 would go with its Service.
	if _, err := client().CoreV1().Pods("deer-flow").Patch(ctx, "sandbox-rbac1", types.MergePatchType, []byte(`{"metadata":{"ownerReferences":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client().CoreV1().Services("deer-flow").Delete(ctx, "sandbox-rbac1-svc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "rbac1", "thread_id": "t"}), 200, "repairing create")
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/rbac1", nil), 200, "delete")
	// A ReplicaSet template, read, created, paused, resumed and destroyed
	// with the Role's verbs.
	applyTemplates(t, "deer-flow", "self-healing")
	expectCode(t, mustDo(t, f, "GET", "/api/templates", nil), 200, "list templates")
	rsBody := map[string]any{"sandbox_id": "rbac2", "thread_id": "t", "template": "self-healing"}
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=15s", rsBody), 200, "create a ReplicaSet sandbox")
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes/rbac2/pause", nil), 200, "pause")
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes/rbac2/resume", nil), 200, "resume")
	expectCode(t, mustDo(t, f, "GET", "/api/sandboxes", nil), 200, "list with a ReplicaSet sandbox")
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/rbac2", nil), 200, "delete a ReplicaSet sandbox")
	// Both destroys took, as the ServiceAccount: the ReplicaSet sandbox's
	// ReplicaSet, Pod and Service are gone, as are the bare one's.
	for _, id := range []string{"rbac2", "rbac1"} {
		eventually(t, 30*time.Second, "sandbox "+id+" removed", func() (bool, error) {
			rs, err := client().AppsV1().ReplicaSets("deer-flow").List(ctx, metav1.ListOptions{LabelSelector: "sandbox-id=" + id})
			if err != nil {
				return false, err
			}
			left := len(rs.Items) + len(pods(t, "deer-flow", "sandbox-id="+id)) + len(services(t, "deer-flow", "sandbox-id="+id))
			return left == 0, fmt.Errorf("%d objects of sandbox %s left", left, id)
		})
	}

	// Outside the Role: denied.
	rc := rest.CopyConfig(kc.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: serviceAccount}
	sa := kubernetes.NewForConfigOrDie(rc)
	// Secrets: create, get and delete (a sandbox's env Secret, by name; the
	// admission policy pins which), never list, watch or update.
	_, err := sa.CoreV1().Secrets("deer-flow").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("listing Secrets as the ServiceAccount: %v, want Forbidden", err)
	}
	_, err = sa.CoreV1().Secrets("deer-flow").Watch(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("watching Secrets as the ServiceAccount: %v, want Forbidden", err)
	}
	_, err = sa.CoreV1().Secrets("deer-flow").Update(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-provisioner"}}, metav1.UpdateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("updating a Secret as the ServiceAccount: %v, want Forbidden", err)
	}
	_, err = sa.CoreV1().Pods("default").List(ctx, metav1.ListOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("listing Pods in another namespace: %v, want Forbidden", err)
	}
	_, err = sa.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "nope"}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("creating a namespace: %v, want Forbidden", err)
	}
	_, err = sa.CoreV1().Pods("deer-flow").Update(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.UpdateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("updating a Pod (not a verb we use): %v, want Forbidden", err)
	}
	// Templates are the operator's: the function reads them, never writes them.
	_, err = sa.CoreV1().PodTemplates("deer-flow").Create(ctx, &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: "mine"}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("creating a PodTemplate: %v, want Forbidden", err)
	}
	// Scaling goes through the object, which the admission policy sees.
	_, err = sa.AppsV1().ReplicaSets("deer-flow").GetScale(ctx, "sandbox-rbac2", metav1.GetOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("reading replicasets/scale: %v, want Forbidden", err)
	}
	err = sa.NetworkingV1().NetworkPolicies("deer-flow").Delete(ctx, "deer-flow-sandbox-isolation", metav1.DeleteOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("deleting the shared sandbox NetworkPolicy: %v, want Forbidden", err)
	}
	// Ownership Leases: create, get, list (a principal's bound) and delete
	// (the reap frees ids unused for a long time), never update, so the
	// function cannot hand an id from its owner to another principal.
	// (Labelled as the function labels its own: the deletes policy, when in
	// force, lets it delete no other Lease.)
	lease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-owner-u-rbac", Labels: map[string]string{keys.LabelManagedBy: keys.ManagedByValue}},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("alice")}}
	if lease, err = sa.CoordinationV1().Leases("deer-flow").Create(ctx, lease, metav1.CreateOptions{}); err != nil {
		t.Errorf("creating an ownership Lease as the ServiceAccount: %v", err)
	} else if _, err := sa.CoordinationV1().Leases("deer-flow").Get(ctx, lease.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("reading an ownership Lease as the ServiceAccount: %v", err)
	} else {
		lease.Spec.HolderIdentity = ptr.To("bob")
		if _, err := sa.CoordinationV1().Leases("deer-flow").Update(ctx, lease, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("updating an ownership Lease: %v, want Forbidden", err)
		}
		if err := sa.CoordinationV1().Leases("deer-flow").Delete(ctx, lease.Name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting an ownership Lease (the reap frees unused ids): %v", err)
		}
	}
	if _, err := sa.CoordinationV1().Leases("deer-flow").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("listing Leases (a principal's bound): %v", err)
	}
	// What token verification needs, and nothing more cluster-wide.
	if _, err := sa.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: "x"}}, metav1.CreateOptions{}); err != nil {
		t.Errorf("TokenReview as the ServiceAccount: %v", err)
	}
	_, err = sa.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{User: "x", ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: "get", Resource: "pods"}}}, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("SubjectAccessReview (not used): %v, want Forbidden", err)
	}
}
