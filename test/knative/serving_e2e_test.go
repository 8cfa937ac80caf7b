//go:build e2e

package knative

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/status"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

var (
	ksvcs      = schema.GroupVersionResource{Group: "serving.knative.dev", Version: "v1", Resource: "services"}
	revisions  = schema.GroupVersionResource{Group: "serving.knative.dev", Version: "v1", Resource: "revisions"}
	brokers    = schema.GroupVersionResource{Group: "eventing.knative.dev", Version: "v1", Resource: "brokers"}
	triggers   = schema.GroupVersionResource{Group: "eventing.knative.dev", Version: "v1", Resource: "triggers"}
	pingSrcs   = schema.GroupVersionResource{Group: "sources.knative.dev", Version: "v1", Resource: "pingsources"}
	policies   = schema.GroupVersionResource{Group: "eventing.knative.dev", Version: "v1alpha1", Resource: "eventpolicies"}
	vwcs       = schema.GroupVersionResource{Group: "admissionregistration.k8s.io", Version: "v1", Resource: "validatingwebhookconfigurations"}
	sandboxSel = "app=deer-flow-sandbox"
)

// ready says whether an object's Ready condition is True, and why not.
func ready(u *unstructured.Unstructured) (bool, string) {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		c, _ := c.(map[string]any)
		if c["type"] == "Ready" {
			return c["status"] == "True", fmt.Sprintf("Ready=%v %v: %v", c["status"], c["reason"], c["message"])
		}
	}
	return false, "no Ready condition"
}

// TestConfigAdmittedAndReady: everything config/ ships went through the
// real Serving and Eventing webhooks (deploy-local applied it; nothing was
// switched off) and is Ready; and those webhooks do refuse what is invalid.
func TestConfigAdmittedAndReady(t *testing.T) {
	need(t)
	ctx := context.Background()
	for _, o := range []struct {
		gvr  schema.GroupVersionResource
		name string
	}{
		{ksvcs, "sandbox-provisioner"}, {brokers, "default"}, {pingSrcs, "sandbox-reaper"},
		{policies, "sandbox-provisioner-broker-senders"},
		{triggers, "sandbox-provisioner-create"}, {triggers, "sandbox-provisioner-get"}, {triggers, "sandbox-provisioner-list"},
		{triggers, "sandbox-provisioner-destroy"}, {triggers, "sandbox-provisioner-pause"}, {triggers, "sandbox-provisioner-resume"},
		{triggers, "sandbox-provisioner-reap"},
	} {
		u, err := dyn.Resource(o.gvr).Namespace(ns).Get(ctx, o.name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("%s %s: %v", o.gvr.Resource, o.name, err)
			continue
		}
		if ok, why := ready(u); !ok {
			t.Errorf("%s %s is not Ready: %s", o.gvr.Resource, o.name, why)
		}
	}

	// Validation is on: Serving's and Eventing's webhooks are registered,
	// failing closed, and refuse an invalid object of each.
	for _, name := range []string{"validation.webhook.serving.knative.dev", "validation.webhook.eventing.knative.dev"} {
		u, err := dyn.Resource(vwcs).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("webhook %s: %v", name, err)
		}
		hooks, _, _ := unstructured.NestedSlice(u.Object, "webhooks")
		for _, h := range hooks {
			if fp := h.(map[string]any)["failurePolicy"]; fp != "Fail" {
				t.Errorf("%s: failurePolicy %v, want Fail", name, fp)
			}
		}
	}
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "serving.knative.dev/v1", "kind": "Service",
		"metadata": map[string]any{"name": "invalid", "namespace": ns},
		"spec": map[string]any{"template": map[string]any{"spec": map[string]any{
			"containerConcurrency": int64(-1),
			"containers":           []any{map[string]any{"image": "localhost/sandbox:e2e"}},
		}}},
	}}
	if _, err := dyn.Resource(ksvcs).Namespace(ns).Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil ||
		!strings.Contains(err.Error(), "validation.webhook.serving.knative.dev") {
		t.Errorf("an invalid Knative Service was not refused by Serving's webhook: %v", err)
	}
	badTrigger := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
		"metadata": map[string]any{"name": "invalid", "namespace": ns},
		"spec":     map[string]any{"broker": "default"},
	}}
	if _, err := dyn.Resource(triggers).Namespace(ns).Create(ctx, badTrigger, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err == nil ||
		!strings.Contains(err.Error(), "validation.webhook.eventing.knative.dev") {
		t.Errorf("a Trigger without a subscriber was not refused by Eventing's webhook: %v", err)
	}
	// And the revision runs on the real node, never on a kwok node. Its
	// min-scale is 0, so a request wakes it first: a check over no Pods
	// would pass whatever node the revision were given.
	expectCode(t, call(t, http.MethodGet, "/api/sandboxes", nil), http.StatusOK, "list through the route")
	var pods []corev1.Pod
	eventually(t, time.Minute, "a function Pod running after a request", func() (bool, error) {
		pods = functionPods(t)
		return len(pods) > 0, fmt.Errorf("%d function Pods running", len(pods))
	})
	for _, p := range pods {
		if p.Spec.NodeName != realnode.Name {
			t.Errorf("function Pod %s runs on %s", p.Name, p.Spec.NodeName)
		}
	}
}

