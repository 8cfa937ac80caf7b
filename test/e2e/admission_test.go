//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	nodev1 "k8s.io/api/node/v1"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/pool"
	"github.com/deerflow-sandbox/provisioner/pkg/poolapi"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
)

const (
	podPolicy     = "sandbox-provisioner-pods"
	rsPolicy      = "sandbox-provisioner-replicasets"
	servicePolicy = "sandbox-provisioner-services"
	deletePolicy  = "sandbox-provisioner-deletes"
)

// serviceAccountNamespace makes a namespace in which the provisioner's
// ServiceAccount holds config/'s Role (copied there) and its read of the
// runtime class, applies config/'s admission policies and their parameters
// (in config/'s namespace), and
// returns a client that acts as that ServiceAccount. The namespace enforces
// no Pod Security level, as in DeerFlow's host-path mode, so that the
// admission policy alone is tested.
func serviceAccountNamespace(t *testing.T) (string, kubernetes.Interface) {
	t.Helper()
	ns := namespace(t)
	objs := readObjects(t, filepath.Join("..", "..", "config", "201-role.yaml"), filepath.Join("..", "..", "config", "202-rolebinding.yaml"))
	for _, o := range objs {
		o.SetNamespace(ns)
	}
	applyServerSide(t, objs)
	applyServerSide(t, readObjects(t, filepath.Join("..", "..", "config", "100-namespace.yaml"), filepath.Join("..", "..", "config", "204-clusterrole-runtimeclass.yaml"),
		filepath.Join("..", "..", "config", "800-admission-policy.yaml"), filepath.Join("..", "..", "config", "801-admission-policy-networkpolicies.yaml")))
	rc := rest.CopyConfig(kc.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: serviceAccount}
	sa := kubernetes.NewForConfigOrDie(rc)
	ctx := context.Background()
	// Every rule compiles against the API server's types: a misspelt field
	// would deny every request at run time (failurePolicy Fail).
	for _, name := range []string{podPolicy, rsPolicy, servicePolicy, deletePolicy} {
		eventually(t, 30*time.Second, name+" type-checked", func() (bool, error) {
			p, err := client().AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, name, metav1.GetOptions{})
			if err != nil || p.Status.ObservedGeneration != p.Generation {
				return false, err
			}
			if tc := p.Status.TypeChecking; tc != nil {
				for _, w := range tc.ExpressionWarnings {
					if otherGroupsOnly(w.Warning) {
						// The API server type-checks resource "services" of
						// group "" against every group's services (Knative
						// Serving's too); requests of those never match.
						t.Logf("%s: type-check warning about a kind it does not match: %s", name, w.Warning)
						continue
					}
					t.Fatalf("%s does not type-check: %+v", name, tc.ExpressionWarnings)
				}
			}
			return true, nil
		})
	}
	// The policies and their parameters take a moment to be in force:
	// wait until the function's own objects pass and an unlabelled one is
	// refused, for each kind (server-side dry run: nothing is stored).
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	eventually(t, 30*time.Second, "admission policies in force", func() (bool, error) {
		a := newAdmission(t, ns, nil)
		pod := a.pod("probe", nil)
		if _, err := sa.CoreV1().Pods(ns).Create(ctx, pod, dry); err != nil {
			return false, err
		}
		delete(pod.Labels, "app")
		if _, err := sa.CoreV1().Pods(ns).Create(ctx, pod, dry); !refusedBy(err, podPolicy, "") {
			return false, err
		}
		rs := a.replicaSet("probe", nil)
		if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, dry); err != nil {
			return false, err
		}
		rs.Spec.Replicas = ptr.To[int32](2)
		if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, dry); !refusedBy(err, rsPolicy, "") {
			return false, err
		}
		svc := a.service("probe", corev1.ServiceTypeNodePort, resources.PodOwnerRef(pod))
		svc.OwnerReferences = nil
		svc.Spec.Type = corev1.ServiceTypeLoadBalancer
		_, err := sa.CoreV1().Services(ns).Create(ctx, svc, dry)
		return refusedBy(err, servicePolicy, ""), err
	})
	return ns, sa
}

// typeCheckKind is how a type-check warning names the kind it is about:
// "<group>/<version>, Kind=<kind>:" (group empty for the core group).
var typeCheckKind = regexp.MustCompile(`(?m)^([^\s/,]*)/v[0-9a-z]+, Kind=[A-Za-z]+:`)

// otherGroupsOnly reports whether a type-check warning is only about kinds
// of API groups with a dot (CRDs such as serving.knative.dev), none of the
// core or apps kinds the policies are written for.
func otherGroupsOnly(warning string) bool {
	kinds := typeCheckKind.FindAllStringSubmatch(warning, -1)
	for _, k := range kinds {
		if !strings.Contains(k[1], ".") {
			return false
		}
	}
	return len(kinds) > 0
}

// refusedBy reports whether err is a refusal by the admission policy
// policy, with message in it.
// labels is a merge patch of an object's labels (nil removes one).
func labels(l map[string]any) []byte {
	p, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": l}}) // maps of strings and nils always marshal
	return p
}

func refusedBy(err error, policy, message string) bool {
	return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy '"+policy+"'") && strings.Contains(err.Error(), message)
}

// admission builds what the function builds, with cfg's settings.
type admission struct {
	t   *testing.T
	cfg *config.Config
}

func newAdmission(t *testing.T, ns string, env map[string]string) admission {
	t.Helper()
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Namespace = ns
	cfg.RuntimeClassName = "gvisor" // as config/400-service.yaml sets it
	cfg.LarkCLIInitImage, cfg.LarkCLIBrokerImage = "lark-init:1", "lark-broker:1"
	cfg.EnvdImage = "sandbox-envd:1" // as make deploy sets it
	for k, v := range env {
		switch k {
		case "pvc":
			cfg.SkillsPVCName, cfg.UserdataPVCName = "deer-flow-skills", "deer-flow-user-data"
		case "service":
			cfg.ServiceType = v
		}
	}
	return admission{t: t, cfg: cfg}
}

func (a admission) spec(id string, req *api.CreateRequest, tmpl string) api.Spec {
	a.t.Helper()
	r := api.CreateRequest{SandboxID: id}
	if req != nil {
		r = *req
		r.SandboxID = id
	}
	s, err := r.Validate(a.cfg.Objects(), time.Now())
	if err != nil {
		a.t.Fatal(err)
	}
	s.Token = strings.Repeat("0a", 16) // as the function gives every sandbox a token (sandbox.newToken)
	if tmpl != "" {
		objs := readObjects(a.t, filepath.Join("..", "..", "config", "templates", tmpl+".yaml"))
		var pt corev1.PodTemplate
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(objs[0].Object, &pt); err != nil {
			a.t.Fatal(err)
		}
		if s.Resolved, err = template.FromPodTemplate(&pt, a.cfg.Objects()); err != nil {
			a.t.Fatal(err)
		}
		if s.Resolved.Envd {
			// What the E2B API adds to a create of it.
			s.EnvdTokenHash, s.Metadata = strings.Repeat("ab", 32), map[string]string{"run": "r1", "owner key": "a value"}
		}
	}
	return s
}

// claim is the function's claim (its own code, through pl) of a pooled
// Pod of tmpl for s, labelled as a create of s labels it; nil when none
// was claimed (the log says why).
func (a admission) claim(ctx context.Context, pl *pool.Pool, tmpl *template.Template, s api.Spec) *corev1.Pod {
	meta := &metav1.ObjectMeta{Labels: resources.Labels(s), Annotations: resources.Annotations(s)}
	resources.RecordPrincipal(meta, s)
	meta.Labels[pooledLabel] = "true"
	hash := resources.PoolPodTemplate(a.cfg.Objects(), resources.PoolSpec(a.cfg.Objects(), tmpl)).Labels[keys.LabelPoolHash]
	return pl.Claim(ctx, tmpl, hash, poolapi.Claim{Labels: meta.Labels, Annotations: meta.Annotations, MaxLifetime: time.Hour})
}

// pod is the Pod the function builds for id (with req's options).
func (a admission) pod(id string, req *api.CreateRequest) *corev1.Pod {
	return resources.BuildPod(a.cfg.Objects(), a.spec(id, req, ""))
}

func (a admission) replicaSet(id string, req *api.CreateRequest) *appsv1.ReplicaSet {
	return resources.BuildReplicaSet(a.cfg.Objects(), a.spec(id, req, ""))
}

func (a admission) service(id string, typ corev1.ServiceType, owner metav1.OwnerReference) *corev1.Service {
	cfg := *a.cfg
	cfg.ServiceType = string(typ)
	return resources.BuildService(cfg.Objects(), a.spec(id, nil, ""), owner)
}

