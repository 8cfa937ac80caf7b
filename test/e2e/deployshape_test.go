//go:build e2e

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/follow"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// bindClaims makes each claim in ns and a volume bound to it. kwok mounts
// nothing; the scheduler only needs the claims bound.
func bindClaims(t *testing.T, ns string, claims ...string) {
	t.Helper()
	ctx := context.Background()
	for _, claim := range claims {
		pv := &corev1.PersistentVolume{
			ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + claim},
			Spec: corev1.PersistentVolumeSpec{
				Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
				PersistentVolumeSource: corev1.PersistentVolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs.invalid", Path: "/" + claim}},
				ClaimRef:               &corev1.ObjectReference{Namespace: ns, Name: claim},
			},
		}
		if _, err := client().CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: claim, Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany}, VolumeName: pv.Name, StorageClassName: ptr.To(""),
				Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
			},
		}
		if _, err := client().CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
}

// quotaCounted waits until every ResourceQuota in ns has been counted: until
// then the API server refuses Pods.
func quotaCounted(t *testing.T, ns string) {
	t.Helper()
	eventually(t, 30*time.Second, "ResourceQuota counted", func() (bool, error) {
		l, err := client().CoreV1().ResourceQuotas(ns).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, q := range l.Items {
			if len(q.Status.Hard) == 0 {
				return false, nil
			}
		}
		return true, nil
	})
}

// serviceEnv is the settings config/400-service.yaml gives the function:
// every variable with a literal value (the API key comes from a Secret
// there, from the harness here).
func serviceEnv(t *testing.T) map[string]string {
	t.Helper()
	objs := readObjects(t, filepath.Join("..", "..", "config", "400-service.yaml"))
	containers, _, err := unstructured.NestedSlice(objs[0].Object, "spec", "template", "spec", "containers")
	if err != nil || len(containers) != 1 {
		t.Fatalf("400-service.yaml: one container expected: %v", err)
	}
	env := map[string]string{}
	list, _, _ := unstructured.NestedSlice(containers[0].(map[string]any), "env")
	for _, e := range list {
		m := e.(map[string]any)
		if v, ok := m["value"].(string); ok {
			env[m["name"].(string)] = v
		}
	}
	if env["USERDATA_PVC_NAME"] == "" || env["K8S_NAMESPACE"] == "" {
		t.Fatalf("400-service.yaml no longer runs in PVC mode: %v", env)
	}
	return env
}

// TestDeerFlowCreateInTheShapeConfigDeploys replays DeerFlow's recorded
// create, extra mounts included, against the function set up as config/
// deploys it: its namespace (Pod Security baseline), ServiceAccount, Role,
// isolation policy, admission policy, LimitRange and ResourceQuota, the
// settings of 400-service.yaml (PVC mode), acting as the ServiceAccount.
// The create succeeds and the Pod the API server stored mounts what
// DeerFlow's provisioner mounts, at DeerFlow's subPaths on the claims.
func TestDeerFlowCreateInTheShapeConfigDeploys(t *testing.T) {
	env, ns := configShape(t)
	ctx := context.Background()
	proxy.Impersonate(serviceAccount)
	defer proxy.Impersonate("")
	f := start(t, ns, env)
	t.Cleanup(func() { _, _ = f.Do("DELETE", "/api/sandboxes/0123456789abcdef", nil) })

	create := goldenRequests(t)[0]
	create.Headers["X-API-Key"] = function.Key
	r, err := f.DoWithHeaders(create.Method, create.Path, []byte(create.Body), create.Headers)
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, r, 200, "DeerFlow's create in the shape config/ deploys")

	pod, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-0123456789abcdef", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			claims[v.Name] = v.PersistentVolumeClaim.ClaimName
		}
		if v.HostPath != nil {
			t.Errorf("volume %s is a hostPath, which the namespace's Pod Security refuses", v.Name)
		}
	}
	got := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		if c, ok := claims[m.Name]; ok {
			mode := "rw"
			if m.ReadOnly {
				mode = "ro"
			}
			got[m.MountPath] = c + " " + m.SubPath + " " + mode
		}
	}
	// DeerFlow's PVC mode (docker/provisioner/app.py) for this request.
	want := map[string]string{
		"/mnt/skills":        "deer-flow-skills  ro",
		"/mnt/user-data":     "deer-flow-user-data deer-flow/users/user-1/threads/t1/user-data rw",
		"/mnt/acp-workspace": "deer-flow-user-data deer-flow/users/user-1/threads/t1/acp-workspace ro",
		"/mnt/skills/custom": "deer-flow-user-data deer-flow/users/user-1/skills_view/custom ro",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the stored Pod's claim mounts differ from DeerFlow's (-DeerFlow +stored):\n%s", diff)
	}
}