// TestDeerFlowThroughTheRoute replays DeerFlow's recorded requests through
// FUNCTION_URL (Traefik's KIngress, then the activator or the revision's
// queue-proxy), then checks that a sandbox made that way answers a backend
// Pod at its sandbox_url: its ClusterIP Service, by name through CoreDNS,
// through the sandboxes' NetworkPolicy.
func TestDeerFlowThroughTheRoute(t *testing.T) {
	need(t)
	reqs := function.GoldenRequests(t)
	send := func(r function.Recorded, query string) map[string]any {
		t.Helper()
		var body any
		if string(r.Body) != "null" {
			body = []byte(r.Body)
		}
		// DeerFlow sends whatever key it is configured with; the recording's
		// "k1" stands for the deployed function's.
		want := http.StatusUnauthorized
		if _, ok := r.Headers["X-API-Key"]; ok {
			r.Headers["X-API-Key"], want = apiKey, http.StatusOK
		}
		resp, err := fn().DoWithHeaders(r.Method, r.Path+query, body, r.Headers)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code != want {
			t.Fatalf("%s %s: status %d, want %d: %s", r.Method, r.Path, resp.Code, want, resp.Raw)
		}
		return resp.Body
	}
	// The first create asks for the Lark CLI runtime, which this function
	// provides only with a Lark image configured: sent as recorded it is
	// answered as DeerFlow's provisioner answers it; wait for Ready here.
	created := send(reqs[0], "?wait=20s")
	destroyLater(t, "0123456789abcdef")
	if created["ready"] != true {
		t.Errorf("DeerFlow's create with ?wait=20s answered %v, want a ready sandbox", created)
	}
	url, _ := created["sandbox_url"].(string)
	if url != "http://sandbox-0123456789abcdef-svc.deer-flow.svc.cluster.local:8080" {
		t.Errorf("sandbox_url %q, want the sandbox Service's cluster DNS name", url)
	}
	anon := send(reqs[1], "")
	destroyLater(t, "abcd1234")
	if anon["sandbox_id"] != "abcd1234" {
		t.Errorf("anonymous create answered %v", anon)
	}
	if got := send(reqs[2], ""); got["sandbox_url"] != url {
		t.Errorf("GET url %v, create url %v", got["sandbox_url"], url)
	}
	send(reqs[3], "")
	if listed := send(reqs[4], ""); listed["count"] != float64(2) {
		t.Errorf("list count = %v, want 2", listed["count"])
	}

	// Before the delete: the sandbox answers a backend Pod at its URL. As
	// DeerFlow's backend does, retry for a while: kube-proxy programs the
	// Service a moment after the Pod is Ready, and CoreDNS may still hold
	// (up to its 30 s TTL) the address of an earlier sandbox of this id.
	answered := false
	defer func() {
		if !answered {
			t.Logf("what the route to the sandbox looked like when it did not answer:\n%s", routeDiagnosis(t, "0123456789abcdef"))
		}
	}()
	eventually(t, 45*time.Second, "the sandbox answers a backend Pod at "+url, func() (bool, error) {
		out, err := fromBackend(t, url+"/v1/sandbox")
		return err == nil && strings.HasPrefix(out, "200 ") && strings.Contains(out, `"status":"ok"`), fmt.Errorf("%q %v", out, err)
	})
	answered = true

	if d := send(reqs[5], ""); d["ok"] != true || d["sandbox_id"] != "0123456789abcdef" {
		t.Errorf("delete answered %v", d)
	}
	if unauth := send(reqs[6], ""); unauth["detail"] == "" {
		t.Errorf("401 without detail")
	}
}

