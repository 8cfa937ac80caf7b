package realnode

// What lets a node start again where one ran before: in a cluster that
// outlived it (`make run NODE=real` keeps sandbox-dev-real between runs), and
// on a machine where a crash (kill -9) left its parts, mounts and rules.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
)

// ensureService creates want, or adopts the Service of that name a node
// before this one left. Create alone cannot tell: for a Service with a fixed
// ClusterIP the API server allocates the IP before it writes, so creating
// one that exists fails with "provided IP is already allocated" (Invalid),
// not AlreadyExists. An existing one gets want's labels, selector and ports;
// one on another ClusterIP (immutable) is replaced.
func ensureService(ctx context.Context, cs kubernetes.Interface, want *corev1.Service) error {
	svcs := cs.CoreV1().Services(want.Namespace)
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cur, err := svcs.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			_, err = svcs.Create(ctx, want, metav1.CreateOptions{})
			if apierrors.IsInvalid(err) && want.Spec.ClusterIP != "" {
				return ipHeldError(ctx, cs, want, err)
			}
			return err
		}
		if err != nil {
			return err
		}
		if cur.Spec.ClusterIP != want.Spec.ClusterIP {
			if err := svcs.Delete(ctx, cur.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(cur.UID))}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			return apierrors.NewConflict(corev1.Resource("services"), cur.Name, errors.New("replaced: its ClusterIP was not "+want.Spec.ClusterIP))
		}
		upd := cur.DeepCopy()
		upd.Labels, upd.Spec.Selector, upd.Spec.Ports = want.Labels, want.Spec.Selector, want.Spec.Ports
		_, err = svcs.Update(ctx, upd, metav1.UpdateOptions{})
		return err
	})
}

// ipHeldError names the Service that holds want's ClusterIP, and what to do.
func ipHeldError(ctx context.Context, cs kubernetes.Interface, want *corev1.Service, err error) error {
	holder := "another Service"
	if l, lerr := cs.CoreV1().Services("").List(ctx, metav1.ListOptions{}); lerr == nil {
		for _, s := range l.Items {
			if s.Spec.ClusterIP == want.Spec.ClusterIP {
				holder = fmt.Sprintf("Service %s/%s", s.Namespace, s.Name)
			}
		}
	}
	return fmt.Errorf("%w: %s holds %s, the address the node's kubelet gives every Pod as its DNS server; "+
		"delete it (kubectl delete service -n <namespace> <name>), or start from a fresh cluster", err, holder, want.Spec.ClusterIP)
}

// replacePod creates pod after removing one of its name that a node before
// this one left: its status (Running, Ready) is that node's, not this one's,
// and its spec may be an older version's.
func replacePod(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) error {
	pods := cs.CoreV1().Pods(pod.Namespace)
	old, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return err
	default:
		if err := removePod(ctx, cs, old); err != nil {
			return err
		}
	}
	_, err = pods.Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return replacePod(ctx, cs, pod) // made again meanwhile (a racing Up)
	}
	return err
}

// removePod deletes an earlier node's Pod at once and waits until it is
// gone. No grace: the node that ran it is gone, and this one has not
// started it, or starts it only to be told to stop.
func removePod(ctx context.Context, cs kubernetes.Interface, old *corev1.Pod) error {
	pods := cs.CoreV1().Pods(old.Namespace)
	err := pods.Delete(ctx, old.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0)), Preconditions: metav1.NewUIDPreconditions(string(old.UID))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("removing the earlier node's Pod %s/%s: %w", old.Namespace, old.Name, err)
	}
	return poll(ctx, 30*time.Second, "the earlier node's Pod "+old.Name+" gone", func(ctx context.Context) (bool, error) {
		p, err := pods.Get(ctx, old.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || err == nil && p.UID != old.UID {
			return true, nil
		}
		return false, err
	})
}

// heartbeatSince reports whether c was written by a kubelet that started
// at or after since: a Node a node before this one registered keeps its
// last Ready condition (True) until the node lifecycle controller marks it
// Unknown, about 50 s later. The condition's times have whole seconds.
func heartbeatSince(c corev1.NodeCondition, since time.Time) bool {
	return !c.LastHeartbeatTime.Time.Before(since.Truncate(time.Second))
}

// sysctlsFile is where a node records the kernel settings it found, so that
// the next node's cleanLeftovers restores them when this one never reached
// Down.
const sysctlsFile = "sysctls.orig"

