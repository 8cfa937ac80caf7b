// Package realnode joins one real node to a test cluster: a kubelet with
// containerd and runc runs real containers from images built here (and,
// when make node built gVisor, containerd's handler "runsc" runs Pods of
// RuntimeClass gvisor in gVisor's kernel; see gvisor.go), the
// bridge CNI plugin wires them, kube-proxy makes Services work and
// kube-network-policies enforces NetworkPolicies. It also builds the
// attacker's surroundings: a "public" host in its own network namespace
// (outside every cluster range, with a web server and a DNS server) and a
// listener on the cloud metadata address.
//
// Everything it starts runs as a local process or Pod on this machine and is
// undone by Down: processes, mounts, network devices, iptables and nftables
// rules, and the kernel settings the parts change.
package realnode

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
)

const (
	// Name is the real node's name; Pods reach it with NodeSelector and
	// Toleration.
	Name = "real-node"
	// NodeLabel is the label (value "true") that selects the real node.
	NodeLabel = "sandbox.test/real-node"
	// TaintKey keeps every Pod not meant for the real node off it.
	TaintKey = "sandbox.test/real-node"
	// SandboxImage is the stand-in for DeerFlow's sandbox image.
	SandboxImage = "localhost/sandbox:e2e"
	// PodCIDR is the bridge network's range.
	PodCIDR = "10.88.0.0/16"
	// PublicIP is the "public" host: outside every private range, so the
	// sandbox policy lets sandboxes reach it (web on 80, DNS on 53).
	PublicIP = "203.0.113.10"
	// publicGateway is the node's end of the public host's veth (its /31).
	publicGateway = "203.0.113.11"
	// MetadataIP is the clouds' metadata address; a web server listens there.
	MetadataIP = "169.254.169.254"
	// ClusterDNSIP is the kube-dns Service's ClusterIP (in the test
	// cluster's Service range 10.96.0.0/16), the nameserver the kubelet
	// writes into every Pod's resolv.conf. A stand-in for CoreDNS serves it
	// (see startClusterDNS).
	ClusterDNSIP = "10.96.0.10"
	// ClusterDNSAnswer is the one address the DNS stand-ins answer every A
	// query with.
	ClusterDNSAnswer = "192.0.2.53"

	bridgeName = "rn0"
	publicNS   = "rn-public"
	publicVeth = "rn-pub0"
)

// Toleration lets a Pod onto the real node.
var Toleration = corev1.Toleration{Key: TaintKey, Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}

// Paths locates the parts hack/install-node.sh and hack/node-images.sh
// cache.
type Paths struct {
	KubeBin   string // kubelet, kube-proxy
	NodeBin   string // containerd, ctr, containerd-shim-runc-v2, kube-network-policies
	CNIBin    string // bridge, host-local, loopback, portmap
	ImagesDir string // pause.tar, sandbox.tar, kube-network-policies.tar
	GVisorBin string // runsc, containerd-shim-runsc-v1 (optional: without them the node has no runsc handler)
}

// DefaultPaths are hack/lib.sh's, under cacheDir.
func DefaultPaths(cacheDir string) Paths {
	kube, containerd := cluster.EnvOr("KUBE_VERSION", "v1.36.3"), cluster.EnvOr("CONTAINERD_VERSION", "v2.4.2")
	knp, cni := cluster.EnvOr("KNP_VERSION", "v0.7.0"), cluster.EnvOr("CNI_VERSION", "v1.9.1")
	gvisor := cluster.EnvOr("GVISOR_VERSION", "v0.0.0-20260905035102-160fafc42237")
	return Paths{
		KubeBin:   filepath.Join(cacheDir, "kube-"+kube),
		NodeBin:   filepath.Join(cacheDir, "node-containerd-"+containerd+"-knp-"+knp),
		CNIBin:    filepath.Join(cacheDir, "cni-"+cni),
		ImagesDir: filepath.Join(cacheDir, "node-images"),
		GVisorBin: filepath.Join(cacheDir, "gvisor-"+gvisor),
	}
}

// Ready reports whether a Pod's Ready condition is true.
func Ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// Cluster is what the node needs of the control plane.
type Cluster struct {
	Host   string // API server URL
	PKIDir string // ca.crt and ca.key
	Client kubernetes.Interface
}