// configShape sets up what config/ deploys around the function (its
// namespace, ServiceAccount, Role and the read of its RuntimeClass,
// isolation and admission policies,
// LimitRange and ResourceQuota, DeerFlow's claims bound) and returns the
// settings of 400-service.yaml with the namespace they name.
func configShape(t *testing.T) (map[string]string, string) {
	t.Helper()
	var files []string
	for _, name := range []string{"100-namespace.yaml", "200-serviceaccount.yaml", "201-role.yaml", "202-rolebinding.yaml",
		"204-clusterrole-runtimeclass.yaml", "701-networkpolicy-sandboxes.yaml", "800-admission-policy.yaml", "801-admission-policy-networkpolicies.yaml", "900-limitrange.yaml"} {
		files = append(files, filepath.Join("..", "..", "config", name))
	}
	applyServerSide(t, readObjects(t, files...))
	env := serviceEnv(t)
	ns := env["K8S_NAMESPACE"]
	eventually(t, 30*time.Second, "default ServiceAccount in "+ns, func() (bool, error) {
		_, err := client().CoreV1().ServiceAccounts(ns).Get(context.Background(), "default", metav1.GetOptions{})
		return err == nil, err
	})
	bindClaims(t, ns, env["SKILLS_PVC_NAME"], env["USERDATA_PVC_NAME"])
	quotaCounted(t, ns)
	env["SANDBOX_NETWORK_POLICY_ENSURE"] = "false" // config/ ships it; the Role may only read it
	return env, ns
}

// TestHeadlessCreateUnderTheRole: in Headless mode, set up as config/
// deploys the function and acting as its ServiceAccount, a create without
// ?wait is answered once an EndpointSlice of the sandbox's Service lists
// its Pod (so that cluster DNS answers the name): the Role grants the
// watch it needs. Without it the create is answered at once and the
// function says so at Warn, which this test reads.
func TestHeadlessCreateUnderTheRole(t *testing.T) {
	env, ns := configShape(t)
	env["SANDBOX_SERVICE_TYPE"] = config.ServiceHeadless
	ctx := context.Background()
	// The Pod gets an address (the name something to list) only once it is
	// scheduled, which waits for DeerFlow's claims to be bound.
	eventually(t, 60*time.Second, "DeerFlow's claims Bound", func() (bool, error) {
		for _, c := range []string{env["SKILLS_PVC_NAME"], env["USERDATA_PVC_NAME"]} {
			pvc, err := client().CoreV1().PersistentVolumeClaims(ns).Get(ctx, c, metav1.GetOptions{})
			if err != nil || pvc.Status.Phase != corev1.ClaimBound {
				return false, err
			}
		}
		return true, nil
	})
	proxy.Impersonate(serviceAccount)
	defer proxy.Impersonate("")
	f := start(t, ns, env)
	const id = "headlessrole1"
	t.Cleanup(func() { _, _ = f.Do("DELETE", "/api/sandboxes/"+id, nil) })
	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": id, "thread_id": "t1"})
	expectCode(t, r, 200, "a Headless create as the ServiceAccount")
	pod, err := client().CoreV1().Pods(ns).Get(ctx, resources.PodName(id), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc := resources.ServiceName(id)
	l, err := client().DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(l.Items, func(s discoveryv1.EndpointSlice) bool { return follow.ListsAddress(&s, svc, pod.UID) }) {
		t.Errorf("answered before an EndpointSlice of its Service listed its Pod %s (%d slices)", pod.Name, len(l.Items))
	}
	log, err := os.ReadFile(f.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(log), follow.LogAnsweredUnnamed) {
		t.Errorf("the function answered without the name; its log:\n%s", log)
	}
}

// TestAdmissionRefusalsSaySo: a Pod that Pod Security or the admission
// policy refuses is reported naming what refused it and what, with the
// setting to fix, never as a missing RBAC permission; and nothing is left
// behind.
func TestAdmissionRefusalsSaySo(t *testing.T) {
	t.Run("Pod Security refuses host-path mode", func(t *testing.T) {
		ns := namespace(t)
		labelled, err := client().CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		labelled.Labels["pod-security.kubernetes.io/enforce"] = "baseline"
		if _, err := client().CoreV1().Namespaces().Update(context.Background(), labelled, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		f := start(t, ns, nil)
		r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "psa1", "thread_id": "t1"})
		refusedSaying(t, r, 500, `Pod Security "baseline`, "hostPath", "USERDATA_PVC_NAME")
		if n := len(pods(t, ns, "sandbox-id=psa1")) + len(services(t, ns, "sandbox-id=psa1")); n != 0 {
			t.Errorf("%d objects left behind by the refused create", n)
		}
	})
	t.Run("the admission policy refuses a base directory out of step with it", func(t *testing.T) {
		ns, _ := serviceAccountNamespace(t)
		proxy.Impersonate(serviceAccount)
		defer proxy.Impersonate("")
		f := start(t, ns, map[string]string{"DEER_FLOW_HOST_BASE_DIR": "/srv/deer-flow", "THREADS_HOST_PATH": "/srv/deer-flow/threads",
			"SANDBOX_NETWORK_POLICY_ENSURE": "false", "SANDBOX_NETWORK_POLICY": "false", "SANDBOX_RUNTIME_CLASS": "gvisor", "SANDBOX_USER_NAMESPACE": "false"})
		r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "vap1", "thread_id": "t1"})
		refusedSaying(t, r, 500, "admission policy sandbox-provisioner-pods", "DEER_FLOW_HOST_BASE_DIR")
	})
}

