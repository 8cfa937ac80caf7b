//go:build e2e

// Package runreal checks `make run NODE=real` as a user runs it, through
// make and the HTTP API (issue 33): it starts every time, after a clean
// stop, after a crash and beside plain `make run`. It runs on its own (make
// test-run), never beside another suite: this machine runs one real node.
package runreal

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/makerun"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
)

const key = "runreal-test-key-0123456789"

// startBound bounds one `make run` until it serves: the tools and the
// node's parts are built (make test-run depends on them), so what is left
// is the cluster (reused, or about 5 s), two cached go builds and the node
// (about 5 s).
const startBound = 4 * time.Minute

// TestMakeRunRealStartsEveryTime runs `make run NODE=real` five times in a
// row, each time creating a sandbox and reaching its URL: a first start,
// after a clean stop (Ctrl-C), after a crash (kill -9 of make and every
// process under it) with another egress mode (isolated), and around plain
// `make run`, the last start in the default mode again, each of those two
// stopped by SIGTERM to make alone (`kill <pid>`, timeout(1)), after which
// nothing that was under make may still run. The second start failed
// before (issue 33: the kube-dns stand-in's Service, left in the cluster,
// refused a second create). Each real start also serves E2B's SDK with the
// lines it printed (issue 48: create, the agent through the router,
// delete); plain `make run` prints none. After the last stop nothing of the node is left
// on the machine: no process, mount, network namespace or NAT chain of it,
// and the kernel settings it changed are back.
func TestMakeRunRealStartsEveryTime(t *testing.T) {
	if why := cannotRun(); why != "" {
		skip.Unavailable(t, "%s", why)
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	addr, err := makerun.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	// Clusters of the test's own (runreal, runreal-real), made anew: one
	// left by an earlier run is deleted first.
	const base = "runreal"
	makerun.DownClusters(repo, base)
	u := &user{t: t, repo: repo, addr: addr, base: base, state: t.TempDir(), logs: t.TempDir()}
	t.Cleanup(func() { makerun.DownClusters(repo, base) })

	r := u.start("real")
	r.sandbox("first")
	lookingWorks(t)
	r.stop()
	clean := machineState()
	if left := leftovers(t); left != "" {
		t.Fatalf("after a clean stop the node left: %s", left)
	}

	r = u.start("real") // issue 33: "provided IP is already allocated"
	r.sandbox("again")
	r.crash()

	// Another egress mode on the kept cluster, then the default again
	// ("afterplain"): make run brings the shared NetworkPolicies in line with
	// the settings it starts with, so neither start refuses its creates.
	r = u.start("real", "SANDBOX_EGRESS_MODE=isolated")
	r.sandbox("aftercrash")
	r.terminate() // the next start binds the same address: nothing of this run may still hold it

	r = u.start("kwok")
	r.sandbox("plain")
	r.terminate()

	r = u.start("real")
	r.sandbox("afterplain")
	r.stop()
	if left := leftovers(t); left != "" {
		t.Fatalf("after the last stop the node left: %s", left)
	}
	if now := machineState(); now != clean {
		t.Fatalf("kernel settings after the last stop differ from those after the first:\nfirst: %s\nlast:  %s", clean, now)
	}
}

// cannotRun says why the sequence cannot run here, or "".
func cannotRun() string {
	if os.Geteuid() != 0 {
		return "make run NODE=real needs root (containers, network namespaces, iptables)"
	}
	if _, err := exec.LookPath("make"); err != nil {
		return "no make on PATH"
	}
	if err := realnode.Preflight(realnode.DefaultPaths(cluster.CacheDir())); err != nil {
		return "no real node here: " + err.Error()
	}
	kube := filepath.Join(cluster.CacheDir(), "kube-"+cluster.EnvOr("KUBE_VERSION", "v1.36.3"), "kube-apiserver")
	if _, err := os.Stat(kube); err != nil {
		return kube + " is missing: make tools builds the cluster's parts"
	}
	if h := realnode.Held(); h != nil {
		return h.Error()
	}
	return ""
}

// user runs `make run` as a user does, in a cluster and state directory of
// the test's own (a user's sandbox-dev clusters stay as they are).
type user struct {
	t                       *testing.T
	repo, addr, base, state string
	logs                    string
	n                       int
}

// run is one `make run`.
type run struct {
	*makerun.Run
	u    *user
	n    int
	real bool
}

// start runs make run NODE=node with env (K=V) as the user's settings.
func (u *user) start(node string, env ...string) *run {
	u.t.Helper()
	u.n++
	o := makerun.Options{Repo: u.repo, Real: node == "real", Cluster: u.base, Addr: u.addr, Key: key, State: u.state,
		Log: filepath.Join(u.logs, fmt.Sprintf("%d-%s.log", u.n, node)), Env: env}
	mr, err := makerun.Start(o, startBound)
	if err != nil {
		u.t.Fatalf("start %d (make run NODE=%s): %v", u.n, node, err)
	}
	u.t.Cleanup(mr.Kill)
	u.t.Logf("start %d (NODE=%s %v): serving after %s", u.n, node, env, mr.Serving.Round(time.Millisecond))
	return &run{Run: mr, u: u, n: u.n, real: o.Real}
}

// sandbox creates a sandbox through the API and waits for it to be Ready;
// on the real node, its URL must answer too, and E2B works with the lines
// the run printed (e2b). Plain `make run` prints no E2B line.
func (r *run) sandbox(id string) {
	t := r.u.t
	t.Helper()
	code, sb, err := r.Do("POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": id, "thread_id": "t-" + id})
	if err != nil || code != 200 || sb["ready"] != true {
		t.Fatalf("start %d: create %s: %v %d %v\n%s", r.n, id, err, code, sb, r.Tail(20))
	}
	if !r.real {
		for _, name := range e2bLines {
			if v, ok := r.Printed(name); ok {
				t.Fatalf("start %d: plain make run printed %s=%s, but kwok runs no agent", r.n, name, v)
			}
		}
		return
	}
	url, _ := sb["sandbox_url"].(string)
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := (&http.Client{Timeout: 2 * time.Second}).Get(url + "/v1/sandbox")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("start %d: sandbox %s is Ready but %s/v1/sandbox did not answer 200 within 15 s (last: %v)", r.n, id, url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.e2b()
}

// e2bLines are the settings `make run NODE=real` prints for E2B's SDK.
var e2bLines = []string{"E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"}

// e2b uses the E2B lines the run printed as E2B's SDK does
// (/tmp/e2bpkg's dist: X-API-Key on the control plane; the envd token as
// X-Access-Token and the sandbox in E2b-Sandbox-Id/Port on the router):
// a create of the SDK's default template answers 201 with an envd token,
// the agent's /health answers 204 through the router, and the delete 204.
// The key (sandbox-e2b-key) is kept between runs, so later starts check
// the key an earlier one made.
func (r *run) e2b() {
	t := r.u.t
	t.Helper()
	got := map[string]string{}
	for _, name := range e2bLines {
		v, ok := r.Printed(name)
		if !ok {
			t.Fatalf("start %d: make run NODE=real printed no %s=… line to paste:\n%s", r.n, name, r.Tail(30))
		}
		got[name] = v
	}
	if got["E2B_API_URL"] != r.URL+"/e2b" || got["E2B_API_KEY"] != key {
		t.Fatalf("start %d: printed E2B_API_URL=%s E2B_API_KEY=%s, want %s/e2b and the run's key %s", r.n, got["E2B_API_URL"], got["E2B_API_KEY"], r.URL, key)
	}
	c := &http.Client{Timeout: 90 * time.Second}
	call := func(method, url string, body []byte, header map[string]string) (int, []byte, error) {
		req, err := http.NewRequest(method, url, bytes.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	apiKey := map[string]string{"X-API-Key": got["E2B_API_KEY"], "Content-Type": "application/json"}
	start := time.Now()
	code, body, err := call("POST", got["E2B_API_URL"]+"/sandboxes", []byte(`{"templateID":"base"}`), apiKey)
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if err == nil {
		err = json.Unmarshal(body, &sb)
	}
	if err != nil || code != http.StatusCreated || sb.SandboxID == "" || sb.EnvdAccessToken == "" {
		t.Fatalf("start %d: E2B create of template base: %v %d %s\n%s", r.n, err, code, body, r.Tail(20))
	}
	envd := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb.EnvdAccessToken}
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body, err = call("GET", got["E2B_SANDBOX_URL"]+"/health", nil, envd)
		if err == nil && code == http.StatusNoContent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("start %d: the E2B sandbox %s's agent did not answer 204 at %s/health within 15 s (last: %v %d %s)",
				r.n, sb.SandboxID, got["E2B_SANDBOX_URL"], err, code, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	code, body, err = call("DELETE", got["E2B_API_URL"]+"/sandboxes/"+sb.SandboxID, nil, apiKey)
	if err != nil || code != http.StatusNoContent {
		t.Fatalf("start %d: E2B delete of %s: %v %d %s", r.n, sb.SandboxID, err, code, body)
	}
	t.Logf("start %d: E2B create, the agent through the router and delete in %s", r.n, time.Since(start).Round(time.Millisecond))
}

// stop is Ctrl-C: the run takes its node down and ends.
func (r *run) stop() { r.end("Ctrl-C", r.Stop) }

// terminate is `kill <make's pid>`: SIGTERM to make alone, as timeout(1)
// or a supervisor sends it. The function once outlived make here, serving
// on with its node gone.
func (r *run) terminate() { r.end("SIGTERM to make alone", r.Terminate) }

// end stops the run with how (makerun's Stop or Terminate), which fails
// when make does not end or anything that was under it outlives it.
func (r *run) end(what string, how func(time.Duration) error) {
	r.u.t.Helper()
	start := time.Now()
	if err := how(2 * time.Minute); err != nil {
		r.u.t.Fatalf("start %d: %v", r.n, err)
	}
	r.u.t.Logf("start %d: stopped (%s) in %s", r.n, what, time.Since(start).Round(time.Millisecond))
}

// crash is kill -9 of make and every process under it.
func (r *run) crash() {
	r.u.t.Helper()
	n := r.Crash()
	r.u.t.Logf("start %d: killed (kill -9 of make and the %d processes under it)", r.n, n)
}

// leftovers describes what of a real node is still on the machine (found),
// at most a dozen of them, as one line: "" when nothing is left.
func leftovers(t testing.TB) string {
	t.Helper()
	left := found(t)
	if len(left) > 12 {
		left = append(left[:12], fmt.Sprintf("and %d more", len(left)-12))
	}
	return strings.Join(left, "; ")
}

// What found names, one kind each, for the check while a node runs.
const (
	foundContainers = "container processes"
	foundNetns      = "network namespace"
	foundNAT        = "NAT rule"
)

// found lists what of a real node is on the machine: its processes (their
// command lines name its state directory under /tmp/rn-*), the processes in
// its kubelet's cgroups, its mounts, the network namespaces its Pods and
// surroundings had, its bridge and the bridge plugin's NAT chains. A look
// that cannot be made (ip or iptables-save missing, no pids cgroup
// hierarchy) fails t: it would otherwise find nothing, and pass.
func found(t testing.TB) []string {
	t.Helper()
	prefix := filepath.Join(os.TempDir(), "rn-")
	var left []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err == nil && bytes.Contains(b, []byte(prefix)) {
			left = append(left, "process "+filepath.Base(d)+": "+strings.Join(strings.Fields(strings.ReplaceAll(string(b), "\x00", " ")), " "))
		}
	}
	// Containers outlive their shims: any process in the kubelet's cgroups.
	root, err := kubepods()
	if err != nil {
		t.Fatalf("cannot look for container processes: %v", err)
	}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		// No kubepods (the kubelet left no cgroup), or a cgroup removed
		// while walked: nothing there.
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if d.Name() == "cgroup.procs" {
			b, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			if len(bytes.TrimSpace(b)) > 0 {
				left = append(left, foundContainers+" "+strings.Join(strings.Fields(string(b)), ",")+" in "+filepath.Dir(path))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("cannot look for container processes under %s: %v", root, err)
	}
	if b, err := os.ReadFile("/proc/self/mounts"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 1 && (strings.HasPrefix(f[1], prefix) || strings.HasPrefix(f[1], "/run/netns/cni-")) {
				left = append(left, "mount "+f[1])
			}
		}
	} else {
		t.Fatalf("cannot look for mounts: %v", err)
	}
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatalf("cannot look for network namespaces (ip netns list): %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && (strings.HasPrefix(f[0], "rn-") || strings.HasPrefix(f[0], "cni-")) {
			left = append(left, foundNetns+" "+f[0])
		}
	}
	// A link's directory under /sys/class/net, rather than `ip link show`,
	// whose failure would not say whether the bridge or ip is missing.
	if _, err := os.Stat("/sys/class/net/rn0"); err == nil {
		left = append(left, "bridge rn0")
	} else if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("cannot look for the bridge rn0: %v", err)
	}
	out, err = exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		t.Fatalf("cannot look for NAT rules (iptables-save -t nat): %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, `name: \"real-node\"`) || strings.HasPrefix(line, "-A KUBE-") {
			left = append(left, foundNAT+" "+line)
		}
	}
	return left
}