// TestAdmissionAdmitsTheFunctionsObjects is the positive control: what the
// function builds (bare Pods and ReplicaSets, with and without templates,
// Lark containers, host-path and PVC mode, both Service types) is created
// for real as the provisioner's ServiceAccount, and the changes the
// function makes later (activity, pause and resume, adopting a Service)
// pass too, also when another controller annotated the Pod meanwhile.
func TestAdmissionAdmitsTheFunctionsObjects(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	user, thread := "u1", "t1"
	mount := func(host, at string, ro bool) api.ExtraMount {
		return api.ExtraMount{HostPath: host, ContainerPath: at, ReadOnly: ptr.To(ro)}
	}
	// DeerFlow's Lark request: both containers, the credential mounts in the
	// user's tree, the shared runtime, a workspace of the user's own.
	lark := &api.CreateRequest{ThreadID: &thread, UserID: &user, ProvisionLarkCLIRuntime: true, ProvisionLarkCLIBroker: true,
		IncludeLegacySkills: true, MaxShellSessions: ptr.To(3), ExtraMounts: []api.ExtraMount{
			mount("/.deer-flow/users/u1/integrations/lark-cli/config", "/mnt/integrations/lark-cli/config", true),
			mount("/.deer-flow/users/u1/integrations/lark-cli/config/locks", "/mnt/integrations/lark-cli/config/locks", false),
			mount("/.deer-flow/users/u1/integrations/lark-cli/data", "/mnt/integrations/lark-cli/data", false),
			mount("/.deer-flow/integrations/lark-cli/sandbox-cli", "/mnt/integrations/lark-cli/runtime", true),
			mount("/.deer-flow/users/u1/threads/t1/acp", "/mnt/acp-workspace", false),
		}}
	// A shared directory asked for read-write: the function mounts it
	// read-only, which the policy demands.
	initOnly := &api.CreateRequest{ThreadID: &thread, UserID: &user, ProvisionLarkCLIRuntime: true, ExtraMounts: []api.ExtraMount{
		mount("/.deer-flow/integrations/skills", "/mnt/skills/integrations", false)}}
	host, pvc := newAdmission(t, ns, nil), newAdmission(t, ns, map[string]string{"pvc": "true"})
	cases := []struct {
		name string
		a    admission
		req  *api.CreateRequest
		tmpl string
		rs   bool
	}{
		{"default Pod", host, nil, "", false},
		{"Pod with Lark containers and extra mounts", host, lark, "", false},
		{"Pod with the Lark init container", host, initOnly, "", false},
		{"Pod in PVC mode", pvc, lark, "", false},
		{"Pod of the python template", host, nil, "python", false},
		{"Pod of the E2B template (the agent, metadata)", host, nil, "e2b", false},
		{"ReplicaSet", host, nil, "", true},
		{"ReplicaSet with Lark containers", host, lark, "", true},
		{"ReplicaSet of the self-healing template", host, nil, "self-healing", true},
		{"ReplicaSet of the python template, PVC mode", pvc, lark, "python", true},
	}
	activity := func(at time.Time) []byte {
		p, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
			keys.AnnotationLastActivity: at.UTC().Format(time.RFC3339), keys.AnnotationExpiresAt: at.Add(time.Hour).UTC().Format(time.RFC3339)}}})
		return p
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("ok%d", i)
			s := tc.a.spec(id, tc.req, tc.tmpl)
			var owner metav1.OwnerReference
			if tc.rs {
				rs, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, resources.BuildReplicaSet(tc.a.cfg.Objects(), s), metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("the ReplicaSet the function builds is refused: %v", err)
				}
				owner = metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs.Name, UID: rs.UID, BlockOwnerDeletion: ptr.To(false)}
				for _, patch := range []string{`{"spec":{"replicas":0}}`, `{"spec":{"replicas":1}}`, string(activity(time.Now()))} {
					if _, err := sa.AppsV1().ReplicaSets(ns).Patch(ctx, rs.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
						t.Errorf("the function's patch %s of its ReplicaSet is refused: %v", patch, err)
					}
				}
			} else {
				pod, err := sa.CoreV1().Pods(ns).Create(ctx, resources.BuildPod(tc.a.cfg.Objects(), s), metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("the Pod the function builds is refused: %v", err)
				}
				owner = resources.PodOwnerRef(pod)
				// Another controller (a CNI, say) annotates the Pod; the
				// function's activity patch still passes.
				if _, err := client().CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType,
					[]byte(`{"metadata":{"annotations":{"cni.example.com/pod-ip":"10.0.0.7"}}}`), metav1.PatchOptions{}); err != nil {
					t.Fatal(err)
				}
				if _, err := sa.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, activity(time.Now()), metav1.PatchOptions{}); err != nil {
					t.Errorf("the function's activity patch of its Pod is refused: %v", err)
				}
			}
			for _, typ := range []corev1.ServiceType{corev1.ServiceTypeNodePort, corev1.ServiceTypeClusterIP} {
				svc := resources.BuildService(withServiceType(tc.a.cfg, typ).Objects(), s, owner)
				created, err := sa.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
				if err != nil {
					t.Fatalf("the %s Service the function builds is refused: %v", typ, err)
				}
				// Adopting a Service (the repair path) is an update.
				created.OwnerReferences = []metav1.OwnerReference{owner}
				if _, err := sa.CoreV1().Services(ns).Update(ctx, created, metav1.UpdateOptions{}); err != nil {
					t.Errorf("the function's update of its %s Service is refused: %v", typ, err)
				}
				if err := sa.CoreV1().Services(ns).Delete(ctx, svc.Name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func withServiceType(cfg *config.Config, typ corev1.ServiceType) *config.Config {
	c := *cfg
	c.ServiceType = string(typ)
	return &c
}

// podCase is one escape: how it changes the Pod the function builds, and
// the rule's message the refusal must carry.
type podCase struct {
	name    string
	message string
	mutate  func(*corev1.Pod)
	// podUpdate is the JSON patch that makes the same escape on a live Pod,
	// when the API server lets a Pod change so at all ("" when it does not:
	// most of a Pod's spec is immutable, and its validation refuses first).
	podUpdate string
	// selector: the change moves the labels a ReplicaSet selects on, which
	// its first rules refuse (and an update cannot change at all).
	selector bool
}

func podCases(t *testing.T) []podCase {
	sc := func(p *corev1.Pod) *corev1.SecurityContext { return p.Spec.Containers[0].SecurityContext }
	hostPath := func(path string, typ *corev1.HostPathType) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.Spec.Volumes[0].HostPath.Path, p.Spec.Volumes[0].HostPath.Type = path, typ }
	}
	volume := func(v corev1.VolumeSource) func(*corev1.Pod) {
		return func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "extra", VolumeSource: v})
		}
	}
	const (
		labels     = "labelled app=deer-flow-sandbox with a sandbox-id"
		backend    = "must not carry a label that a NetworkPolicy admits traffic from"
		annotation = "may carry only the annotations"
		hostPaths  = "may mount from the node only the"
		toleration = "may tolerate only"
		parents    = "must not mount a directory that holds the tenants' roots"
		ephemeral  = "ephemeral volume starts empty"
		handler    = "must not name a host"
	)
	// A handler that sends the kubelet elsewhere: the cloud's metadata
	// server, from the node's network namespace.
	const elsewhere = "169.254.169.254"
	httpAt := func(host string) *corev1.HTTPGetAction {
		return &corev1.HTTPGetAction{Path: "/", Port: intstr.FromInt32(80), Host: host, Scheme: corev1.URISchemeHTTP}
	}
	tcpAt := func(host string) *corev1.TCPSocketAction {
		return &corev1.TCPSocketAction{Port: intstr.FromInt32(22), Host: host}
	}
	probeOf := func(h corev1.ProbeHandler) *corev1.Probe {
		return &corev1.Probe{ProbeHandler: h, PeriodSeconds: 10, TimeoutSeconds: 1, FailureThreshold: 3, SuccessThreshold: 1}
	}
	claimFrom := func(mutate func(*corev1.PersistentVolumeClaimSpec)) corev1.VolumeSource {
		spec := corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}
		mutate(&spec)
		return corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: spec}}}
	}
	secret := corev1.LocalObjectReference{Name: "sandbox-provisioner"}
	return []podCase{
		// Each change also drops what the API server's own validation
		// would refuse first, as a compromised function would, so that the
		// refusal shown is the admission policy's.
		{name: "no sandbox label", message: labels, mutate: func(p *corev1.Pod) { delete(p.Labels, "app") }, selector: true},
		{name: "no sandbox id", message: labels, mutate: func(p *corev1.Pod) { delete(p.Labels, "sandbox-id") }, selector: true},
		{name: "the backend's label", message: backend, mutate: func(p *corev1.Pod) { p.Labels["app.kubernetes.io/name"] = "deer-flow-backend" },
			podUpdate: `[{"op":"add","path":"/metadata/labels/app.kubernetes.io~1name","value":"deer-flow-backend"}]`},
		{name: "a runtime annotation", message: annotation, mutate: func(p *corev1.Pod) {
			p.Annotations["io.katacontainers.config.hypervisor.kernel_params"] = "init=/bin/sh"
		}, podUpdate: `[{"op":"add","path":"/metadata/annotations/io.katacontainers.config.hypervisor.kernel_params","value":"init=/bin/sh"}]`},
		{name: "privileged", message: "must not be privileged", mutate: func(p *corev1.Pod) {
			sc(p).Privileged, sc(p).AllowPrivilegeEscalation = ptr.To(true), nil
		}},
		{name: "privilege escalation", message: "allowPrivilegeEscalation to false", mutate: func(p *corev1.Pod) { sc(p).AllowPrivilegeEscalation = ptr.To(true) }},
		{name: "privilege escalation unset", message: "allowPrivilegeEscalation to false", mutate: func(p *corev1.Pod) { sc(p).AllowPrivilegeEscalation = nil }},
		{name: "capabilities not dropped", message: "must drop ALL capabilities", mutate: func(p *corev1.Pod) { sc(p).Capabilities.Drop = nil }},
		{name: "capability off the list", message: "may add only the capabilities", mutate: func(p *corev1.Pod) {
			sc(p).Capabilities.Add = append(sc(p).Capabilities.Add, "NET_ADMIN")
		}},
		{name: "capability off the list in an init container", message: "may add only the capabilities", mutate: func(p *corev1.Pod) {
			c := p.Spec.Containers[0].DeepCopy()
			c.Name = "init"
			c.Ports, c.ReadinessProbe, c.LivenessProbe, c.StartupProbe = nil, nil, nil, nil
			c.SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
			p.Spec.InitContainers = []corev1.Container{*c}
		}},
		{name: "seccomp unconfined", message: "seccomp profile RuntimeDefault or Localhost", mutate: func(p *corev1.Pod) {
			sc(p).SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined}
		}},
		{name: "no seccomp profile", message: "seccomp profile RuntimeDefault or Localhost", mutate: func(p *corev1.Pod) {
			for i := range p.Spec.Containers {
				p.Spec.Containers[i].SecurityContext.SeccompProfile = nil
			}
			p.Spec.SecurityContext.SeccompProfile = nil
		}},
		{name: "may run as root", message: "runAsNonRoot", mutate: func(p *corev1.Pod) { sc(p).RunAsNonRoot = ptr.To(false) }},
		{name: "root user", message: "non-zero runAsUser", mutate: func(p *corev1.Pod) { sc(p).RunAsUser = ptr.To[int64](0) }},
		{name: "the image's user", message: "non-zero runAsUser", mutate: func(p *corev1.Pod) { p.Spec.SecurityContext.RunAsUser = nil }},
		{name: "SELinux super-privileged type", message: "SELinux", mutate: func(p *corev1.Pod) {
			sc(p).SELinuxOptions = &corev1.SELinuxOptions{Type: "spc_t"}
		}},
		{name: "AppArmor unconfined", message: "AppArmor", mutate: func(p *corev1.Pod) {
			p.Spec.SecurityContext.AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
		}},
		{name: "a sysctl", message: "set no sysctls", mutate: func(p *corev1.Pod) {
			p.Spec.SecurityContext.Sysctls = []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}}
		}},
		{name: "a shared process namespace", message: "share no process namespace", mutate: func(p *corev1.Pod) { p.Spec.ShareProcessNamespace = ptr.To(true) }},
		{name: "hostNetwork", message: "node's network, PID or IPC", mutate: func(p *corev1.Pod) { p.Spec.HostNetwork, p.Spec.HostUsers = true, nil }},
		{name: "hostPID", message: "node's network, PID or IPC", mutate: func(p *corev1.Pod) { p.Spec.HostPID, p.Spec.HostUsers = true, nil }},
		{name: "hostIPC", message: "node's network, PID or IPC", mutate: func(p *corev1.Pod) { p.Spec.HostIPC, p.Spec.HostUsers = true, nil }},
		{name: "a host port", message: "host ports", mutate: func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 8080 }},
		{name: "hostPath outside the base", message: hostPaths, mutate: hostPath("/etc", ptr.To(corev1.HostPathDirectory))},
		{name: "hostPath beside the base", message: hostPaths, mutate: hostPath("/.deer-flow-evil", ptr.To(corev1.HostPathDirectory))},
		{name: "hostPath at the base", message: hostPaths, mutate: hostPath("/.deer-flow", ptr.To(corev1.HostPathDirectory))},
		// The attack: a plain hostPath at a link planted in user data.
		{name: "hostPath inside a thread's data", message: hostPaths, mutate: hostPath("/.deer-flow/threads/t/user-data/root", ptr.To(corev1.HostPathDirectory))},
		{name: "hostPath inside a user's tree", message: hostPaths, mutate: hostPath("/.deer-flow/users/u/x", ptr.To(corev1.HostPathDirectoryOrCreate))},
		{name: "hostPath at a dot segment", message: hostPaths, mutate: hostPath("/.deer-flow/users/.", ptr.To(corev1.HostPathDirectory))},
		// The shared pattern (<base>/*) matches the directories that hold
		// every tenant's root: refused even read-only (volume 0 is mounted
		// read-only, a shared root's).
		{name: "hostPath at the users' directory", message: parents, mutate: hostPath("/.deer-flow/users", ptr.To(corev1.HostPathDirectory))},
		{name: "hostPath at the threads' directory", message: parents, mutate: hostPath("/.deer-flow/threads", ptr.To(corev1.HostPathDirectory))},
		{name: "hostPath of no type", message: hostPaths, mutate: hostPath("/.deer-flow/skills_view", nil)},
		{name: "hostPath of a file", message: hostPaths, mutate: hostPath("/.deer-flow/skills_view", ptr.To(corev1.HostPathFileOrCreate))},
		// A shared root read-write would let a sandbox replace the tenants'
		// roots it holds with links.
		{name: "a shared root read-write", message: "read-only", mutate: func(p *corev1.Pod) {
			for i := range p.Spec.Containers[0].VolumeMounts {
				if m := &p.Spec.Containers[0].VolumeMounts[i]; m.Name == p.Spec.Volumes[0].Name {
					m.ReadOnly = false
				}
			}
		}},
		{name: "a Secret volume", message: "must not mount Secrets", mutate: volume(corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: secret.Name}})},
		{name: "a projected Secret", message: "must not mount Secrets", mutate: volume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{Secret: &corev1.SecretProjection{LocalObjectReference: secret}}}}})},
		// Storage beyond the Pod, each off its allow-list (config/ lists its
		// two claims and the python template's export; the rest is empty).
		{name: "a claim off the list", message: "may mount only the claims", mutate: volume(corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "another-tenants-data"}})},
		{name: "a listed claim's name as a prefix", message: "may mount only the claims", mutate: volume(corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "deer-flow-user-data-2"}})},
		{name: "an NFS export off the list", message: "may mount only the NFS exports", mutate: volume(corev1.VolumeSource{
			NFS: &corev1.NFSVolumeSource{Server: "nfs.storage.svc.cluster.local", Path: "/exports"}})},
		{name: "an NFS server off the list", message: "may mount only the NFS exports", mutate: volume(corev1.VolumeSource{
			NFS: &corev1.NFSVolumeSource{Server: "10.0.0.9", Path: "/exports/datasets"}})},
		{name: "an image volume off the list", message: "may mount only the images", mutate: volume(corev1.VolumeSource{
			Image: &corev1.ImageVolumeSource{Reference: "registry.example.com/secrets-baked-in:1", PullPolicy: corev1.PullIfNotPresent}})},
		{name: "an inline CSI volume", message: "CSI drivers", mutate: volume(corev1.VolumeSource{
			CSI: &corev1.CSIVolumeSource{Driver: "secrets-store.csi.k8s.io"}})},
		{name: "an ephemeral volume bound to a PersistentVolume", message: ephemeral, mutate: volume(claimFrom(func(s *corev1.PersistentVolumeClaimSpec) {
			s.VolumeName = "pv-of-another-tenant"
		}))},
		{name: "an ephemeral volume copied from a claim", message: ephemeral, mutate: volume(claimFrom(func(s *corev1.PersistentVolumeClaimSpec) {
			s.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "deer-flow-user-data"}
		}))},
		{name: "an ephemeral volume from a snapshot", message: ephemeral, mutate: volume(claimFrom(func(s *corev1.PersistentVolumeClaimSpec) {
			s.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "golden"}
		}))},
		{name: "a gitRepo volume", message: "sandbox volumes may be only", mutate: volume(corev1.VolumeSource{GitRepo: &corev1.GitRepoVolumeSource{Repository: "https://example.com/x.git"}})},
		{name: "envFrom a Secret", message: "environment from Secrets", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: secret}}}
		}},
		{name: "envFrom a ConfigMap", message: "environment from Secrets", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: secret}}}
		}},
		{name: "env from a Secret key", message: "environment from Secrets", mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "KEY", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: secret, Key: "api-key"}}})
		}},
		{name: "a mounted token", message: "automountServiceAccountToken to false", mutate: func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = ptr.To(true) }},
		{name: "token mounting left to the ServiceAccount", message: "automountServiceAccountToken to false", mutate: func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil }},
		{name: "a projected token", message: "ServiceAccount token", mutate: volume(corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token"}}}}})},
		{name: "a node named", message: "nodeName", mutate: func(p *corev1.Pod) { p.Spec.NodeName = "kwok-node-0" }},
		{name: "a control-plane toleration", message: toleration, mutate: func(p *corev1.Pod) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Key: "node-role.kubernetes.io/control-plane", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
		}, podUpdate: `[{"op":"add","path":"/spec/tolerations/-","value":{"key":"node-role.kubernetes.io/control-plane","operator":"Exists","effect":"NoSchedule"}}]`},
		{name: "a toleration of every taint", message: toleration, mutate: func(p *corev1.Pod) {
			p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists})
		}, podUpdate: `[{"op":"add","path":"/spec/tolerations/-","value":{"operator":"Exists"}}]`},
		{name: "a priority class", message: "priority classes", mutate: func(p *corev1.Pod) { p.Spec.PriorityClassName = admissionPriorityClass }},
		// Pod Security baseline's newer controls (issue 45): the kubelet
		// sent to another host by a probe or a lifecycle hook, in a
		// container or a (sidecar) init container, and another
		// ServiceAccount (made by the test, so that the API server's own
		// ServiceAccount check passes).
		{name: "a liveness probe's host", message: handler, mutate: func(p *corev1.Pod) { p.Spec.Containers[0].LivenessProbe.HTTPGet.Host = elsewhere }},
		{name: "a readiness probe's TCP host", message: handler, mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].ReadinessProbe.ProbeHandler = corev1.ProbeHandler{TCPSocket: tcpAt(elsewhere)}
		}},
		{name: "a startup probe's host", message: handler, mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].StartupProbe = probeOf(corev1.ProbeHandler{HTTPGet: httpAt(elsewhere)})
		}},
		{name: "a postStart hook's host", message: handler, mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PostStart: &corev1.LifecycleHandler{HTTPGet: httpAt(elsewhere)}}
		}},
		{name: "a preStop hook's TCP host", message: handler, mutate: func(p *corev1.Pod) {
			p.Spec.Containers[0].Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{TCPSocket: tcpAt(elsewhere)}}
		}},
		{name: "a sidecar's probe host", message: handler, mutate: func(p *corev1.Pod) {
			c := p.Spec.Containers[0].DeepCopy()
			c.Name, c.RestartPolicy = "sidecar", ptr.To(corev1.ContainerRestartPolicyAlways)
			c.Ports, c.ReadinessProbe, c.StartupProbe = nil, nil, nil
			c.LivenessProbe = probeOf(corev1.ProbeHandler{TCPSocket: tcpAt(elsewhere)})
			p.Spec.InitContainers = []corev1.Container{*c}
		}},
		{name: "another ServiceAccount", message: "run as the ServiceAccount default", mutate: func(p *corev1.Pod) {
			p.Spec.ServiceAccountName = admissionOtherServiceAccount
		}},
	}
}

