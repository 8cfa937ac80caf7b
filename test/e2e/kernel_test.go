//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kernelRow is one thing hostile code tries against the kernel it runs on.
type kernelRow struct {
	name   string
	action map[string]any
	// refused judges an outcome (ok, and what the sandbox saw) as the
	// kernel refusing it; nil means the default: the call failed.
	refused func(ok bool, saw string) bool
	// runcRefused says whether runc's sandbox must be refused too (false:
	// the row shows what runc exposes, which only gVisor closes).
	runcRefused bool
}

func kernelProbe(name string) map[string]any { return map[string]any{"op": "kernel", "name": name} }

// TestKernelSurface runs, from a sandbox under runc (the node's own kernel)
// and from one under gVisor (config/'s default, SANDBOX_RUNTIME_CLASS=gvisor),
// what hostile code tries against the kernel: which kernel it sees, raw and
// packet sockets, kernel memory and sysfs, loading a module, the syscalls
// behind most container escapes (keyctl, bpf, perf_event_open,
// userfaultfd, io_uring_setup, unshare, mount), tracing another process,
// and reading the node's process environment by any path. Every row prints
// both results and what is expected; under gVisor every row must be
// refused (or, for the kernel, not be the node's).
func TestKernelSurface(t *testing.T) {
	rn := needRealNode(t)
	needRuntimeHandler(t, "runsc")
	var node unix.Utsname
	if err := unix.Uname(&node); err != nil {
		t.Fatal(err)
	}
	nodeRelease := unix.ByteSliceToString(node.Release[:])
	// The node's own processes: containerd's environment names the node's
	// binaries, a marker no sandbox may read.
	marker := rn.NodeBinDir()
	pid := nodeProcess(t, "containerd --config")
	environ, err := os.ReadFile("/proc/" + pid + "/environ")
	if err != nil || !bytes.Contains(environ, []byte(marker)) {
		t.Fatalf("containerd's environment (pid %s) does not hold %q, so the environ rows could not fail: %v", pid, marker, err)
	}

	sandboxes := map[string]string{} // runtime -> the sandbox Pod's IP
	for _, rt := range []struct{ name, class string }{{"runc", ""}, {"gVisor", "gvisor"}} {
		ns := namespace(t)
		f := start(t, ns, realEnv(t, ns, map[string]string{"SANDBOX_RUNTIME_CLASS": rt.class}))
		expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "kernel"}), 200, "create under "+rt.name)
		pod := runningPod(t, ns, "kernel")
		if got := ptrString(pod.Spec.RuntimeClassName); got != rt.class {
			t.Fatalf("the %s sandbox runs with runtime class %q, want %q", rt.name, got, rt.class)
		}
		sandboxes[rt.name] = pod.Status.PodIP
	}

	notNodeKernel := func(ok bool, saw string) bool {
		return ok && !strings.HasPrefix(saw, nodeRelease+" ") && saw != nodeRelease
	}
	noContent := func(ok bool, saw string) bool { return !ok || strings.TrimSpace(saw) == "" }
	nodeOnlySysfs := []string{"btf", "debug", "tracing", "security", "vmcoreinfo"}
	noNodeSysfs := func(ok bool, saw string) bool {
		if !ok {
			return true
		}
		return !slices.ContainsFunc(strings.Split(saw, ","), func(e string) bool { return slices.Contains(nodeOnlySysfs, e) })
	}
	notTheNodes := func(ok bool, saw string) bool { return !ok || !strings.Contains(saw, marker) }
	rows := []kernelRow{
		{name: "the kernel a sandbox sees (uname, /proc/version): not the node's " + nodeRelease, action: kernelProbe("uname"), refused: notNodeKernel},
		{name: "a raw socket (AF_INET, SOCK_RAW)", action: kernelProbe("raw-socket"), runcRefused: true},
		{name: "a packet socket (AF_PACKET)", action: kernelProbe("packet-socket"), runcRefused: true},
		{name: "read /proc/kcore (kernel memory)", action: map[string]any{"op": "read", "path": "/proc/kcore"}, refused: noContent, runcRefused: true},
		{name: "list /sys/kernel (the node's btf, debug, tracing, security)", action: map[string]any{"op": "list", "path": "/sys/kernel"}, refused: noNodeSysfs},
		{name: "load a kernel module (init_module)", action: kernelProbe("init_module"), runcRefused: true},
		{name: "load a kernel module (finit_module)", action: kernelProbe("finit_module"), runcRefused: true},
		{name: "keyctl (join a session keyring)", action: kernelProbe("keyctl"), runcRefused: true},
		{name: "bpf (create a map)", action: kernelProbe("bpf"), runcRefused: true},
		{name: "perf_event_open", action: kernelProbe("perf_event_open"), runcRefused: true},
		{name: "userfaultfd", action: kernelProbe("userfaultfd"), runcRefused: true},
		{name: "io_uring_setup", action: kernelProbe("io_uring_setup"), runcRefused: true},
		{name: "unshare a user and mount namespace", action: kernelProbe("unshare"), runcRefused: true},
		{name: "mount a tmpfs", action: kernelProbe("mount"), runcRefused: true},
		{name: "ptrace another process (PTRACE_ATTACH to pid 1)", action: kernelProbe("ptrace"), runcRefused: true},
	}
	for _, path := range []string{"/proc/1/environ", "/proc/" + pid + "/environ", "/proc/self/root/proc/1/environ", "/proc/1/root/proc/" + pid + "/environ"} {
		rows = append(rows, kernelRow{name: "read the node's process environment at " + path,
			action: map[string]any{"op": "read", "path": path}, refused: notTheNodes, runcRefused: true})
	}

	var table strings.Builder
	table.WriteString("\n| from a sandbox | expected | under runc | under gVisor |\n|---|---|---|---|\n")
	for _, r := range rows {
		refused := r.refused
		if refused == nil {
			refused = func(ok bool, _ string) bool { return !ok }
		}
		seen := map[string]string{}
		for _, rt := range []string{"runc", "gVisor"} {
			ok, saw := execIn(t, sandboxes[rt], r.action)
			verdict := "refused"
			if !refused(ok, saw) {
				verdict = "ALLOWED"
			}
			seen[rt] = verdict + ": " + shorten(saw)
			switch {
			case rt == "gVisor" && verdict != "refused":
				t.Errorf("%s: under gVisor %s, want it refused", r.name, seen[rt])
			case rt == "runc" && r.runcRefused && verdict != "refused":
				t.Errorf("%s: under runc %s, want it refused", r.name, seen[rt])
			}
		}
		want := "refused under both"
		if !r.runcRefused {
			want = "refused under gVisor (runc exposes the node's)"
		}
		fmt.Fprintf(&table, "| %s | %s | %s | %s |\n", r.name, want, seen["runc"], seen["gVisor"])
	}
	t.Log(table.String())
}

