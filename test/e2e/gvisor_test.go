//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
)

// needGVisor stops a test that needs the real node's runsc handler when
// the node has none (make node builds gVisor): a skip outside CI, a
// failure in CI.
func needGVisor(t *testing.T) *realnode.Node {
	t.Helper()
	rn := needRealNode(t)
	if err := rn.GVisor(); err != nil {
		skip.Unavailable(t, "the real node has no gVisor, so this test cannot run here: %v", err)
	}
	return rn
}

// standInPod is a Pod running the sandbox stand-in on the real node, shaped
// like a sandbox (its user, no capabilities, no token, the readiness probe
// DeerFlow's client polls), under the given RuntimeClass.
func standInPod(ns, name, runtimeClass string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			RuntimeClassName: ptr.To(runtimeClass),
			NodeSelector:     map[string]string{realnode.NodeLabel: "true"}, Tolerations: []corev1.Toleration{realnode.Toleration},
			AutomountServiceAccountToken: ptr.To(false), TerminationGracePeriodSeconds: ptr.To[int64](1),
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](1000)},
			Containers: []corev1.Container{{
				Name: "sandbox", Image: realnode.SandboxImage, ImagePullPolicy: corev1.PullNever,
				Ports: []corev1.ContainerPort{{ContainerPort: 8080}},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/v1/sandbox", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
			}},
		},
	}
}

