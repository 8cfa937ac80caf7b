//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/events"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// applyTemplates applies config/templates/<name>.yaml, as shipped, into ns.
func applyTemplates(t *testing.T, ns string, names ...string) {
	t.Helper()
	for _, name := range names {
		objs := readObjects(t, filepath.Join("..", "..", "config", "templates", name+".yaml"))
		for _, o := range objs {
			o.SetNamespace(ns)
		}
		applyServerSide(t, objs)
	}
}

// putTemplate creates or replaces a PodTemplate in ns.
func putTemplate(t *testing.T, ns string, pt *corev1.PodTemplate) {
	t.Helper()
	ctx := context.Background()
	pts := client().CoreV1().PodTemplates(ns)
	existing, err := pts.Get(ctx, pt.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = pts.Create(ctx, pt, metav1.CreateOptions{})
	case err == nil:
		pt.ResourceVersion = existing.ResourceVersion
		_, err = pts.Update(ctx, pt, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("put template %s: %v", pt.Name, err)
	}
}

func podTemplate(name string, annotations map[string]string, spec corev1.PodSpec) *corev1.PodTemplate {
	return &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{keys.LabelTemplate: "true"}, Annotations: annotations},
		Template:   corev1.PodTemplateSpec{Spec: spec},
	}
}

// shape is what a test compares of a sandbox's objects: what the template
// and the provisioner decide, without what the API server or the node add.
type shape struct {
	Workload         string // Pod or ReplicaSet
	Replicas         int32
	Labels           map[string]string
	Template         string
	Containers       []string // name=image
	InitContainers   []string
	Volumes          []string // name:type
	Mounts           []string // sandbox container mount paths
	ImagePullSecrets []string
	NodeSelector     map[string]string
	Limits           map[string]string // sandbox container
	Deadline         bool              // activeDeadlineSeconds set
	Probes           []string          // the sandbox container's probes: kind period×failures (+initial delay)
	Hardened         bool              // every container drops ALL, no escalation, RuntimeDefault
	NoToken          bool
	Chain            string // which of the Service and the workload owns the other
}

