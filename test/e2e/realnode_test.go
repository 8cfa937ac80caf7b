//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
)

// needRealNode skips, saying why, when the real node could not start.
func needRealNode(t *testing.T) *realnode.Node {
	t.Helper()
	if realNode == nil {
		skip.Unavailable(t, "no real node, so this test cannot run here: %v", realNodeErr)
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
	t.Setenv("PROVISIONER_API_KEY", function.Key) // config.Load needs one; only the defaults are read
	defaults, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	_, hostNet, err := net.ParseCIDR(rn.HostIP + "/24")
	if err != nil {
		t.Fatal(err)
	}
	env := function.BaseEnv(kubeconfig, ns)
	for k, v := range realnode.FunctionEnv(hostBase(t)) {
		env[k] = v
	}
	env["SANDBOX_EGRESS_DENY_CIDRS"] = strings.Join(append(defaults.EgressDenyCIDRs, hostNet.String()), ",")
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// hostBase makes this test's DeerFlow base directory on the node.
func hostBase(t *testing.T) string {
	t.Helper()
	base, err := realnode.HostBase(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return base
}

// waitReady waits (bounded) until the Pod get returns is Ready and
// returns it.
func waitReady(t *testing.T, what string, get func() (*corev1.Pod, error)) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	eventually(t, 60*time.Second, what+" Ready", func() (bool, error) {
		p, err := get()
		if err != nil {
			return false, err
		}
		pod = p
		return realnode.Ready(p), fmt.Errorf("phase %s, statuses %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
	return pod
}

// podNamed is a get for waitReady.
func podNamed(ns, name string) func() (*corev1.Pod, error) {
	return func() (*corev1.Pod, error) {
		return client().CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	}
}

// freshClient opens a new connection for every request. A kept-alive one
// would pin the first route taken: a GET to a ClusterIP that kube-proxy had
// not programmed yet leaves the node through its default route (on this
// machine an egress proxy answers it with an empty 404), and every retry
// reusing that connection would see the same 404 long after the rules exist.
func freshClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
}

// answers waits (bounded) until url answers 200 with a body containing
// want, on a fresh connection each try. An address no kube-proxy rule covers
// yet is answered 404 by this machine's outbound proxy, so only the expected
// body counts.
func answers(t *testing.T, url, want string) string {
	t.Helper()
	var body string
	eventually(t, 90*time.Second, "GET "+url, func() (bool, error) {
		resp, err := freshClient(3 * time.Second).Get(url)
		if err != nil {
			return false, err
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		body = b.String()
		return resp.StatusCode == 200 && strings.Contains(body, want), fmt.Errorf("%d %s", resp.StatusCode, body)
	})
	return body
}

// execIn asks the stand-in in a sandbox (or any Pod running it) to act, the
// way hostile code inside would. The request goes from the host (root, which
// the policy agent always admits) straight to the Pod's IP.
func execIn(t *testing.T, podIP string, action map[string]any) (ok bool, detail string) {
	t.Helper()
	return execAt(t, net.JoinHostPort(podIP, "8080"), action)
}

// execAt asks the stand-in listening at addr to act: a Pod's, or one of the
// real node's surroundings (the public host's, on port 80).
func execAt(t *testing.T, addr string, action map[string]any) (ok bool, detail string) {
	t.Helper()
	ok, detail, err := tryExecAt(addr, action)
	if err != nil {
		t.Fatal(err)
	}
	return ok, detail
}

// tryExecAt is execAt for any goroutine: the stand-in's failure to answer
// is an error, for the test's own goroutine to fail on.
func tryExecAt(addr string, action map[string]any) (ok bool, detail string, err error) {
	body, _ := json.Marshal(action)
	resp, err := freshClient(10*time.Second).Post("http://"+addr+"/v1/exec", "application/json", bytes.NewReader(body))
	if err != nil {
		return false, "", fmt.Errorf("exec at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	var r struct {
		OK     bool     `json:"ok"`
		Error  string   `json:"error"`
		Output string   `json:"output"`
		Items  []string `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return false, "", fmt.Errorf("exec at %s: %w", addr, err)
	}
	if r.OK {
		return true, strings.TrimSpace(r.Output + " " + strings.Join(r.Items, ",")), nil
	}
	return false, r.Error, nil
}

// probed is one attack row's outcome.
type probed struct {
	ok     bool
	detail string
}

// execEach runs every attack's action in the stand-in at podIP (execAll).
func execEach(t *testing.T, podIP string, attacks []attack) []probed {
	t.Helper()
	return execAll(t, len(attacks), func(i int) (string, map[string]any) { return podIP, attacks[i].action })
}

// execAll runs n actions, the i-th in the stand-in of the Pod at(i) names,
// at most eight at once, and returns the outcomes in order. A blocked row
// waits out its action's timeout (2 to 3 s), which one after another made
// the network tables the e2e tier's longest tests; the rows are
// independent (each its own connection or query, judged alone).
func execAll(t *testing.T, n int, at func(i int) (podIP string, action map[string]any)) []probed {
	t.Helper()
	out := make([]probed, n)
	errs := make([]error, n)
	var g errgroup.Group
	g.SetLimit(8)
	for i := range n {
		ip, action := at(i)
		g.Go(func() error {
			out[i].ok, out[i].detail, errs[i] = tryExecAt(net.JoinHostPort(ip, "8080"), action)
			return nil
		})
	}
	_ = g.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	return out
}

// runningPod waits for the sandbox's Pod to be Ready on the real node and
// returns it.
func runningPod(t *testing.T, ns, id string) corev1.Pod {
	t.Helper()
	pod := waitReady(t, "sandbox "+id+" on the real node", func() (*corev1.Pod, error) {
		p := pods(t, ns, "sandbox-id="+id)
		if len(p) != 1 {
			return nil, fmt.Errorf("%d Pods", len(p))
		}
		if p[0].Spec.NodeName != realnode.Name {
			return nil, fmt.Errorf("on node %q", p[0].Spec.NodeName)
		}
		return &p[0], nil
	})
	return *pod
}

// TestNodePortCannotTakeTheAPIServersPort guards the suite itself: the real
// node's kube-proxy answers 127.0.0.1:<nodePort>, and kwokctl puts the API
// server on a port counting down from 32767. A CI run once failed thirty
// tests at once: a sandbox Service on a kwok node drew the API server's port
// as its NodePort, kube-proxy sent every new connection to 127.0.0.1:<that
// port> to the fake Pod's address, and this machine's egress proxy answered
// there with its own certificate ("doesn't contain any IP SANs"). The test
// clusters keep NodePorts below the control plane's ports, so the API
// server refuses such a Service.
func TestNodePortCannotTakeTheAPIServersPort(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	u, err := url.Parse(kc.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("API server address %s: %v", kc.Config.Host, err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "shadow"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "shadow"},
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: int32(port)}}},
	}
	_, err = client().CoreV1().Services(ns).Create(context.Background(), svc, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("a Service with NodePort %d (the API server's port): err %v, want Invalid (outside %s)", port, err, cluster.NodePortRange)
	}
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
				// How an operator admits NodePort clients under agents that
				// judge after kube-proxy's SNAT (the node's bridge address).
				// kube-network-policies judges before it, and this test's
				// client (root on the node) is one its rules always accept.
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
				if len(svc) != 1 || !strings.HasPrefix(url, "http://sandbox-real1-svc."+ns+".svc") {
					t.Fatalf("ClusterIP URL %q, Services %d", url, len(svc))
				}
				url = fmt.Sprintf("http://%s:%d", svc[0].Spec.ClusterIP, svc[0].Spec.Ports[0].Port)
			}
			began = time.Now()
			answers(t, url+"/v1/sandbox", pod.Name) // from the sandbox's own container
			t.Logf("%s: %s answered after %s", mode, url, time.Since(began).Round(time.Millisecond))
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

// etcdPort is the test cluster's etcd client port (kwok runs it with no
// authentication, listening on every address).
func etcdPort(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(kc.Workdir, "clusters", kc.Name, "kwok.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "- --listen-client-urls=http://0.0.0.0:"); ok {
			return v
		}
	}
	t.Fatal("no etcd client port in kwok.yaml")
	return ""
}

// TestSymlinkedExtraMountNeverMountsItsTarget: code in a sandbox plants a
// symlink in its user data pointing at the host's root, and a later create
// names it as an extra mount. The kubelet resolves subPaths safely, so the
// link's target is never mounted.
func TestSymlinkedExtraMountNeverMountsItsTarget(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	env := realEnv(t, ns, nil)
	userData := filepath.Join(env["THREADS_HOST_PATH"], "t1", "user-data")
	if err := os.MkdirAll(userData, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(userData, 0o777); err != nil {
		t.Fatal(err)
	}
	f := start(t, ns, env)
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "plant", "thread_id": "t1"}), 200, "create the planting sandbox")
	planter := runningPod(t, ns, "plant")
	if ok, detail := execIn(t, planter.Status.PodIP, map[string]any{"op": "symlink", "target": "/", "path": "/mnt/user-data/escape"}); !ok {
		t.Fatalf("planting the symlink from inside the sandbox: %s", detail)
	}
	if target, err := os.Readlink(filepath.Join(userData, "escape")); err != nil || target != "/" {
		t.Fatalf("the planted link on the host: %q %v", target, err)
	}

	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "victim2", "thread_id": "t1",
		"extra_mounts": []map[string]any{{"host_path": filepath.Join(userData, "escape"), "container_path": "/mnt/acp-workspace", "read_only": true}}})
	// The link lies in the requester's own thread directory, so the API
	// accepts the mount: what stops the escape is the kubelet, tested here.
	if r.Code != 200 {
		t.Fatalf("the create naming the link: %d %s; want 200, so that the kubelet's refusal is what is tested", r.Code, r.Raw)
	}
	last := mountRefused(t, ns, "victim2", "/mnt/acp-workspace", func(listing string) bool {
		return strings.Contains(listing, "proc") || strings.Contains(listing, "etc")
	})
	t.Logf("the kubelet refused the mount: %s", last)
}

// mountRefused waits (30 s) for the kubelet's refusal to start sandbox id's
// container because a subPath leaves its volume, and fails the test if the
// container ever runs with a listing of at that leaked shows. It returns the
// refusal the kubelet reported.
func mountRefused(t *testing.T, ns, id, at string, leaked func(listing string) bool) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		p := pods(t, ns, "sandbox-id="+id)
		if len(p) == 1 {
			for _, cs := range p[0].Status.ContainerStatuses {
				if cs.State.Waiting != nil {
					last = cs.State.Waiting.Reason + ": " + cs.State.Waiting.Message
				}
				if cs.State.Running != nil {
					ok, detail := execIn(t, p[0].Status.PodIP, map[string]any{"op": "list", "path": at})
					if ok && leaked(detail) {
						t.Fatalf("the link's target is mounted in sandbox %s at %s: %s", id, at, detail)
					}
				}
			}
		}
		time.Sleep(time.Second)
	}
	if !strings.Contains(last, "CreateContainerConfigError") && !strings.Contains(last, "subPath") && !strings.Contains(last, "symlink") {
		t.Errorf("the kubelet did not refuse the escaping subPath of %s; last container state: %q", id, last)
	}
	return last
}

// TestLinkToAnotherTenantNeverMountsIt: alice's sandbox plants, in her own
// writable tree, a link to bob's tree, and a later create for alice names
// the link as an extra mount. The link lies under alice's directory, so the
// API accepts it; the volume is rooted at alice's tree (not at the base
// directory every tenant shares), so the kubelet refuses the subPath that
// leaves it and bob's files never appear.
func TestLinkToAnotherTenantNeverMountsIt(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	env := realEnv(t, ns, nil)
	base := env["DEER_FLOW_HOST_BASE_DIR"]
	workspace := filepath.Join(base, "users", "alice", "threads", "t1", "acp-workspace")
	bob := filepath.Join(base, "users", "bob")
	for _, d := range []string{workspace, bob} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(bob, "bobs-secret.txt"), []byte("bob's"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := start(t, ns, env)
	alice := map[string]any{"sandbox_id": "alice1", "thread_id": "t1", "user_id": "alice",
		"extra_mounts": []map[string]any{{"host_path": workspace, "container_path": "/mnt/acp-workspace", "read_only": false}}}
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=20s", alice), 200, "create alice's sandbox")
	planter := runningPod(t, ns, "alice1")
	if ok, detail := execIn(t, planter.Status.PodIP, map[string]any{"op": "symlink", "target": bob, "path": "/mnt/acp-workspace/to-bob"}); !ok {
		t.Fatalf("planting the link from inside alice's sandbox: %s", detail)
	}
	if target, err := os.Readlink(filepath.Join(workspace, "to-bob")); err != nil || target != bob {
		t.Fatalf("the planted link on the host: %q %v", target, err)
	}
	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "alice2", "thread_id": "t1", "user_id": "alice",
		"extra_mounts": []map[string]any{{"host_path": filepath.Join(workspace, "to-bob"), "container_path": "/mnt/skills/integrations", "read_only": true}}})
	if r.Code != 200 {
		t.Fatalf("the create naming the link: %d %s; want 200, so that the kubelet's refusal is what is tested", r.Code, r.Raw)
	}
	last := mountRefused(t, ns, "alice2", "/mnt/skills/integrations", func(listing string) bool {
		return strings.Contains(listing, "bobs-secret.txt")
	})
	t.Logf("the kubelet refused alice's link to bob's tree: %s", last)
}

// TestUserNamespacesFailClosed: with the code's default
// SANDBOX_USER_NAMESPACE=true (hostUsers: false) on a runtime that cannot
// provide user namespaces (this node's runc), the kubelet refuses the Pod:
// the sandbox never runs in the host's user namespace instead. (Under
// gVisor the function refuses the combination itself:
// TestGVisorUserNamespaceFailsClosed and pkg/sandbox.)
func TestUserNamespacesFailClosed(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	f := start(t, ns, realEnv(t, ns, map[string]string{"SANDBOX_USER_NAMESPACE": "true", "SANDBOX_RUNTIME_CLASS": ""}))
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "userns1"}), 200, "create")
	var reason string
	eventually(t, 30*time.Second, "the kubelet's refusal", func() (bool, error) {
		evs, err := client().CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=sandbox-userns1"})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == "FailedCreatePodSandBox" {
				reason = e.Message
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events", len(evs.Items))
	})
	if !strings.Contains(reason, "user namespaces") {
		t.Errorf("the kubelet refused for another reason: %s", reason)
	}
	p := pods(t, ns, "sandbox-id=userns1")
	if len(p) != 1 || p[0].Status.Phase != corev1.PodPending || len(p[0].Status.ContainerStatuses) > 0 && p[0].Status.ContainerStatuses[0].State.Running != nil {
		t.Errorf("a sandbox asking for a user namespace ran without one: %+v", p)
	}
	t.Logf("kubelet: %s", reason)
}

// TestDeerFlowContractOnRealNode replays DeerFlow's recorded requests
// against sandboxes that run for real, and polls {sandbox_url}/v1/sandbox as
// DeerFlow's backend does before it hands the sandbox to an agent. The
// recording's host paths under /.deer-flow are moved under this test's base
// directory (the only change), because the node is this machine.
func TestDeerFlowContractOnRealNode(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	env := realEnv(t, ns, map[string]string{"SANDBOX_SERVICE_TYPE": "NodePort", "SANDBOX_INGRESS_NODE_CIDRS": "10.88.0.1/32"})
	base := env["DEER_FLOW_HOST_BASE_DIR"]
	f := start(t, ns, env)
	send := func(r recorded) function.Response {
		var body any
		if string(r.Body) != "null" {
			body = []byte(strings.ReplaceAll(string(r.Body), `"/.deer-flow/`, `"`+base+`/`))
		}
		if _, hasKey := r.Headers["X-API-Key"]; hasKey {
			r.Headers["X-API-Key"] = function.Key
		}
		resp, err := f.DoWithHeaders(r.Method, r.Path, body, r.Headers)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	reqs := goldenRequests(t)
	// DeerFlow polls {sandbox_url}/v1/sandbox until it answers; the body
	// names the sandbox's Pod, so the answer is the container's own.
	poll := func(url, id string) time.Duration {
		began := time.Now()
		answers(t, url+"/v1/sandbox", "sandbox-"+id)
		return time.Since(began)
	}
	for i, want := range map[int]string{0: "0123456789abcdef", 1: "abcd1234"} {
		r := send(reqs[i])
		if r.Code != 200 || r.Body["sandbox_id"] != want {
			t.Fatalf("create %s: %d %s", want, r.Code, r.Raw)
		}
		url, _ := r.Body["sandbox_url"].(string)
		t.Logf("%s: %s answered DeerFlow's poll after %s", want, url, poll(url, want).Round(time.Millisecond))
	}
	if r := send(reqs[2]); r.Code != 200 || r.Body["status"] != "Running" || r.Body["ready"] != true {
		t.Errorf("GET after the poll: %d %s", r.Code, r.Raw)
	}
	if r := send(reqs[4]); r.Code != 200 || r.Body["count"] != float64(2) {
		t.Errorf("list: %d %s", r.Code, r.Raw)
	}
	if r := send(reqs[5]); r.Code != 200 || r.Body["ok"] != true {
		t.Errorf("delete: %d %s", r.Code, r.Raw)
	}
	if r := send(reqs[6]); r.Code != 401 || r.Detail() == "" {
		t.Errorf("unauthenticated: %d %s", r.Code, r.Raw)
	}
}

// readyPodOtherThan waits for a Ready Pod of sandbox id on the real node
// other than the one with UID not.
func readyPodOtherThan(t *testing.T, ns, id string, not types.UID) *corev1.Pod {
	t.Helper()
	return waitReady(t, "a new Pod of "+id, func() (*corev1.Pod, error) {
		for _, p := range pods(t, ns, "sandbox-id="+id) {
			if p.UID != not && p.DeletionTimestamp == nil && p.Spec.NodeName == realnode.Name {
				return &p, nil
			}
		}
		return nil, fmt.Errorf("no new Pod yet")
	})
}

// servedBy checks that the sandbox's Service is still the one it was (same
// UID and ClusterIP: the same URL), that its EndpointSlice routes to pod,
// Ready, that pod's own container answers, and that the Service's address
// answers from pod (through kube-proxy, on a fresh connection each try).
func servedBy(t *testing.T, ns string, svc corev1.Service, pod *corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	now, err := client().CoreV1().Services(ns).Get(ctx, svc.Name, metav1.GetOptions{})
	if err != nil || now.UID != svc.UID || now.Spec.ClusterIP != svc.Spec.ClusterIP {
		t.Fatalf("the sandbox's Service changed: %v", err)
	}
	endpointsOf(t, ns, svc.Name, pod)
	answers(t, "http://"+net.JoinHostPort(pod.Status.PodIP, "8080")+"/v1/sandbox", pod.Name)
	answers(t, fmt.Sprintf("http://%s/v1/sandbox", net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port)))), pod.Name)
}

// endpointsOf waits until the Service's EndpointSlice routes to pod, Ready:
// what kube-proxy routes a ClusterIP to, and what cluster DNS answers a
// headless Service's name with.
func endpointsOf(t *testing.T, ns, svc string, pod *corev1.Pod) {
	t.Helper()
	eventually(t, 60*time.Second, "the Service's EndpointSlice routes to "+pod.Name, func() (bool, error) {
		list, err := client().DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + svc})
		if err != nil {
			return false, err
		}
		for _, sl := range list.Items {
			for _, ep := range sl.Endpoints {
				if ep.TargetRef != nil && ep.TargetRef.UID == pod.UID && ep.Conditions.Ready != nil && *ep.Conditions.Ready {
					return true, nil
				}
			}
		}
		return false, fmt.Errorf("%d slices", len(list.Items))
	})
}

// TestRealReplicaSetHealsAndResumes: with real containers, a ReplicaSet
// sandbox whose Pod is deleted comes back behind the same Service, and one
// paused (its container stopped) and resumed is served by the same Service
// from a new container. It logs pause → resume → Ready over several rounds.
func TestRealReplicaSetHealsAndResumes(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	putTemplate(t, ns, rsTemplate("real-rs", realnode.SandboxImage, nil))
	f := start(t, ns, realEnv(t, ns, map[string]string{"SANDBOX_SERVICE_TYPE": "ClusterIP"}))
	ctx := context.Background()

	r := mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "rs1", "template": "real-rs"})
	if r.Code != 200 || r.Body["status"] != "Running" || r.Body["ready"] != true {
		t.Fatalf("create of a ReplicaSet sandbox on the real node: %d %s", r.Code, r.Raw)
	}
	sandboxURL := r.Body["sandbox_url"]
	svc := services(t, ns, "sandbox-id=rs1")
	if len(svc) != 1 {
		t.Fatalf("%d Services", len(svc))
	}
	first := readyPodOtherThan(t, ns, "rs1", "")
	servedBy(t, ns, svc[0], first)

	// Self-healing: the Pod (and its container) deleted, a new one serves.
	if err := client().CoreV1().Pods(ns).Delete(ctx, first.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	second := readyPodOtherThan(t, ns, "rs1", first.UID)
	t.Logf("Pod deleted → replacement Ready in %s", time.Since(began).Round(time.Millisecond))
	servedBy(t, ns, svc[0], second)
	if g := mustDo(t, f, "GET", "/api/sandboxes/rs1", nil); g.Body["status"] != "Running" || g.Body["sandbox_url"] != sandboxURL {
		t.Errorf("after self-healing: %s, want Running at %v", g.Raw, sandboxURL)
	}

	// Pause and resume, several rounds, timing resume → Ready.
	const rounds = 5
	var took []time.Duration
	last := second
	for i := 0; i < rounds; i++ {
		p := mustDo(t, f, "POST", "/api/sandboxes/rs1/pause", nil)
		if p.Code != 200 || p.Body["status"] != "Paused" {
			t.Fatalf("pause round %d: %d %s", i, p.Code, p.Raw)
		}
		eventually(t, 60*time.Second, "the paused sandbox's container stopped and Pod gone", func() (bool, error) {
			return len(pods(t, ns, "sandbox-id=rs1")) == 0, nil
		})
		if len(services(t, ns, "sandbox-id=rs1")) != 1 {
			t.Fatal("the paused sandbox lost its Service")
		}
		began := time.Now()
		rr := mustDo(t, f, "POST", "/api/sandboxes/rs1/resume?wait=20s", nil)
		d := time.Since(began)
		if rr.Code != 200 || rr.Body["status"] != "Running" || rr.Body["ready"] != true || rr.Body["sandbox_url"] != sandboxURL {
			t.Fatalf("resume round %d: %d %s", i, rr.Code, rr.Raw)
		}
		took = append(took, d)
		last = readyPodOtherThan(t, ns, "rs1", last.UID)
	}
	servedBy(t, ns, svc[0], last)
	slices.Sort(took)
	t.Logf("pause → resume → Ready on the real node: p50 %s, min %s, max %s over %d rounds (resume?wait=20s answering Running)",
		took[len(took)/2].Round(time.Millisecond), took[0].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond), rounds)
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/rs1", nil), 200, "destroy")
	eventually(t, 60*time.Second, "destroyed ReplicaSet sandbox gone", func() (bool, error) {
		return len(pods(t, ns, "sandbox-id=rs1"))+len(services(t, ns, "sandbox-id=rs1")) == 0, nil
	})
}