// kubepods is the cgroup under which the real node's kubelet (cgroupfs
// driver, realnode's kubelet.go) puts its Pods, in this machine's pids
// hierarchy: cgroup v1's pids controller (this machine mounts it at
// /sys/fs/cgroup/pids, beside a cgroup2 at unified with no controllers), or
// the cgroup2 root where that holds the pids controller. Neither is an
// error: a walk of a path that cannot exist would find nothing and pass.
func kubepods() (string, error) {
	if b, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil && slices.Contains(strings.Fields(string(b)), "pids") {
		return "/sys/fs/cgroup/kubepods", nil
	}
	if _, err := os.Stat("/sys/fs/cgroup/pids/cgroup.procs"); err == nil {
		return "/sys/fs/cgroup/pids/kubepods", nil
	}
	return "", errors.New("no pids cgroup hierarchy: neither cgroup v1's /sys/fs/cgroup/pids nor a cgroup2 /sys/fs/cgroup with the pids controller")
}

// lookingWorks fails t unless found, while a node runs and serves a
// sandbox, sees its container processes, its Pods' network namespaces and
// kube-proxy's NAT rules: the proof that the checks after a stop look
// where the node puts them, so that finding nothing there means nothing
// is left.
func lookingWorks(t testing.TB) {
	t.Helper()
	live := found(t)
	for _, kind := range []string{foundContainers, foundNetns, foundNAT} {
		if !slices.ContainsFunc(live, func(s string) bool { return strings.HasPrefix(s, kind+" ") }) {
			t.Fatalf("while the node runs a sandbox, found no %s (found: %d things, the first %v): the check after a stop would look in the wrong place",
				kind, len(live), live[:min(len(live), 5)])
		}
	}
}

// machineState is the kernel settings a real node changes, as one line.
func machineState() string {
	var kv []string
	for _, k := range []string{"net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet", "vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"} {
		b, _ := os.ReadFile(filepath.Join("/proc/sys", k))
		kv = append(kv, k+"="+strings.TrimSpace(string(b)))
	}
	sort.Strings(kv)
	return strings.Join(kv, " ")
}