// fromBackend runs a GET of url inside a Pod labelled as DeerFlow's backend
// (the only Pods the sandbox policy lets in), using the stand-in image's
// http action, and returns what it saw.
func fromBackend(t *testing.T, url string) (string, error) {
	t.Helper()
	pod := backendPod(t, "deer-flow-backend-probe", "default")
	body := fmt.Sprintf(`{"op":"http","url":%q,"timeout_ms":5000}`, url)
	var res struct {
		OK            bool
		Error, Output string
	}
	raw := execInPod(t, pod, body)
	if err := json.Unmarshal([]byte(raw), &res); err != nil {
		t.Fatalf("GET %s from the backend Pod: %s", url, raw)
	}
	if !res.OK {
		return "", fmt.Errorf("%s", res.Error)
	}
	return res.Output, nil
}

// routeDiagnosis describes, for a failure message, each hop from a backend
// Pod to sandbox id: what cluster DNS answers for its name (asked from the
// backend Pod, as its client asks), the Service's address and ports, its
// EndpointSlices, and the Pod's address and readiness. A sandbox that once
// answered another server's 404 at its URL for 45 s (2026-11-27) left only
// the status to go on.
func routeDiagnosis(t *testing.T, id string) string {
	ctx := context.Background()
	var b strings.Builder
	name := resources.ServiceName(id)
	if dns, err := kube.CoreV1().Services("kube-system").Get(ctx, "kube-dns", metav1.GetOptions{}); err != nil {
		fmt.Fprintf(&b, "kube-dns Service: %v\n", err)
	} else {
		q := fmt.Sprintf(`{"op":"dns","server":%q,"name":%q,"timeout_ms":2000}`, dns.Spec.ClusterIP+":53", name+"."+ns+".svc.cluster.local")
		fmt.Fprintf(&b, "DNS from the backend Pod: %s\n", strings.TrimSpace(execInPod(t, backendPod(t, "deer-flow-backend-probe", "default"), q)))
	}
	if svc, err := kube.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
		fmt.Fprintf(&b, "Service: %v\n", err)
	} else {
		fmt.Fprintf(&b, "Service: type %s, cluster IP %s, ports %+v, selector %v, uid %s\n", svc.Spec.Type, svc.Spec.ClusterIP, svc.Spec.Ports, svc.Spec.Selector, svc.UID)
	}
	if l, err := kube.DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + name}); err != nil {
		fmt.Fprintf(&b, "EndpointSlices: %v\n", err)
	} else {
		for _, es := range l.Items {
			for _, e := range es.Endpoints {
				fmt.Fprintf(&b, "EndpointSlice %s: %v ready=%v target=%v\n", es.Name, e.Addresses, ptr.Deref(e.Conditions.Ready, false), e.TargetRef)
			}
		}
	}
	if l, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelID + "=" + id}); err != nil {
		fmt.Fprintf(&b, "Pods: %v\n", err)
	} else {
		for _, p := range l.Items {
			fmt.Fprintf(&b, "Pod %s: IP %s, phase %s, conditions %v\n", p.Name, p.Status.PodIP, p.Status.Phase, p.Status.Conditions)
		}
	}
	return b.String()
}

