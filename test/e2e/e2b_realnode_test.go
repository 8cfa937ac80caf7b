//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/test/framework/e2bsdk"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// e2bStack is the E2B API's parts on the real node, as shipped: the
// function (its /e2b control plane), the router from config/310-router.yaml
// (its image built here from cmd/router), the router's sandbox policy
// (config/702), and two templates annotated sandbox.deerflow.dev/envd whose
// image is the sandbox stand-in with a shell beside it (Debian's static
// bash and busybox: the SDK runs every command as /bin/bash -l -c), under
// gVisor. Stand-ins, each said here: the image (built here, never pulled)
// and the node (this machine).
type e2bStack struct {
	ns      string
	fn      *function.Instance
	apiURL  string              // E2B_API_URL
	router  *realnode.E2BRouter // its URL is E2B_SANDBOX_URL
	key     access.Key
	threads string // the node's THREADS_HOST_PATH
}

func startE2B(t *testing.T) *e2bStack {
	t.Helper()
	needRealNode(t)
	ns := namespace(t)
	keyFile := filepath.Join(t.TempDir(), "key")
	env := realEnv(t, ns, map[string]string{
		"SANDBOX_SERVICE_TYPE": "ClusterIP",
		"PROVISIONER_API_KEYS": "alice=" + aliceKey + ",bob=" + bobKey,
		// The default key reaps (which keeps the pools); alice and bob are
		// the tenants.
		"PROVISIONER_ADMINS": "default",
		"SANDBOX_ENVD_IMAGE": realnode.EnvdImage,
		"E2B_TOKEN_KEY_FILE": keyFile,
		"E2B_DOMAIN":         realnode.E2BDomain,
	})
	// The router's sandbox policy is built from the configuration of this
	// test's namespace.
	t.Setenv("K8S_NAMESPACE", ns)
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	router, err := realnode.DeployE2BRouter(ctx, client(), filepath.Join("..", "..", "config", "310-router.yaml"), ns, keyFile, cfg.Objects())
	if err != nil {
		for _, p := range pods(t, ns, "app.kubernetes.io/name=sandbox-router") {
			t.Logf("router Pod %s: %s %+v", p.Name, p.Status.Phase, p.Status.ContainerStatuses)
		}
		t.Fatal(err)
	}
	f := start(t, ns, env)
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: realnode.ShellSandboxImage}}}
	putTemplate(t, ns, podTemplate("e2b", map[string]string{keys.TemplateEnvd: "true", keys.TemplateDeerFlowMounts: "false"}, spec))
	// A pausable one, with DeerFlow's mounts: its user data (its id as the
	// thread) outlives the Pod, as E2B's pause keeps files.
	putTemplate(t, ns, podTemplate("e2b-pause", map[string]string{keys.TemplateEnvd: "true", keys.TemplateKind: "ReplicaSet",
		keys.TemplateIdleAction: "pause"}, spec))
	// And a warm pool of two: its Pods' agents start without a token hash,
	// which the router gives each before the first call it forwards.
	putTemplate(t, ns, podTemplate("e2b-pool", map[string]string{keys.TemplateEnvd: "true", keys.TemplateDeerFlowMounts: "false",
		keys.TemplatePoolSize: "2"}, spec))
	return &e2bStack{ns: ns, fn: f, apiURL: f.URL + "/e2b", router: router, key: access.Key(router.Key), threads: env["THREADS_HOST_PATH"]}
}

