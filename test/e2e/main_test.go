//go:build e2e

// Package e2e runs the provisioner against a real kube-apiserver (with kwok
// nodes) that the suite starts itself.
package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/test/framework/apiproxy"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

var (
	kc         *cluster.Cluster
	proxy      *apiproxy.Proxy
	kubeconfig string // points at the proxy
	workdir    string
	// realNode is the real kubelet node (nil when it could not start, and
	// realNodeErr says why).
	realNode    *realnode.Node
	realNodeErr error
)

// Tests that touch only their own namespace and function process call
// t.Parallel() first thing, so they run side by side (make test-e2e:
// -parallel 4) once every serial test has ended. A test stays serial when it
// stops or slows the shared API server or its proxy, reads the proxy's
// counts, writes cluster-scoped objects or the shared deer-flow namespace,
// calls t.Setenv (realEnv, for the real node's tests), probes the real node's
// network, or asserts a timing that other tests' load could break. A
// parallel test that began before its t.Parallel() would talk to the API
// server while a serial test counts calls: keep the call first.
func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	defer function.Cleanup()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	var err error
	// The egress proxy runs on the real node and watches the API server
	// as an in-cluster client, through the kubernetes Service's ClusterIP:
	// the certificate must name it.
	if kc, err = cluster.UpWith(ctx, "e2e", cluster.Options{Nodes: 2, APIServerSANs: []string{"10.96.0.1"}}); err != nil {
		fmt.Fprintln(os.Stderr, "bringing up the test cluster:", err)
		return 1
	}
	defer kc.Down()
	if proxy, err = apiproxy.Start(kc.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer proxy.Close()
	if workdir, err = os.MkdirTemp("", "e2e-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workdir)
	if kubeconfig, err = proxy.WriteKubeconfig(workdir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "test cluster up in %s\n", time.Since(start).Round(time.Millisecond))
	if os.Getenv("REAL_NODE") == "0" {
		realNodeErr = fmt.Errorf("REAL_NODE=0")
	} else {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Minute)
		start = time.Now()
		realNode, realNodeErr = realnode.Up(rctx, realnode.DefaultPaths(cluster.CacheDir()),
			realnode.Cluster{Host: kc.Config.Host, PKIDir: kc.PKIDir(), Client: kc.Client})
		rcancel()
		if realNodeErr != nil {
			fmt.Fprintf(os.Stderr, "real node: not available, its tests skip: %v\n", realNodeErr)
		} else {
			defer realNode.Down()
			fmt.Fprintf(os.Stderr, "real node up in %s (%v)\n", time.Since(start).Round(time.Millisecond), realNode.Timings)
		}
	}
	return m.Run()
}

func client() kubernetes.Interface { return kc.Client }

// namespace creates a namespace for one test and deletes it afterwards.
func namespace(t *testing.T) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + "-" + fmt.Sprint(time.Now().UnixNano()%100000)
	if err := kc.EnsureNamespace(context.Background(), name); err != nil {
		t.Fatal(err)
	}
	// Pods are refused until the ServiceAccount controller made "default".
	eventually(t, 30*time.Second, "default ServiceAccount", func() (bool, error) {
		_, err := kc.Client.CoreV1().ServiceAccounts(name).Get(context.Background(), "default", metav1.GetOptions{})
		return err == nil, err
	})
	t.Cleanup(func() {
		_ = kc.Client.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// start runs a function for ns, with extra settings over the base ones.
func start(t *testing.T, ns string, extra map[string]string) *function.Instance {
	t.Helper()
	env := function.BaseEnv(kubeconfig, ns)
	for k, v := range extra {
		env[k] = v
	}
	return function.Start(t, env)
}

// eventually polls cond (bounded by timeout) until it holds.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, error)) {
	t.Helper()
	function.Eventually(t, timeout, 100*time.Millisecond, what, cond)
}

func pods(t *testing.T, ns, selector string) []corev1.Pod {
	t.Helper()
	l, err := client().CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func services(t *testing.T, ns, selector string) []corev1.Service {
	t.Helper()
	l, err := client().CoreV1().Services(ns).List(context.Background(), metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

// mustDo sends a request and fails the test on a transport error.
func mustDo(t *testing.T, f *function.Instance, method, path string, body any) function.Response {
	t.Helper()
	r, err := f.Do(method, path, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	return r
}

func expectCode(t *testing.T, r function.Response, want int, what string) {
	t.Helper()
	if r.Code != want {
		t.Fatalf("%s: status %d, want %d; body %s", what, r.Code, want, r.Raw)
	}
}

// outage kills the API server and returns a function that brings it back;
// the cleanup brings it back too if the test ends first.
func outage(t *testing.T) (restore func()) {
	t.Helper()
	if err := kc.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore = func() {
		if restored {
			return
		}
		restored = true
		if err := kc.StartAPIServer(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(restore)
	return restore
}

// waitReadiness polls the function's readiness probe until it answers code.
func waitReadiness(t *testing.T, f *function.Instance, code int) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("readiness %d", code), func() (bool, error) {
		resp, err := f.Client.Get(f.URL + "/health/readiness")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == code, nil
	})
}
