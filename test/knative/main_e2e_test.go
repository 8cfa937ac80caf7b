//go:build e2e

package knative

// The Knative suite: the function as `make deploy-local` deploys it
// (config/ through test/overlays/knative-local, the image from a registry on
// this machine) on real Knative Serving and Eventing, Traefik's KIngress and
// CoreDNS, all running on the real node. Nothing here is a stand-in for a
// Knative part; the sandbox image is the stand-in built here
// (test/images/sandbox), as everywhere on this machine.

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/knative"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
)

const ns = "deer-flow"

var (
	env *knative.Env
	// upErr says why the cluster or the deploy could not be had; every test
	// then stops through unavailable.
	upErr error
	// What make deploy-local printed.
	fnURL, apiKey, kubeconfigPath string
	// nodeIP is the real node's (this machine's) address.
	nodeIP string
	kube   kubernetes.Interface
	dyn    dynamic.Interface
	root   string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	defer function.Cleanup()
	root, _ = filepath.Abs(filepath.Join("..", ".."))
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "knative suite: "+format+"\n", args...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	start := time.Now()
	var cfg *rest.Config
	if kc := os.Getenv("KNATIVE_KUBECONFIG"); kc != "" {
		// A developer's running `make knative` cluster, to iterate on one
		// test without bringing a cluster up each time.
		kubeconfigPath, nodeIP = kc, realnode.HostIP()
		if cfg, upErr = clientcmd.BuildConfigFromFlags("", kc); upErr == nil {
			kube, upErr = kubernetes.NewForConfig(cfg)
		}
	} else {
		env, upErr = knative.Up(ctx, "knative-e2e", root, knative.Settings{ScaleToZeroGracePeriod: "6s"}, logf)
		if upErr == nil {
			defer env.Down()
			logf("Knative cluster up in %s (%v)", time.Since(start).Round(time.Second), env.Timings)
			kube, kubeconfigPath, cfg, nodeIP = env.Cluster.Client, env.Cluster.Kubeconfig, env.Cluster.Config, env.Node.HostIP
		}
	}
	if upErr != nil {
		logf("the Knative cluster is not available, every test stops: %v", upErr)
		return m.Run()
	}
	if dyn, upErr = dynamic.NewForConfig(cfg); upErr != nil {
		return m.Run()
	}

	// Deploy exactly as make deploy-local does, on a registry port of its
	// own so a developer's registry on the default port is left alone.
	addr, err := function.FreeAddr()
	if err != nil {
		upErr = err
		return m.Run()
	}
	defer stopRegistry(addr)
	if env != nil {
		// The line make deploy-local adds to /etc/hosts goes with the
		// cluster (a developer's KNATIVE_KUBECONFIG cluster keeps its own).
		defer func() { _ = exec.Command(filepath.Join(root, "hack", "hosts.sh"), "remove").Run() }()
	}
	start = time.Now()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "deploy-local.sh"))
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfigPath, "REGISTRY_ADDR="+addr)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		upErr = fmt.Errorf("hack/deploy-local.sh: %w\n%s", err, out)
		logf("%v", upErr)
		return m.Run()
	}
	printed := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			printed[k] = v
		}
	}
	fnURL, apiKey = printed["FUNCTION_URL"], printed["PROVISIONER_API_KEY"]
	if fnURL == "" || apiKey == "" || printed["KUBECONFIG"] != kubeconfigPath {
		upErr = fmt.Errorf("make deploy-local printed %q, want FUNCTION_URL, PROVISIONER_API_KEY and KUBECONFIG=%s", out, kubeconfigPath)
		return m.Run()
	}
	logf("deployed in %s: FUNCTION_URL=%s", time.Since(start).Round(time.Second), fnURL)
	defer func() {
		for _, name := range suiteTriggers {
			_ = dyn.Resource(triggers).Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	}()
	return m.Run()
}

// stopRegistry stops the registry hack/deploy-local.sh started on addr.
func stopRegistry(addr string) {
	dir := filepath.Join(cluster.CacheDir(), "local-registry-"+strings.NewReplacer(":", "-", ".", "-").Replace(addr))
	if raw, err := os.ReadFile(filepath.Join(dir, "pid")); err == nil {
		var pid int
		if _, err := fmt.Sscan(string(raw), &pid); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGTERM)
		}
	}
	_ = os.RemoveAll(dir)
}

// need stops a test when the Knative cluster could not be had
// (skip.Unavailable: a failure under CI=true).
func need(t *testing.T) {
	t.Helper()
	if upErr == nil {
		return
	}
	skip.Unavailable(t, "the Knative cluster is not available: %v", upErr)
}

// fn is the deployed function, reached at FUNCTION_URL exactly as printed:
// no extra headers, through the KIngress.
func fn() *function.Instance {
	return &function.Instance{URL: fnURL, Client: &http.Client{Timeout: 90 * time.Second}}
}

// call sends a request with the deployed function's key.
func call(t *testing.T, method, path string, body any) function.Response {
	t.Helper()
	r, err := fn().DoWithHeaders(method, path, body, map[string]string{"X-API-Key": apiKey})
	if err != nil {
		t.Fatalf("%s %s%s: %v", method, fnURL, path, err)
	}
	return r
}

func expectCode(t *testing.T, r function.Response, want int, what string) {
	t.Helper()
	if r.Code != want {
		t.Fatalf("%s: status %d, want %d; body %s", what, r.Code, want, r.Raw)
	}
}

// eventually polls cond (bounded by timeout) until it holds.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	function.Eventually(t, timeout, 250*time.Millisecond, what, cond)
}

// destroy deletes a sandbox through the route, at the end of a test.
func destroyLater(t *testing.T, id string) {
	t.Cleanup(func() {
		_, _ = fn().DoWithHeaders(http.MethodDelete, "/api/sandboxes/"+id, nil, map[string]string{"X-API-Key": apiKey})
	})
}

// functionPods are the running Pods of the function's revisions.
func functionPods(t testing.TB) []corev1.Pod {
	t.Helper()
	l, err := kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "serving.knative.dev/service=sandbox-provisioner"})
	if err != nil {
		t.Fatal(err)
	}
	var running []corev1.Pod
	for _, p := range l.Items {
		if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
			running = append(running, p)
		}
	}
	return running
}

// functionLogs are the provisioner container's logs of every function Pod.
func functionLogs(t testing.TB) string {
	t.Helper()
	var b strings.Builder
	for _, p := range functionPods(t) {
		raw, err := kube.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{Container: "provisioner"}).DoRaw(context.Background())
		if err != nil {
			t.Fatalf("logs of %s: %v", p.Name, err)
		}
		b.Write(raw)
	}
	return b.String()
}

// functionLogsNaming reads the function's logs until they contain s
// (bounded by timeout) and returns the last read. Pod logs are
// asynchronous: a line reaches the API server through the container
// runtime's log file, and some lines (an event's "event handled") are
// written after the answer. The caller judges what it returns.
func functionLogsNaming(t testing.TB, s string, timeout time.Duration) string {
	t.Helper()
	var logs string
	_ = wait.PollUntilContextTimeout(context.Background(), 250*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		logs = functionLogs(t)
		return strings.Contains(logs, s), nil
	})
	return logs
}
