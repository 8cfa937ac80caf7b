//go:build e2e

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	sandboxtoken "github.com/deerflow-sandbox/provisioner/pkg/token"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
)

// The chart's gateway Pods' labels (deploy/helm/deer-flow,
// templates/gateway-deployment.yaml: deer-flow.selectorLabels plus the
// component) for a release, and the paths its gateway runs with.
func chartGatewayLabels(release string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":      "deer-flow",
		"app.kubernetes.io/instance":  release,
		"app.kubernetes.io/component": "gateway",
	}
}

const chartHostBaseDir = "/app/backend/.deer-flow" // the gateway's DEER_FLOW_HOST_BASE_DIR

// renderChartOverlay writes the kustomization for release in namespace with
// hack/deerflow-chart-overlay.sh and renders it with the kubectl
// hack/install-kube.sh builds, as an operator would.
func renderChartOverlay(t *testing.T, release, namespace string) []*unstructured.Unstructured {
	t.Helper()
	kubectl := filepath.Join(cluster.EnvOr("KUBE_BIN_DIR", filepath.Join(cluster.CacheDir(), "kube-"+cluster.EnvOr("KUBE_VERSION", "v1.36.3"))), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("no kubectl at %s (hack/install-kube.sh builds it): %v", kubectl, err)
	}
	dir := filepath.Join(t.TempDir(), "overlay")
	runScript(t, map[string]string{"OUT": dir}, filepath.Join("..", "..", "hack", "deerflow-chart-overlay.sh"), release, namespace)
	out, err := exec.Command(kubectl, "kustomize", dir).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr)
	}
	for _, leftover := range []string{"RELEASE", ":deer-flow:", "namespace: deer-flow\n", "deer-flow/sandbox-admission"} {
		if namespace != "deer-flow" && strings.Contains(string(out), leftover) {
			t.Errorf("the rendered overlay still contains %q:\n%s", leftover, out)
		}
	}
	rendered := filepath.Join(t.TempDir(), "rendered.yaml")
	if err := os.WriteFile(rendered, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return readObjects(t, rendered)
}

// renderedObject finds one rendered object and converts it to a typed one.
func renderedObject(t *testing.T, objs []*unstructured.Unstructured, apiVersion, kind, name string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.GetAPIVersion() == apiVersion && o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("the rendered overlay has no %s %s %s", apiVersion, kind, name)
}