func shapeOf(t *testing.T, ns, id string) shape {
	t.Helper()
	ctx := context.Background()
	var s shape
	var spec corev1.PodSpec
	var meta metav1.ObjectMeta
	if rs, err := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{}); err == nil {
		s.Workload, s.Replicas, spec, meta = "ReplicaSet", *rs.Spec.Replicas, rs.Spec.Template.Spec, rs.Spec.Template.ObjectMeta
		if _, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{}); err == nil {
			t.Errorf("sandbox %s has both a ReplicaSet and a bare Pod", id)
		}
	} else {
		pod, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("sandbox %s: neither a ReplicaSet nor a Pod: %v", id, err)
		}
		s.Workload, spec, meta = "Pod", pod.Spec, pod.ObjectMeta
	}
	s.Labels = map[string]string{}
	for k, v := range meta.Labels {
		if k != "sandbox.deerflow.dev/user" && k != "sandbox.deerflow.dev/thread" {
			s.Labels[k] = v
		}
	}
	// The selector token is random: its shape is what is compared.
	if tok, ok := s.Labels[keys.LabelToken]; ok && regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(tok) {
		s.Labels[keys.LabelToken] = "<32 hex digits>"
	}
	s.Template = meta.Annotations["sandbox.deerflow.dev/template-name"]
	s.Hardened, s.NoToken = true, spec.AutomountServiceAccountToken != nil && !*spec.AutomountServiceAccountToken
	for _, c := range spec.Containers {
		s.Containers = append(s.Containers, c.Name+"="+c.Image)
	}
	for _, c := range spec.InitContainers {
		s.InitContainers = append(s.InitContainers, c.Name+"="+c.Image)
	}
	for _, c := range append(append([]corev1.Container{}, spec.Containers...), spec.InitContainers...) {
		sc := c.SecurityContext
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil ||
			len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" || sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			s.Hardened = false
		}
	}
	for _, v := range spec.Volumes {
		kind := "other"
		switch {
		case v.HostPath != nil:
			kind = "hostPath"
		case v.NFS != nil:
			kind = "nfs"
		case v.EmptyDir != nil:
			kind = "emptyDir"
		case v.PersistentVolumeClaim != nil:
			kind = "pvc"
		}
		s.Volumes = append(s.Volumes, v.Name+":"+kind)
	}
	sandbox := spec.Containers[0]
	for _, m := range sandbox.VolumeMounts {
		s.Mounts = append(s.Mounts, m.MountPath)
	}
	sort.Strings(s.Mounts)
	for _, p := range spec.ImagePullSecrets {
		s.ImagePullSecrets = append(s.ImagePullSecrets, p.Name)
	}
	s.NodeSelector = spec.NodeSelector
	s.Limits = map[string]string{}
	for k, q := range sandbox.Resources.Limits {
		s.Limits[string(k)] = q.String()
	}
	s.Deadline = spec.ActiveDeadlineSeconds != nil
	for _, p := range []struct {
		kind  string
		probe *corev1.Probe
	}{{"startup", sandbox.StartupProbe}, {"readiness", sandbox.ReadinessProbe}, {"liveness", sandbox.LivenessProbe}} {
		if p.probe != nil {
			s.Probes = append(s.Probes, fmt.Sprintf("%s %ds×%d+%ds", p.kind, p.probe.PeriodSeconds, p.probe.FailureThreshold, p.probe.InitialDelaySeconds))
		}
	}
	svc, err := client().CoreV1().Services(ns).Get(ctx, "sandbox-"+id+"-svc", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("sandbox %s has no Service: %v", id, err)
	}
	for _, r := range svc.OwnerReferences {
		s.Chain = r.Kind + " owns Service"
	}
	for _, r := range meta.OwnerReferences {
		if r.Kind == "Service" && r.UID == svc.UID {
			s.Chain = "Service owns " + s.Workload
		}
	}
	return s
}

// deerflowImage is the image config/templates/self-healing.yaml names.
const deerflowImage = "enterprise-public-cn-beijing.cr.volces.com/vefaas-public/all-in-one-sandbox:latest"

func sandboxLabels(id string, extra map[string]string) map[string]string {
	l := map[string]string{"app": "deer-flow-sandbox", "sandbox-id": id, "app.kubernetes.io/name": "deer-flow",
		"app.kubernetes.io/component": "sandbox", "app.kubernetes.io/managed-by": "deerflow-sandbox-provisioner",
		keys.LabelPrincipal: resources.PrincipalLabelValue("default"), keys.LabelToken: "<32 hex digits>",
		keys.LabelEgress: "open"} // the default mode, recorded on every sandbox
	for k, v := range extra {
		l[k] = v
	}
	return l
}

