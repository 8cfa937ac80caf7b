//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// kernelRow is one thing hostile code tries against the kernel it runs on.
type kernelRow struct {
	name   string
	action map[string]any
	// want, for a call into the kernel, is what each place (kernelPlaces)
	// must see: "ok", or the name of the errno the call fails with. Any
	// other failure, or another errno, fails the row: a probe the stand-in
	// does not know, or a call refused for a reason other than the one the
	// row is about, shows nothing.
	want map[string]string
	// For a row that reads what the kernel shows (want nil): refused judges
	// an outcome (ok, and what the sandbox saw) as the kernel refusing it;
	// nil means the default: the call failed. runcRefused says whether
	// runc's sandbox must be refused too (false: the row shows what runc
	// exposes, which only gVisor closes). The control must see what the row
	// guards (the judge calls it ALLOWED) unless noControl says why it
	// cannot on this node.
	refused     func(ok bool, saw string) bool
	runcRefused bool
	noControl   string
}

// kernelPlaces are where every row runs: a sandbox under runc, one under
// gVisor, and the control (kernelControl), which is not a sandbox.
var kernelPlaces = []string{"runc", "gVisor", "control"}

func kernelProbe(name string) map[string]any { return map[string]any{"op": "kernel", "name": name} }

// kernelEnds is a kernel probe's expected outcomes: errno under runc and
// gVisor, and control in the control.
func kernelEnds(runc, gVisor, control string) map[string]string {
	return map[string]string{"runc": runc, "gVisor": gVisor, "control": control}
}

// kernelOutcome is a kernel probe's outcome as a row's want names it: "ok",
// or the errno the stand-in led its error with ("EPERM: …"). An error with
// no errno (an unknown probe, say) is returned whole, and matches no want.
func kernelOutcome(ok bool, saw string) string {
	if ok {
		return "ok"
	}
	if name, _, found := strings.Cut(saw, ": "); found && isErrnoName(name) {
		return name
	}
	return "no errno: " + saw
}

// isErrnoName says whether name is an errno's name (EPERM) on this kernel.
func isErrnoName(name string) bool {
	for e := unix.Errno(1); e < 256; e++ {
		if unix.ErrnoName(e) == name {
			return true
		}
	}
	return false
}

// kernelControl starts, on the real node, the stand-in in a Pod that is a
// control, NOT a sandbox: privileged (every capability, no seccomp filter,
// /proc and /sys unmasked), root, in the node's pid namespace, under runc.
// It runs nothing the function makes and nothing like it; it exists to show
// that every call a sandbox is refused can get through on this node, so the
// sandboxes' refusals are theirs and not the node's. It returns its IP once
// Ready.
func kernelControl(t *testing.T) string {
	t.Helper()
	ns := namespace(t)
	const name = "kernel-control-not-a-sandbox"
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{realnode.NodeLabel: "true"}, Tolerations: []corev1.Toleration{realnode.Toleration},
			HostPID: true, AutomountServiceAccountToken: ptr.To(false), TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "control", Image: realnode.SandboxImage, ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true), RunAsUser: ptr.To[int64](0), RunAsGroup: ptr.To[int64](0)},
				ReadinessProbe:  &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/v1/sandbox", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
			}},
		},
	}
	if _, err := client().CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the control Pod: %v", err)
	}
	return waitReady(t, "the control Pod", podNamed(ns, name)).Status.PodIP
}