// backendPod starts (once per name) a Pod of the stand-in image labelled as
// DeerFlow's backend, with the given ServiceAccount, and waits until it
// answers.
func backendPod(t testing.TB, name, sa string) *corev1.Pod {
	t.Helper()
	ctx := context.Background()
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app.kubernetes.io/name": "deer-flow-backend"}},
		Spec: corev1.PodSpec{
			ServiceAccountName: sa,
			Containers: []corev1.Container{{Name: "backend", Image: "localhost/sandbox:e2e", ImagePullPolicy: corev1.PullNever,
				ReadinessProbe: &corev1.Probe{PeriodSeconds: 1, ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/v1/sandbox", Port: intstr.FromInt32(8080)}}},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), RunAsNonRoot: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}, SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}}},
		},
	}
	if _, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var got *corev1.Pod
	eventually(t, 90*time.Second, "backend Pod "+name+" Ready", func() (bool, error) {
		var err error
		got, err = kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range got.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, fmt.Errorf("phase %s", got.Status.Phase)
	})
	return got
}

// execInPod asks the stand-in's /v1/exec (on the Pod's IP, from this
// machine, the node) to run one action, and returns its answer.
func execInPod(t *testing.T, p *corev1.Pod, action string) string {
	t.Helper()
	resp, err := http.Post("http://"+p.Status.PodIP+":8080/v1/exec", "application/json", strings.NewReader(action))
	if err != nil {
		t.Fatalf("exec in %s: %v", p.Name, err)
	}
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
	return b.String()
}

// revisionDeployment is the latest ready revision's Deployment.
func revisionDeployment(t testing.TB) string {
	t.Helper()
	return latestReadyRevision(t) + "-deployment"
}

// patchTemplate merges annotations into the Knative Service's revision
// template (a new revision), waits until it is the ready one, and restores
// the old annotations at cleanup.
func patchTemplate(t testing.TB, annotations map[string]string) {
	t.Helper()
	ctx := context.Background()
	apply := func(a map[string]any) {
		raw, _ := json.Marshal(map[string]any{"spec": map[string]any{"template": map[string]any{"metadata": map[string]any{"annotations": a}}}})
		if _, err := dyn.Resource(ksvcs).Namespace(ns).Patch(ctx, "sandbox-provisioner", types.MergePatchType, raw, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitLatestReady(t)
	}
	u, err := dyn.Resource(ksvcs).Namespace(ns).Get(ctx, "sandbox-provisioner", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old, _, _ := unstructured.NestedStringMap(u.Object, "spec", "template", "metadata", "annotations")
	restore, set := map[string]any{}, map[string]any{}
	for k, v := range annotations {
		set[k] = v
		if o, ok := old[k]; ok {
			restore[k] = o
		} else {
			restore[k] = nil
		}
	}
	apply(set)
	t.Cleanup(func() { apply(restore) })
}

// waitLatestReady waits until the Knative Service's newest revision is
// Ready and serves the route.
func waitLatestReady(t testing.TB) {
	t.Helper()
	eventually(t, 3*time.Minute, "the newest revision Ready", func() (bool, error) {
		u, err := dyn.Resource(ksvcs).Namespace(ns).Get(context.Background(), "sandbox-provisioner", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		gen, obs := u.GetGeneration(), int64(0)
		if v, ok, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration"); ok {
			obs = v
		}
		created, _, _ := unstructured.NestedString(u.Object, "status", "latestCreatedRevisionName")
		readyRev, _, _ := unstructured.NestedString(u.Object, "status", "latestReadyRevisionName")
		ok, why := ready(u)
		return ok && obs == gen && created == readyRev, fmt.Errorf("generation %d observed %d, created %s ready %s, %s", gen, obs, created, readyRev, why)
	})
}

// replicas is the revision Deployment's replica count.
func replicas(t testing.TB, deployment string) int32 {
	t.Helper()
	d, err := kube.AppsV1().Deployments(ns).Get(context.Background(), deployment, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ptr.Deref(d.Spec.Replicas, 1)
}

// scaleToZeroWindow is the test-only short window: Knative's minimum
// stable window, no retention after the last request, and the activator
// always in the path so a request at zero is held, not dropped.
var scaleToZeroWindow = map[string]string{
	"autoscaling.knative.dev/window":                             "6s",
	"autoscaling.knative.dev/scale-to-zero-pod-retention-period": "0s",
	"autoscaling.knative.dev/target-burst-capacity":              "-1",
}

// waitZero waits until the revision's Deployment is at 0 replicas.
func waitZero(t testing.TB, deployment string) time.Duration {
	t.Helper()
	start := time.Now()
	eventually(t, 3*time.Minute, deployment+" at 0 replicas", func() (bool, error) {
		return replicas(t, deployment) == 0, nil
	})
	return time.Since(start)
}

// TestScaleToZeroAndWake: with no traffic the revision goes to zero
// replicas; a create through the route wakes it (activator, then the
// revision's queue-proxy) and is answered 200, with a wait that outlasts
// the sandbox's own start, from zero and warm.
func TestScaleToZeroAndWake(t *testing.T) {
	need(t)
	patchTemplate(t, scaleToZeroWindow)
	dep := revisionDeployment(t)
	took := waitZero(t, dep)
	t.Logf("%s reached 0 replicas %s after the new revision was Ready", dep, took.Round(time.Second))

	// From zero: a sandbox whose server starts 10 s late, waited for.
	slow := map[string]any{"sandbox_id": "wake0000slow0001", "env": map[string]string{"STANDIN_START_DELAY": "10s"}}
	destroyLater(t, "wake0000slow0001")
	start := time.Now()
	r := call(t, http.MethodPost, "/api/sandboxes?wait=20s", slow)
	expectCode(t, r, http.StatusOK, "create with ?wait=20s from zero")
	if r.Body["status"] != "Running" || r.Body["ready"] != true {
		t.Errorf("from zero, waited create answered %s, want a Running, ready sandbox", r.Raw)
	}
	if el := time.Since(start); el < 9*time.Second {
		t.Errorf("answered after %s, before the sandbox's server could start (10 s)", el)
	}
	t.Logf("create with ?wait=20s from zero: %s", time.Since(start).Round(time.Millisecond))
	if n := replicas(t, dep); n < 1 {
		t.Errorf("%s has %d replicas after a request woke it", dep, n)
	}

	// Warm: the same through a running revision.
	slow["sandbox_id"] = "wake0000slow0002"
	destroyLater(t, "wake0000slow0002")
	start = time.Now()
	r = call(t, http.MethodPost, "/api/sandboxes?wait=20s", slow)
	expectCode(t, r, http.StatusOK, "create with ?wait=20s, warm")
	if r.Body["status"] != "Running" || r.Body["ready"] != true {
		t.Errorf("warm, waited create answered %s, want a Running, ready sandbox", r.Raw)
	}
	t.Logf("create with ?wait=20s, warm: %s", time.Since(start).Round(time.Millisecond))
}

// TestManyReplicasOneSandbox: with a minimum of two replicas, 20
// concurrent creates of one id give one sandbox. They go through the route
// and straight to each of two Ready replicas in turn, and both replicas'
// audit lines must show they served: through the route alone the activator
// may send every create to one replica, and one replica proves nothing
// about many.
func TestManyReplicasOneSandbox(t *testing.T) {
	need(t)
	patchTemplate(t, map[string]string{"autoscaling.knative.dev/min-scale": "2"})
	rev := latestReadyRevision(t)
	var readyPods []corev1.Pod
	eventually(t, 2*time.Minute, "two function Pods of "+rev+" Ready", func() (bool, error) {
		readyPods = readyPods[:0]
		for _, p := range functionPods(t) {
			if p.Labels["serving.knative.dev/revision"] == rev && status.Ready(&p) {
				readyPods = append(readyPods, p)
			}
		}
		return len(readyPods) >= 2, fmt.Errorf("%d Ready", len(readyPods))
	})
	const id = "many0000replicas"
	destroyLater(t, id)
	targets := []string{fnURL}
	for _, p := range readyPods[:2] {
		targets = append(targets, "http://"+p.Status.PodIP+":8080")
	}
	var wg sync.WaitGroup
	codes := make([]int, 20)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			to := &function.Instance{URL: targets[i%len(targets)], Client: &http.Client{Timeout: 90 * time.Second}}
			r, err := to.DoWithHeaders(http.MethodPost, "/api/sandboxes", map[string]any{"sandbox_id": id}, map[string]string{"X-API-Key": apiKey})
			if err == nil {
				codes[i] = r.Code
			}
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Errorf("create %d (to %s) answered %d", i, targets[i%len(targets)], c)
		}
	}
	pods, err := kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sandboxSel + ",sandbox-id=" + id})
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := kube.CoreV1().Services(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sandboxSel + ",sandbox-id=" + id})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 1 || len(svcs.Items) != 1 {
		t.Errorf("%d Pods and %d Services for one id, want 1 and 1", len(pods.Items), len(svcs.Items))
	}
	// Both replicas the creates were sent to straight must have served: a create
	// writes an audit line with the id (package audit), so a replica's log
	// names it only if it served one.
	for _, p := range readyPods[:2] {
		raw, err := kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: "provisioner"}).DoRaw(context.Background())
		if err != nil {
			t.Fatalf("logs of %s: %v", p.Name, err)
		}
		if !strings.Contains(string(raw), id) {
			t.Errorf("replica %s logged no create of %s: two replicas did not both serve", p.Name, id)
		}
	}
}