// TestTemplatesShapeTheSandbox creates a sandbox with each of three
// templates (the built-in default, config/templates/python.yaml and
// config/templates/self-healing.yaml, applied as shipped) and compares the
// objects made with what each template asks for.
func TestTemplatesShapeTheSandbox(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	applyTemplates(t, ns, "python", "self-healing")
	f := start(t, ns, nil)
	defaultMounts := []string{"/mnt/skills/custom", "/mnt/skills/legacy", "/mnt/skills/public", "/mnt/user-data"}
	// Host-path mode: DeerFlow's mounts rooted at the shared skills view,
	// the user's tree and the thread's directory (see sandbox.hostRootOf).
	hostRoots := []string{"host-shared-skills-view-fa5d0ede:hostPath", "host-user:hostPath", "host-thread:hostPath"}
	limits := map[string]string{"cpu": "1", "memory": "1Gi", "ephemeral-storage": "500Mi"}
	// The built-in probes (sandbox/pod.go): readiness every second from the
	// start, liveness only after the slow-start budget.
	probes := []string{"readiness 1s×3+0s", "liveness 10s×3+300s"}
	tests := []struct {
		template string
		want     shape
	}{{
		template: "",
		// A bare Pod carries its pin, its own name, which its Service selects.
		want: shape{Workload: "Pod", Labels: sandboxLabels("tpl-default", map[string]string{keys.LabelPod: "sandbox-tpl-default"}), Containers: []string{"sandbox=sandbox:test"},
			Volumes: hostRoots, Mounts: defaultMounts, Limits: limits, Deadline: true, Probes: probes, Hardened: true, NoToken: true, Chain: "Service owns Pod"},
	}, {
		template: "python",
		want: shape{Workload: "Pod", Labels: sandboxLabels("tpl-python", map[string]string{"team": "data", keys.LabelPod: "sandbox-tpl-python"}), Template: "python",
			Containers:       []string{"sandbox=registry.example.com/sandboxes/python:3.12", "datasets-index=registry.example.com/sandboxes/datasets-index:1.4"},
			Volumes:          append(hostRoots[:len(hostRoots):len(hostRoots)], "datasets:nfs", "pip-cache:emptyDir"),
			Mounts:           []string{"/data", "/mnt/skills/custom", "/mnt/skills/legacy", "/mnt/skills/public", "/mnt/user-data", "/var/cache/pip"},
			ImagePullSecrets: []string{"registry-credentials"}, NodeSelector: map[string]string{"sandbox.deerflow.dev/pool": "python"},
			Limits: map[string]string{"cpu": "2", "memory": "2Gi", "ephemeral-storage": "500Mi"}, Deadline: true, Probes: append([]string{"startup 2s×60+0s"}, probes...),
			Hardened: true, NoToken: true, Chain: "Service owns Pod"},
	}, {
		template: "self-healing",
		want: shape{Workload: "ReplicaSet", Replicas: 1, Labels: sandboxLabels("tpl-self-healing", map[string]string{"sandbox.deerflow.dev/workload": "replicaset"}),
			Template: "self-healing", Containers: []string{"sandbox=" + deerflowImage}, Volumes: hostRoots, Mounts: defaultMounts,
			Limits: limits, Probes: probes, Hardened: true, NoToken: true, Chain: "ReplicaSet owns Service"},
	}}
	for _, tc := range tests {
		id := "tpl-" + tc.template
		if tc.template == "" {
			id = "tpl-default"
		}
		body := map[string]any{"sandbox_id": id, "thread_id": "t1", "user_id": "u1"}
		if tc.template != "" {
			body["template"] = tc.template
		}
		r := create(t, f, body)
		if r.Body["sandbox_url"] == "" || r.Body["status"] == "NotFound" {
			t.Errorf("create with template %q: %s", tc.template, r.Raw)
		}
		if diff := cmp.Diff(tc.want, shapeOf(t, ns, id)); diff != "" {
			t.Errorf("template %q: objects (-want +got):\n%s", tc.template, diff)
		}
	}
	// Lifetimes come from the template unless the request sets them.
	pod, err := client().CoreV1().Pods(ns).Get(context.Background(), "sandbox-tpl-python", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := [2]string{pod.Annotations["sandbox.deerflow.dev/idle-timeout-seconds"], pod.Annotations["sandbox.deerflow.dev/max-lifetime-seconds"]}; got != [2]string{"1800", "28800"} {
		t.Errorf("python sandbox idle/lifetime = %v, want the template's 1800/28800", got)
	}
	create(t, f, map[string]any{"sandbox_id": "tpl-python2", "template": "python", "idle_timeout_seconds": 60, "memory": "3Gi"})
	pod, err = client().CoreV1().Pods(ns).Get(context.Background(), "sandbox-tpl-python2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Annotations["sandbox.deerflow.dev/idle-timeout-seconds"] != "60" || pod.Spec.Containers[0].Resources.Limits.Memory().String() != "3Gi" {
		t.Errorf("request fields did not win over the template: idle %s, memory %s", pod.Annotations["sandbox.deerflow.dev/idle-timeout-seconds"], pod.Spec.Containers[0].Resources.Limits.Memory())
	}

	// Listing: GET /api/templates and the capabilities.
	l := mustDo(t, f, "GET", "/api/templates", nil)
	expectCode(t, l, 200, "list templates")
	var names []string
	for _, x := range l.Body["templates"].([]any) {
		names = append(names, x.(map[string]any)["name"].(string))
	}
	if diff := cmp.Diff([]string{"default", "python", "self-healing"}, names); diff != "" {
		t.Errorf("GET /api/templates names (-want +got):\n%s\n%s", diff, l.Raw)
	}
	c := mustDo(t, f, "GET", "/api/capabilities", nil)
	if fmt.Sprint(c.Body["templates"]) != "[default python self-healing]" || c.Body["pause_resume"] != true {
		t.Errorf("capabilities: templates %v pause_resume %v", c.Body["templates"], c.Body["pause_resume"])
	}
}

// TestTemplateEditsAndRefusals: an edited template changes the next create
// of the same running function; an unsafe or unknown template gets 422
// naming it and creates nothing.
func TestTemplateEditsAndRefusals(t *testing.T) {
	ns := namespace(t)
	f := start(t, ns, nil)
	spec := func(image string) corev1.PodSpec {
		return corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: image}}}
	}
	putTemplate(t, ns, podTemplate("edit", nil, spec("first:1")))
	create(t, f, map[string]any{"sandbox_id": "edit1", "template": "edit"})
	putTemplate(t, ns, podTemplate("edit", nil, spec("second:2")))
	// The function's watch delivers the edit within milliseconds; a
	// replica whose watch has not synced reuses a read for
	// SANDBOX_TEMPLATE_CACHE_TTL (1 s by default, as deployed). Past both,
	// the next create sees the edit.
	time.Sleep(1100 * time.Millisecond)
	create(t, f, map[string]any{"sandbox_id": "edit2", "template": "edit"})
	images := map[string]string{}
	for _, id := range []string{"edit1", "edit2"} {
		p, err := client().CoreV1().Pods(ns).Get(context.Background(), "sandbox-"+id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		images[id] = p.Spec.Containers[0].Image
	}
	if diff := cmp.Diff(map[string]string{"edit1": "first:1", "edit2": "second:2"}, images); diff != "" {
		t.Errorf("images after an edit, same function process (-want +got):\n%s", diff)
	}

	unsafe := spec("x:1")
	unsafe.Containers = append(unsafe.Containers, corev1.Container{Name: "helper", Image: "h:1", SecurityContext: &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}}})
	putTemplate(t, ns, podTemplate("unsafe", nil, unsafe))
	hostPath := spec("x:1")
	hostPath.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
	putTemplate(t, ns, podTemplate("hostpath", nil, hostPath))
	putTemplate(t, ns, podTemplate("badkind", map[string]string{keys.TemplateKind: "Deployment"}, spec("x:1")))
	// The function's API keys live in the namespace's Secrets: a template
	// reaches none of them.
	secretVol := spec("x:1")
	secretVol.Volumes = []corev1.Volume{{Name: "keys", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "sandbox-provisioner"}}}}
	putTemplate(t, ns, podTemplate("secretvol", nil, secretVol))
	envFrom := spec("x:1")
	envFrom.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "sandbox-provisioner"}}}}
	putTemplate(t, ns, podTemplate("envfrom", nil, envFrom))
	unlabelled := podTemplate("unlabelled", nil, spec("x:1"))
	unlabelled.Labels = nil
	putTemplate(t, ns, unlabelled)
	// Editing a good template into an unsafe one is refused from then on.
	putTemplate(t, ns, podTemplate("edit", nil, hostPath))
	time.Sleep(1100 * time.Millisecond)
	for _, tc := range []struct{ template, detail string }{
		{"unsafe", `sandbox template "unsafe": template.spec.containers[1].securityContext.capabilities.add: SYS_ADMIN is not on the allow-list`},
		{"hostpath", `sandbox template "hostpath": template.spec.volumes[0].hostPath`},
		{"badkind", `sandbox template "badkind": metadata.annotations[sandbox.deerflow.dev/kind]`},
		{"secretvol", `sandbox template "secretvol": template.spec.volumes[0].secret`},
		{"envfrom", `sandbox template "envfrom": template.spec.containers[0].envFrom`},
		{"edit", `sandbox template "edit": template.spec.volumes[0].hostPath`},
		{"missing", `no such sandbox template: "missing"`},
		{"unlabelled", `no such sandbox template: "unlabelled"`},
	} {
		id := "bad-" + tc.template
		for _, door := range []string{"http", "event"} {
			var code int
			var detail string
			if door == "http" {
				r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": id, "template": tc.template})
				code, detail = r.Code, r.Detail()
			} else {
				r, _ := f.DoWithHeaders("POST", "/", map[string]any{"operation": "create", "sandbox_id": id, "template": tc.template}, map[string]string{"X-API-Key": function.Key})
				code, detail = r.Code, r.Detail()
			}
			if code != 422 || !strings.Contains(detail, tc.detail) {
				t.Errorf("%s create with template %s: %d %q, want 422 containing %q", door, tc.template, code, detail, tc.detail)
			}
		}
		if n := len(pods(t, ns, "sandbox-id="+id)) + len(services(t, ns, "sandbox-id="+id)); n != 0 {
			t.Errorf("a refused template %s left %d objects", tc.template, n)
		}
		if rs, err := client().AppsV1().ReplicaSets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "sandbox-id=" + id}); err != nil || len(rs.Items) != 0 {
			t.Errorf("a refused template %s left ReplicaSets: %v %v", tc.template, err, rs)
		}
	}
	l := mustDo(t, f, "GET", "/api/templates", nil)
	refused := map[string]bool{}
	for _, x := range l.Body["templates"].([]any) {
		m := x.(map[string]any)
		refused[m["name"].(string)] = m["error"] != nil
	}
	if diff := cmp.Diff(map[string]bool{"default": false, "edit": true, "unsafe": true, "hostpath": true, "badkind": true, "secretvol": true, "envfrom": true}, refused); diff != "" {
		t.Errorf("GET /api/templates: refused (-want +got):\n%s", diff)
	}
}