// Options change the node for a cluster whose workloads all run on it
// (the Knative cluster, package test/framework/knative). The zero value is
// the e2e suite's node.
type Options struct {
	// Untainted registers the node without TaintKey, so workloads that know
	// nothing of it (Knative's, CoreDNS, the function's revision) land on
	// it; that cluster taints its kwok nodes instead.
	Untainted bool
	// Images are more image archives to import and pin (they can never be
	// pulled here).
	Images []string
	// NoDNSStandIn leaves cluster DNS to the caller (real CoreDNS).
	NoDNSStandIn bool
	// NoSurroundings skips the attack tests' off-node hosts.
	NoSurroundings bool
}

// Node is a running real node.
type Node struct {
	State    string // scratch directory
	HostIP   string // this machine's address: the node's, and the API server's
	Timings  map[string]time.Duration
	paths    Paths
	cluster  Cluster
	opts     Options
	procs    []*exec.Cmd
	sysctls  map[string]string
	sock     string
	logFiles []*os.File
	since    time.Time // when Up began: what this node's kubelet wrote is newer
	// gvisorErr says why the node has no runsc handler (nil: it has one).
	gvisorErr error
}

// Preflight says why a real node cannot start here, or nil.
func Preflight(p Paths) error {
	if os.Geteuid() != 0 {
		return errors.New("the real node needs root (containers, network namespaces, iptables)")
	}
	need := []string{
		filepath.Join(p.KubeBin, "kubelet"), filepath.Join(p.KubeBin, "kube-proxy"),
		filepath.Join(p.NodeBin, "containerd"), filepath.Join(p.NodeBin, "ctr"), filepath.Join(p.NodeBin, "containerd-shim-runc-v2"),
		filepath.Join(p.CNIBin, "bridge"), filepath.Join(p.CNIBin, "host-local"), filepath.Join(p.CNIBin, "loopback"), filepath.Join(p.CNIBin, "portmap"),
		filepath.Join(p.ImagesDir, "pause.tar"), filepath.Join(p.ImagesDir, "sandbox.tar"), filepath.Join(p.ImagesDir, "kube-network-policies.tar"),
	}
	for _, f := range need {
		if _, err := os.Stat(f); err != nil {
			return fmt.Errorf("%s is missing: hack/node-images.sh (make node) builds the real node's parts: %w", f, err)
		}
	}
	for _, c := range []string{"runc", "iptables", "nft", "ip", "conntrack"} {
		if _, err := exec.LookPath(c); err != nil {
			return fmt.Errorf("%s is not installed: hack/install-node.sh installs it from Debian: %w", c, err)
		}
	}
	if _, err := os.Stat("/sys/fs/cgroup"); err != nil {
		return fmt.Errorf("no cgroup filesystem: %w", err)
	}
	return nil
}

// Up starts the node and waits until it is Ready, the policy agent runs and
// the sandbox image is present. On error everything started is undone.
func Up(ctx context.Context, p Paths, c Cluster) (n *Node, err error) {
	return UpWith(ctx, p, c, Options{})
}

// UpWith is Up with options.
func UpWith(ctx context.Context, p Paths, c Cluster, o Options) (n *Node, err error) {
	if err := Preflight(p); err != nil {
		return nil, err
	}
	if h := Held(); h != nil {
		return nil, h
	}
	cleanLeftovers(p)
	state, err := os.MkdirTemp("", "rn-")
	if err != nil {
		return nil, err
	}
	n = &Node{State: state, paths: p, cluster: c, opts: o, sysctls: map[string]string{}, Timings: map[string]time.Duration{},
		sock: filepath.Join(state, "containerd.sock"), since: time.Now()}
	defer func() {
		if err != nil {
			n.Down()
			n = nil
		}
	}()
	u, err := url.Parse(c.Host)
	if err != nil {
		return n, err
	}
	n.HostIP = hostIP()
	step := func(name string, f func() error) error {
		start := time.Now()
		if err := f(); err != nil {
			return fmt.Errorf("real node, %s: %w", name, err)
		}
		n.Timings[name] = time.Since(start)
		return nil
	}
	type upStep struct {
		name string
		f    func() error
	}
	steps := []upStep{
		{"kernel settings", n.saveAndSetSysctls},
		{"credentials", n.writeCredentials},
		{"network namespaces", n.shareNetnsDir},
		{"containerd", func() error { return n.startContainerd(ctx) }},
		{"images", func() error { return n.importImages(ctx) }},
		{"the earlier node's Pods", func() error { return n.removeEarlierPods(ctx) }},
		{"kubelet", func() error { return n.startKubelet(ctx) }},
		{"kube-proxy", func() error { return n.startKubeProxy(ctx) }},
		{"node Ready", func() error { return n.waitNodeReady(ctx) }},
		{"RuntimeClass gvisor", func() error { return n.applyRuntimeClass(ctx) }},
		{"network policy agent", func() error { return n.startPolicyAgent(ctx, u.Port()) }},
	}
	if !o.NoDNSStandIn {
		steps = append(steps, upStep{"cluster DNS (a stand-in for CoreDNS)", func() error { return n.startClusterDNS(ctx) }})
	}
	if !o.NoSurroundings {
		steps = append(steps, upStep{"public host and metadata listener", func() error { return n.startSurroundings(ctx) }})
	}
	for _, s := range steps {
		if err := step(s.name, s.f); err != nil {
			return n, err
		}
	}
	return n, nil
}