// admissionOtherServiceAccount is a ServiceAccount the test makes in its
// namespace: a sandbox must not run as it.
const admissionOtherServiceAccount = "e2e-admission-other"

func ensureServiceAccount(t *testing.T, ns, name string) {
	t.Helper()
	_, err := client().CoreV1().ServiceAccounts(ns).Create(context.Background(), &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// admissionPriorityClass is a PriorityClass the test makes: a sandbox must
// not use it (none is on the list by default).
const admissionPriorityClass = "e2e-admission-high"

func ensurePriorityClass(t *testing.T) {
	t.Helper()
	_, err := client().SchedulingV1().PriorityClasses().Create(context.Background(), &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: admissionPriorityClass}, Value: 1000000}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// TestAdmissionPolicyRefusesEscapes acts as the provisioner's ServiceAccount
// and sends each escape for real (no dry run): as a Pod, as a ReplicaSet's
// Pod template, as an update of a valid ReplicaSet and, where the API
// server lets a Pod change so, as an update of a valid Pod. Each is refused
// by the policy, with the rule's message.
func TestAdmissionPolicyRefusesEscapes(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ensurePriorityClass(t)
	ensureServiceAccount(t, ns, admissionOtherServiceAccount)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)

	// One valid Pod and one valid ReplicaSet, created for real, to update.
	livePod, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("live", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's Pod is refused: %v", err)
	}
	liveRS := a.replicaSet("live-rs", nil)
	liveRS.Spec.Replicas = ptr.To[int32](0)
	if liveRS, err = sa.AppsV1().ReplicaSets(ns).Create(ctx, liveRS, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the function's ReplicaSet is refused: %v", err)
	}

	for i, tc := range podCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			id := fmt.Sprintf("x%d", i)
			p := a.pod(id, nil)
			tc.mutate(p)
			_, err := sa.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			if !refusedBy(err, podPolicy, tc.message) {
				t.Errorf("Pod created as the provisioner's ServiceAccount: %v; want a refusal by %s saying %q", err, podPolicy, tc.message)
			}

			// The same escape through a ReplicaSet's Pod template, whose Pods
			// the ReplicaSet controller (not the provisioner) creates.
			rs := a.replicaSet(id, nil)
			tp := &corev1.Pod{ObjectMeta: rs.Spec.Template.ObjectMeta, Spec: rs.Spec.Template.Spec}
			tc.mutate(tp)
			rs.Spec.Template.ObjectMeta, rs.Spec.Template.Spec = tp.ObjectMeta, tp.Spec
			// Keep the selector matching the template, as the API server
			// demands; the ReplicaSet's own selector rule then refuses it.
			for k := range rs.Spec.Selector.MatchLabels {
				if _, ok := tp.Labels[k]; !ok {
					delete(rs.Spec.Selector.MatchLabels, k)
				}
			}
			want := tc.message
			if tc.selector {
				want = "selects only its own sandbox's Pods"
			}
			_, err = sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{})
			if !refusedBy(err, rsPolicy, want) {
				t.Errorf("ReplicaSet created as the provisioner's ServiceAccount: %v; want a refusal by %s saying %q", err, rsPolicy, want)
			}

			if !tc.selector {
				// An update that brings the escape into a valid ReplicaSet.
				tmpl := liveRS.Spec.Template.DeepCopy()
				tp := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
				tc.mutate(tp)
				tmpl.ObjectMeta, tmpl.Spec = tp.ObjectMeta, tp.Spec
				patch, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/template", "value": tmpl}})
				_, err = sa.AppsV1().ReplicaSets(ns).Patch(ctx, liveRS.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
				if !refusedBy(err, rsPolicy, tc.message) {
					t.Errorf("ReplicaSet update as the provisioner's ServiceAccount: %v; want a refusal by %s saying %q", err, rsPolicy, tc.message)
				}
			}
			if tc.podUpdate != "" {
				_, err = sa.CoreV1().Pods(ns).Patch(ctx, livePod.Name, types.JSONPatchType, []byte(tc.podUpdate), metav1.PatchOptions{})
				if !refusedBy(err, podPolicy, tc.message) {
					t.Errorf("Pod update %s as the provisioner's ServiceAccount: %v; want a refusal by %s saying %q", tc.podUpdate, err, podPolicy, tc.message)
				}
			}
		})
	}

	// The ReplicaSet's own rules.
	for name, mutate := range map[string]func(*appsv1.ReplicaSet){
		"more than one Pod": func(rs *appsv1.ReplicaSet) { rs.Spec.Replicas = ptr.To[int32](50) },
		"a selector wider than its id": func(rs *appsv1.ReplicaSet) {
			delete(rs.Spec.Selector.MatchLabels, "sandbox-id")
			delete(rs.Spec.Template.Labels, "sandbox-id") // still matching its template, as the API server demands
		},
	} {
		rs := a.replicaSet("rs-"+strings.ReplaceAll(name, " ", "-")[:12], nil)
		mutate(rs)
		if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{}); !refusedBy(err, rsPolicy, "") {
			t.Errorf("ReplicaSet with %s created as the provisioner's ServiceAccount: %v, want a refusal", name, err)
		}
	}
	if _, err := sa.AppsV1().ReplicaSets(ns).Patch(ctx, liveRS.Name, types.MergePatchType, []byte(`{"spec":{"replicas":50}}`), metav1.PatchOptions{}); !refusedBy(err, rsPolicy, "at most one Pod") {
		t.Errorf("scaling a sandbox ReplicaSet to 50 as the provisioner's ServiceAccount: %v, want a refusal", err)
	}
}