// rsTemplate is a ReplicaSet template made in the test, with the given
// idle action and timeouts.
func rsTemplate(name, image string, annotations map[string]string) *corev1.PodTemplate {
	a := map[string]string{keys.TemplateKind: template.KindReplicaSet}
	for k, v := range annotations {
		a[k] = v
	}
	return podTemplate(name, a, corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: image}}})
}

// currentPod is the live Pod of a ReplicaSet sandbox, or nil.
func currentPod(t *testing.T, ns, id string) *corev1.Pod {
	t.Helper()
	for _, p := range pods(t, ns, "sandbox-id="+id) {
		if p.DeletionTimestamp == nil {
			return &p
		}
	}
	return nil
}

// TestReplicaSetSandboxHealsAndIsReaped: a deleted Pod comes back behind
// the same Service and URL; twenty concurrent creates make one ReplicaSet;
// the reap removes the ReplicaSet and its Service; the quota counts them.
func TestReplicaSetSandboxHealsAndIsReaped(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	applyTemplates(t, ns, "self-healing")
	f := start(t, ns, map[string]string{"MAX_SANDBOXES": "3"})
	ctx := context.Background()

	r := create(t, f, map[string]any{"sandbox_id": "heal", "template": "self-healing"})
	url := r.Body["sandbox_url"]
	g := mustDo(t, f, "GET", "/api/sandboxes/heal?wait=15s", nil)
	if g.Body["status"] != "Running" || g.Body["sandbox_url"] != url {
		t.Fatalf("ReplicaSet sandbox not Running at its URL: %s", g.Raw)
	}
	first := currentPod(t, ns, "heal")
	if err := client().CoreV1().Pods(ns).Delete(ctx, first.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a new Pod for the ReplicaSet sandbox", func() (bool, error) {
		p := currentPod(t, ns, "heal")
		return p != nil && p.UID != first.UID, nil
	})
	g = mustDo(t, f, "GET", "/api/sandboxes/heal?wait=15s", nil)
	if g.Body["status"] != "Running" || g.Body["sandbox_url"] != url {
		t.Errorf("after its Pod was deleted: %s, want Running at %v", g.Raw, url)
	}
	if svc := services(t, ns, "sandbox-id=heal"); len(svc) != 1 || svc[0].OwnerReferences[0].Kind != "ReplicaSet" {
		t.Errorf("Service of the healed sandbox: %+v", svc)
	}

	// Twenty concurrent creates of one id: one ReplicaSet, one Service.
	var wg sync.WaitGroup
	codes := make([]int, 20)
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := f.Do("POST", "/api/sandboxes", map[string]any{"sandbox_id": "race", "template": "self-healing"})
			if err == nil {
				codes[i] = r.Code
			}
		}()
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Errorf("concurrent create %d: %d", i, c)
		}
	}
	rss, err := client().AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{LabelSelector: "sandbox-id=race"})
	if err != nil || len(rss.Items) != 1 || len(services(t, ns, "sandbox-id=race")) != 1 {
		t.Errorf("twenty concurrent creates: %v ReplicaSets (%v), %d Services", len(rss.Items), err, len(services(t, ns, "sandbox-id=race")))
	}

	// The quota counts ReplicaSet sandboxes (heal and race, and one more).
	create(t, f, map[string]any{"sandbox_id": "short", "template": "self-healing", "max_lifetime_seconds": 2})
	q := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "over", "template": "self-healing"})
	if q.Code != 429 || !strings.Contains(q.Detail(), "limit of 3 sandboxes") {
		t.Errorf("fourth ReplicaSet sandbox with MAX_SANDBOXES=3: %d %s", q.Code, q.Raw)
	}
	if rs, _ := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-over", metav1.GetOptions{}); rs != nil && rs.Name != "" && rs.DeletionTimestamp == nil {
		t.Error("the refused create left its ReplicaSet")
	}

	// Expiry is the reap deleting the ReplicaSet (no activeDeadlineSeconds
	// that the ReplicaSet would answer with a new Pod).
	time.Sleep(2500 * time.Millisecond)
	rp := mustDo(t, f, "POST", "/api/reap", nil)
	if diff := cmp.Diff(map[string]string{"short": "lifetime"}, reapedIDs(t, rp.Body)); diff != "" {
		t.Errorf("reap (-want +got):\n%s", diff)
	}
	eventually(t, 30*time.Second, "the reaped sandbox's ReplicaSet, Pod and Service gone", func() (bool, error) {
		_, err := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-short", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(services(t, ns, "sandbox-id=short")) == 0 && currentPod(t, ns, "short") == nil, nil
	})
	// Destroy removes the rest; list is back to what remains.
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/race", nil), 200, "destroy a ReplicaSet sandbox")
	eventually(t, 30*time.Second, "destroyed ReplicaSet sandbox gone", func() (bool, error) {
		_, err := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-race", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && currentPod(t, ns, "race") == nil, nil
	})
	l := mustDo(t, f, "GET", "/api/sandboxes", nil)
	if l.Body["count"] != float64(1) {
		t.Errorf("list after reap and destroy: %s", l.Raw)
	}
}