// latestReadyRevision is the Knative Service's newest Ready revision.
func latestReadyRevision(t testing.TB) string {
	t.Helper()
	u, err := dyn.Resource(ksvcs).Namespace(ns).Get(context.Background(), "sandbox-provisioner", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rev, _, _ := unstructured.NestedString(u.Object, "status", "latestReadyRevisionName")
	if rev == "" {
		t.Fatal("the Knative Service has no Ready revision")
	}
	return rev
}

// TestFuncInvokeThroughTheRoute runs the real func CLI's invoke against the
// deployed function's route.
func TestFuncInvokeThroughTheRoute(t *testing.T) {
	need(t)
	bin := filepath.Join(cluster.CacheDir(), "func-"+cluster.EnvOr("FUNC_VERSION", "v0.48.4"), "func")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no func CLI at %s (make tools builds it): %v", bin, err)
	}
	dir := t.TempDir()
	raw, err := os.ReadFile(filepath.Join(root, "func.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "func.yaml"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		data, want string
	}{
		{`{"operation":"create","sandbox_id":"funcinvoke000001","api_key":"` + apiKey + `"}`, `"sandbox_id":"funcinvoke000001"`},
		{`{"operation":"list","api_key":"` + apiKey + `"}`, `"funcinvoke000001"`},
		{`{"operation":"destroy","sandbox_id":"funcinvoke000001","api_key":"` + apiKey + `"}`, `"ok":true`},
	} {
		cmd := exec.Command(bin, "invoke", "--path", dir, "--target", fnURL, "--format", "http", "--data", c.data)
		cmd.Env = append(os.Environ(), "FUNC_VERBOSE=false")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("func invoke %s: %v\n%s", c.data, err, out)
		}
		if !strings.Contains(strings.Join(strings.Fields(string(out)), ""), c.want) {
			t.Errorf("func invoke %s printed %s, want %s in it", strings.ReplaceAll(c.data, apiKey, "…"), out, c.want)
		}
	}
}