// TestAdmissionPolicyRefusesServiceEscapes: a Service the provisioner's
// ServiceAccount creates or updates reaches its own sandbox only, and
// opens nothing beyond its NodePort.
func TestAdmissionPolicyRefusesServiceEscapes(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)
	pod, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("svc", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's Pod is refused: %v", err)
	}
	owner := resources.PodOwnerRef(pod)
	live, err := sa.CoreV1().Services(ns).Create(ctx, a.service("svc", corev1.ServiceTypeNodePort, owner), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's Service is refused: %v", err)
	}
	cases := []struct {
		name, message string
		mutate        func(*corev1.Service)
	}{
		{"LoadBalancer", "ClusterIP or NodePort", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeLoadBalancer }},
		{"external IPs", "no external IPs", func(s *corev1.Service) { s.Spec.ExternalIPs = []string{"203.0.113.7"} }},
		{"selects every sandbox", "selects exactly its own sandbox", func(s *corev1.Service) {
			s.Spec.Selector = map[string]string{"app": "deer-flow-sandbox"}
		}},
		{"selects another sandbox", "selects exactly its own sandbox", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"sandbox-id": "other"} }},
		{"selects more than the id", "selects exactly its own sandbox", func(s *corev1.Service) { s.Spec.Selector["app.kubernetes.io/name"] = "deer-flow-backend" }},
		// issue 29: the id alone would take in another principal's Pod of the id.
		{"selects by the id alone", "selects exactly its own sandbox", func(s *corev1.Service) { s.Spec.Selector = map[string]string{"sandbox-id": "svc"} }},
		{"a token that is no random token", "selects exactly its own sandbox", func(s *corev1.Service) { s.Spec.Selector[keys.LabelToken] = "x" }},
		{"externalTrafficPolicy Local", "externalTrafficPolicy Cluster", func(s *corev1.Service) {
			s.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		}},
		{"not a sandbox's", "sandbox-<id>-svc", func(s *corev1.Service) { delete(s.Labels, "app") }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			svc := a.service("svc2", corev1.ServiceTypeNodePort, owner)
			// Its own pin (owner is sandbox-svc, not sandbox-svc2, so
			// BuildService gave it none): the row's change alone is what
			// the policy judges.
			maps.Copy(svc.Spec.Selector, resources.ServicePin("svc2", metav1.OwnerReference{Kind: "Pod"}))
			tc.mutate(svc)
			if _, err := sa.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); !refusedBy(err, servicePolicy, tc.message) {
				t.Errorf("Service created as the provisioner's ServiceAccount: %v; want a refusal by %s saying %q", err, servicePolicy, tc.message)
			}
			upd := live.DeepCopy()
			tc.mutate(upd)
			if _, err := sa.CoreV1().Services(ns).Update(ctx, upd, metav1.UpdateOptions{}); !refusedBy(err, servicePolicy, tc.message) {
				t.Errorf("Service update as the provisioner's ServiceAccount: %v; want a refusal by %s saying %q", err, servicePolicy, tc.message)
			}
		})
	}
	// A Service from before tokens (made by an administrator here, as
	// DeerFlow's provisioner or an older function made it) may keep its
	// id-only selector through an update, and may gain a token.
	old := a.service("svc3", corev1.ServiceTypeNodePort, owner)
	old.Spec.Selector = map[string]string{"sandbox-id": "svc3"}
	old, err = client().CoreV1().Services(ns).Create(ctx, old, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old.Labels["example.com/note"] = "kept"
	if old, err = sa.CoreV1().Services(ns).Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("an update that keeps a Service's id-only selector is refused: %v", err)
	}
	old.Spec.Selector = resources.ServiceSelector("svc3", strings.Repeat("0b", 16))
	if _, err := sa.CoreV1().Services(ns).Update(ctx, old, metav1.UpdateOptions{}); err != nil {
		t.Errorf("giving a Service from before tokens its token is refused: %v", err)
	}
}

// TestAdmissionParamsAreTheOnePlace: the policies read the deployment's
// settings from their parameters: the runtime class there (gvisor, as
// config/ ships it) is required of every sandbox, an empty one admits only
// sandboxes that name no class (never any class), and without the
// parameters nothing is admitted (fail closed).
func TestAdmissionParamsAreTheOnePlace(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil) // builds with SANDBOX_RUNTIME_CLASS=gvisor, as config/ deploys
	none := newAdmission(t, ns, nil)
	none.cfg.RuntimeClassName = ""
	cms := client().CoreV1().ConfigMaps("deer-flow")
	restore := func() {
		applyServerSide(t, readObjects(t, filepath.Join("..", "..", "config", "800-admission-policy.yaml")))
	}
	t.Cleanup(restore)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	eventually(t, 30*time.Second, "a Pod without the runtime class refused", func() (bool, error) {
		_, err := sa.CoreV1().Pods(ns).Create(ctx, none.pod("rtc", nil), dry)
		return refusedBy(err, podPolicy, "runtime class gvisor"), err
	})
	rs := none.replicaSet("rtc", nil)
	if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{}); !refusedBy(err, rsPolicy, "runtime class gvisor") {
		t.Errorf("ReplicaSet without the runtime class: %v, want a refusal", err)
	}
	if _, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("rtc", nil), dry); err != nil {
		t.Errorf("a Pod with the runtime class is refused: %v", err)
	}
	// Another class that exists (the RuntimeClass admission plugin refuses a
	// Pod naming one that does not, before any policy sees it).
	rcs := client().NodeV1().RuntimeClasses()
	if _, err := rcs.Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "kata"}, Handler: "kata"}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rcs.Delete(context.Background(), "kata", metav1.DeleteOptions{}) })
	other := a.pod("kata", nil)
	other.Spec.RuntimeClassName = ptr.To("kata")
	if _, err := sa.CoreV1().Pods(ns).Create(ctx, other, dry); !refusedBy(err, podPolicy, "runtime class gvisor") {
		t.Errorf("a Pod with another runtime class: %v, want a refusal", err)
	}

	// An empty parameter is the opt-out: the node's default runtime, and
	// no class at all, not any class.
	if _, err := cms.Patch(ctx, "sandbox-admission", types.MergePatchType, []byte(`{"data":{"runtimeClassName":""}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a Pod naming a class refused under an empty parameter", func() (bool, error) {
		_, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("anyclass", nil), dry)
		return refusedBy(err, podPolicy, "must name no runtime class"), err
	})
	if _, err := sa.CoreV1().Pods(ns).Create(ctx, none.pod("noclass", nil), dry); err != nil {
		t.Errorf("a Pod naming no class under an empty parameter is refused: %v", err)
	}

	// A setting missing from the parameters refuses everything, naming the
	// ConfigMap, rather than reading as "no restriction".
	if _, err := cms.Patch(ctx, "sandbox-admission", types.MergePatchType, []byte(`{"data":{"runtimeClassName":"","nonRoot":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the function's own Pod refused with a setting missing", func() (bool, error) {
		_, err := sa.CoreV1().Pods(ns).Create(ctx, none.pod("partial", nil), dry)
		return refusedBy(err, podPolicy, "deer-flow/sandbox-admission lacks a setting"), err
	})

	if err := cms.Delete(ctx, "sandbox-admission", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the function's own Pod refused without parameters", func() (bool, error) {
		_, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("noparams", nil), dry)
		return err != nil && strings.Contains(err.Error(), podPolicy), err
	})
	restore()
	eventually(t, 30*time.Second, "the function's own Pod admitted again", func() (bool, error) {
		_, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("params", nil), dry)
		return err == nil, err
	})
}

// TestAdmissionRequiresTheUserNamespaceWhenSet: with the parameter
// userNamespace "true" (SANDBOX_USER_NAMESPACE under runc), a sandbox in the
// node's user namespace is refused, directly and through a ReplicaSet.
// config/ ships "false" beside gVisor (runsc cannot start hostUsers: false),
// so the test sets it for its run.
func TestAdmissionRequiresTheUserNamespaceWhenSet(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)
	cms := client().CoreV1().ConfigMaps("deer-flow")
	t.Cleanup(func() {
		applyServerSide(t, readObjects(t, filepath.Join("..", "..", "config", "800-admission-policy.yaml")))
	})
	if _, err := cms.Patch(ctx, "sandbox-admission", types.MergePatchType, []byte(`{"data":{"userNamespace":"true"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	eventually(t, 30*time.Second, "a Pod in the node's user namespace refused", func() (bool, error) {
		p := a.pod("userns", nil)
		p.Spec.HostUsers = ptr.To(true)
		_, err := sa.CoreV1().Pods(ns).Create(ctx, p, dry)
		return refusedBy(err, podPolicy, "hostUsers: false"), err
	})
	rs := a.replicaSet("userns", nil)
	rs.Spec.Template.Spec.HostUsers = ptr.To(true)
	if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, dry); !refusedBy(err, rsPolicy, "hostUsers: false") {
		t.Errorf("ReplicaSet in the node's user namespace: %v, want a refusal", err)
	}
	if _, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("userns-ok", nil), dry); err != nil {
		t.Errorf("a Pod in its own user namespace is refused: %v", err)
	}
}

// TestAdmissionHoldsBaselinesNewerControls (issue 45) is the positive
// control of the rules on probe and lifecycle hosts, the ServiceAccount and
// Pod certificates, whose refusals are rows of podCases: handlers that name
// no host (every kind, in a container and a sidecar) and a projected
// volume of plain sources are admitted; under the parameter
// serviceAccountName the function's Pod built with SANDBOX_SERVICE_ACCOUNT
// set to it is admitted and one running as the namespace's default is not;
// a projected Pod certificate is refused, and the same volume without it
// admitted. The API server drops podCertificate before admission while its
// feature gate PodCertificateRequest is off: then that row cannot be sent.
func TestAdmissionHoldsBaselinesNewerControls(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	// bothKinds creates p as a Pod and as a ReplicaSet's Pod template.
	bothKinds := func(id string, mutate func(*corev1.Pod)) (podErr, rsErr error) {
		p := a.pod(id, nil)
		mutate(p)
		_, podErr = sa.CoreV1().Pods(ns).Create(ctx, p, dry)
		rs := a.replicaSet(id, nil)
		tp := &corev1.Pod{ObjectMeta: rs.Spec.Template.ObjectMeta, Spec: rs.Spec.Template.Spec}
		mutate(tp)
		rs.Spec.Template.ObjectMeta, rs.Spec.Template.Spec = tp.ObjectMeta, tp.Spec
		_, rsErr = sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, dry)
		return podErr, rsErr
	}

	t.Run("handlers naming no host", func(t *testing.T) {
		port := intstr.FromInt32(8080)
		podErr, rsErr := bothKinds("hooks", func(p *corev1.Pod) {
			c := &p.Spec.Containers[0]
			c.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: port}},
				PeriodSeconds: 1, TimeoutSeconds: 1, FailureThreshold: 30, SuccessThreshold: 1}
			c.Lifecycle = &corev1.Lifecycle{
				PostStart: &corev1.LifecycleHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/v1/sandbox", Port: port}},
				PreStop:   &corev1.LifecycleHandler{TCPSocket: &corev1.TCPSocketAction{Port: port}},
			}
			side := c.DeepCopy()
			side.Name, side.RestartPolicy, side.Ports, side.ReadinessProbe = "sidecar", ptr.To(corev1.ContainerRestartPolicyAlways), nil, nil
			side.Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"true"}}}}
			p.Spec.InitContainers = []corev1.Container{*side}
		})
		if podErr != nil || rsErr != nil {
			t.Errorf("probes and hooks that name no host: Pod %v, ReplicaSet %v; want both admitted", podErr, rsErr)
		}
	})

	t.Run("Pod certificate", func(t *testing.T) {
		plain := []corev1.VolumeProjection{
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "name", FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}}},
		}
		cert := corev1.VolumeProjection{PodCertificate: &corev1.PodCertificateProjection{SignerName: "example.com/workloads",
			KeyType: "ED25519", CredentialBundlePath: "credentials.pem"}}
		projected := func(sources []corev1.VolumeProjection) func(*corev1.Pod) {
			return func(p *corev1.Pod) {
				p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "projected", VolumeSource: corev1.VolumeSource{
					Projected: &corev1.ProjectedVolumeSource{Sources: sources}}})
			}
		}
		if podErr, rsErr := bothKinds("plain", projected(plain)); podErr != nil || rsErr != nil {
			t.Errorf("a projected volume of a ConfigMap and the downward API: Pod %v, ReplicaSet %v; want both admitted", podErr, rsErr)
		}
		// Does the API server keep the field? Asked as the administrator,
		// whom no policy judges.
		probe := a.pod("cert", nil)
		projected(append(slices.Clone(plain), cert))(probe)
		kept, err := client().CoreV1().Pods(ns).Create(ctx, probe, dry)
		if err != nil {
			t.Fatal(err)
		}
		if v := kept.Spec.Volumes[len(kept.Spec.Volumes)-1]; v.Projected == nil || len(v.Projected.Sources) != 3 || v.Projected.Sources[2].PodCertificate == nil {
			skip.Unavailable(t, "the API server dropped the podCertificate source (feature gate PodCertificateRequest off): start it with --feature-gates=PodCertificateRequest=true to send this row")
		}
		const msg = "Pod certificate"
		podErr, rsErr := bothKinds("cert", projected(append(slices.Clone(plain), cert)))
		if !refusedBy(podErr, podPolicy, msg) || !refusedBy(rsErr, rsPolicy, msg) {
			t.Errorf("a projected Pod certificate: Pod %v, ReplicaSet %v; want refusals saying %q", podErr, rsErr, msg)
		}
	})

	t.Run("the configured ServiceAccount", func(t *testing.T) {
		const name = "e2e-sandbox-runner"
		ensureServiceAccount(t, ns, name)
		cms := client().CoreV1().ConfigMaps("deer-flow")
		t.Cleanup(func() {
			applyServerSide(t, readObjects(t, filepath.Join("..", "..", "config", "800-admission-policy.yaml")))
		})
		if _, err := cms.Patch(ctx, "sandbox-admission", types.MergePatchType, []byte(`{"data":{"serviceAccountName":"`+name+`"}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		const msg = "run as the ServiceAccount " + name
		eventually(t, 30*time.Second, "a sandbox running as the namespace's default refused", func() (bool, error) {
			_, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("sa-default", nil), dry)
			return refusedBy(err, podPolicy, msg), err
		})
		if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, a.replicaSet("sa-default", nil), dry); !refusedBy(err, rsPolicy, msg) {
			t.Errorf("a sandbox ReplicaSet whose Pods run as the namespace's default: %v; want a refusal saying %q", err, msg)
		}
		own := newAdmission(t, ns, nil)
		own.cfg.ServiceAccountName = name // SANDBOX_SERVICE_ACCOUNT, as the parameter says
		if _, err := sa.CoreV1().Pods(ns).Create(ctx, own.pod("sa-own", nil), dry); err != nil {
			t.Errorf("the function's Pod under SANDBOX_SERVICE_ACCOUNT=%s is refused: %v", name, err)
		}
		if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, own.replicaSet("sa-own", nil), dry); err != nil {
			t.Errorf("the function's ReplicaSet under SANDBOX_SERVICE_ACCOUNT=%s is refused: %v", name, err)
		}
	})
}