// TestQuotaCountsBothKinds: DeerFlow's creates (bare Pods) count ReplicaSet
// sandboxes, paused ones too, in the quota's quick count, which finds them
// through their Services; and racing creates of both kinds, through two
// replicas, never overshoot.
func TestQuotaCountsBothKinds(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	applyTemplates(t, ns, "self-healing")
	f := start(t, ns, map[string]string{"MAX_SANDBOXES": "2"})
	create(t, f, map[string]any{"sandbox_id": "napper", "template": "self-healing"})
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes/napper/pause", nil), 200, "pause")
	// Gone, not only terminating: a Pod still listed would send the quick
	// count to the full one, which reads the ReplicaSets themselves.
	eventually(t, 30*time.Second, "no Pod of the paused sandbox", func() (bool, error) {
		return len(pods(t, ns, "sandbox-id=napper")) == 0, nil
	})
	create(t, f, map[string]any{"sandbox_id": "bare1"})
	// One Pod and one ReplicaSet sandbox's Service: the quick count sees the
	// limit of 2 reached. Missing the paused sandbox, it would admit a third.
	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "bare2"})
	if r.Code != 429 || !strings.Contains(r.Detail(), "limit of 2 sandboxes") {
		t.Errorf("a bare sandbox beside a paused ReplicaSet one and a bare one, MAX_SANDBOXES=2: %d %s", r.Code, r.Raw)
	}

	ns = namespace(t)
	applyTemplates(t, ns, "self-healing")
	env := map[string]string{"MAX_SANDBOXES": "5"}
	replicas := []*function.Instance{start(t, ns, env), start(t, ns, env)}
	const n = 24
	admitted := raceCreates(t, n, func(i int) (*function.Instance, map[string]any) {
		body := map[string]any{"sandbox_id": fmt.Sprintf("m%02d", i)}
		if i%2 == 1 {
			body["template"] = "self-healing"
		}
		return replicas[i%3%2], body
	})
	live := liveSandboxes(t, ns)
	t.Logf("admitted %d of %d racing creates of both kinds; %d live sandboxes; limit 5", admitted, n, live)
	if admitted > 5 || live > 5 {
		t.Errorf("quota overshoot: %d admitted, %d live, limit 5", admitted, live)
	}
	if admitted == 0 {
		t.Errorf("no create admitted")
	}
}