// openThreads stands in for an operator's storage that the image's user
// may write: the kubelet makes each sandbox's user-data directory (a
// hostPath, DirectoryOrCreate) as root, 0755, and the stand-in image runs as
// uid 1000, so this opens each new one to it until the test ends (bounded:
// it stops with the test).
func (s *e2bStack) openThreads(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	t.Cleanup(func() { cancel(); wg.Wait() })
	go func() {
		defer wg.Done()
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			dirs, _ := filepath.Glob(filepath.Join(s.threads, "*", "user-data"))
			for _, d := range dirs {
				_ = os.Chmod(d, 0o777)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// create makes a sandbox through the E2B API (the SDK's create, by hand).
func (s *e2bStack) create(t *testing.T, key, body string) map[string]any {
	t.Helper()
	req, _ := http.NewRequest("POST", s.apiURL+"/sandboxes", bytes.NewReader([]byte(body)))
	req.Header.Set("X-API-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := freshClient(90 * time.Second).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 201 || json.Unmarshal(raw, &out) != nil {
		t.Fatalf("create: %d %s", resp.StatusCode, raw)
	}
	return out
}

// node runs one of test/e2b's scripts with the SDK installed by `make e2b`
// (hack/install-e2b.sh), as alice, bounded by timeout, and returns its
// output.
func (s *e2bStack) node(t *testing.T, timeout time.Duration, env map[string]string, args ...string) (string, error) {
	t.Helper()
	dir := e2bsdk.Dir(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	all := map[string]string{"E2B_API_URL": s.apiURL, "E2B_SANDBOX_URL": s.router.URL, "E2B_API_KEY": aliceKey}
	for k, v := range env {
		all[k] = v
	}
	out, err := e2bsdk.Command(ctx, dir, all, args...).CombinedOutput()
	return string(out), err
}

// TestE2BSDK (issue 48): E2B's own SDK, the unmodified e2b package from npm
// (test/e2b pins it), drives our sandboxes on the real node under gVisor
// through the function's /e2b control plane, the router and the agent:
// create, commands (stdout, stderr, exit codes, env, cwd, background, kill,
// timeouts), files (write, read, list, exists, rename, remove, makeDir,
// getInfo, a 10 MiB upload), setTimeout, list by metadata, pause then
// connect (files kept), kill; another key sees none of it; traffic without
// the sandbox's token is refused (test/e2b/sdk.test.mjs says each). Then
// nothing is left behind.
func TestE2BSDK(t *testing.T) {
	s := startE2B(t)
	s.openThreads(t)
	out, err := s.node(t, 15*time.Minute, map[string]string{
		"E2B_OTHER_API_KEY": bobKey, "E2B_TEMPLATE": "e2b", "E2B_PAUSE_TEMPLATE": "e2b-pause",
	}, "--test", "--test-reporter=spec", "sdk.test.mjs")
	t.Logf("node --test sdk.test.mjs:\n%s", out)
	if err != nil {
		t.Fatalf("E2B's SDK suite failed: %v", err)
	}
	// node's reporters end with "ℹ skipped N" (spec) or "# skipped N" (tap).
	if m := regexp.MustCompile(`(?m)^\s*(?:ℹ|#) (skipped|todo|cancelled) ([1-9]\d*)$`).FindStringSubmatch(out); m != nil {
		t.Errorf("the SDK suite has %s %s tests; every one must run here", m[2], m[1])
	}
	if !regexp.MustCompile(`(?m)(?:ℹ|#) pass [1-9]\d*$`).MatchString(out) {
		t.Errorf("the SDK suite reports no passing test")
	}
	eventually(t, 60*time.Second, "every sandbox the suite made is gone", func() (bool, error) {
		left := pods(t, s.ns, keys.LabelApp+"="+keys.LabelAppValue)
		svcs, err := client().CoreV1().Services(s.ns).List(context.Background(), metav1.ListOptions{LabelSelector: keys.LabelApp + "=" + keys.LabelAppValue})
		if err != nil {
			return false, err
		}
		return len(left) == 0 && len(svcs.Items) == 0, fmt.Errorf("%d Pods and %d Services left", len(left), len(svcs.Items))
	})
}

// TestE2BPooled: an E2B create from a template with a warm pool takes a
// pooled Pod, whose agent started without a token hash: the router gives it
// the hash of the token it checked before the first call it forwards, so
// the sandbox's token works and another does not; then E2B's SDK drives
// pooled sandboxes (test/e2b/bench.mjs: create, commands.run, an upload).
func TestE2BPooled(t *testing.T) {
	s := startE2B(t)
	// The reap keeps the pools (as a create of the template would).
	expectCode(t, mustDo(t, s.fn, "POST", "/api/reap", nil), 200, "reap, which keeps the pools")
	eventually(t, 120*time.Second, "two pooled Pods of e2b-pool Ready", func() (bool, error) {
		return poolReady(t, s.ns, "e2b-pool") == 2, poolState(t, s.ns, "e2b-pool")
	})
	sb := s.create(t, aliceKey, `{"templateID":"e2b-pool","timeout":300}`)
	id, tok := sb["sandboxID"].(string), sb["envdAccessToken"].(string)
	pod := runningPod(t, s.ns, id)
	if pod.Labels[keys.LabelPooled] != "true" {
		t.Fatalf("sandbox %s's Pod %s was not claimed from the pool (labels %v)", id, pod.Name, pod.Labels)
	}
	if envOf(pod)["ENVD_ACCESS_TOKEN_SHA256"] != "" {
		t.Errorf("the pooled Pod's agent was given a hash in its env; want none (the router gives it)")
	}
	stat := func(token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("POST", s.router.URL+"/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/tmp"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", "49983")
		req.Header.Set("X-Access-Token", token)
		resp, err := freshClient(15 * time.Second).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	// A wrong token first: refused by the router, and the agent is not
	// given its hash by it.
	if code, body := stat(strings.Repeat("0", 64)); code != 401 {
		t.Errorf("a wrong token: %d %s; want 401", code, body)
	}
	// Twice each way: two router replicas, each gives the hash once.
	for i := 0; i < 4; i++ {
		if code, body := stat(tok); code != 200 || !strings.Contains(body, `"name"`) {
			t.Fatalf("Stat with the sandbox's token, call %d: %d %s; want 200 with the entry", i+1, code, body)
		}
	}
	out, err := s.node(t, 5*time.Minute, map[string]string{"E2B_TEMPLATE": "e2b-pool", "E2B_BENCH_ROUNDS": "2", "E2B_BENCH_RUNS": "5",
		"E2B_BENCH_UPLOADS": "1"}, "bench.mjs")
	t.Logf("node bench.mjs on the pool:\n%s", out)
	if err != nil {
		t.Fatalf("E2B's SDK on pooled sandboxes: %v", err)
	}
}

// TestE2BRouterRefusesAndIsolates: the router refuses a request that names
// no sandbox, an unknown one, a port the sandbox does not expose, or comes
// without the sandbox's token, and stays up; a sandbox reaches neither the
// router nor another sandbox's agent (the router is the only new way in,
// and the tenant network holds around it).
func TestE2BRouterRefusesAndIsolates(t *testing.T) {
	s := startE2B(t)
	a, b := s.create(t, aliceKey, `{"templateID":"e2b","timeout":300}`), s.create(t, aliceKey, `{"templateID":"e2b","timeout":300}`)
	aID, bID := a["sandboxID"].(string), b["sandboxID"].(string)
	aTok, aTraffic := a["envdAccessToken"].(string), a["trafficAccessToken"].(string)
	// get asks the router for path with hdr; host "" is the router's own
	// address, else the Host a wildcard ingress would pass on.
	get := func(host, path string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", s.router.URL+path, nil)
		if host != "" {
			req.Host = host
		}
		for k, v := range hdr {
			if v != "" {
				req.Header.Set(k, v)
			}
		}
		resp, err := freshClient(15 * time.Second).Do(req)
		if err != nil {
			t.Fatalf("the router: %v", err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	route := func(id, port, token string) (int, string) {
		t.Helper()
		hdr := map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": port}
		if port == "49983" {
			hdr["X-Access-Token"] = token
		} else {
			hdr["E2b-Traffic-Access-Token"] = token
		}
		return get("", "/health", hdr)
	}
	for _, c := range []struct {
		name, id, port, token string
		code                  int
		says                  string
	}{
		{"the agent with its token", aID, "49983", aTok, 204, ""},
		{"no sandbox named", "", "49983", aTok, 400, "E2b-Sandbox-Id"},
		{"an unknown sandbox: E2B's 502", "nosuchsandbox0000000", "49983", aTok, 502, `"message":"The sandbox was not found","sandboxId":"nosuchsandbox0000000"`},
		{"a port not exposed (with the traffic token)", aID, "2222", aTraffic, 404, "2222"},
		{"a port not exposed, without the traffic token", aID, "2222", "", 401, ""},
		{"the container's port with the envd token", aID, "8080", aTok, 401, ""},
		{"no token", aID, "49983", "", 401, ""},
		{"another sandbox's token", bID, "49983", aTok, 401, ""},
		{"a token of the key's but the wrong kind", aID, "49983", s.key.Token(access.Traffic, access.Sandbox{Principal: "alice", ID: aID}), 401, ""},
	} {
		code, body := route(c.id, c.port, c.token)
		if code != c.code || !strings.Contains(body, c.says) {
			t.Errorf("%s: %d %q; want %d saying %q", c.name, code, body, c.code, c.says)
		}
	}
	if code, _ := route(aID, "49983", aTok); code != 204 {
		t.Errorf("after the refusals the router answers %d; want it still up (204)", code)
	}

	// E2B's own addressing: the Host names the sandbox and port, with no
	// header, as the SDK sends when E2B_DOMAIN alone is set (here on a
	// request to the router's address, as a wildcard ingress passes it).
	signedURL := func(path string, exp int64, token string) string {
		raw := path + ":read::" + token
		q := url.Values{"path": {path}}
		if exp != 0 {
			raw += ":" + strconv.FormatInt(exp, 10)
			q.Set("signature_expiration", strconv.FormatInt(exp, 10))
		}
		sum := sha256.Sum256([]byte(raw))
		q.Set("signature", "v1_"+strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "="))
		return "/files?" + q.Encode()
	}
	bTok := b["envdAccessToken"].(string)
	aHost, bHost := "49983-"+aID+"."+realnode.E2BDomain, "49983-"+bID+"."+realnode.E2BDomain
	for _, c := range []struct {
		name, host, path string
		hdr              map[string]string
		code             int
		says             string
	}{
		{"the agent by host with its token", aHost, "/health", map[string]string{"X-Access-Token": aTok}, 204, ""},
		{"by host, without its token", aHost, "/health", nil, 401, "X-Access-Token"},
		{"another sandbox by host with a's token", bHost, "/health", map[string]string{"X-Access-Token": aTok}, 401, ""},
		{"a host that names no sandbox", "nosuch." + realnode.E2BDomain, "/health", nil, 400, "names no sandbox"},
		{"a gone sandbox by host", "49983-nosuchsandbox0000000." + realnode.E2BDomain, "/health", nil, 502, "The sandbox was not found"},
		{"a signed download, with neither header nor token", aHost, signedURL("/etc/hostname", 0, aTok), nil, 200, ""},
		{"a signed download before its expiry", aHost, signedURL("/etc/hostname", time.Now().Add(time.Hour).Unix(), aTok), nil, 200, ""},
		{"a signed download past its expiry", aHost, signedURL("/etc/hostname", time.Now().Add(-time.Minute).Unix(), aTok), nil, 401, "expired"},
		{"b's signature at a's host", aHost, signedURL("/etc/hostname", 0, bTok), nil, 401, "invalid signature"},
	} {
		code, body := get(c.host, c.path, c.hdr)
		if code != c.code || !strings.Contains(body, c.says) {
			t.Errorf("%s: %d %q; want %d saying %q", c.name, code, body, c.code, c.says)
		}
	}

	// The control plane at api.<domain>, on its root path.
	req, _ := http.NewRequest("GET", s.fn.URL+"/sandboxes", nil)
	req.Host = "api." + realnode.E2BDomain
	req.Header.Set("X-API-Key", aliceKey)
	resp, err := freshClient(15 * time.Second).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(raw), aID) {
		t.Errorf("GET /sandboxes at api.%s: %d %s; want 200 listing %s", realnode.E2BDomain, resp.StatusCode, raw, aID)
	}
	if d, _ := a["domain"].(string); d != realnode.E2BDomain {
		t.Errorf("the create answered domain %v, want %s", a["domain"], realnode.E2BDomain)
	}

	// From inside sandbox a: the router's Service and Pods, and b's agent.
	time.Sleep(egressAgentWindow)
	aPod, bPod := runningPod(t, s.ns, aID), runningPod(t, s.ns, bID)
	targets := map[string]string{
		"the router's Service":    s.router.Addr,
		"another sandbox's agent": net.JoinHostPort(bPod.Status.PodIP, "49983"),
	}
	for _, p := range pods(t, s.ns, "app.kubernetes.io/name=sandbox-router") {
		targets["the router's Pod "+p.Name] = net.JoinHostPort(p.Status.PodIP, "8080")
	}
	for what, addr := range targets {
		// Shown up first from the host (the test), so a block is the policy's.
		if _, err := (&net.Dialer{Timeout: 3 * time.Second}).Dial("tcp", addr); err != nil {
			t.Fatalf("%s at %s does not answer the host either: %v", what, addr, err)
		}
		if ok, detail := execIn(t, aPod.Status.PodIP, map[string]any{"op": "connect", "addr": addr, "timeout_ms": 3000}); ok {
			t.Errorf("sandbox %s reached %s at %s: %s", aID, what, addr, detail)
		}
	}
}