// TestHeadlessSandboxAnswersByName: with SANDBOX_SERVICE_TYPE=Headless a
// sandbox's URL is the same cluster DNS name as in ClusterIP mode, and the
// real CoreDNS answers it with the sandbox Pod's own address (the Service
// has no virtual IP): a backend Pod reaches the sandbox at that URL,
// through the sandboxes' NetworkPolicy.
func TestHeadlessSandboxAnswersByName(t *testing.T) {
	need(t)
	local := headlessFunction(t)
	const id = "headless1"
	r, err := local.Do(http.MethodPost, "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": id})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = local.Do(http.MethodDelete, "/api/sandboxes/"+id, nil) }()
	if r.Code != http.StatusOK || r.Body["ready"] != true {
		t.Fatalf("create in Headless mode: %d %s", r.Code, r.Raw)
	}
	url := r.Body["sandbox_url"]
	if url != "http://sandbox-"+id+"-svc."+ns+".svc.cluster.local:8080" {
		t.Errorf("sandbox_url %v, want the sandbox Service's cluster DNS name", url)
	}
	svc, err := kube.CoreV1().Services(ns).Get(context.Background(), "sandbox-"+id+"-svc", metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone {
		t.Fatalf("the sandbox Service in Headless mode: %v, clusterIP %q, want None", err, svc.Spec.ClusterIP)
	}
	eventually(t, 45*time.Second, fmt.Sprintf("the sandbox answers a backend Pod at %v", url), func() (bool, error) {
		out, err := fromBackend(t, fmt.Sprint(url)+"/v1/sandbox")
		return err == nil && strings.HasPrefix(out, "200 ") && strings.Contains(out, `"status":"ok"`), fmt.Errorf("%q %v", out, err)
	})
}