// TestDeerFlowChartOverlay renders config/overlays/deerflow-chart for a
// release of DeerFlow's Helm chart in a namespace other than config/'s,
// checks that every release- and namespace-derived value followed, that the
// function accepts the rendered settings and builds the very sandbox policy
// rendered, applies it server-side, and then, as the overlay's
// ServiceAccount under its Role, admission policy and Pod Security level,
// creates a sandbox the way the chart's gateway asks for one.
func TestDeerFlowChartOverlay(t *testing.T) {
	const release = "my-deerflow"
	ns := namespace(t)
	objs := renderChartOverlay(t, release, ns)
	home := release + "-deer-flow-home"
	gateway := chartGatewayLabels(release)

	// Every object config/ places in a namespace is in the chart's.
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			if o.GetName() != ns {
				t.Errorf("Namespace %s, want %s", o.GetName(), ns)
			}
			continue
		}
		if o.GetNamespace() != "" && o.GetNamespace() != ns {
			t.Errorf("%s %s is in namespace %s, want %s", o.GetKind(), o.GetName(), o.GetNamespace(), ns)
		}
		if o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "deerflow-chart") {
			t.Errorf("the overlay's local-config ConfigMap %s is in the output", o.GetName())
		}
		if o.GetKind() == "RoleBinding" || o.GetKind() == "ClusterRoleBinding" {
			subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
			for _, s := range subjects {
				if got := s.(map[string]any)["namespace"]; got != ns {
					t.Errorf("%s %s binds a ServiceAccount in %v, want %s", o.GetKind(), o.GetName(), got, ns)
				}
			}
		}
		if o.GetKind() == "ValidatingAdmissionPolicy" {
			conds, _, _ := unstructured.NestedSlice(o.Object, "spec", "matchConditions")
			account := "sandbox-provisioner"
			if o.GetName() == "sandbox-router-resume" {
				account = "sandbox-router"
			}
			want := "request.userInfo.username == 'system:serviceaccount:" + ns + ":" + account + "'"
			if len(conds) != 1 || conds[0].(map[string]any)["expression"] != want {
				t.Errorf("ValidatingAdmissionPolicy %s matches %v, want the one condition %s", o.GetName(), conds, want)
			}
		}
	}

	// The function's settings: the chart's claim, paths, gateway and Secret.
	var svc servingv1.Service
	renderedObject(t, objs, "serving.knative.dev/v1", "Service", "sandbox-provisioner", &svc)
	env := map[string]string{}
	var keyRef *corev1.SecretKeySelector
	for _, e := range svc.Spec.Template.Spec.Containers[0].Env {
		if e.ValueFrom != nil {
			if e.Name == "PROVISIONER_API_KEY" {
				keyRef = e.ValueFrom.SecretKeyRef
			}
			continue
		}
		env[e.Name] = e.Value
	}
	got := map[string]string{}
	for _, k := range []string{"K8S_NAMESPACE", "USERDATA_PVC_NAME", "SKILLS_PVC_NAME", "DEER_FLOW_HOST_BASE_DIR", "THREADS_HOST_PATH", "SANDBOX_INGRESS_FROM_POD_LABELS", "SANDBOX_SERVICE_TYPE"} {
		got[k] = env[k]
	}
	want := map[string]string{
		"K8S_NAMESPACE":                   ns,
		"USERDATA_PVC_NAME":               home,
		"SKILLS_PVC_NAME":                 "deer-flow-skills",
		"DEER_FLOW_HOST_BASE_DIR":         chartHostBaseDir,
		"THREADS_HOST_PATH":               chartHostBaseDir + "/threads",
		"SANDBOX_INGRESS_FROM_POD_LABELS": "app.kubernetes.io/name:deer-flow,app.kubernetes.io/component:gateway,app.kubernetes.io/instance:" + release,
		"SANDBOX_SERVICE_TYPE":            "ClusterIP",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the rendered function's settings (-want +got):\n%s", diff)
	}
	wantRef := &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: release + "-deer-flow-provider"}, Key: "PROVISIONER_API_KEY"}
	if diff := cmp.Diff(wantRef, keyRef); diff != "" {
		t.Errorf("the API key's Secret (-the chart's provider Secret +rendered):\n%s", diff)
	}
	// Every event sender's OIDC subject (in the new namespace) is allowed.
	allowed := strings.Split(env["AUTH_ALLOWED_SUBJECTS"], ",")
	senders := 0
	for _, o := range objs {
		var subject string
		switch o.GetKind() {
		case "Trigger":
			subject = "system:serviceaccount:" + o.GetNamespace() + ":" + o.GetName() + "-oidc-eventing.knative.dev-trigger"
		case "PingSource":
			subject = "system:serviceaccount:" + o.GetNamespace() + ":" + o.GetName() + "-oidc-sources.knative.dev-pingsource"
		default:
			continue
		}
		senders++
		if !slices.Contains(allowed, subject) {
			t.Errorf("%s %s: its OIDC subject %s is not in AUTH_ALLOWED_SUBJECTS %v", o.GetKind(), o.GetName(), subject, allowed)
		}
	}
	if senders != len(allowed) {
		t.Errorf("AUTH_ALLOWED_SUBJECTS names %d subjects for %d event senders: %v", len(allowed), senders, allowed)
	}
	// The Triggers' identities (in the new namespace) are one owner,
	// `default` (the backend's own, as the chart's shared claims need), so
	// that what the create Trigger made the others find.
	groups, err := config.ParsePrincipalGroups(env["PROVISIONER_PRINCIPAL_GROUPS"])
	if err != nil {
		t.Fatalf("the rendered PROVISIONER_PRINCIPAL_GROUPS: %v", err)
	}
	wantGroups := map[string]string{}
	for _, o := range objs {
		if o.GetKind() == "Trigger" {
			wantGroups["system:serviceaccount:"+ns+":"+o.GetName()+"-oidc-eventing.knative.dev-trigger"] = "default"
		}
	}
	if diff := cmp.Diff(wantGroups, groups); diff != "" {
		t.Errorf("the rendered PROVISIONER_PRINCIPAL_GROUPS, member → group (-the Triggers in %s +rendered):\n%s", ns, diff)
	}

	// Who may send into the Broker: its EventPolicy, beside it in the
	// namespace, names config/'s backend sender and each Trigger's identity
	// (the broker filter sends the function's replies back in with it), all
	// in the namespace. The chart makes no sender: its gateway calls the
	// provisioner over HTTP, as the namespace's `default` ServiceAccount.
	type policyRef struct {
		APIVersion string `json:"apiVersion,omitempty"`
		Kind       string `json:"kind,omitempty"`
		Name       string `json:"name,omitempty"`
		Namespace  string `json:"namespace,omitempty"`
	}
	type policyPeer struct {
		Ref *policyRef `json:"ref,omitempty"`
		Sub string     `json:"sub,omitempty"`
	}
	var policy struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
		Spec     struct {
			To   []policyPeer `json:"to"`
			From []policyPeer `json:"from"`
		} `json:"spec"`
	}
	var broker struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	renderedObject(t, objs, "eventing.knative.dev/v1alpha1", "EventPolicy", "sandbox-provisioner-broker-senders", &policy)
	renderedObject(t, objs, "eventing.knative.dev/v1", "Broker", "default", &broker)
	if policy.Metadata.Namespace != ns || broker.Metadata.Namespace != ns {
		t.Errorf("the EventPolicy is in %q and the Broker in %q, want both in %s", policy.Metadata.Namespace, broker.Metadata.Namespace, ns)
	}
	// A `to` ref has no namespace: it names the Broker in the policy's own.
	wantTo := []policyPeer{{Ref: &policyRef{APIVersion: "eventing.knative.dev/v1", Kind: "Broker", Name: broker.Metadata.Name}}}
	if diff := cmp.Diff(wantTo, policy.Spec.To); diff != "" {
		t.Errorf("what the EventPolicy covers (-the Broker +rendered):\n%s", diff)
	}
	wantFrom := []policyPeer{{Sub: "system:serviceaccount:" + ns + ":deer-flow-backend"}}
	for _, o := range objs {
		if o.GetKind() != "Trigger" {
			continue
		}
		if b, _, _ := unstructured.NestedString(o.Object, "spec", "broker"); b != broker.Metadata.Name {
			t.Errorf("Trigger %s reads from Broker %q, want %s", o.GetName(), b, broker.Metadata.Name)
		}
		wantFrom = append(wantFrom, policyPeer{Sub: "system:serviceaccount:" + o.GetNamespace() + ":" + o.GetName() + "-oidc-eventing.knative.dev-trigger"})
	}
	bySub := func(a, b policyPeer) int { return strings.Compare(a.Sub, b.Sub) }
	gotFrom := slices.Clone(policy.Spec.From)
	slices.SortFunc(wantFrom, bySub)
	slices.SortFunc(gotFrom, bySub)
	if diff := cmp.Diff(wantFrom, gotFrom); diff != "" {
		t.Errorf("who may send to the Broker (-the backend and the Triggers in %s +rendered):\n%s", ns, diff)
	}

	// Only the release's gateway may reach the provisioner and the sandboxes.
	var fnPolicy, sandboxPolicy networkingv1.NetworkPolicy
	renderedObject(t, objs, "networking.k8s.io/v1", "NetworkPolicy", "sandbox-provisioner", &fnPolicy)
	renderedObject(t, objs, "networking.k8s.io/v1", "NetworkPolicy", "deer-flow-sandbox-isolation", &sandboxPolicy)
	var podPeers []map[string]string
	for _, p := range fnPolicy.Spec.Ingress[0].From {
		if p.PodSelector != nil {
			podPeers = append(podPeers, p.PodSelector.MatchLabels)
		}
	}
	if diff := cmp.Diff([]map[string]string{gateway}, podPeers); diff != "" {
		t.Errorf("Pods that may reach the provisioner (-the chart's gateway +rendered):\n%s", diff)
	}
	if len(sandboxPolicy.Spec.Ingress) != 0 {
		t.Errorf("the shared sandbox policy admits %+v; want no one (each principal's own policy admits its backends)", sandboxPolicy.Spec.Ingress)
	}

	// The admission policies' parameters: no node directories, the
	// release's home claim and the skills claim only, and the gateway's own
	// labels refused on sandboxes (not app.kubernetes.io/name, which
	// sandboxes carry too: the selector needs all three).
	var params corev1.ConfigMap
	renderedObject(t, objs, "v1", "ConfigMap", "sandbox-admission", &params)
	gotParams := map[string]string{}
	for _, k := range []string{"hostPathRoots", "hostPathSharedRoots", "forbiddenLabels", "persistentVolumeClaims"} {
		gotParams[k] = params.Data[k]
	}
	wantParams := map[string]string{"hostPathRoots": "", "hostPathSharedRoots": "",
		"forbiddenLabels":        "app.kubernetes.io/component=gateway,app.kubernetes.io/instance=" + release,
		"persistentVolumeClaims": home + ",deer-flow-skills"}
	if diff := cmp.Diff(wantParams, gotParams); diff != "" {
		t.Errorf("the admission policies' parameters (-want +got):\n%s", diff)
	}
	for _, o := range objs {
		if ref, ok, _ := unstructured.NestedString(o.Object, "spec", "paramRef", "namespace"); ok && ref != ns {
			t.Errorf("%s %s reads its parameters from namespace %s, want %s", o.GetKind(), o.GetName(), ref, ns)
		}
	}

	// The function starts with these settings and builds the same policy.
	for k, v := range env {
		t.Setenv(k, v)
	}
	t.Setenv("PROVISIONER_API_KEY", "from-the-secret")
	cfg, err := config.Load()
	if err != nil {
		t.Fatalf("the function refuses the rendered settings: %v", err)
	}
	if diff := cmp.Diff(resources.BuildNetworkPolicy(cfg.Objects()), &sandboxPolicy); diff != "" {
		t.Errorf("the rendered sandbox policy differs from what the function builds with the rendered settings (-built +rendered):\n%s", diff)
	}
	// The policy the function writes for DeerFlow's key admits the release's
	// gateway alone.
	ingress := resources.BuildIngressPolicy(cfg.Objects(), config.DefaultPrincipal, cfg.IngressSources(config.DefaultPrincipal, cfg.MultiplePrincipals()))
	if len(ingress.Spec.Ingress) != 1 {
		t.Fatalf("the ingress policy for DeerFlow's key: %+v, want one rule", ingress.Spec.Ingress)
	}
	if diff := cmp.Diff([]networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: gateway}}}, ingress.Spec.Ingress[0].From); diff != "" {
		t.Errorf("Pods that may reach DeerFlow's sandboxes (-the chart's gateway +built):\n%s", diff)
	}

	// The API server takes it. The admission policies and the token-review
	// binding are cluster-wide, under config/'s names: put config/'s back.
	installKnativeCRDs(t)
	t.Cleanup(func() {
		base := readObjects(t, filepath.Join("..", "..", "config", "203-clusterrole-tokenreview.yaml"), filepath.Join("..", "..", "config", "800-admission-policy.yaml"),
			filepath.Join("..", "..", "config", "801-admission-policy-networkpolicies.yaml"))
		applyServerSide(t, slices.DeleteFunc(base, func(o *unstructured.Unstructured) bool { return o.GetNamespace() != "" }))
	})
	applyServerSide(t, objs)
	// The policies take a moment to be in force: wait until they refuse,
	// for the overlay's ServiceAccount, a Pod without the sandbox label, so
	// that the create below passes them, not just their absence. The
	// policy and its binding reach the API server's admission cache
	// separately, and config/'s binding (same name, config/'s parameters)
	// refuses that Pod too: wait as well until a Pod mounting the chart's
	// home claim, which only the overlay's parameters allow, is admitted.
	sa := "system:serviceaccount:" + ns + ":sandbox-provisioner"
	rc := rest.CopyConfig(kc.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: sa}
	asSA := kubernetes.NewForConfigOrDie(rc)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	eventually(t, 30*time.Second, "the overlay's admission policy and binding in force", func() (bool, error) {
		spec, err := api.CreateRequest{SandboxID: "probe", ThreadID: ptr.To("t0"), UserID: ptr.To("user-0")}.Validate(cfg.Objects(), time.Now())
		if err != nil {
			return false, err
		}
		spec.Token = sandboxtoken.New()
		p := resources.BuildPod(cfg.Objects(), spec)
		if _, err := asSA.CoreV1().Pods(ns).Create(context.Background(), p, dryRun); err != nil {
			return false, err
		}
		delete(p.Labels, "app")
		_, err = asSA.CoreV1().Pods(ns).Create(context.Background(), p, dryRun)
		return refusedBy(err, podPolicy, ""), err
	})

	// As the overlay's ServiceAccount, the gateway's create: user data and
	// extra mounts on the home claim under deer-flow/, as DeerFlow's own
	// provisioner mounts them with this chart, and nothing from the node.
	ctx := context.Background()
	bindClaims(t, ns, home, "deer-flow-skills")
	quotaCounted(t, ns)
	proxy.Impersonate(sa)
	defer proxy.Impersonate("")
	run := map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "false"}
	for _, k := range []string{"K8S_NAMESPACE", "USERDATA_PVC_NAME", "SKILLS_PVC_NAME", "DEER_FLOW_HOST_BASE_DIR", "THREADS_HOST_PATH", "SANDBOX_INGRESS_FROM_POD_LABELS", "SANDBOX_SERVICE_TYPE"} {
		if v, ok := env[k]; ok {
			run[k] = v
		}
	}
	f := start(t, ns, run)
	body := map[string]any{
		"sandbox_id": "chart1", "thread_id": "t1", "user_id": "user-1", "include_legacy_skills": true,
		"extra_mounts": []map[string]any{
			{"host_path": chartHostBaseDir + "/users/user-1/threads/t1/acp-workspace", "container_path": "/mnt/acp-workspace", "read_only": true},
		},
	}
	r := mustDo(t, f, "POST", "/api/sandboxes", body)
	expectCode(t, r, 200, "create as the overlay's ServiceAccount")
	pod, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-chart1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]string{}
	for _, v := range pod.Spec.Volumes {
		switch {
		case v.HostPath != nil:
			t.Errorf("volume %s mounts %s from the node", v.Name, v.HostPath.Path)
		case v.PersistentVolumeClaim != nil:
			claims[v.Name] = v.PersistentVolumeClaim.ClaimName
		}
	}
	type mount struct {
		Claim, SubPath string
		ReadOnly       bool
	}
	mounts := map[string]mount{}
	for _, c := range pod.Spec.Containers {
		if c.Name != "sandbox" {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.MountPath == "/mnt/user-data" || m.MountPath == "/mnt/acp-workspace" {
				mounts[m.MountPath] = mount{claims[m.Name], m.SubPath, m.ReadOnly}
			}
		}
	}
	wantMounts := map[string]mount{
		"/mnt/user-data":     {home, "deer-flow/users/user-1/threads/t1/user-data", false},
		"/mnt/acp-workspace": {home, "deer-flow/users/user-1/threads/t1/acp-workspace", true},
	}
	if diff := cmp.Diff(wantMounts, mounts); diff != "" {
		t.Errorf("the sandbox's mounts of the chart's home claim (-DeerFlow's +ours):\n%s", diff)
	}
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/chart1", nil), 200, "delete")
}