// onNode says whether the node (this machine, whose kernel it shares) has
// path.
func onNode(t *testing.T, path string) bool {
	t.Helper()
	_, err := os.Stat(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return err == nil
}

// TestKernelSurface runs, from a sandbox under runc (the node's own kernel)
// and from one under gVisor (config/'s default, SANDBOX_RUNTIME_CLASS=gvisor),
// what hostile code tries against the kernel: which kernel it sees, raw and
// packet sockets, kernel memory and sysfs, loading a module, the syscalls
// behind most container escapes (keyctl, bpf, perf_event_open,
// userfaultfd, io_uring_setup, user and mount namespaces, mount), tracing
// another process, and reading the node's process environment by any path.
// Each call into the kernel must end as its row says, to the errno, in each
// sandbox; each runs too in a control, a privileged container on the node
// that is no sandbox, where it must get through (or, where this node's
// kernel cannot do it for anyone, fail as the kernel itself answers), so a
// refusal in a sandbox is the sandbox's. Every row prints the three results
// and what is expected; under gVisor none may reach the node's kernel.
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

	at := map[string]string{} // place -> the Pod's IP
	for _, rt := range []struct{ name, class string }{{"runc", ""}, {"gVisor", "gvisor"}} {
		ns := namespace(t)
		f := start(t, ns, realEnv(t, ns, map[string]string{"SANDBOX_RUNTIME_CLASS": rt.class}))
		expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "kernel"}), 200, "create under "+rt.name)
		pod := runningPod(t, ns, "kernel")
		if got := ptrString(pod.Spec.RuntimeClassName); got != rt.class {
			t.Fatalf("the %s sandbox runs with runtime class %q, want %q", rt.name, got, rt.class)
		}
		at[rt.name] = pod.Status.PodIP
	}
	at["control"] = kernelControl(t) // a control, not a sandbox: see kernelControl

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
	// A kernel without modules (no /proc/modules) has no module calls, for
	// anyone: the control then shows the kernel's own answer, ENOSYS, not
	// the sandboxes' refusal. With modules, the control gets past every
	// right and is refused only for what it loads, which is no module.
	moduleControl := "ENOEXEC"
	if !onNode(t, "/proc/modules") {
		moduleControl = "ENOSYS"
	}
	kcoreControl := ""
	if !onNode(t, "/proc/kcore") {
		kcoreControl = "the node's kernel has no /proc/kcore, for anyone: this row cannot fail here"
	}
	rows := []kernelRow{
		{name: "the kernel a sandbox sees (uname, /proc/version): not the node's " + nodeRelease, action: kernelProbe("uname"), refused: notNodeKernel},
		{name: "a raw socket (AF_INET, SOCK_RAW)", action: kernelProbe("raw-socket"), want: kernelEnds("EPERM", "EPERM", "ok")},
		{name: "a packet socket (AF_PACKET)", action: kernelProbe("packet-socket"), want: kernelEnds("EPERM", "EPERM", "ok")},
		{name: "read /proc/kcore (kernel memory)", action: map[string]any{"op": "read", "path": "/proc/kcore"}, refused: noContent, runcRefused: true, noControl: kcoreControl},
		{name: "list /sys/kernel (the node's btf, debug, tracing, security)", action: map[string]any{"op": "list", "path": "/sys/kernel"}, refused: noNodeSysfs},
		{name: "load a kernel module (init_module)", action: kernelProbe("init_module"), want: kernelEnds("EPERM", "EPERM", moduleControl)},
		{name: "load a kernel module (finit_module)", action: kernelProbe("finit_module"), want: kernelEnds("EPERM", "EPERM", moduleControl)},
		{name: "keyctl (join a session keyring)", action: kernelProbe("keyctl"), want: kernelEnds("EPERM", "EPERM", "ok")},
		{name: "bpf (create a map)", action: kernelProbe("bpf"), want: kernelEnds("EPERM", "EPERM", "ok")},
		{name: "perf_event_open", action: kernelProbe("perf_event_open"), want: kernelEnds("EPERM", "EPERM", "ok")},
		{name: "userfaultfd", action: kernelProbe("userfaultfd"), want: kernelEnds("EPERM", "EPERM", "ok")},
		{name: "io_uring_setup", action: kernelProbe("io_uring_setup"), want: kernelEnds("EPERM", "EPERM", "ok")},
		{name: "a new user and mount namespace (clone)", action: kernelProbe("unshare"), want: kernelEnds("EPERM", "EPERM", "ok")},
		{name: "mount a tmpfs", action: kernelProbe("mount"), want: kernelEnds("EPERM", "EPERM", "ok")},
		// Any process may trace its own children, in a sandbox too (under
		// gVisor, the Sentry's ptrace serves it): this row is the next
		// one's control inside each sandbox, the same call on a target it
		// may trace.
		{name: "ptrace a process it started (PTRACE_ATTACH to its child)", action: kernelProbe("ptrace"), want: kernelEnds("ok", "ok", "ok")},
		{name: "ptrace a process that refuses tracing (its child, made non-dumpable: CAP_SYS_PTRACE only)", action: kernelProbe("ptrace-nondumpable"), want: kernelEnds("EPERM", "EPERM", "ok")},
	}
	// The control shares the node's pid namespace and sees what the node's
	// own root sees at each path. Where even that root is refused (EACCES:
	// pid 1 is this machine's init, which it may not inspect) the row can
	// have no control; at any other path, one the node's root reads or one
	// that does not exist (a misspelt path), the control must read the
	// marker.
	for _, path := range []string{"/proc/1/environ", "/proc/" + pid + "/environ", "/proc/self/root/proc/1/environ", "/proc/1/root/proc/" + pid + "/environ"} {
		noControl := ""
		if _, err := os.ReadFile(path); errors.Is(err, fs.ErrPermission) {
			noControl = "the node's root is refused it too: " + err.Error()
		}
		rows = append(rows, kernelRow{name: "read the node's process environment at " + path,
			action: map[string]any{"op": "read", "path": path}, refused: notTheNodes, runcRefused: true, noControl: noControl})
	}

	var table strings.Builder
	table.WriteString("\n| from a sandbox | expected | under runc | under gVisor | in the control (privileged, not a sandbox) |\n|---|---|---|---|---|\n")
	for _, r := range rows {
		seen := map[string]string{}
		for _, place := range kernelPlaces {
			ok, saw := execIn(t, at[place], r.action)
			cell, met := r.judge(place, ok, saw)
			seen[place] = cell
			if !met {
				t.Errorf("%s: in %s %s, want %s", r.name, place, cell, r.expected(place))
			}
		}
		want := fmt.Sprintf("%s under runc, %s under gVisor, %s in the control", r.expected("runc"), r.expected("gVisor"), r.expected("control"))
		fmt.Fprintf(&table, "| %s | %s | %s | %s | %s |\n", r.name, want, seen["runc"], seen["gVisor"], seen["control"])
	}
	t.Log(table.String())
}