// TestHeadlessSandboxAnswersDeerFlowsPoll: DeerFlow's backend creates
// without ?wait and polls {sandbox_url}/v1/sandbox at once. In Headless
// mode cluster DNS answers the name from the Service's EndpointSlice; a
// lookup made before that lists the Pod is answered NXDOMAIN, and CoreDNS
// caches the denial (cache 30 with ttl 30, in this suite's Corefile as in
// kubeadm's), so the poll would fail for half a minute after the sandbox
// turned Ready. The first 200 must come well before that: within 15 s of
// the create (Ready takes about a second here), for a cold create and for
// one served from a warm pool.
func TestHeadlessSandboxAnswersDeerFlowsPoll(t *testing.T) {
	need(t)
	local := headlessFunction(t)
	warmPool(t, local, "warm-headless")
	for _, c := range []struct {
		name, id, template string
		pooled             bool
	}{
		{"cold", "headless2", "", false},
		// A claimed Pod is Ready before its Service exists: the window is
		// the EndpointSlice controller's reaction to the new Service.
		{"from the warm pool", "headless3", "warm-headless", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			body := map[string]any{"sandbox_id": c.id}
			if c.template != "" {
				body["template"] = c.template
			}
			r, err := local.Do(http.MethodPost, "/api/sandboxes", body)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _, _ = local.Do(http.MethodDelete, "/api/sandboxes/"+c.id, nil) }()
			url, _ := r.Body["sandbox_url"].(string)
			if r.Code != http.StatusOK || url == "" || (r.Body["pooled"] == true) != c.pooled {
				t.Fatalf("create in Headless mode: %d %s; want pooled %v", r.Code, r.Raw, c.pooled)
			}
			var polls []string
			for time.Since(start) < 45*time.Second {
				out, err := fromBackend(t, url+"/v1/sandbox")
				if err == nil && strings.HasPrefix(out, "200 ") {
					break
				}
				polls = append(polls, fmt.Sprintf("%.1fs: %q %v", time.Since(start).Seconds(), out, err))
				time.Sleep(100 * time.Millisecond)
			}
			took := time.Since(start)
			t.Logf("create → first 200 by name from a backend Pod: %s (%d polls before)", took.Round(time.Millisecond), len(polls))
			if took > 15*time.Second {
				t.Errorf("the first 200 from %s came %s after the create, want within 15 s; the polls before it:\n%s", url, took.Round(time.Millisecond), strings.Join(polls, "\n"))
			}
		})
	}
}

// warmPool makes a template named name with a warm pool of one Pod,
// through local's POST /api/reap (which keeps the pools; reads do not), and
// waits until that Pod is Ready.
func warmPool(t *testing.T, local *function.Instance, name string) {
	t.Helper()
	ctx := context.Background()
	zeroPool(t, name) // the template, and its removal at cleanup
	if r, err := local.Do(http.MethodPost, "/api/reap", nil); err != nil || r.Code != http.StatusOK {
		t.Fatalf("POST /api/reap: %v %v", r, err)
	}
	eventually(t, 60*time.Second, "the warm pool of "+name+" stands one Ready Pod", func() (bool, error) {
		l, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelPool + "=" + name})
		if err != nil {
			return false, err
		}
		for _, p := range l.Items {
			if realnode.Ready(&p) {
				return true, nil
			}
		}
		return false, fmt.Errorf("%d pooled Pods, none Ready", len(l.Items))
	})
}

// headlessFunction starts the function in Headless mode. Stand-in: it runs
// as a process on this machine with the suite's administrator kubeconfig,
// beside the deployed one, whose mode is ClusterIP (a second revision in
// Headless mode would disturb the suite's other tests); it makes the same
// objects.
func headlessFunction(t *testing.T) *function.Instance {
	t.Helper()
	bin, err := function.Binary()
	if err != nil {
		t.Fatal(err)
	}
	env := function.BaseEnv(kubeconfigPath, ns)
	env["SANDBOX_SERVICE_TYPE"] = config.ServiceHeadless
	env["SANDBOX_IMAGE"] = "localhost/sandbox:e2e"
	env["SANDBOX_USER_NAMESPACE"] = "false"
	// As config/ deploys it: DeerFlow's mounts from the claims, not host
	// paths, which the namespace's Pod Security level refuses.
	env["SKILLS_PVC_NAME"], env["USERDATA_PVC_NAME"] = "deer-flow-skills", "deer-flow-user-data"
	// config/ applied the shared NetworkPolicy: this function only checks it.
	env["SANDBOX_NETWORK_POLICY_ENSURE"] = "false"
	local, err := function.StartBinary(bin, env, filepath.Join(t.TempDir(), "headless.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(local.Stop)
	return local
}