// TestAdmissionAdmitsListedStorage is the positive control of the storage
// allow-lists: with a claim prefix, an image, a CSI driver and ephemeral
// sources listed in the parameters, a sandbox mounting exactly those is
// admitted, and one a name off each list still refused. A new, empty
// ephemeral volume needs no entry (config/'s parameters list none).
func TestAdmissionAdmitsListedStorage(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	ephemeral := func(mutate func(*corev1.PersistentVolumeClaimSpec)) corev1.VolumeSource {
		spec := corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}}}
		mutate(&spec)
		return corev1.VolumeSource{Ephemeral: &corev1.EphemeralVolumeSource{VolumeClaimTemplate: &corev1.PersistentVolumeClaimTemplate{Spec: spec}}}
	}
	with := func(id string, vs ...corev1.VolumeSource) *corev1.Pod {
		p := a.pod(id, nil)
		for i, v := range vs {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: fmt.Sprintf("extra-%d", i), VolumeSource: v})
		}
		return p
	}
	empty := ephemeral(func(*corev1.PersistentVolumeClaimSpec) {})
	if _, err := sa.CoreV1().Pods(ns).Create(ctx, with("scratch", empty), dry); err != nil {
		t.Errorf("a sandbox with a new, empty ephemeral volume is refused: %v", err)
	}

	cms := client().CoreV1().ConfigMaps("deer-flow")
	t.Cleanup(func() {
		applyServerSide(t, readObjects(t, filepath.Join("..", "..", "config", "800-admission-policy.yaml")))
	})
	params := `{"data":{"persistentVolumeClaims":"deer-flow-skills,deer-flow-user-data,home-*","imageVolumes":"registry.example.com/tools/*,registry.example.com/models:7",` +
		`"csiDrivers":"example.csi.k8s.io","ephemeralSources":"VolumeSnapshot/golden,PersistentVolume/pv-1,PersistentVolumeClaim/seed"}}`
	if _, err := cms.Patch(ctx, "sandbox-admission", types.MergePatchType, []byte(params), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	listed := with("listed",
		corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "home-alice"}},
		corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "registry.example.com/tools/jq:1", PullPolicy: corev1.PullIfNotPresent}},
		corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "registry.example.com/models:7", PullPolicy: corev1.PullIfNotPresent}},
		corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "example.csi.k8s.io"}},
		ephemeral(func(s *corev1.PersistentVolumeClaimSpec) {
			s.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "golden"}
		}),
		ephemeral(func(s *corev1.PersistentVolumeClaimSpec) { s.VolumeName = "pv-1" }),
		ephemeral(func(s *corev1.PersistentVolumeClaimSpec) {
			s.DataSource = &corev1.TypedLocalObjectReference{Kind: "PersistentVolumeClaim", Name: "seed"}
		}),
	)
	eventually(t, 30*time.Second, "a sandbox mounting listed storage admitted", func() (bool, error) {
		_, err := sa.CoreV1().Pods(ns).Create(ctx, listed, dry)
		return err == nil, err
	})
	rs := a.replicaSet("listed", nil)
	rs.Spec.Template.Spec.Volumes = append(rs.Spec.Template.Spec.Volumes, listed.Spec.Volumes[len(rs.Spec.Template.Spec.Volumes):]...)
	if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, dry); err != nil {
		t.Errorf("a sandbox ReplicaSet mounting listed storage is refused: %v", err)
	}
	for _, tc := range []struct {
		name, message string
		volume        corev1.VolumeSource
	}{
		{"a claim beside the prefix", "may mount only the claims", corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "homes"}}},
		{"an image beside the prefix", "may mount only the images", corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "registry.example.com/toolsx:1", PullPolicy: corev1.PullIfNotPresent}}},
		{"another tag of a listed image", "may mount only the images", corev1.VolumeSource{Image: &corev1.ImageVolumeSource{Reference: "registry.example.com/models:8", PullPolicy: corev1.PullIfNotPresent}}},
		{"another CSI driver", "CSI drivers", corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{Driver: "secrets-store.csi.k8s.io"}}},
		{"another snapshot", "ephemeral volume starts empty", ephemeral(func(s *corev1.PersistentVolumeClaimSpec) {
			s.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "other"}
		})},
		{"a listed snapshot in another namespace", "ephemeral volume starts empty", ephemeral(func(s *corev1.PersistentVolumeClaimSpec) {
			s.DataSourceRef = &corev1.TypedObjectReference{APIGroup: ptr.To("snapshot.storage.k8s.io"), Kind: "VolumeSnapshot", Name: "golden", Namespace: ptr.To("other")}
		})},
	} {
		_, err := sa.CoreV1().Pods(ns).Create(ctx, with("unlisted", tc.volume), dry)
		// An API server without cross-namespace data sources drops the
		// namespace and admits the listed snapshot: that is no escape.
		if tc.name == "a listed snapshot in another namespace" && err == nil {
			t.Logf("%s: the API server dropped the namespace (CrossNamespaceVolumeDataSource off)", tc.name)
			continue
		}
		if !refusedBy(err, podPolicy, tc.message) {
			t.Errorf("%s: %v; want a refusal by %s saying %q", tc.name, err, podPolicy, tc.message)
		}
	}
}

// warmPool creates, as the ServiceAccount, the warm pool the function
// makes for a template of one pooled Pod, and returns the template and one
// Ready pooled Pod (the ReplicaSet controller's).
func warmPool(t *testing.T, ns string, sa kubernetes.Interface, a admission, name string) (*template.Template, *appsv1.ReplicaSet, *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	tmpl, err := template.FromPodTemplate(pooledTemplate(name, 1, corev1.PodSpec{}), a.cfg.Objects())
	if err != nil {
		t.Fatal(err)
	}
	rs, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, pool.Build(a.cfg.Objects(), tmpl), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the warm pool's ReplicaSet the function builds is refused: %v", err)
	}
	var pod *corev1.Pod
	eventually(t, 60*time.Second, "a Ready pooled Pod", func() (bool, error) {
		for _, p := range pods(t, ns, poolLabel+"="+rs.Spec.Selector.MatchLabels[poolLabel]) {
			if p.DeletionTimestamp == nil && ready(&p) {
				pod = p.DeepCopy()
				return true, nil
			}
		}
		return false, nil
	})
	return tmpl, rs, pod
}