// cleanLeftovers undoes what an earlier run that never reached Down (a
// killed test binary) left behind, so this run does not trip over it: its
// processes (found by their state directory in the command line), mounts,
// devices, namespace and rule tables. kube-proxy's NAT rules outlive it too:
// a stale one for 127.0.0.1:<nodePort> would redirect whatever now listens
// on that port.
func cleanLeftovers(p Paths) {
	prefix := filepath.Join(os.TempDir(), "rn-")
	_ = exec.Command("pkill", "-KILL", "-f", prefix).Run()
	// Containers outlive their killed shims: end every process the kubelet
	// placed under kubepods (this machine runs no other kubelet).
	_ = filepath.WalkDir("/sys/fs/cgroup/pids/kubepods", func(path string, d os.DirEntry, err error) error {
		if err != nil || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(path)
		for _, f := range strings.Fields(string(b)) {
			var pid int
			if _, err := fmt.Sscanf(f, "%d", &pid); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
	removeSurroundings()
	for _, table := range []string{"kube-network-policies", NodeGuardTable} {
		_ = exec.Command("nft", "delete", "table", "inet", table).Run()
	}
	_ = exec.Command(filepath.Join(p.KubeBin, "kube-proxy"), "--cleanup").Run()
	removeCNIChains()
	uncoverNetns()
	old, _ := filepath.Glob(prefix + "*")
	for _, dir := range old {
		restoreSysctls(dir)
		(&Node{State: dir}).unmountAll()
		_ = os.RemoveAll(dir)
	}
}

// Down stops everything Up started and undoes its changes to the machine.
func (n *Node) Down() {
	if n == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Containers first, while containerd still answers (and the kubelet
	// no longer restarts them); then the parts.
	n.stopKubelet()
	if out, err := n.ctr(ctx, "tasks", "list", "--quiet"); err == nil {
		for _, id := range strings.Fields(string(out)) {
			_, _ = n.ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
		}
	}
	for i := len(n.procs) - 1; i >= 0; i-- {
		p := n.procs[i]
		stopGroup(p)
	}
	// Shims outlive containerd: end the ones serving this node's socket,
	// and gVisor's sandboxes and gofers (their --root is in the state
	// directory), which outlive their shims.
	_ = exec.Command("pkill", "-KILL", "-f", "containerd-shim-run(c-v2|sc-v1) .*"+n.sock).Run()
	_ = exec.Command("pkill", "-KILL", "-f", "runsc-(sandbox|gofer) .*--root="+n.State+"/").Run()
	_ = exec.Command(filepath.Join(n.paths.KubeBin, "kube-proxy"), "--cleanup").Run()
	removeCNIChains()
	_ = exec.Command("nft", "delete", "table", "inet", "kube-network-policies").Run()
	n.RemoveNodeGuard()
	removeSurroundings()
	n.unmountAll()
	for path, v := range n.sysctls {
		_ = os.WriteFile(path, []byte(v), 0o644)
	}
	for _, f := range n.logFiles {
		f.Close()
	}
	if os.Getenv("REAL_NODE_KEEP_STATE") == "" {
		_ = os.RemoveAll(n.State)
	}
}

// unmountAll lazily unmounts everything under the state directory and the
// network namespaces the CNI left, deepest first.
func (n *Node) unmountAll() {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return
	}
	var targets []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		if strings.HasPrefix(f[1], n.State+"/") || strings.HasPrefix(f[1], "/run/netns/cni-") {
			targets = append(targets, f[1])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(targets)))
	for _, t := range targets {
		_ = syscall.Unmount(t, syscall.MNT_DETACH)
		if strings.HasPrefix(t, "/run/netns/cni-") {
			_ = os.Remove(t)
		}
	}
}
