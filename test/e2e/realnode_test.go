//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/test/harness"
	"github.com/deerflow-sandbox/provisioner/test/realnode"
)

// needRealNode skips, saying why, when the real node could not start.
func needRealNode(t *testing.T) *realnode.Node {
	t.Helper()
	if realNode == nil {
		t.Skipf("no real node, so this test cannot run here: %v", realNodeErr)
	}
	return realNode
}

// realEnv is the function's configuration for sandboxes on the real node:
// the stand-in image, scheduled onto the node. The sandbox policy keeps the
// isolation defaults, plus this machine's own subnet among the denied
// ranges: its address (192.0.2.2 here) is in TEST-NET-1, outside the
// private ranges the defaults deny, and the README tells operators to add a
// cluster's public ranges exactly so.
func realEnv(t *testing.T, ns string, extra map[string]string) map[string]string {
	t.Helper()
	rn := needRealNode(t)
	var probe config.Config
	t.Setenv("PROVISIONER_API_KEY", harness.Key)
	c, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	probe = *c
	env := harness.BaseEnv(kubeconfig, ns)
	env["SANDBOX_IMAGE"] = realnode.SandboxImage
	env["SANDBOX_NODE_SELECTOR"] = "sandbox.test/real-node:true"
	env["SANDBOX_TOLERATIONS"] = realnode.TaintKey + "=true:NoSchedule"
	env["SANDBOX_EGRESS_DENY_CIDRS"] = strings.Join(append(probe.EgressDenyCIDRs, rn.HostIP+"/24"), ",")
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// execIn asks the stand-in in a sandbox (or any Pod running it) to act, the
// way hostile code inside would. The request goes from the host (root, which
// the policy agent always admits) straight to the Pod's IP.
func execIn(t *testing.T, podIP string, action map[string]any) (ok bool, detail string) {
	t.Helper()
	body, _ := json.Marshal(action)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Post("http://"+net.JoinHostPort(podIP, "8080")+"/v1/exec", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatalf("exec in %s: %v", podIP, err)
	}
	defer resp.Body.Close()
	var r struct {
		OK     bool     `json:"ok"`
		Error  string   `json:"error"`
		Output string   `json:"output"`
		Items  []string `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		t.Fatalf("exec in %s: %v", podIP, err)
	}
	if r.OK {
		return true, strings.TrimSpace(r.Output + " " + strings.Join(r.Items, ","))
	}
	return false, r.Error
}

// runningPod waits for the sandbox's Pod to be Running and Ready on the real
// node and returns it.
func runningPod(t *testing.T, ns, id string) corev1.Pod {
	t.Helper()
	var pod corev1.Pod
	eventually(t, 60*time.Second, "sandbox "+id+" Ready on the real node", func() (bool, error) {
		p := pods(t, ns, "sandbox-id="+id)
		if len(p) != 1 {
			return false, fmt.Errorf("%d Pods", len(p))
		}
		pod = p[0]
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return pod.Spec.NodeName == realnode.Name, nil
			}
		}
		return false, fmt.Errorf("phase %s, statuses %+v", pod.Status.Phase, pod.Status.ContainerStatuses)
	})
	return pod
}

// TestRealSandbox: a sandbox on the real node runs the stand-in, its probe
// passes, status and readiness come from the real kubelet, and the URL
// answers DeerFlow's readiness poll, in NodePort and ClusterIP modes.
func TestRealSandbox(t *testing.T) {
	needRealNode(t)
	for _, mode := range []string{"NodePort", "ClusterIP"} {
		t.Run(mode, func(t *testing.T) {
			ns := namespace(t)
			f := start(t, ns, realEnv(t, ns, map[string]string{"SANDBOX_SERVICE_TYPE": mode,
				// NodePort traffic reaches the Pod masqueraded to the node's
				// bridge address, which the operator admits so.
				"SANDBOX_INGRESS_NODE_CIDRS": "10.88.0.1/32"}))
			began := time.Now()
			r := mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "real1", "thread_id": "t1"})
			took := time.Since(began)
			if r.Code != 200 || r.Body["status"] != "Running" || r.Body["ready"] != true {
				t.Fatalf("create with wait on the real node: %d %s", r.Code, r.Raw)
			}
			t.Logf("%s: create → Ready (wait) in %s", mode, took.Round(time.Millisecond))
			pod := runningPod(t, ns, "real1")
			if cs := pod.Status.ContainerStatuses; len(cs) != 1 || cs[0].State.Running == nil || !cs[0].Ready || cs[0].ContainerID == "" {
				t.Errorf("container status from the kubelet: %+v", cs)
			}
			url, _ := r.Body["sandbox_url"].(string)
			if mode == "ClusterIP" {
				// The URL is the Service's DNS name, which only cluster DNS
				// resolves; ask the Service's ClusterIP, as that name would.
				svc := services(t, ns, "sandbox-id=real1")
				if len(svc) != 1 || !strings.HasPrefix(url, "http://sandbox-real1.") {
					t.Fatalf("ClusterIP URL %q, Services %d", url, len(svc))
				}
				url = fmt.Sprintf("http://%s:%d", svc[0].Spec.ClusterIP, svc[0].Spec.Ports[0].Port)
			}
			var body string
			eventually(t, 20*time.Second, "GET "+url+"/v1/sandbox", func() (bool, error) {
				resp, err := (&http.Client{Timeout: 3 * time.Second}).Get(url + "/v1/sandbox")
				if err != nil {
					return false, err
				}
				defer resp.Body.Close()
				var b bytes.Buffer
				_, _ = b.ReadFrom(resp.Body)
				body = b.String()
				return resp.StatusCode == 200, fmt.Errorf("%d %s", resp.StatusCode, body)
			})
			if !strings.Contains(body, pod.Name) {
				t.Errorf("/v1/sandbox answered %q, not from the sandbox's container (%s)", body, pod.Name)
			}
		})
	}
}

// TestRealLifecycle: activeDeadlineSeconds ends a Pod for real, reap then
// removes it, and destroy stops the container within the grace period.
func TestRealLifecycle(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	f := start(t, ns, realEnv(t, ns, nil))

	r := mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "dl1", "max_lifetime_seconds": 15})
	expectCode(t, r, 200, "create with a 15 s lifetime")
	eventually(t, 60*time.Second, "the kubelet ends the Pod at its deadline", func() (bool, error) {
		p := pods(t, ns, "sandbox-id=dl1")
		if len(p) != 1 {
			return false, fmt.Errorf("%d Pods", len(p))
		}
		return p[0].Status.Phase == corev1.PodFailed && p[0].Status.Reason == "DeadlineExceeded", fmt.Errorf("phase %s reason %q", p[0].Status.Phase, p[0].Status.Reason)
	})
	r = mustDo(t, f, "POST", "/api/reap", nil)
	if r.Code != 200 || !strings.Contains(string(r.Raw), "dl1") {
		t.Errorf("reap after the deadline: %d %s", r.Code, r.Raw)
	}
	eventually(t, 30*time.Second, "reaped Pod and Service gone", func() (bool, error) {
		return len(pods(t, ns, "sandbox-id=dl1"))+len(services(t, ns, "sandbox-id=dl1")) == 0, nil
	})

	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "ds1"}), 200, "create")
	pod := runningPod(t, ns, "ds1")
	grace := time.Duration(ptr.Deref(pod.Spec.TerminationGracePeriodSeconds, 30)) * time.Second
	began := time.Now()
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/ds1", nil), 200, "destroy")
	eventually(t, grace+15*time.Second, "the container stopped and the Pod gone", func() (bool, error) {
		_, err := client().CoreV1().Pods(ns).Get(context.Background(), pod.Name, metav1.GetOptions{})
		return err != nil, nil
	})
	t.Logf("destroy → Pod gone in %s (grace period %s)", time.Since(began).Round(time.Millisecond), grace)
	if d := time.Since(began); d > grace+5*time.Second {
		t.Errorf("destroy took %s, more than the %s grace period", d, grace)
	}
}

// TestAttacksFromInsideASandbox runs, from inside a sandbox, what hostile
// code would try, with the isolation defaults. Each attack is also made from
// a backend Pod (labelled as the policy's allowed peer, not a sandbox), which
// shows the target is up and reachable from the Pod network, so a block is
// the policy's doing.
func TestAttacksFromInsideASandbox(t *testing.T) {
	rn := needRealNode(t)
	ns := namespace(t)
	env := realEnv(t, ns, map[string]string{"SANDBOX_SERVICE_TYPE": "ClusterIP"})
	f := start(t, ns, env)

	// The provisioner itself, listening where the Pod network can reach it.
	bin, err := harness.Binary()
	if err != nil {
		t.Fatal(err)
	}
	port, err := harness.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(port)
	prov, err := harness.StartProcess(bin, env, net.JoinHostPort(rn.HostIP, p), filepath.Join(t.TempDir(), "exposed.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer prov.Stop()
	if err := prov.WaitReady(20 * time.Second); err != nil {
		t.Fatal(err)
	}

	for _, id := range []string{"attacker", "victim"} {
		expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": id}), 200, "create "+id)
	}
	attacker, victim := runningPod(t, ns, "attacker"), runningPod(t, ns, "victim")
	victimSvc := services(t, ns, "sandbox-id=victim")[0]

	// The backend: what the sandbox policy admits, on the same node.
	backend := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "backend", Namespace: ns, Labels: map[string]string{"app.kubernetes.io/name": "deer-flow-backend"}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"sandbox.test/real-node": "true"}, Tolerations: []corev1.Toleration{realnode.Toleration},
			AutomountServiceAccountToken: ptr.To(false), TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{Name: "backend", Image: realnode.SandboxImage, ImagePullPolicy: corev1.PullNever,
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/v1/sandbox", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1}}},
		},
	}
	if _, err := client().CoreV1().Pods(ns).Create(context.Background(), backend, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var backendIP string
	eventually(t, 60*time.Second, "backend Pod Ready", func() (bool, error) {
		p, err := client().CoreV1().Pods(ns).Get(context.Background(), "backend", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		backendIP = p.Status.PodIP
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		return false, fmt.Errorf("phase %s", p.Status.Phase)
	})

	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(kc.Config.Host, "https://"))
	type attack struct {
		name     string
		action   map[string]any
		blocked  bool // expected from the sandbox
		fromBack bool // expected from the backend (the control)
	}
	connect := func(addr string) map[string]any { return map[string]any{"op": "connect", "addr": addr, "timeout_ms": 2000} }
	attacks := []attack{
		{"another sandbox's port 8080 (Pod IP)", connect(net.JoinHostPort(victim.Status.PodIP, "8080")), true, true},
		{"another sandbox's Service (ClusterIP)", connect(net.JoinHostPort(victimSvc.Spec.ClusterIP, "8080")), true, true},
		{"the API server (node address)", connect(net.JoinHostPort(rn.HostIP, apiPort)), true, true},
		{"the API server (kubernetes Service)", connect("10.96.0.1:443"), true, false},
		{"the kubelet's port 10250", connect(net.JoinHostPort(rn.HostIP, "10250")), true, true},
		{"the provisioner", connect(net.JoinHostPort(rn.HostIP, p)), true, true},
		{"the metadata address", connect(realnode.MetadataIP + ":80"), true, true},
		{"DNS to a server other than the cluster's", map[string]any{"op": "dns", "server": realnode.PublicIP + ":53", "name": "exfil.example.com", "timeout_ms": 2000}, true, true},
		{"a public host (HTTP)", map[string]any{"op": "http", "url": "http://" + realnode.PublicIP + "/v1/sandbox", "timeout_ms": 3000}, false, true},
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n| attack from a sandbox | expected | observed | from the backend (control) |\n|---|---|---|---|\n")
	word := func(ok bool) string {
		if ok {
			return "reached"
		}
		return "blocked"
	}
	for _, a := range attacks {
		ok, detail := execIn(t, attacker.Status.PodIP, a.action)
		cok, cdetail := execIn(t, backendIP, a.action)
		fmt.Fprintf(&table, "| %s | %s | %s | %s |\n", a.name, word(!a.blocked), word(ok), word(cok))
		if ok == a.blocked {
			t.Errorf("%s: from the sandbox %s (%s), want %s", a.name, word(ok), detail, word(!a.blocked))
		}
		if cok != a.fromBack {
			t.Errorf("%s: from the backend %s (%s), want %s", a.name, word(cok), cdetail, word(a.fromBack))
		}
	}
	// The backend's selector reaches the sandbox it serves.
	ok, detail := execIn(t, backendIP, connect(net.JoinHostPort(attacker.Status.PodIP, "8080")))
	fmt.Fprintf(&table, "| (backend → sandbox port 8080) | reached | %s | |\n", word(ok))
	if !ok {
		t.Errorf("the backend cannot reach a sandbox: %s", detail)
	}
	t.Log(table.String())
}

// TestSymlinkedExtraMountNeverMountsItsTarget: code in a sandbox plants a
// symlink in its user data pointing at the host's root, and a later create
// names it as an extra mount. The kubelet resolves subPaths safely, so the
// link's target is never mounted.
func TestSymlinkedExtraMountNeverMountsItsTarget(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	base, err := os.MkdirTemp("", "deer-flow-base-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(base)
	userData := filepath.Join(base, "threads", "t1", "user-data")
	for _, d := range []string{userData, filepath.Join(base, "skills", "public"), filepath.Join(base, "skills", "custom")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// World-writable, as a shared user-data volume is: the sandbox's user
	// (in its own user namespace) must be able to write it.
	if err := os.Chmod(userData, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "host-secret"), []byte("not for sandboxes"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := start(t, ns, realEnv(t, ns, map[string]string{
		"DEER_FLOW_HOST_BASE_DIR": base, "THREADS_HOST_PATH": filepath.Join(base, "threads"), "SKILLS_HOST_PATH": filepath.Join(base, "skills"),
	}))
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "plant", "thread_id": "t1"}), 200, "create the planting sandbox")
	planter := runningPod(t, ns, "plant")
	if ok, detail := execIn(t, planter.Status.PodIP, map[string]any{"op": "symlink", "target": "/", "path": "/mnt/user-data/escape"}); !ok {
		t.Fatalf("planting the symlink from inside the sandbox: %s", detail)
	}
	if target, err := os.Readlink(filepath.Join(userData, "escape")); err != nil || target != "/" {
		t.Fatalf("the planted link on the host: %q %v", target, err)
	}

	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "victim2", "thread_id": "t1",
		"extra_mounts": []map[string]any{{"host_path": filepath.Join(userData, "escape"), "container_path": "/mnt/escape", "read_only": true}}})
	if r.Code != 200 {
		// Refusing it up front is as good an outcome.
		t.Logf("the create naming the link was refused: %d %s", r.Code, r.Raw)
		return
	}
	// The kubelet must refuse to start the container; if it ever runs, the
	// mount must not show the host's root.
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		p := pods(t, ns, "sandbox-id=victim2")
		if len(p) == 1 {
			for _, cs := range p[0].Status.ContainerStatuses {
				if cs.State.Waiting != nil {
					last = cs.State.Waiting.Reason + ": " + cs.State.Waiting.Message
				}
				if cs.State.Running != nil {
					ok, detail := execIn(t, p[0].Status.PodIP, map[string]any{"op": "list", "path": "/mnt/escape"})
					if ok && strings.Contains(detail, filepath.Base(base)) || strings.Contains(detail, "proc") {
						t.Fatalf("the host's root is mounted in the sandbox: %s", detail)
					}
				}
			}
		}
		time.Sleep(time.Second)
	}
	if !strings.Contains(last, "CreateContainerConfigError") && !strings.Contains(last, "subPath") && !strings.Contains(last, "symlink") {
		t.Errorf("the kubelet did not refuse the escaping subPath; last container state: %q", last)
	}
	t.Logf("the kubelet refused the mount: %s", last)
}