// sandboxRefusal waits (bounded) for the kubelet's FailedCreatePodSandBox
// Event on Pod name and returns its message. The Pod's status carries no
// reason (its container waits in ContainerCreating); only the Event says
// why.
func sandboxRefusal(t *testing.T, ns, name string) string {
	t.Helper()
	var msg string
	eventually(t, 60*time.Second, "the kubelet's refusal of "+name, func() (bool, error) {
		evs, err := client().CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "FailedCreatePodSandBox" {
				msg = e.Message
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events", len(evs.Items))
	})
	return msg
}

// neverRan fails the test if Pod name has a running container, or is
// anything but Pending.
func neverRan(t *testing.T, ns, name string) {
	t.Helper()
	p, err := client().CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Status.Phase != corev1.PodPending {
		t.Errorf("Pod %s: phase %s, want Pending", name, p.Status.Phase)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Running != nil || cs.State.Terminated != nil || cs.ContainerID != "" {
			t.Errorf("Pod %s: container %s ran: %+v", name, cs.Name, cs.State)
		}
	}
}

// TestGVisorSandboxSeesItsOwnKernel: a sandbox-shaped Pod of RuntimeClass
// gvisor (config/node/runtimeclass-gvisor.yaml, which the real node
// applies) becomes Ready through its HTTP probe, answers through its
// NodePort Service, and the kernel it sees is gVisor's Sentry, not the
// node's: /proc/version and the release name come from gVisor.
func TestGVisorSandboxSeesItsOwnKernel(t *testing.T) {
	needGVisor(t)
	ns := namespace(t)
	ctx := context.Background()
	rc, err := client().NodeV1().RuntimeClasses().Get(ctx, realnode.GVisorRuntimeClass, metav1.GetOptions{})
	if err != nil || rc.Handler != realnode.GVisorHandler {
		t.Fatalf("RuntimeClass %s: %+v, %v; want handler %s", realnode.GVisorRuntimeClass, rc, err, realnode.GVisorHandler)
	}
	const name = "gvisor-kernel"
	began := time.Now()
	if _, err := client().CoreV1().Pods(ns).Create(ctx, standInPod(ns, name, realnode.GVisorRuntimeClass), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := client().CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": name},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080)}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod := waitReady(t, "the gVisor Pod", podNamed(ns, name))
	t.Logf("create → Ready under gVisor (%s platform) in %s", realnode.GVisorPlatform, time.Since(began).Round(time.Millisecond))

	answers(t, fmt.Sprintf("http://127.0.0.1:%d/v1/sandbox", svc.Spec.Ports[0].NodePort), name)

	host, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	hostRelease := strings.TrimSpace(string(host))
	ok, version := execIn(t, pod.Status.PodIP, map[string]any{"op": "read", "path": "/proc/version"})
	if !ok || !strings.Contains(version, "gvisor") || strings.Contains(version, hostRelease) {
		t.Errorf("/proc/version inside the sandbox: %q (ok %v); want gVisor's kernel, not the node's %s", version, ok, hostRelease)
	}
	// uname(2), what `uname -r` asks: the release, then /proc/version.
	ok, uname := execIn(t, pod.Status.PodIP, map[string]any{"op": "kernel", "name": "uname"})
	if release, _, _ := strings.Cut(uname, " "); !ok || !strings.HasSuffix(release, "-gvisor") || release == hostRelease {
		t.Errorf("uname inside the sandbox: %q (ok %v); want gVisor's release, not the node's %s", uname, ok, hostRelease)
	}
	t.Logf("inside the sandbox: %s (the node's kernel: %s)", version, hostRelease)
}

// TestGVisorUserNamespaceFailsClosed: hostUsers: false (the shipped
// SANDBOX_USER_NAMESPACE=true) under gVisor. The node advertises user
// namespaces for the runsc handler, so the kubelet passes the Pod on;
// containerd makes the Pod's user namespace and hands runsc its path, and
// runsc cannot join it (setns into a user namespace fails with EINVAL in a
// multithreaded process). The Pod is refused and never runs, in the node's
// user namespace or any other.
func TestGVisorUserNamespaceFailsClosed(t *testing.T) {
	needGVisor(t)
	ns := namespace(t)
	const name = "gvisor-userns"
	p := standInPod(ns, name, realnode.GVisorRuntimeClass)
	p.Spec.HostUsers = ptr.To(false)
	if _, err := client().CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := sandboxRefusal(t, ns, name)
	if !strings.Contains(msg, "namespace of type user") {
		t.Errorf("the kubelet refused the Pod for another reason: %s", msg)
	}
	neverRan(t, ns, name)
	t.Logf("kubelet: %s", msg)
}

// TestRuntimeClassWithoutHandlerIsReported: a Pod whose RuntimeClass names
// a handler the node lacks is refused by the kubelet with a reason that
// says so (the Event a create's ?wait must surface), and never runs.
func TestRuntimeClassWithoutHandlerIsReported(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	ctx := context.Background()
	const class = "nosuch"
	rcs := client().NodeV1().RuntimeClasses()
	_, err := rcs.Create(ctx, &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: class}, Handler: class}, metav1.CreateOptions{})
	switch {
	case err == nil:
		t.Cleanup(func() { _ = rcs.Delete(context.Background(), class, metav1.DeleteOptions{}) })
	case !apierrors.IsAlreadyExists(err):
		t.Fatal(err)
	}
	const name = "no-handler"
	if _, err := client().CoreV1().Pods(ns).Create(ctx, standInPod(ns, name, class), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	msg := sandboxRefusal(t, ns, name)
	if want := `no runtime for "` + class + `" is configured`; !strings.Contains(msg, want) {
		t.Errorf("the kubelet's refusal %q does not say %q", msg, want)
	}
	neverRan(t, ns, name)
	t.Logf("kubelet: %s", msg)

	// Through the function: a create that waits answers with the kubelet's
	// reason when the wait ends, never a hang and never a bare "not ready".
	fns := namespace(t)
	f := start(t, fns, realEnv(t, fns, map[string]string{"SANDBOX_RUNTIME_CLASS": class}))
	r := mustDo(t, f, "POST", "/api/sandboxes?wait=8s", map[string]any{"sandbox_id": "no-handler"})
	expectCode(t, r, 200, "create with a class whose handler the node lacks")
	if reason, _ := r.Body["reason"].(string); r.Body["wait_timed_out"] != true || !strings.Contains(reason, `no runtime for "`+class+`" is configured`) {
		t.Errorf("the create's answer does not carry the kubelet's reason: %s", r.Raw)
	}
}