func refusedSaying(t *testing.T, r function.Response, code int, parts ...string) {
	t.Helper()
	detail, _ := r.Body["detail"].(string)
	if r.Code != code {
		t.Fatalf("status %d, want %d: %s", r.Code, code, r.Raw)
	}
	for _, p := range parts {
		if !strings.Contains(detail, p) {
			t.Errorf("detail %q does not say %q", detail, p)
		}
	}
	if strings.Contains(detail, "Role") {
		t.Errorf("detail %q sends the operator to the Role", detail)
	}
}

// TestE2BCreateInTheShapeConfigDeploys: set up as config/ deploys the
// function (its LimitRange, which defaults cpu, memory and ephemeral
// storage, among the rest) and acting as its ServiceAccount, an E2B create
// of config/templates/e2b.yaml as shipped is admitted, and so are its warm
// pool's Pods. A container that leaves a resource for the LimitRange to
// fill in gets the Pod annotated kubernetes.io/limit-ranger, which the
// admission policy refuses: that refused every E2B create on the Knative
// deployment while the policy test (no LimitRange) admitted the Pod.
// Stand-ins: kwok's node (the Pods are only admitted and scheduled) and a
// token key written here (config/ reads it from the Secret sandbox-e2b-key).
func TestE2BCreateInTheShapeConfigDeploys(t *testing.T) {
	env, ns := configShape(t)
	ctx := context.Background()
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte("a-test-token-key-of-thirty-two-bytes-or-more"), 0o600); err != nil {
		t.Fatal(err)
	}
	env["SANDBOX_ENVD_IMAGE"] = "localhost/sandbox-envd:e2e"
	env["E2B_TOKEN_KEY_FILE"] = keyFile
	applyTemplates(t, ns, "e2b")
	poolPods := keys.LabelPool + "=base"
	t.Cleanup(func() {
		_ = client().CoreV1().PodTemplates(ns).Delete(ctx, "base", metav1.DeleteOptions{})
		_ = client().CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: poolPods})
	})
	proxy.Impersonate(serviceAccount)
	defer proxy.Impersonate("")
	f := start(t, ns, env)

	r, err := f.Do("POST", "/e2b/sandboxes", map[string]any{"templateID": "base", "timeout": 60, "metadata": map[string]string{"run": "shape"}})
	if err != nil {
		t.Fatal(err)
	}
	expectCode(t, r, 201, "an E2B create of config/templates/e2b.yaml in the shape config/ deploys")
	id, _ := r.Body["sandboxID"].(string)
	t.Cleanup(func() { _, _ = f.Do("DELETE", "/e2b/sandboxes/"+id, nil) })
	pod, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for k := range pod.Annotations {
		if !strings.HasPrefix(k, "sandbox.deerflow.dev/") {
			t.Errorf("the stored E2B Pod carries the annotation %s; want only sandbox.deerflow.dev/ ones", k)
		}
	}
	// The pool's Pods (the agent without a token hash) are admitted too.
	eventually(t, 30*time.Second, "the e2b template's warm pool of 2 admitted", func() (bool, error) {
		l, err := client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: poolPods})
		return err == nil && len(l.Items) >= 2, err
	})
}
