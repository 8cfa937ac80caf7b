//go:build e2e

package e2e

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
)

// serviceAccountNamespace makes a namespace in which the provisioner's
// ServiceAccount holds config/'s Role (copied there), applies config/'s
// ValidatingAdmissionPolicy, and returns a client that acts as that
// ServiceAccount. The namespace enforces no Pod Security level, as in
// DeerFlow's host-path mode, so that the admission policy alone is tested.
func serviceAccountNamespace(t *testing.T) (string, kubernetes.Interface) {
	t.Helper()
	ns := namespace(t)
	var objs = readObjects(t, filepath.Join("..", "..", "config", "201-role.yaml"), filepath.Join("..", "..", "config", "202-rolebinding.yaml"))
	for _, o := range objs {
		o.SetNamespace(ns)
	}
	applyServerSide(t, objs)
	applyServerSide(t, readObjects(t, filepath.Join("..", "..", "config", "800-admission-policy.yaml")))
	rc := rest.CopyConfig(kc.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: serviceAccount}
	sa := kubernetes.NewForConfigOrDie(rc)
	// The policy takes a moment to be in force: wait until it refuses a Pod
	// without the sandbox label.
	eventually(t, 30*time.Second, "admission policy in force", func() (bool, error) {
		p := admissionPod(ns)
		delete(p.Labels, "app")
		_, err := sa.CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "sandbox-provisioner-pods"), err
	})
	return ns, sa
}

// admissionPod is a Pod the function would build, with default settings.
func admissionPod(ns string) *corev1.Pod {
	cfg, _ := config.Load()
	cfg.Namespace = ns
	spec, err := sandbox.CreateRequest{SandboxID: "adm1"}.Validate(cfg, time.Now())
	if err != nil {
		panic(err)
	}
	return sandbox.BuildPod(cfg, spec)
}

// admissionReplicaSet is the ReplicaSet the function would build for a
// ReplicaSet template, with default settings.
func admissionReplicaSet(ns string) *appsv1.ReplicaSet {
	cfg, _ := config.Load()
	cfg.Namespace = ns
	spec, err := sandbox.CreateRequest{SandboxID: "adm2"}.Validate(cfg, time.Now())
	if err != nil {
		panic(err)
	}
	return sandbox.BuildReplicaSet(cfg, spec)
}

// TestAdmissionPolicyRefusesEscapes acts as the provisioner's ServiceAccount:
// the API server itself refuses every Pod shape that would let a compromised
// function create an escaping sandbox, and admits the Pod the function builds.
func TestAdmissionPolicyRefusesEscapes(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := sa.CoreV1().Pods(ns).Create(ctx, admissionPod(ns), dry); err != nil {
		t.Fatalf("the Pod the function builds is refused: %v", err)
	}
	if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, admissionReplicaSet(ns), dry); err != nil {
		t.Fatalf("the ReplicaSet the function builds is refused: %v", err)
	}
	for name, mutate := range map[string]func(*appsv1.ReplicaSet){
		"more than one Pod":            func(rs *appsv1.ReplicaSet) { rs.Spec.Replicas = ptr.To[int32](50) },
		"a selector wider than its id": func(rs *appsv1.ReplicaSet) { delete(rs.Spec.Selector.MatchLabels, "sandbox-id") },
	} {
		rs := admissionReplicaSet(ns)
		mutate(rs)
		if name == "a selector wider than its id" {
			delete(rs.Spec.Template.Labels, "sandbox-id") // still matching its template, as the API server demands
			rs.Spec.Template.Labels["app"] = "deer-flow-sandbox"
		}
		if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, dry); err == nil || !strings.Contains(err.Error(), "sandbox-provisioner-replicasets") {
			t.Errorf("ReplicaSet with %s created as the provisioner's ServiceAccount: %v, want a refusal", name, err)
		}
	}
	cases := []struct {
		name   string
		mutate func(*corev1.Pod)
	}{
		// Each mutation also drops what the API server's own validation
		// would refuse first, as a compromised function would, so that the
		// refusal shown is the admission policy's.
		{"privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = nil
		}},
		{"hostNetwork", func(p *corev1.Pod) { p.Spec.HostNetwork, p.Spec.HostUsers = true, nil }},
		{"hostPID", func(p *corev1.Pod) { p.Spec.HostPID, p.Spec.HostUsers = true, nil }},
		{"hostPath outside the base", func(p *corev1.Pod) { p.Spec.Volumes[0].HostPath.Path = "/etc" }},
		{"hostPath beside the base", func(p *corev1.Pod) { p.Spec.Volumes[0].HostPath.Path = "/.deer-flow-evil" }},
		{"capability off the list", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = append(p.Spec.Containers[0].SecurityContext.Capabilities.Add, "NET_ADMIN")
		}},
		{"capability off the list in an init container", func(p *corev1.Pod) {
			c := p.Spec.Containers[0].DeepCopy()
			c.Name = "init"
			c.Ports, c.ReadinessProbe, c.LivenessProbe = nil, nil, nil
			c.SecurityContext.Capabilities.Add = []corev1.Capability{"SYS_ADMIN"}
			p.Spec.InitContainers = []corev1.Container{*c}
		}},
		{"no sandbox label", func(p *corev1.Pod) { delete(p.Labels, "app") }},
		{"no sandbox id", func(p *corev1.Pod) { delete(p.Labels, "sandbox-id") }},
		{"a mounted token", func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = ptr.To(true) }},
		{"privilege escalation", func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true) }},
		{"a host port", func(p *corev1.Pod) { p.Spec.Containers[0].Ports[0].HostPort = 8080 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The same escape through a ReplicaSet's Pod template, whose Pods
			// the ReplicaSet controller (not the provisioner) creates.
			rs := admissionReplicaSet(ns)
			p := &corev1.Pod{ObjectMeta: rs.Spec.Template.ObjectMeta, Spec: rs.Spec.Template.Spec}
			tc.mutate(p)
			rs.Spec.Template.ObjectMeta, rs.Spec.Template.Spec = p.ObjectMeta, p.Spec
			// Keep the selector matching the template, as the API server
			// demands, so that the refusal shown is the policy's.
			for k := range rs.Spec.Selector.MatchLabels {
				if _, ok := p.Labels[k]; !ok {
					delete(rs.Spec.Selector.MatchLabels, k)
				}
			}
			if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, dry); err == nil || !strings.Contains(err.Error(), "sandbox-provisioner-replicasets") {
				t.Errorf("ReplicaSet created as the provisioner's ServiceAccount: %v, want a refusal by the admission policy", err)
			}
			p = admissionPod(ns)
			tc.mutate(p)
			_, err := sa.CoreV1().Pods(ns).Create(ctx, p, dry)
			if err == nil || !strings.Contains(err.Error(), "sandbox-provisioner-pods") {
				t.Errorf("created as the provisioner's ServiceAccount: %v, want a refusal by the admission policy", err)
			}
		})
	}
}