// shorten keeps a table cell readable.
func shorten(s string) string {
	s = strings.ReplaceAll(strings.TrimSpace(s), "|", "/")
	if len(s) > 70 {
		return s[:70] + "…"
	}
	return s
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// nodeProcess is the pid of the one node process whose command line holds
// what.
func nodeProcess(t *testing.T, what string) string {
	t.Helper()
	out, err := exec.Command("pgrep", "-f", what).Output()
	pids := strings.Fields(string(out))
	if err != nil || len(pids) != 1 {
		t.Fatalf("pgrep -f %q: %v %q, want one process", what, err, out)
	}
	if _, err := strconv.Atoi(pids[0]); err != nil {
		t.Fatal(err)
	}
	return pids[0]
}

// needRuntimeHandler fails in CI, and skips elsewhere, unless the real
// node's kubelet reports the container runtime handler (containerd's
// runtime name), as the node's status lists them.
func needRuntimeHandler(t *testing.T, handler string) {
	t.Helper()
	n, err := client().CoreV1().Nodes().Get(context.Background(), realnode.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, h := range n.Status.RuntimeHandlers {
		if h.Name == handler {
			return
		}
		have = append(have, h.Name)
	}
	skip.Unavailable(t, "the real node has no %q runtime handler (it reports %v): make node builds runsc and its containerd shim", handler, have)
}