// judge is what row r's outcome (ok, and what was seen) in place shows as a
// table cell, and whether it is what the row expects there.
func (r kernelRow) judge(place string, ok bool, saw string) (cell string, met bool) {
	if r.want != nil {
		got := kernelOutcome(ok, saw)
		cell = got
		if ok && saw != "" {
			cell += ": " + shorten(saw)
		}
		return cell, got == r.want[place]
	}
	refused := r.refused
	if refused == nil {
		refused = func(ok bool, _ string) bool { return !ok }
	}
	verdict := "refused"
	if !refused(ok, saw) {
		verdict = "ALLOWED"
	}
	cell = verdict + ": " + shorten(saw)
	switch place {
	case "runc":
		return cell, !r.runcRefused || verdict == "refused"
	case "control":
		return cell, r.noControl != "" || verdict == "ALLOWED"
	}
	return cell, verdict == "refused"
}

// expected is what row r expects in place.
func (r kernelRow) expected(place string) string {
	switch {
	case r.want != nil:
		return r.want[place]
	case place == "runc" && !r.runcRefused:
		return "anything (runc exposes the node's; only gVisor closes it)"
	case place == "control" && r.noControl != "":
		return "anything (no control: " + r.noControl + ")"
	case place == "control":
		return "ALLOWED (the control shows the row can fail)"
	}
	return "refused"
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