// TestAdmissionTiesTheSandboxIDToNames: the sandbox-id label, which a
// sandbox's Service selects, is tied to something the API server can
// check. A Pod the ServiceAccount creates is sandbox-<id>; a Pod's id never
// changes, and a Pod of another name gets one only as a warm pool's Pod
// claimed (the function's own claim passes); a ReplicaSet is sandbox-<id>
// for the id it selects and carries; a Service sandbox-<id>-svc carries and
// selects that id. Each refused for real, beside the function's own
// objects as the positive control.
func TestAdmissionTiesTheSandboxIDToNames(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)
	const podTie, rsTie = "a sandbox Pod the provisioner creates is named sandbox-<its sandbox-id>", "is named sandbox-<id> for the sandbox-id it selects"
	t.Run("bare Pod", func(t *testing.T) {
		p := a.pod("tie1", nil)
		p.Name = resources.PodName("tie2")
		if _, err := sa.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); !refusedBy(err, podPolicy, podTie) {
			t.Errorf("Pod sandbox-tie2 labelled tie1: %v; want a refusal by %s saying %q", err, podPolicy, podTie)
		}
		live, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("tie1", nil), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("the function's Pod is refused: %v", err)
		}
		for _, l := range []map[string]any{{"sandbox-id": "tie3"}, {"sandbox.deerflow.dev/pooled": "true", "sandbox-id": "tie3"}} {
			if _, err := sa.CoreV1().Pods(ns).Patch(ctx, live.Name, types.MergePatchType, labels(l), metav1.PatchOptions{}); !refusedBy(err, podPolicy, "an id never changes") {
				t.Errorf("relabelling Pod %s %v: %v; want a refusal", live.Name, l, err)
			}
		}
	})

	t.Run("claimed pool Pod", func(t *testing.T) {
		tmpl, _, pooled := warmPool(t, ns, sa, a, "admtie")
		poolValue := pooled.Labels[poolLabel]
		// Not a claim: an id while still in the pool (its ReplicaSet would
		// count it, and a Service of that id select it), or an id without
		// the pooled mark.
		token := strings.Repeat("0d", 16) // each with a token, so that the id's rule is what refuses it
		for _, l := range []map[string]any{
			{"sandbox-id": "tie4", pooledLabel: "true", keys.LabelToken: token},
			{"sandbox-id": "tie4", poolLabel: nil, keys.LabelPoolHash: nil, keys.LabelToken: token},
		} {
			if _, err := sa.CoreV1().Pods(ns).Patch(ctx, pooled.Name, types.MergePatchType, labels(l), metav1.PatchOptions{}); !refusedBy(err, podPolicy, "claimed (out of its pool, labelled pooled)") {
				t.Errorf("labelling pooled Pod %s %v: %v; want a refusal", pooled.Name, l, err)
			}
		}
		// The function's claim, its own code, as the ServiceAccount.
		s := resources.WithTemplate(a.cfg.Objects(), a.spec("tie4", nil, ""), tmpl)
		claimed := a.claim(ctx, pool.New(a.cfg, sa, nil, nil), tmpl, s)
		if claimed == nil {
			t.Fatalf("the function's claim of a pooled Pod of %s (pool %s) failed; see the log", tmpl.Name, poolValue)
		}
		if claimed.Labels["sandbox-id"] != "tie4" || claimed.Labels[pooledLabel] != "true" {
			t.Fatalf("claimed Pod labels %v", claimed.Labels)
		}
		p, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{keys.AnnotationLastActivity: time.Now().UTC().Format(time.RFC3339)}}})
		if _, err := sa.CoreV1().Pods(ns).Patch(ctx, claimed.Name, types.MergePatchType, p, metav1.PatchOptions{}); err != nil {
			t.Errorf("the function's activity patch of a claimed Pod is refused: %v", err)
		}
		if _, err := sa.CoreV1().Pods(ns).Patch(ctx, claimed.Name, types.MergePatchType, labels(map[string]any{"sandbox-id": "tie5"}), metav1.PatchOptions{}); !refusedBy(err, podPolicy, "an id never changes") {
			t.Errorf("relabelling claimed Pod %s: %v; want a refusal", claimed.Name, err)
		}
	})

	t.Run("ReplicaSet", func(t *testing.T) {
		for name, mutate := range map[string]func(*appsv1.ReplicaSet){
			"named for another id": func(rs *appsv1.ReplicaSet) { rs.Name = resources.PodName("tie7") },
			"labelled another id":  func(rs *appsv1.ReplicaSet) { rs.Labels["sandbox-id"] = "tie7" },
			"no id of its own":     func(rs *appsv1.ReplicaSet) { delete(rs.Labels, "sandbox-id") },
		} {
			rs := a.replicaSet("tie6", nil)
			mutate(rs)
			if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{}); !refusedBy(err, rsPolicy, rsTie) {
				t.Errorf("ReplicaSet %s: %v; want a refusal by %s saying %q", name, err, rsPolicy, rsTie)
			}
		}
		live := a.replicaSet("tie6", nil)
		live.Spec.Replicas = ptr.To[int32](0)
		live, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, live, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("the function's ReplicaSet is refused: %v", err)
		}
		if _, err := sa.AppsV1().ReplicaSets(ns).Patch(ctx, live.Name, types.MergePatchType, labels(map[string]any{"sandbox-id": "tie7"}), metav1.PatchOptions{}); !refusedBy(err, rsPolicy, rsTie) {
			t.Errorf("relabelling ReplicaSet %s: %v; want a refusal", live.Name, err)
		}
	})

	t.Run("Service", func(t *testing.T) {
		pod, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("tie8", nil), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("the function's Pod is refused: %v", err)
		}
		svc := a.service("tie8", corev1.ServiceTypeClusterIP, resources.PodOwnerRef(pod))
		svc.Name = resources.ServiceName("tie9")
		if _, err := sa.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); !refusedBy(err, servicePolicy, "sandbox-<id>-svc") {
			t.Errorf("Service sandbox-tie9-svc labelled and selecting tie8: %v; want a refusal", err)
		}
		if _, err := sa.CoreV1().Services(ns).Create(ctx, a.service("tie8", corev1.ServiceTypeClusterIP, resources.PodOwnerRef(pod)), metav1.CreateOptions{}); err != nil {
			t.Errorf("the function's Service is refused: %v", err)
		}
	})
}

// TestAdmissionDeletesOnlySandboxesAndPools: the Role lets the
// ServiceAccount delete any Pod, Service or ReplicaSet of its namespace;
// the delete policy lets it delete only sandboxes and warm pools. Objects
// that are neither (the backend's, say, made here by the test's own admin
// client) are refused for real; the function's own are deleted.
func TestAdmissionDeletesOnlySandboxesAndPools(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)
	const message = "the provisioner deletes only sandboxes"

	backend := map[string]string{"app.kubernetes.io/name": "deer-flow-backend"}
	plainPod := func(name string, l map[string]string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "backend:1"}}}}
	}
	// A ReplicaSet of no Pods that selects none of the Pods here (it would
	// adopt and delete them).
	plainRS := func(name string, l map[string]string) *appsv1.ReplicaSet {
		own := map[string]string{"e2e-replicaset": name}
		return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}, Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To[int32](0), Selector: &metav1.LabelSelector{MatchLabels: own},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: own}, Spec: plainPod("", nil).Spec}}}
	}
	admin := client()
	must := func(_ any, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(admin.CoreV1().Pods(ns).Create(ctx, plainPod("backend", backend), metav1.CreateOptions{}))
	must(admin.CoreV1().Pods(ns).Create(ctx, plainPod("sandbox-unlabelled", nil), metav1.CreateOptions{}))
	// The sandbox label without an id or a pool marks nothing the function made.
	must(admin.CoreV1().Pods(ns).Create(ctx, plainPod("sandbox-noid", map[string]string{"app": "deer-flow-sandbox"}), metav1.CreateOptions{}))
	must(admin.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "backend", Labels: backend},
		Spec: corev1.ServiceSpec{Selector: backend, Ports: []corev1.ServicePort{{Port: 80}}}}, metav1.CreateOptions{}))
	must(admin.AppsV1().ReplicaSets(ns).Create(ctx, plainRS("backend", backend), metav1.CreateOptions{}))
	// A pool label on a ReplicaSet not named for that pool.
	must(admin.AppsV1().ReplicaSets(ns).Create(ctx, plainRS("sandbox-pool-other", map[string]string{poolLabel: "python"}), metav1.CreateOptions{}))

	for _, tc := range []struct {
		what string
		del  func() error
	}{
		{"the backend's Pod", func() error { return sa.CoreV1().Pods(ns).Delete(ctx, "backend", metav1.DeleteOptions{}) }},
		{"an unlabelled Pod named like a sandbox", func() error {
			return sa.CoreV1().Pods(ns).Delete(ctx, "sandbox-unlabelled", metav1.DeleteOptions{})
		}},
		{"a Pod with the sandbox label and no id", func() error { return sa.CoreV1().Pods(ns).Delete(ctx, "sandbox-noid", metav1.DeleteOptions{}) }},
		{"the backend's Service", func() error { return sa.CoreV1().Services(ns).Delete(ctx, "backend", metav1.DeleteOptions{}) }},
		{"the backend's ReplicaSet", func() error { return sa.AppsV1().ReplicaSets(ns).Delete(ctx, "backend", metav1.DeleteOptions{}) }},
		{"a ReplicaSet with another pool's label", func() error {
			return sa.AppsV1().ReplicaSets(ns).Delete(ctx, "sandbox-pool-other", metav1.DeleteOptions{})
		}},
	} {
		if err := tc.del(); !refusedBy(err, deletePolicy, message) {
			t.Errorf("deleting %s as the provisioner's ServiceAccount: %v; want a refusal by %s saying %q", tc.what, err, deletePolicy, message)
		}
	}

	// The positive control: what the function deletes (destroy, reap, a
	// failed create's undo, a pool's old Pods and the pool itself), with the
	// preconditions it sends.
	pod, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("del1", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's Pod is refused: %v", err)
	}
	svc, err := sa.CoreV1().Services(ns).Create(ctx, a.service("del1", corev1.ServiceTypeNodePort, resources.PodOwnerRef(pod)), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's Service is refused: %v", err)
	}
	rs := a.replicaSet("del2", nil)
	rs.Spec.Replicas = ptr.To[int32](0)
	if rs, err = sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the function's ReplicaSet is refused: %v", err)
	}
	_, poolRS, pooled := warmPool(t, ns, sa, a, "admdel")
	background := metav1.DeletePropagationBackground
	uid := func(u types.UID) metav1.DeleteOptions {
		return metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(u)), PropagationPolicy: &background}
	}
	// In order: the Service before the Pod that owns it, which the garbage
	// collector would otherwise remove first (a NotFound, not a refusal).
	for _, tc := range []struct {
		what string
		del  func() error
	}{
		{"a sandbox's Service", func() error { return sa.CoreV1().Services(ns).Delete(ctx, svc.Name, uid(svc.UID)) }},
		{"a sandbox's Pod", func() error { return sa.CoreV1().Pods(ns).Delete(ctx, pod.Name, uid(pod.UID)) }},
		{"a sandbox's ReplicaSet", func() error { return sa.AppsV1().ReplicaSets(ns).Delete(ctx, rs.Name, uid(rs.UID)) }},
		{"a pool's unclaimed Pod", func() error {
			return sa.CoreV1().Pods(ns).Delete(ctx, pooled.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pooled.UID}})
		}},
	} {
		if err := tc.del(); err != nil {
			t.Errorf("the function's delete of %s is refused: %v", tc.what, err)
		}
	}
	if err := sa.AppsV1().ReplicaSets(ns).Delete(ctx, poolRS.Name, uid(poolRS.UID)); err != nil {
		t.Errorf("the function's delete of a pool's ReplicaSet is refused: %v", err)
	}
}

// TestAdmissionPinsTheSelectorToken (issue 29): a sandbox Pod the
// ServiceAccount creates, or a pooled Pod it claims, carries a selector
// token of 32 hex digits, which never changes; a Pod from before tokens may
// be updated without one, or gain one. The same for a sandbox ReplicaSet's
// Pod template.
func TestAdmissionPinsTheSelectorToken(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)
	const msg = "carries a selector token"
	for name, mutate := range map[string]func(*corev1.Pod){
		"no token":       func(p *corev1.Pod) { delete(p.Labels, keys.LabelToken) },
		"a chosen token": func(p *corev1.Pod) { p.Labels[keys.LabelToken] = "alice" },
	} {
		p := a.pod("tok1", nil)
		mutate(p)
		if _, err := sa.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); !refusedBy(err, podPolicy, msg) {
			t.Errorf("Pod with %s: %v; want a refusal by %s saying %q", name, err, podPolicy, msg)
		}
	}
	live, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("tok1", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's Pod is refused: %v", err)
	}
	for name, l := range map[string]map[string]any{
		"another token":     {keys.LabelToken: strings.Repeat("0e", 16)},
		"the token removed": {keys.LabelToken: nil},
	} {
		if _, err := sa.CoreV1().Pods(ns).Patch(ctx, live.Name, types.MergePatchType, labels(l), metav1.PatchOptions{}); !refusedBy(err, podPolicy, msg) {
			t.Errorf("%s on Pod %s: %v; want a refusal", name, live.Name, err)
		}
	}
	// From before tokens (made by an administrator, as an older function
	// made it): an activity patch passes without a token; one is given.
	old := a.pod("tok2", nil)
	delete(old.Labels, keys.LabelToken)
	if old, err = client().CoreV1().Pods(ns).Create(ctx, old, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	mark, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		keys.AnnotationLastActivity: time.Now().UTC().Format(time.RFC3339Nano)}}})
	if _, err := sa.CoreV1().Pods(ns).Patch(ctx, old.Name, types.MergePatchType, mark, metav1.PatchOptions{}); err != nil {
		t.Errorf("the activity patch of a Pod from before tokens is refused: %v", err)
	}
	if _, err := sa.CoreV1().Pods(ns).Patch(ctx, old.Name, types.MergePatchType, labels(map[string]any{keys.LabelToken: strings.Repeat("0f", 16)}), metav1.PatchOptions{}); err != nil {
		t.Errorf("giving a Pod from before tokens its token is refused: %v", err)
	}
	rs := a.replicaSet("tok3", nil)
	delete(rs.Spec.Template.Labels, keys.LabelToken)
	if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{}); !refusedBy(err, rsPolicy, msg) {
		t.Errorf("ReplicaSet whose Pod template has no token: %v; want a refusal by %s saying %q", err, rsPolicy, msg)
	}
}