// TestPauseAndResume drives pause and resume through every door, DeerFlow's
// create on a paused sandbox, and the reap's idle pause then delete.
func TestPauseAndResume(t *testing.T) {
	ns := namespace(t)
	applyTemplates(t, ns, "self-healing")
	putTemplate(t, ns, rsTemplate("nap", "sandbox:test", map[string]string{keys.TemplateIdleTimeout: "2s", keys.TemplateIdleAction: template.IdlePause, keys.TemplatePausedTimeout: "2s"}))
	f := start(t, ns, map[string]string{"SANDBOX_ACTIVITY_THROTTLE": "0s"})
	ctx := context.Background()
	key := map[string]string{"X-API-Key": function.Key}

	body := map[string]any{"sandbox_id": "p1", "thread_id": "t1", "user_id": "u1", "template": "self-healing"}
	url := create(t, f, body).Body["sandbox_url"]
	if g := mustDo(t, f, "GET", "/api/sandboxes/p1?wait=15s", nil); g.Body["status"] != "Running" {
		t.Fatalf("not running: %s", g.Raw)
	}
	p := mustDo(t, f, "POST", "/api/sandboxes/p1/pause", nil)
	expectCode(t, p, 200, "pause over HTTP")
	if p.Body["status"] != "Paused" || p.Body["sandbox_url"] != url || p.Body["ready"] != false {
		t.Errorf("pause answer: %s", p.Raw)
	}
	eventually(t, 30*time.Second, "no Pod while paused", func() (bool, error) { return currentPod(t, ns, "p1") == nil, nil })
	if len(services(t, ns, "sandbox-id=p1")) != 1 {
		t.Error("the paused sandbox lost its Service")
	}
	if g := mustDo(t, f, "GET", "/api/sandboxes/p1", nil); g.Body["status"] != "Paused" || g.Body["sandbox_url"] != url {
		t.Errorf("GET of a paused sandbox: %s", g.Raw)
	}
	if l := mustDo(t, f, "GET", "/api/sandboxes", nil); !strings.Contains(string(l.Raw), `"status":"Paused"`) {
		t.Errorf("list does not show the paused sandbox: %s", l.Raw)
	}

	// Resume by CloudEvent: the reply type, then Running at the same URL.
	reply, code := send(t, f, false, events.TypeResume, "p1", map[string]any{"wait_seconds": 15}, key)
	if code != 200 || reply.Type() != events.TypeResumed {
		t.Fatalf("resume event: %d %v", code, reply)
	}
	if d := replyData(t, reply); d["status"] != "Running" || d["sandbox_url"] != url {
		t.Errorf("resume reply: %v, want Running at %v", d, url)
	}
	// Pause by CloudEvent and by POST /, then DeerFlow's create (no
	// template) resumes it.
	reply, code = send(t, f, true, events.TypePause, "", map[string]any{"sandbox_id": "p1"}, key)
	if code != 200 || reply.Type() != events.TypePaused || replyData(t, reply)["status"] != "Paused" {
		t.Fatalf("pause event: %d %v", code, reply)
	}
	inv, _ := f.DoWithHeaders("POST", "/", map[string]any{"operation": "pause", "sandbox_id": "p1"}, key)
	if inv.Code != 200 || inv.Body["status"] != "Paused" {
		t.Errorf("pause by POST /: %d %s", inv.Code, inv.Raw)
	}
	deerflow := mustDo(t, f, "POST", "/api/sandboxes?wait=15s", map[string]any{"sandbox_id": "p1", "thread_id": "t1", "user_id": "u1"})
	if deerflow.Code != 200 || deerflow.Body["status"] != "Running" || deerflow.Body["sandbox_url"] != url {
		t.Errorf("DeerFlow's create on a paused sandbox: %d %s, want Running at %v", deerflow.Code, deerflow.Raw, url)
	}
	if _, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-p1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("DeerFlow's create made a bare Pod beside the ReplicaSet: %v", err)
	}
	// Another user's create on it is refused, paused or not.
	if r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "p1", "thread_id": "t1", "user_id": "intruder"}); r.Code != 409 {
		t.Errorf("another user's create of a ReplicaSet sandbox: %d %s", r.Code, r.Raw)
	}
	// A bare Pod sandbox cannot be paused; an unknown one is 404.
	create(t, f, map[string]any{"sandbox_id": "bare"})
	if r := mustDo(t, f, "POST", "/api/sandboxes/bare/pause", nil); r.Code != 409 || !strings.Contains(r.Detail(), "bare Pod") {
		t.Errorf("pause a bare Pod sandbox: %d %s", r.Code, r.Raw)
	}
	if r := mustDo(t, f, "POST", "/api/sandboxes/nope/resume", nil); r.Code != 404 {
		t.Errorf("resume an unknown sandbox: %d %s", r.Code, r.Raw)
	}

	// Idle pause, then delete, on reap.
	t0 := time.Now()
	create(t, f, map[string]any{"sandbox_id": "napper", "template": "nap"})
	sleepUntil(t0.Add(2500 * time.Millisecond))
	rp := mustDo(t, f, "POST", "/api/reap", nil)
	paused := map[string]string{}
	for _, x := range asList(rp.Body["paused"]) {
		m := x.(map[string]any)
		paused[m["sandbox_id"].(string)] = m["reason"].(string)
	}
	if diff := cmp.Diff(map[string]string{"napper": "idle"}, paused); diff != "" || len(reapedIDs(t, rp.Body)) != 0 {
		t.Errorf("first reap paused (-want +got):\n%s\nbody %s", diff, rp.Raw)
	}
	if g := mustDo(t, f, "GET", "/api/sandboxes/napper", nil); g.Body["status"] != "Paused" {
		t.Errorf("idle sandbox after reap: %s", g.Raw)
	}
	time.Sleep(2500 * time.Millisecond)
	rp = mustDo(t, f, "POST", "/api/reap", nil)
	if diff := cmp.Diff(map[string]string{"napper": "paused-timeout"}, reapedIDs(t, rp.Body)); diff != "" {
		t.Errorf("second reap removed (-want +got):\n%s", diff)
	}
	eventually(t, 30*time.Second, "paused sandbox deleted with its Service", func() (bool, error) {
		_, err := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-napper", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(services(t, ns, "sandbox-id=napper")) == 0, nil
	})
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}