// recordSysctls writes n.sysctls to the state directory.
func (n *Node) recordSysctls() error {
	var b strings.Builder
	for path, v := range n.sysctls {
		fmt.Fprintf(&b, "%s %s\n", path, v)
	}
	return os.WriteFile(filepath.Join(n.State, sysctlsFile), []byte(b.String()), 0o600)
}

// restoreSysctls puts back the kernel settings an earlier node recorded in
// its state directory dir.
func restoreSysctls(dir string) {
	f, err := os.Open(filepath.Join(dir, sysctlsFile))
	if err != nil {
		return
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		path, v, ok := strings.Cut(s.Text(), " ")
		if ok && strings.HasPrefix(path, "/proc/sys/") {
			_ = os.WriteFile(path, []byte(v), 0o644)
		}
	}
}

// removeCNIChains deletes the NAT chains the bridge plugin's ipMasq made for
// this node's Pods (CNI-<hash>, jumped to from POSTROUTING, each tagged with
// the network's name in a comment). The plugin removes one when the
// runtime tears its Pod's network down, which Down (containers killed, then
// containerd) and a crash both skip, so each would stay for good.
func removeCNIChains() {
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		return
	}
	tag := fmt.Sprintf(`name: \"%s\"`, cniNetwork)
	chains := map[string]bool{}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.Contains(line, tag) {
			continue
		}
		// A chain's own rules name it too: one whose plugin was stopped
		// before it added the jump to it has no rule in POSTROUTING.
		if chain, _, _ := strings.Cut(strings.TrimPrefix(line, "-A "), " "); strings.HasPrefix(chain, "CNI-") {
			chains[chain] = true
		}
		if !strings.HasPrefix(line, "-A POSTROUTING ") {
			continue
		}
		// The rule as listed, with -A made -D, deletes it.
		args := append([]string{"-t", "nat", "-D"}, splitRule(strings.TrimPrefix(line, "-A "))...)
		_ = exec.Command("iptables", args...).Run()
	}
	for c := range chains {
		_ = exec.Command("iptables", "-t", "nat", "-F", c).Run()
		_ = exec.Command("iptables", "-t", "nat", "-X", c).Run()
	}
}

// cniNetwork is the name of the CNI network startContainerd writes.
const cniNetwork = "real-node"

// splitRule splits an iptables-save rule into arguments, keeping a quoted
// comment ("name: \"real-node\" id: \"…\"") as one.
func splitRule(rule string) []string {
	var args []string
	var cur strings.Builder
	quoted, escaped, started := false, false, false
	for _, r := range rule {
		switch {
		case escaped:
			cur.WriteRune(r)
			escaped = false
		case r == '\\' && quoted:
			escaped = true
		case r == '"':
			quoted, started = !quoted, true
		case r == ' ' && !quoted:
			if started {
				args = append(args, cur.String())
				cur.Reset()
				started = false
			}
		default:
			cur.WriteRune(r)
			started = true
		}
	}
	if started {
		args = append(args, cur.String())
	}
	return args
}

// Holder is a live process that holds a real node on this machine.
type Holder struct {
	PID     int    // the holder's
	Command string // its executable's name
	Kubelet int    // the node's kubelet
}

// Held reports a real node on this machine that a live process still holds
// (a test binary, realnode-up under `make run NODE=real`, knative-up under
// `make knative`), or nil: Up would end it, as cleanLeftovers ends every
// earlier node's parts. A node whose holder is gone (killed) is a leftover,
// for Up to clean, not held.
func Held() *Holder {
	prefix := filepath.Join(os.TempDir(), "rn-")
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		args := cmdline(p)
		if len(args) == 0 || filepath.Base(args[0]) != "kubelet" || !strings.Contains(strings.Join(args, " "), prefix) {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(p))
		ppid := parentPID(pid)
		if ppid <= 1 {
			continue
		}
		parent := cmdline(fmt.Sprintf("/proc/%d", ppid))
		if len(parent) == 0 {
			continue
		}
		name := filepath.Base(parent[0])
		if name == "realnode-up" || name == "knative-up" || strings.HasSuffix(name, ".test") {
			return &Holder{PID: ppid, Command: name, Kubelet: pid}
		}
	}
	return nil
}