// TestAdmissionWiresAPooledPod: wiring a warm pool's Pod (issue 32) writes
// its token and nothing else, once; its wire is owned by it alone, selects
// only that token and is never updated; a sandbox claimed from it keeps the
// token, and its Service names only its own Pod's wire for its URL. The
// function's own wiring, claim and Services pass (its code, as the
// ServiceAccount), beside each refusal for real.
func TestAdmissionWiresAPooledPod(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)
	if !resources.Wired(a.cfg.Objects()) {
		t.Fatalf("SANDBOX_SERVICE_TYPE %s wires no pooled Pods; this test needs NodePort or ClusterIP", a.cfg.ServiceType)
	}
	tmpl, _, pooled := warmPool(t, ns, sa, a, "admwire")
	const wiring, pinned = "only to give it its token", "carries a selector token"
	token := strings.Repeat("0c", 16)
	for _, tc := range []struct {
		name    string
		patch   map[string]any
		message string
	}{
		{"a chosen token", map[string]any{"metadata": map[string]any{"labels": map[string]any{keys.LabelToken: "alice"}}}, pinned},
		{"a token and another label", map[string]any{"metadata": map[string]any{"labels": map[string]any{keys.LabelToken: token, "x": "y"}}}, wiring},
		{"a token and an annotation", map[string]any{"metadata": map[string]any{"labels": map[string]any{keys.LabelToken: token},
			"annotations": map[string]any{keys.AnnotationExpiresAt: "2030-01-01T00:00:00Z"}}}, wiring},
		// Refused first by the token's rule: a Pod written without an id must gain its token.
		{"an annotation alone", map[string]any{"metadata": map[string]any{"annotations": map[string]any{keys.AnnotationExpiresAt: "2030-01-01T00:00:00Z"}}}, pinned},
		{"a token and a deadline", map[string]any{"metadata": map[string]any{"labels": map[string]any{keys.LabelToken: token}},
			"spec": map[string]any{"activeDeadlineSeconds": 60}}, wiring},
		// Its pin is its own name (issue 45): no pooled Pod carries
		// another's, which that Pod's wire selects.
		{"a token and another Pod's name as its pin", map[string]any{"metadata": map[string]any{"labels": map[string]any{keys.LabelToken: token,
			keys.LabelPod: pooled.Name + "x"}}}, "sandbox.deerflow.dev/pod label is its own name"},
	} {
		p, _ := json.Marshal(tc.patch)
		if _, err := sa.CoreV1().Pods(ns).Patch(ctx, pooled.Name, types.MergePatchType, p, metav1.PatchOptions{}); !refusedBy(err, podPolicy, tc.message) {
			t.Errorf("%s on pooled Pod %s: %v; want a refusal by %s saying %q", tc.name, pooled.Name, err, podPolicy, tc.message)
		}
	}
	pl := pool.New(a.cfg, sa, nil, nil)
	if n, err := pl.Wire(ctx, tmpl); err != nil || n != 1 {
		t.Fatalf("the function's wiring: %d wired, %v; want its one pooled Pod wired", n, err)
	}
	wired, err := sa.CoreV1().Pods(ns).Get(ctx, pooled.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wire, err := sa.CoreV1().Services(ns).Get(ctx, resources.WireName(wired), metav1.GetOptions{})
	if err != nil || !resources.Wires(a.cfg.Objects(), wire, wired) {
		t.Fatalf("wire: %v %+v; want one that wires %s", err, wire, wired.Name)
	}
	// The wiring gave the Pod its pin with its token (one update the Pod
	// policy admits), and its wire selects both (issue 45).
	if wired.Labels[keys.LabelPod] != wired.Name || resources.UnpinnedWire(wire) {
		t.Errorf("wired Pod labels %v, its wire selects %v; want %s=%s, selected beside the token", wired.Labels, wire.Spec.Selector, keys.LabelPod, wired.Name)
	}
	if _, err := sa.CoreV1().Pods(ns).Patch(ctx, wired.Name, types.MergePatchType, labels(map[string]any{keys.LabelToken: token}), metav1.PatchOptions{}); !refusedBy(err, podPolicy, pinned) {
		t.Errorf("another token on wired Pod %s: %v; want a refusal saying %q", wired.Name, err, pinned)
	}
	// Wires: only as built, never updated. Each below is the function's
	// wire of another Pod of the pool (sandbox-pool-<pool>-zzzzz, not
	// there: the owner reference only names it), changed; unchanged, it
	// is admitted (and removed at once, lest a claim take it for the
	// wired Pod's).
	zzzzz := func() *corev1.Service {
		w := resources.BuildWire(a.cfg.Objects(), wired, wired.Labels[keys.LabelToken])
		w.Name = "sandbox-pool-" + wired.Labels[poolLabel] + "-zzzzz"
		w.OwnerReferences[0].Name, w.OwnerReferences[0].UID, w.Spec.Selector[keys.LabelPod] = w.Name, "00000000-0000-0000-0000-00000000zzzz", w.Name
		return w
	}
	const wireRule = "wire is owned by that Pod alone, selects exactly"
	for name, tc := range map[string]struct {
		mutate  func(*corev1.Service)
		message string
	}{
		"selecting the sandbox label": {func(s *corev1.Service) { s.Spec.Selector = map[string]string{keys.LabelApp: keys.LabelAppValue} }, ""},
		"owned by no one":             {func(s *corev1.Service) { s.OwnerReferences = nil }, ""},
		"named for another pool":      {func(s *corev1.Service) { s.Name = "sandbox-pool-other-abcde" }, ""},
		"labelled a sandbox":          {func(s *corev1.Service) { s.Labels[keys.LabelApp] = keys.LabelAppValue }, ""},
		// Issue 45: a wire of the token alone would take in any Pod given
		// that token; one naming another Pod would take in that Pod.
		"selecting the token alone":           {func(s *corev1.Service) { delete(s.Spec.Selector, keys.LabelPod) }, wireRule},
		"selecting another Pod's name as pin": {func(s *corev1.Service) { s.Spec.Selector[keys.LabelPod] = wired.Name }, wireRule},
	} {
		w := zzzzz()
		tc.mutate(w)
		if _, err := sa.CoreV1().Services(ns).Create(ctx, w, metav1.CreateOptions{}); !refusedBy(err, servicePolicy, tc.message) {
			t.Errorf("a wire %s: %v; want a refusal by %s saying %q", name, err, servicePolicy, tc.message)
		}
	}
	if made, err := sa.CoreV1().Services(ns).Create(ctx, zzzzz(), metav1.CreateOptions{}); err != nil {
		t.Errorf("the function's wire of a Pod sandbox-pool-...-zzzzz is refused: %v", err)
	} else if err := sa.CoreV1().Services(ns).Delete(ctx, made.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// A stray Pod the ServiceAccount makes with the wired Pod's token (read
	// from a Pod list) is admitted, a bare sandbox's shape, and does not
	// join the wire: it cannot carry the wired Pod's name as its pin.
	strayPod := a.pod("wirestray", nil)
	strayPod.Labels[keys.LabelToken] = wired.Labels[keys.LabelToken]
	stray, err := sa.CoreV1().Pods(ns).Create(ctx, strayPod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a bare Pod carrying a token it read is refused (a bare sandbox's shape, selected by no other Service): %v", err)
	}
	if _, err := sa.CoreV1().Pods(ns).Patch(ctx, stray.Name, types.MergePatchType, labels(map[string]any{keys.LabelPod: wired.Name}), metav1.PatchOptions{}); !refusedBy(err, podPolicy, "sandbox.deerflow.dev/pod label is its own name") {
		t.Errorf("the wired Pod's name as the stray Pod's pin: %v; want a refusal", err)
	}
	if got := pods(t, ns, labelsOf(wire.Spec.Selector)); len(got) != 1 || got[0].Name != wired.Name {
		t.Errorf("the wire %v selects %d Pods (%v); want %s alone, not the stray %s", wire.Spec.Selector, len(got), got, wired.Name, stray.Name)
	}
	upd := wire.DeepCopy()
	upd.Spec.Selector = map[string]string{keys.LabelToken: token}
	if _, err := sa.CoreV1().Services(ns).Update(ctx, upd, metav1.UpdateOptions{}); !refusedBy(err, servicePolicy, "never updated") {
		t.Errorf("updating wire %s: %v; want a refusal", wire.Name, err)
	}
	// The function's claim keeps the token; its Service names the wire.
	s := resources.WithTemplate(a.cfg.Objects(), a.spec("wire1", nil, ""), tmpl)
	claimed := a.claim(ctx, pl, tmpl, s)
	if claimed == nil {
		t.Fatalf("the function's claim of wired Pod %s failed; see the log", wired.Name)
	}
	if claimed.Labels[keys.LabelToken] != wired.Labels[keys.LabelToken] || claimed.Labels[keys.LabelPod] != claimed.Name {
		t.Errorf("claimed Pod token %q, pin %q; want the token it was wired with, %q, and its own name", claimed.Labels[keys.LabelToken], claimed.Labels[keys.LabelPod], wired.Labels[keys.LabelToken])
	}
	s.Token = claimed.Labels[keys.LabelToken]
	other := resources.Reference(resources.BuildService(a.cfg.Objects(), s, resources.PodOwnerRef(claimed)), &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-pool-other-abcde"}})
	if _, err := sa.CoreV1().Services(ns).Create(ctx, other, metav1.CreateOptions{}); !refusedBy(err, servicePolicy, "names its own Pod's wire") {
		t.Errorf("a sandbox Service naming another Pod's wire: %v; want a refusal", err)
	}
	// It selects nothing: the wire alone reaches the Pod. One that selects
	// anything (its sandbox as a cold one's Service does, or more) is not
	// made.
	for name, sel := range map[string]map[string]string{
		"its sandbox":     resources.ServiceSelector(s.ID, s.Token),
		"the token alone": {keys.LabelToken: s.Token},
		"every sandbox":   {keys.LabelApp: keys.LabelAppValue},
	} {
		selecting := resources.Reference(resources.BuildService(a.cfg.Objects(), s, resources.PodOwnerRef(claimed)), wire)
		selecting.Spec.Selector = sel
		if _, err := sa.CoreV1().Services(ns).Create(ctx, selecting, metav1.CreateOptions{}); !refusedBy(err, servicePolicy, "selects nothing") {
			t.Errorf("a sandbox Service naming its wire and selecting %s: %v; want a refusal", name, err)
		}
	}
	ref := resources.Reference(resources.BuildService(a.cfg.Objects(), s, resources.PodOwnerRef(claimed)), wire)
	if _, err := sa.CoreV1().Services(ns).Create(ctx, ref, metav1.CreateOptions{}); err != nil {
		t.Errorf("the function's Service of a sandbox claimed wired is refused: %v", err)
	}
	if err := sa.CoreV1().Services(ns).Delete(ctx, wire.Name, metav1.DeleteOptions{}); err != nil {
		t.Errorf("the function's delete of a wire is refused: %v", err)
	}
}

// TestAdmissionPinsServicesToTheirWorkload (issue 45): a Pod the
// ServiceAccount writes cannot join another sandbox's Service with a token
// read from a Pod list, and every sandbox it creates is visible to the
// reap. A Service selects its pin beside id and token: a bare Pod's own
// name (sandbox.deerflow.dev/pod, which must be that Pod's name), or
// workload=replicaset, which only the one ReplicaSet sandbox-<id>'s
// template may carry. Each refusal is sent for real as the ServiceAccount
// beside the function's own objects; the Pods an attacker may still make
// (another kind under the victim's id and token) are admitted and shown
// not to match the victim's Service's selector.
func TestAdmissionPinsServicesToTheirWorkload(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	a := newAdmission(t, ns, nil)
	const (
		podPin, workloadPin = "sandbox.deerflow.dev/pod label is its own name", "carries no sandbox.deerflow.dev/workload"
		rsPin, managed      = "Pod template carries sandbox.deerflow.dev/workload=replicaset", "labelled app.kubernetes.io/managed-by"
		selects             = "selects exactly its own sandbox"
	)
	// selected is the names of the Pods svc's selector matches.
	selected := func(svc *corev1.Service) []string {
		var names []string
		for _, p := range pods(t, ns, labelsOf(svc.Spec.Selector)) {
			names = append(names, p.Name)
		}
		return names
	}

	// The victims, as the function makes them: a bare Pod and a ReplicaSet
	// sandbox (its one Pod made by the ReplicaSet controller), each with
	// its Service. Every sandbox here carries the same token (a.spec's),
	// as an attacker who read it would write it.
	victim, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("pin1", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's Pod is refused: %v", err)
	}
	victimSvc, err := sa.CoreV1().Services(ns).Create(ctx, a.service("pin1", corev1.ServiceTypeClusterIP, resources.PodOwnerRef(victim)), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's Service is refused: %v", err)
	}
	victimRS, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, a.replicaSet("pin2", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's ReplicaSet is refused: %v", err)
	}
	victimRSSvc, err := sa.CoreV1().Services(ns).Create(ctx, a.service("pin2", corev1.ServiceTypeClusterIP, resources.ReplicaSetOwnerRef(victimRS)), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the function's Service of a ReplicaSet is refused: %v", err)
	}

	t.Run("Pods", func(t *testing.T) {
		for _, tc := range []struct {
			name, message string
			mutate        func(*corev1.Pod)
		}{
			// The bare victim's pin on a Pod of another name.
			{"another Pod's name as its pin", podPin, func(p *corev1.Pod) { p.Labels[keys.LabelPod] = victim.Name }},
			// The ReplicaSet victim's pin on a bare Pod of its id (that
			// name is free: the ReplicaSet's Pods are named by its
			// controller).
			{"a ReplicaSet's Pods' mark", workloadPin, func(p *corev1.Pod) {
				p.Name, p.Labels[keys.LabelID], p.Labels[keys.LabelPod] = resources.PodName("pin2"), "pin2", resources.PodName("pin2")
				p.Labels[keys.LabelWorkload] = keys.WorkloadReplicaSetValue
			}},
			{"no managed-by, unseen by the reap", managed, func(p *corev1.Pod) { delete(p.Labels, keys.LabelManagedBy) }},
			{"another managed-by", managed, func(p *corev1.Pod) { p.Labels[keys.LabelManagedBy] = "someone-else" }},
		} {
			p := a.pod("pin3", nil)
			tc.mutate(p)
			if _, err := sa.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); !refusedBy(err, podPolicy, tc.message) {
				t.Errorf("Pod with %s: %v; want a refusal by %s saying %q", tc.name, err, podPolicy, tc.message)
			}
		}
		for name, l := range map[string]map[string]any{
			"a ReplicaSet's Pods' mark": {keys.LabelWorkload: keys.WorkloadReplicaSetValue},
			"managed-by removed":        {keys.LabelManagedBy: nil},
			"another Pod's name":        {keys.LabelPod: resources.PodName("pin9")},
		} {
			if _, err := sa.CoreV1().Pods(ns).Patch(ctx, victim.Name, types.MergePatchType, labels(l), metav1.PatchOptions{}); !refusedBy(err, podPolicy, "") {
				t.Errorf("%s on Pod %s: %v; want a refusal by %s", name, victim.Name, err, podPolicy)
			}
		}
		// What an attacker may still make under the victims' ids and
		// token: a bare Pod sandbox-pin2 beside the ReplicaSet sandbox
		// pin2, and a ReplicaSet sandbox-pin1 beside the bare Pod pin1.
		// Each is admitted (the function's own shapes), and neither joins.
		stray, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("pin2", nil), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a bare Pod beside a ReplicaSet sandbox of its id is refused: %v", err)
		}
		strayRS, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, a.replicaSet("pin1", nil), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a ReplicaSet beside a bare sandbox of its id is refused: %v", err)
		}
		eventually(t, 60*time.Second, "both ReplicaSets' Pods made", func() (bool, error) {
			for _, rs := range []*appsv1.ReplicaSet{victimRS, strayRS} {
				if len(pods(t, ns, labelsOf(rs.Spec.Selector.MatchLabels))) == 0 {
					return false, nil
				}
			}
			return true, nil
		})
		if got := selected(victimSvc); !slices.Equal(got, []string{victim.Name}) {
			t.Errorf("the bare sandbox's Service selects %v; want its own Pod %s alone (not ReplicaSet %s's)", got, victim.Name, strayRS.Name)
		}
		got := selected(victimRSSvc)
		if len(got) != 1 || slices.Contains(got, stray.Name) {
			t.Errorf("the ReplicaSet sandbox's Service selects %v; want its ReplicaSet's one Pod, not the bare Pod %s", got, stray.Name)
		}
	})

	t.Run("ReplicaSets", func(t *testing.T) {
		for name, mutate := range map[string]func(*appsv1.ReplicaSet){
			"a template naming a Pod": func(rs *appsv1.ReplicaSet) { rs.Spec.Template.Labels[keys.LabelPod] = resources.PodName("pin5") },
			"no managed-by":           func(rs *appsv1.ReplicaSet) { delete(rs.Spec.Template.Labels, keys.LabelManagedBy) },
		} {
			rs := a.replicaSet("pin5", nil)
			mutate(rs)
			want := rsPin
			if name == "no managed-by" {
				want = managed
			}
			if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{}); !refusedBy(err, rsPolicy, want) {
				t.Errorf("ReplicaSet with %s: %v; want a refusal by %s saying %q", name, err, rsPolicy, want)
			}
		}
		// A warm pool's template marked as a sandbox ReplicaSet's Pods.
		tmpl, err := template.FromPodTemplate(pooledTemplate("admpin", 1, corev1.PodSpec{}), a.cfg.Objects())
		if err != nil {
			t.Fatal(err)
		}
		poolRS := pool.Build(a.cfg.Objects(), tmpl)
		poolRS.Spec.Template.Labels[keys.LabelWorkload] = keys.WorkloadReplicaSetValue
		if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, poolRS, metav1.CreateOptions{}); !refusedBy(err, rsPolicy, rsPin) {
			t.Errorf("a warm pool whose Pods carry workload=replicaset: %v; want a refusal saying %q", err, rsPin)
		}
	})

	// A sandbox claimed from a warm pool and not wired (Headless mode, or
	// a Pod not wired yet): its Service, owned by the pooled Pod and made
	// before the claim, selects the id, the token and that Pod's name,
	// which the claim writes on the Pod. Neither the form before pins (id
	// and token) nor another Pod's name is admitted; the function's is,
	// and a stray Pod given the id and token does not join it.
	t.Run("claimed pooled Pod", func(t *testing.T) {
		tmpl, _, pooled := warmPool(t, ns, sa, a, "admpinpool")
		s := resources.WithTemplate(a.cfg.Objects(), a.spec("pin8", nil, ""), tmpl)
		built := func() *corev1.Service {
			return resources.BuildService(a.cfg.Objects(), s, resources.PodOwnerRef(pooled))
		}
		for name, mutate := range map[string]func(*corev1.Service){
			"its id and token alone": func(svc *corev1.Service) { delete(svc.Spec.Selector, keys.LabelPod) },
			"another pooled Pod's name": func(svc *corev1.Service) {
				svc.Spec.Selector[keys.LabelPod] = pooled.Name[:len(pooled.Name)-5] + "zzzzz"
			},
			"a bare Pod's name": func(svc *corev1.Service) { svc.Spec.Selector[keys.LabelPod] = resources.PodName("pin8") + "x" },
		} {
			svc := built()
			mutate(svc)
			if _, err := sa.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); !refusedBy(err, servicePolicy, selects) {
				t.Errorf("a claimed pooled Pod's Service selecting %s: %v; want a refusal saying %q", name, err, selects)
			}
		}
		svc, err := sa.CoreV1().Services(ns).Create(ctx, built(), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("the function's Service of a sandbox claimed from a pool is refused: %v", err)
		}
		claimed := a.claim(ctx, pool.New(a.cfg, sa, nil, nil), tmpl, s)
		if claimed == nil {
			t.Fatalf("the function's claim of pooled Pod %s failed; see the log", pooled.Name)
		}
		if claimed.Name != pooled.Name || claimed.Labels[keys.LabelPod] != claimed.Name {
			t.Fatalf("claimed Pod %s labels %v; want %s carrying its own name as its pin", claimed.Name, claimed.Labels, pooled.Name)
		}
		stray, err := sa.CoreV1().Pods(ns).Create(ctx, a.pod("pin8", nil), metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("a bare Pod of the claimed sandbox's id and token is refused (a bare sandbox's shape): %v", err)
		}
		if got := selected(svc); !slices.Equal(got, []string{claimed.Name}) {
			t.Errorf("the claimed sandbox's Service selects %v; want its claimed Pod %s alone, not the stray %s", got, claimed.Name, stray.Name)
		}
	})

	t.Run("Services", func(t *testing.T) {
		other := strings.Repeat("0e", 16)
		for _, tc := range []struct {
			name   string
			mutate func(*corev1.Service)
		}{
			{"no pin", func(s *corev1.Service) { delete(s.Spec.Selector, keys.LabelPod) }},
			{"another Pod's name", func(s *corev1.Service) { s.Spec.Selector[keys.LabelPod] = resources.PodName("pin9") }},
			{"both pins", func(s *corev1.Service) { s.Spec.Selector[keys.LabelWorkload] = keys.WorkloadReplicaSetValue }},
			{"another token", func(s *corev1.Service) { s.Spec.Selector[keys.LabelToken] = other }},
		} {
			svc := a.service("pin6", corev1.ServiceTypeClusterIP, resources.PodOwnerRef(victim))
			// Its own pin (its owner, sandbox-pin1, is not its id's
			// Pod, so BuildService gave it none): the row's change alone
			// is what the policy judges.
			maps.Copy(svc.Spec.Selector, resources.ServicePin("pin6", metav1.OwnerReference{Kind: "Pod"}))
			svc.Spec.Selector[keys.LabelToken] = strings.Repeat("0a", 16)
			if tc.name != "another token" {
				tc.mutate(svc)
				if _, err := sa.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); !refusedBy(err, servicePolicy, selects) {
					t.Errorf("a Service with %s: %v; want a refusal saying %q", tc.name, err, selects)
				}
			}
			upd := victimSvc.DeepCopy()
			tc.mutate(upd)
			if _, err := sa.CoreV1().Services(ns).Update(ctx, upd, metav1.UpdateOptions{}); !refusedBy(err, servicePolicy, selects) {
				t.Errorf("an update of Service %s to %s: %v; want a refusal saying %q", victimSvc.Name, tc.name, err, selects)
			}
		}
		// From before pins (made by an administrator, as the previous
		// version made it): kept through an update, given its pin, never
		// another token.
		old := a.service("pin7", corev1.ServiceTypeClusterIP, resources.PodOwnerRef(victim))
		old.Spec.Selector = resources.ServiceSelector("pin7", strings.Repeat("0a", 16))
		if old, err = client().CoreV1().Services(ns).Create(ctx, old, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		switched := old.DeepCopy()
		switched.Spec.Selector[keys.LabelToken] = other
		if _, err := sa.CoreV1().Services(ns).Update(ctx, switched, metav1.UpdateOptions{}); !refusedBy(err, servicePolicy, selects) {
			t.Errorf("switching the token of a Service from before pins: %v; want a refusal", err)
		}
		old.Labels["example.com/note"] = "kept"
		if old, err = sa.CoreV1().Services(ns).Update(ctx, old, metav1.UpdateOptions{}); err != nil {
			t.Errorf("an update that keeps the selector of a Service from before pins is refused: %v", err)
		} else {
			old.Spec.Selector[keys.LabelPod] = resources.PodName("pin7")
			if _, err := sa.CoreV1().Services(ns).Update(ctx, old, metav1.UpdateOptions{}); err != nil {
				t.Errorf("giving a Service from before pins its pin is refused: %v", err)
			}
		}
	})
}

// labelsOf is a selector string for exactly m.
func labelsOf(m map[string]string) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