// Error says what holds the node and what to do.
func (h *Holder) Error() string {
	what := "a test suite (" + h.Command + ")"
	switch h.Command {
	case "realnode-up":
		what = "another `make run NODE=real`"
	case "knative-up":
		what = "the local Knative cluster (`make knative`; `make knative-down` takes it down)"
	}
	return fmt.Sprintf("this machine runs one real node, and %s holds it (pid %d, its kubelet pid %d): stop that first, or wait until it ends", what, h.PID, h.Kubelet)
}

func cmdline(procDir string) []string {
	b, err := os.ReadFile(filepath.Join(procDir, "cmdline"))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// parentPID reads a process's parent from /proc/<pid>/stat (the field after
// the command, which may itself hold spaces and parentheses).
func parentPID(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// netnsDir is where containerd and ip(8) mount network namespaces.
const netnsDir = "/run/netns"

// shareNetnsDir makes netnsDir the shared bind mount of itself that ip(8)
// makes at its first `ip netns add`, before containerd mounts any Pod's
// namespace there. Made later (startSurroundings adds its namespaces after
// the DNS stand-in's Pod has one), the bind mount covers the Pod namespaces
// mounted before it: Down could neither unmount nor remove them, and every
// run left one behind.
func (n *Node) shareNetnsDir() error {
	if err := exec.Command("ip", "netns", "add", "rn-init").Run(); err != nil {
		return fmt.Errorf("ip netns add rn-init: %w", err)
	}
	return exec.Command("ip", "netns", "del", "rn-init").Run()
}

// uncoverNetns removes the Pod namespaces (cni-*) earlier nodes left in
// netnsDir, those a late bind mount covers too (see shareNetnsDir): when
// only Pod namespaces are mounted beneath that bind mount and nothing else
// inside it, it is unmounted, which uncovers them. ip(8) makes it again
// when it next needs it. Up calls it only when no live process holds a
// node, so every Pod namespace left is a leftover.
func uncoverNetns() {
	for range 4 { // a bind mount per late `ip netns add`
		unmountPodNetns()
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			return
		}
		type mount struct{ id, parent, point string }
		var mounts []mount
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) > 4 {
				mounts = append(mounts, mount{f[0], f[1], f[4]})
			}
		}
		top := ""
		for _, m := range mounts {
			if m.point == netnsDir {
				top = m.id // the last listed is the one on top
			}
		}
		if top == "" {
			return
		}
		covered, inside := false, false
		for _, m := range mounts {
			switch {
			case m.parent == top:
				inside = true // not a Pod's: another tool's namespace
			case strings.HasPrefix(m.point, netnsDir+"/cni-"):
				covered = true
			}
		}
		if !covered || inside {
			return
		}
		if err := syscall.Unmount(netnsDir, syscall.MNT_DETACH); err != nil {
			return
		}
	}
}

// unmountPodNetns unmounts and removes the Pod namespaces mounted (and not
// covered) in netnsDir.
func unmountPodNetns() {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && strings.HasPrefix(f[1], netnsDir+"/cni-") {
			if syscall.Unmount(f[1], syscall.MNT_DETACH) == nil {
				_ = os.Remove(f[1])
			}
		}
	}
}

// stopKubelet ends the kubelet before Down kills the containers: running,
// it starts them again (a container restarted, a Pod's new sandbox with
// its network namespace and NAT chain) while the node goes down, and those
// stay behind.
func (n *Node) stopKubelet() {
	for _, p := range n.procs {
		if filepath.Base(p.Path) != "kubelet" || p.ProcessState != nil {
			continue
		}
		stopGroup(p)
	}
}

// earlierPods are the Pods a node makes for itself in kube-system (see
// startPolicyAgent, startClusterDNS).
var earlierPods = []string{"kube-network-policies", "coredns-standin"}

// removeEarlierPods deletes the Pods an earlier node made for itself, before
// this node's kubelet starts: it would run them again, bound to the node's
// name, and the policy agent deletes its nftables table when it stops, the
// one the agent this node starts has just made (startPolicyAgent would then
// wait in vain, and policies go unenforced).
func (n *Node) removeEarlierPods(ctx context.Context) error {
	pods := n.cluster.Client.CoreV1().Pods("kube-system")
	for _, name := range earlierPods {
		p, err := pods.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return err
		}
		if p.Spec.NodeName != Name {
			continue
		}
		if err := removePod(ctx, n.cluster.Client, p); err != nil {
			return err
		}
	}
	return nil
}
