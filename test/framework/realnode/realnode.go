// Package realnode joins one real node to a test cluster: a kubelet with
// containerd and runc runs real containers from images built here, the
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
	"archive/tar"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

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

// OffNodeHost is a host outside the cluster on an address the sandbox
// policy's egress denies: a network namespace on this machine, routed from
// the node through a veth pair (as the public host is), serving the
// stand-in's web server on 80 and its DNS server on 53. From a sandbox each
// must be blocked; from the backend each is reached, which shows it is up.
type OffNodeHost struct {
	What string // what it stands for
	IP   string // its address, inside the namespace
	gw   string // the node's end of the veth, in the same /24
	ns   string // network namespace
	veth string // the node's end of the veth
}

// OffNodeHosts are one host in each private range and on two metadata
// addresses the defaults deny, none overlapping the Pod range (10.88.0.0/16),
// the Service range (10.96.0.0/16), this machine's subnet or its resolver.
var OffNodeHosts = []OffNodeHost{
	{What: "a private host in 10.0.0.0/8", IP: "10.250.0.10", gw: "10.250.0.1", ns: "rn-p10", veth: "rn-p10"},
	{What: "a private host in 172.16.0.0/12", IP: "172.31.250.10", gw: "172.31.250.1", ns: "rn-p172", veth: "rn-p172"},
	{What: "a private host in 192.168.0.0/16", IP: "192.168.250.10", gw: "192.168.250.1", ns: "rn-p192", veth: "rn-p192"},
	{What: "AWS ECS's task metadata address", IP: "169.254.170.2", gw: "169.254.170.1", ns: "rn-ecs", veth: "rn-ecs"},
	{What: "Alibaba Cloud's metadata address (CGNAT range)", IP: "100.100.100.200", gw: "100.100.100.1", ns: "rn-ali", veth: "rn-ali"},
}

// policyAgentImage is the reference hack/node-images.sh gives the patched
// kube-network-policies.
func policyAgentImage() string {
	v := os.Getenv("KNP_VERSION")
	if v == "" {
		v = "v0.7.0"
	}
	return "localhost/kube-network-policies:" + v + "-xtq"
}

// Toleration lets a Pod onto the real node.
var Toleration = corev1.Toleration{Key: TaintKey, Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule}

// Paths locates the parts hack/install-node.sh and hack/node-images.sh
// cache.
type Paths struct {
	KubeBin   string // kubelet, kube-proxy
	NodeBin   string // containerd, ctr, containerd-shim-runc-v2, kube-network-policies
	CNIBin    string // bridge, host-local, loopback, portmap
	ImagesDir string // pause.tar, sandbox.tar, kube-network-policies.tar
}

// DefaultPaths are hack/lib.sh's, under cacheDir.
func DefaultPaths(cacheDir string) Paths {
	kube, containerd := cluster.EnvOr("KUBE_VERSION", "v1.36.3"), cluster.EnvOr("CONTAINERD_VERSION", "v2.4.2")
	knp, cni := cluster.EnvOr("KNP_VERSION", "v0.7.0"), cluster.EnvOr("CNI_VERSION", "v1.9.1")
	return Paths{
		KubeBin:   filepath.Join(cacheDir, "kube-"+kube),
		NodeBin:   filepath.Join(cacheDir, "node-containerd-"+containerd+"-knp-"+knp),
		CNIBin:    filepath.Join(cacheDir, "cni-"+cni),
		ImagesDir: filepath.Join(cacheDir, "node-images"),
	}
}

// FunctionEnv is what the function needs, beyond its base settings, to put
// sandboxes on the real node: the stand-in image, the node's selector and
// toleration, no user namespace (this node's runtime cannot provide one;
// the e2e suite shows the kubelet refusing), and DeerFlow's host-path mode
// under base (see HostBase).
func FunctionEnv(base string) map[string]string {
	return map[string]string{
		"SANDBOX_IMAGE":           SandboxImage,
		"SANDBOX_NODE_SELECTOR":   NodeLabel + ":true",
		"SANDBOX_TOLERATIONS":     TaintKey + "=true:NoSchedule",
		"SANDBOX_USER_NAMESPACE":  "false",
		"DEER_FLOW_HOST_BASE_DIR": base,
		"THREADS_HOST_PATH":       filepath.Join(base, "threads"),
	}
}

// HostBase makes a DeerFlow base directory under dir on the node (this
// machine) in DeerFlow's layout: the shared public skills view, a users
// directory and a threads directory. The kubelet creates a tenant's own
// directories (DirectoryOrCreate roots, subPaths) as root, so users and
// threads are world-writable here, as a sandbox's user must write its
// thread's data.
func HostBase(dir string) (string, error) {
	for _, d := range []string{"skills_view/public", "users", "threads"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return "", err
		}
	}
	for _, d := range []string{"users", "threads"} {
		if err := os.Chmod(filepath.Join(dir, d), 0o777); err != nil {
			return "", err
		}
	}
	return dir, nil
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
	cleanLeftovers(p)
	state, err := os.MkdirTemp("", "rn-")
	if err != nil {
		return nil, err
	}
	n = &Node{State: state, paths: p, cluster: c, opts: o, sysctls: map[string]string{}, Timings: map[string]time.Duration{},
		sock: filepath.Join(state, "containerd.sock")}
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
		{"containerd", func() error { return n.startContainerd(ctx) }},
		{"images", func() error { return n.importImages(ctx) }},
		{"kubelet", func() error { return n.startKubelet(ctx) }},
		{"kube-proxy", func() error { return n.startKubeProxy(ctx) }},
		{"node Ready", func() error { return n.waitNodeReady(ctx) }},
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
	old, _ := filepath.Glob(prefix + "*")
	for _, dir := range old {
		(&Node{State: dir}).unmountAll()
		_ = os.RemoveAll(dir)
	}
}

// HostIP is this machine's address (the real node's), on the interface
// holding the default route.
func HostIP() string { return hostIP() }

// hostIP is the address of the interface holding the default route.
func hostIP() string {
	out, err := exec.Command("ip", "-4", "-o", "route", "get", "203.0.113.1").Output()
	if err != nil {
		return "127.0.0.1"
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "src" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return "127.0.0.1"
}

// The kernel settings the parts change (the kubelet, the bridge, kube-proxy)
// or need; Down restores what was there.
var sysctls = map[string]string{
	"net/ipv4/ip_forward":                  "1",
	"net/ipv4/conf/all/route_localnet":     "1",
	"net/bridge/bridge-nf-call-iptables":   "1",
	"net/bridge/bridge-nf-call-ip6tables":  "1",
	"vm/overcommit_memory":                 "",
	"kernel/panic":                         "",
	"kernel/panic_on_oops":                 "",
	"net/ipv4/conf/all/rp_filter":          "",
	"net/netfilter/nf_conntrack_max":       "",
	"net/ipv4/vs/conntrack":                "",
	"net/ipv4/conf/default/route_localnet": "",
}

func (n *Node) saveAndSetSysctls() error {
	for k, v := range sysctls {
		path := filepath.Join("/proc/sys", k)
		old, err := os.ReadFile(path)
		if err != nil {
			continue // not on this kernel
		}
		n.sysctls[path] = strings.TrimSpace(string(old))
		if v != "" {
			if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
				return fmt.Errorf("setting %s: %w", k, err)
			}
		}
	}
	return nil
}

// writeCredentials issues client certificates signed by the cluster's CA:
// the kubelet's passes the Node authorizer (O=system:nodes), kube-proxy's is
// the system:kube-proxy user.
func (n *Node) writeCredentials() error {
	caPEM, err := os.ReadFile(filepath.Join(n.cluster.PKIDir, "ca.crt"))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(filepath.Join(n.cluster.PKIDir, "ca.key"))
	if err != nil {
		return err
	}
	cb, _ := pem.Decode(caPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return errors.New("the cluster's CA is not PEM")
	}
	ca, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return err
	}
	var caKey any
	if caKey, err = x509.ParsePKCS1PrivateKey(kb.Bytes); err != nil {
		if caKey, err = x509.ParsePKCS8PrivateKey(kb.Bytes); err != nil {
			return fmt.Errorf("the cluster's CA key: %w", err)
		}
	}
	if _, ok := caKey.(*rsa.PrivateKey); !ok {
		if _, ok := caKey.(*ecdsa.PrivateKey); !ok {
			return fmt.Errorf("the cluster's CA key is a %T", caKey)
		}
	}
	for _, id := range []struct{ file, cn, org string }{
		{"kubelet", "system:node:" + Name, "system:nodes"},
		{"kube-proxy", "system:kube-proxy", ""},
	} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		subject := pkix.Name{CommonName: id.cn}
		if id.org != "" {
			subject.Organization = []string{id.org}
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: subject,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			return err
		}
		crt, k := filepath.Join(n.State, id.file+".crt"), filepath.Join(n.State, id.file+".key")
		if err := os.WriteFile(crt, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			return err
		}
		if err := os.WriteFile(k, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
			return err
		}
		kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: %q}
users:
- name: %s
  user: {client-certificate: %q, client-key: %q}
contexts:
- name: test
  context: {cluster: test, user: %s}
current-context: test
`, n.cluster.Host, filepath.Join(n.cluster.PKIDir, "ca.crt"), id.file, crt, k, id.file)
		if err := os.WriteFile(filepath.Join(n.State, id.file+".kubeconfig"), []byte(kubeconfig), 0o600); err != nil {
			return err
		}
	}
	return nil
}

// start runs a part in the background, its output in <state>/<name>.log.
func (n *Node) start(name string, env []string, bin string, args ...string) error {
	logf, err := os.Create(filepath.Join(n.State, name+".log"))
	if err != nil {
		return err
	}
	n.logFiles = append(n.logFiles, logf)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: Down signals the part, not the test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	n.procs = append(n.procs, cmd)
	return nil
}

// Log returns the tail of a part's log, for failure messages.
func (n *Node) Log(name string, lines int) string {
	b, err := os.ReadFile(filepath.Join(n.State, name+".log"))
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

func (n *Node) ctr(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(n.paths.NodeBin, "ctr"), append([]string{"--address", n.sock, "--namespace", "k8s.io"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

func poll(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		last = err
		return ok, nil
	})
	if err != nil {
		return fmt.Errorf("%s not within %s (last: %v)", what, timeout, last)
	}
	return nil
}

// startContainerd writes containerd's configuration (CRI with runc from
// Debian, the bridge CNI, the local pause image pinned) and starts it.
func (n *Node) startContainerd(ctx context.Context) error {
	for _, d := range []string{"containerd/root", "containerd/state", "cni/net.d", "cni/ipam", "runc"} {
		if err := os.MkdirAll(filepath.Join(n.State, d), 0o755); err != nil {
			return err
		}
	}
	runc, _ := exec.LookPath("runc")
	// This machine's root lacks CAP_SYS_RESOURCE: runc cannot lower
	// oom_score_adj below containerd's own, which the kubelet asks for
	// (-998, -997), so every container would fail to start without the
	// restriction.
	config := fmt.Sprintf(`version = 3
root = %[1]q
state = %[2]q

[grpc]
  address = %[3]q

[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = 'localhost/pause:e2e'
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = 'io.containerd.runc.v2'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = %[4]q
          SystemdCgroup = false
          Root = %[5]q
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[6]q]
      conf_dir = %[7]q
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
`, filepath.Join(n.State, "containerd/root"), filepath.Join(n.State, "containerd/state"), n.sock, runc,
		filepath.Join(n.State, "runc"), n.paths.CNIBin, filepath.Join(n.State, "cni/net.d"))
	if err := os.WriteFile(filepath.Join(n.State, "containerd.toml"), []byte(config), 0o644); err != nil {
		return err
	}
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "real-node",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, bridgeName, filepath.Join(n.State, "cni/ipam"), PodCIDR)
	if err := os.WriteFile(filepath.Join(n.State, "cni/net.d/10-bridge.conflist"), []byte(cni), 0o644); err != nil {
		return err
	}
	path := "PATH=" + n.paths.NodeBin + ":" + os.Getenv("PATH")
	if err := n.start("containerd", []string{path}, filepath.Join(n.paths.NodeBin, "containerd"), "--config", filepath.Join(n.State, "containerd.toml")); err != nil {
		return err
	}
	return poll(ctx, 30*time.Second, "containerd answering", func(ctx context.Context) (bool, error) {
		_, err := n.ctr(ctx, "version")
		return err == nil, err
	})
}

// importImages loads the images built here and pins them: they can never be
// pulled again, so image garbage collection must not delete them.
func (n *Node) importImages(ctx context.Context) error {
	for _, img := range []struct{ file, ref string }{
		{"pause.tar", "localhost/pause:e2e"},
		{"sandbox.tar", SandboxImage},
		{"kube-network-policies.tar", policyAgentImage()},
	} {
		if _, err := n.ctr(ctx, "images", "import", "--platform", "linux/amd64", filepath.Join(n.paths.ImagesDir, img.file)); err != nil {
			return err
		}
	}
	for _, archive := range n.opts.Images {
		if _, err := n.ctr(ctx, "images", "import", "--platform", "linux/amd64", archive); err != nil {
			return err
		}
	}
	out, err := n.ctr(ctx, "images", "list", "--quiet")
	if err != nil {
		return err
	}
	for _, ref := range strings.Fields(string(out)) {
		if _, err := n.ctr(ctx, "images", "label", ref, "io.cri-containerd.pinned=pinned"); err != nil {
			return err
		}
	}
	return nil
}

func (n *Node) startKubelet(ctx context.Context) error {
	taints := fmt.Sprintf("registerWithTaints:\n- {key: %s, value: \"true\", effect: NoSchedule}\n", TaintKey)
	if n.opts.Untainted {
		taints = ""
	}
	config := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://%[1]s
imageServiceEndpoint: unix://%[1]s
podLogsDir: %[2]s
address: 0.0.0.0
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %[3]q}
authorization: {mode: Webhook}
registerNode: true
%[4]sfailSwapOn: false
resolvConf: /etc/resolv.conf
clusterDNS: [%[5]s]
clusterDomain: cluster.local
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 5%%, imagefs.available: 5%%}
syncFrequency: 5s
nodeStatusUpdateFrequency: 5s
`, n.sock, filepath.Join(n.State, "kubelet/pod-logs"), filepath.Join(n.cluster.PKIDir, "ca.crt"), taints, ClusterDNSIP)
	if err := os.MkdirAll(filepath.Join(n.State, "kubelet/pod-logs"), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.State, "kubelet.yaml"), []byte(config), 0o644); err != nil {
		return err
	}
	return n.start("kubelet", nil, filepath.Join(n.paths.KubeBin, "kubelet"),
		"--config", filepath.Join(n.State, "kubelet.yaml"),
		"--kubeconfig", filepath.Join(n.State, "kubelet.kubeconfig"),
		"--cert-dir", filepath.Join(n.State, "kubelet/pki"),
		"--root-dir", filepath.Join(n.State, "kubelet/root"),
		"--hostname-override", Name,
		"--node-ip", n.HostIP,
		"--node-labels", NodeLabel+"=true",
		"--v", "1")
}

// startKubeProxy runs kube-proxy in iptables mode, as a kubeadm cluster
// does, with its default minSyncPeriod of one second: after a sync, the
// next waits until a second has passed, so a new Service's endpoints (a
// sandbox Pod turning Ready, or a claimed Pod's new Service) reach its
// rules up to a second after the API server has them. 0s would read as
// unset and become 1s all the same. The benchmarks' DeerFlow views measure
// that second; Headless Services leave kube-proxy out of the path.
func (n *Node) startKubeProxy(ctx context.Context) error {
	config := fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %q}
hostnameOverride: %s
mode: iptables
clusterCIDR: %s
nodePortAddresses: ["127.0.0.0/8", "%s/32"]
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
iptables: {localhostNodePorts: true, syncPeriod: 5s, minSyncPeriod: 1s}
`, filepath.Join(n.State, "kube-proxy.kubeconfig"), Name, PodCIDR, n.HostIP)
	if err := os.WriteFile(filepath.Join(n.State, "kube-proxy.yaml"), []byte(config), 0o644); err != nil {
		return err
	}
	return n.start("kube-proxy", nil, filepath.Join(n.paths.KubeBin, "kube-proxy"), "--config", filepath.Join(n.State, "kube-proxy.yaml"), "--v", "1")
}

func (n *Node) waitNodeReady(ctx context.Context) error {
	err := poll(ctx, 90*time.Second, "node "+Name+" Ready", func(ctx context.Context) (bool, error) {
		node, err := n.cluster.Client.CoreV1().Nodes().Get(ctx, Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				return c.Status == corev1.ConditionTrue, fmt.Errorf("Ready=%s: %s", c.Status, c.Message)
			}
		}
		return false, errors.New("no Ready condition yet")
	})
	if err != nil {
		return fmt.Errorf("%w\nkubelet log:\n%s", err, n.Log("kubelet", 15))
	}
	return nil
}

// startPolicyAgent runs kube-network-policies as a privileged hostNetwork
// Pod on the node (it reads only in-cluster configuration). The API server's
// certificate names 127.0.0.1, not the kubernetes Service's address, so the
// agent talks to it over the host network.
func (n *Node) startPolicyAgent(ctx context.Context, apiPort string) error {
	cs := n.cluster.Client
	const ns, name = "kube-system", "kube-network-policies"
	objs := []func() error{
		func() error {
			_, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{
				{APIGroups: []string{""}, Resources: []string{"pods", "namespaces", "nodes"}, Verbs: []string{"list", "watch"}},
				{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
			}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
				RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
				Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}}}, metav1.CreateOptions{})
			return err
		},
		func() error {
			_, err := cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
				Spec: corev1.PodSpec{
					NodeName: Name, HostNetwork: true, ServiceAccountName: name,
					Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
					Containers: []corev1.Container{{
						Name: "netpol", Image: policyAgentImage(), ImagePullPolicy: corev1.PullNever,
						Command:         []string{"/bin/netpol", "--hostname-override=" + Name, "--v=2", "--nfqueue-id=98", "--metrics-bind-address=127.0.0.1:9080"},
						Env:             []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: "127.0.0.1"}, {Name: "KUBERNETES_SERVICE_PORT", Value: apiPort}},
						SecurityContext: &corev1.SecurityContext{Privileged: ptr.To(true)},
					}},
				},
			}, metav1.CreateOptions{})
			return err
		},
	}
	for _, create := range objs {
		if err := create(); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return poll(ctx, 60*time.Second, "kube-network-policies Running", func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		// Its nftables table exists once it has synced.
		if p.Status.Phase == corev1.PodRunning {
			err := exec.CommandContext(ctx, "nft", "list", "table", "inet", "kube-network-policies").Run()
			return err == nil, fmt.Errorf("running, table: %v", err)
		}
		return false, fmt.Errorf("phase %s: %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
}

// startClusterDNS gives the cluster the DNS every Pod's resolv.conf names
// (the kubelet's clusterDNS): the kube-dns Service at ClusterDNSIP, served by
// a Pod in kube-system labelled k8s-app=kube-dns, as CoreDNS's is, so the
// sandbox policy's DNS rule selects it. The Pod runs the sandbox stand-in's
// DNS server, a stand-in for CoreDNS: it answers every A query with
// ClusterDNSAnswer. Port 53 is below the unprivileged ports for the image's
// user, so the Pod lowers that bound (a sysctl the kubelet allows).
func (n *Node) startClusterDNS(ctx context.Context) error {
	cs := n.cluster.Client
	const ns, name = "kube-system", "kube-dns"
	labels := map[string]string{"k8s-app": name}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: labels},
		Spec: corev1.ServiceSpec{ClusterIP: ClusterDNSIP, Selector: labels, Ports: []corev1.ServicePort{
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53)},
			{Name: "dns-tcp", Protocol: corev1.ProtocolTCP, Port: 53, TargetPort: intstr.FromInt32(53)},
		}},
	}
	if _, err := cs.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "coredns-standin", Namespace: ns, Labels: labels},
		Spec: corev1.PodSpec{
			NodeName: Name, Tolerations: []corev1.Toleration{Toleration}, AutomountServiceAccountToken: ptr.To(false),
			// Its own resolver is the node's: it must not ask itself.
			DNSPolicy:       corev1.DNSDefault,
			SecurityContext: &corev1.PodSecurityContext{Sysctls: []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "53"}}},
			Containers: []corev1.Container{{
				Name: "dns", Image: SandboxImage, ImagePullPolicy: corev1.PullNever,
				Env:            []corev1.EnvVar{{Name: "SANDBOX_DNS_ADDR", Value: ":53"}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/v1/sandbox", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return poll(ctx, 60*time.Second, "the cluster DNS stand-in Ready", func(ctx context.Context) (bool, error) {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return Ready(p), fmt.Errorf("phase %s: %+v", p.Status.Phase, p.Status.ContainerStatuses)
	})
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// startSurroundings builds what the attack tests aim at outside the cluster:
// a "public" host (a network namespace at PublicIP, reached through a veth,
// serving HTTP on 80 and DNS on 53), the off-node hosts on denied addresses
// (OffNodeHosts, built the same way), a web server on the metadata address
// and a resolver on the node's own address (port 53, as a node-local cache
// or a dnsmasq would be). All run the sandbox stand-in's binary, taken from
// its image.
func (n *Node) startSurroundings(ctx context.Context) error {
	bin := filepath.Join(n.State, "standin")
	if err := extractEntrypoint(filepath.Join(n.paths.ImagesDir, "sandbox.tar"), bin); err != nil {
		return err
	}
	hosts := append([]OffNodeHost{{What: "the public host", IP: PublicIP, gw: "203.0.113.1", ns: publicNS, veth: publicVeth}}, OffNodeHosts...)
	var cmds [][]string
	for _, h := range hosts {
		cmds = append(cmds,
			[]string{"ip", "netns", "add", h.ns},
			[]string{"ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
			[]string{"ip", "addr", "add", h.gw + "/24", "dev", h.veth},
			[]string{"ip", "link", "set", h.veth, "up"},
			[]string{"ip", "-n", h.ns, "addr", "add", h.IP + "/24", "dev", "eth0"},
			[]string{"ip", "-n", h.ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", h.ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", h.ns, "route", "add", "default", "via", h.gw})
	}
	// This kernel has no dummy devices: the metadata address goes on lo.
	cmds = append(cmds, []string{"ip", "addr", "add", MetadataIP + "/32", "dev", "lo"})
	for _, c := range cmds {
		if err := run(ctx, c[0], c[1:]...); err != nil {
			return err
		}
	}
	for _, h := range hosts {
		if err := n.start(h.ns, []string{"SANDBOX_ADDR=" + h.IP + ":80", "SANDBOX_DNS_ADDR=" + h.IP + ":53"}, "ip", "netns", "exec", h.ns, bin); err != nil {
			return err
		}
	}
	if err := n.start("metadata", []string{"SANDBOX_ADDR=" + MetadataIP + ":80", "SANDBOX_DNS_ADDR=" + n.NodeResolver()}, bin); err != nil {
		return err
	}
	return poll(ctx, 10*time.Second, "public host, off-node hosts and metadata listener", func(ctx context.Context) (bool, error) {
		addrs := []string{MetadataIP + ":80"}
		for _, h := range hosts {
			addrs = append(addrs, net.JoinHostPort(h.IP, "80"))
		}
		for _, addr := range addrs {
			c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return false, err
			}
			c.Close()
		}
		return true, nil
	})
}

// NodeResolver is the DNS server on the node's own address.
func (n *Node) NodeResolver() string { return net.JoinHostPort(n.HostIP, "53") }

// removeSurroundings deletes the Pods' bridge and what startSurroundings
// made (the processes are stopped by then): deleting a veth's node end deletes its peer, deleting a
// namespace what is left in it.
func removeSurroundings() {
	_ = exec.Command("ip", "link", "del", bridgeName).Run()
	for _, h := range append([]OffNodeHost{{ns: publicNS, veth: publicVeth}}, OffNodeHosts...) {
		_ = exec.Command("ip", "link", "del", h.veth).Run()
		_ = exec.Command("ip", "netns", "del", h.ns).Run()
	}
	_ = exec.Command("ip", "addr", "del", MetadataIP+"/32", "dev", "lo").Run()
}

// ImportOCILayout imports an OCI image layout directory (as func's host
// builder writes it) into the node's runtime as ref, pinned.
func (n *Node) ImportOCILayout(ctx context.Context, dir, ref string) error {
	archive := filepath.Join(n.State, "import.tar")
	if err := run(ctx, "tar", "-C", dir, "-cf", archive, "."); err != nil {
		return err
	}
	defer os.Remove(archive)
	if _, err := n.ctr(ctx, "images", "import", "--platform", "linux/amd64", "--index-name", ref, archive); err != nil {
		return err
	}
	_, err := n.ctr(ctx, "images", "label", ref, "io.cri-containerd.pinned=pinned")
	return err
}

// ImportArchive imports an image archive (docker save or OCI) into the
// node's runtime and pins ref, which the archive must hold: an operator's
// own sandbox image, which nothing on this machine can pull.
func (n *Node) ImportArchive(ctx context.Context, archive, ref string) error {
	if _, err := n.ctr(ctx, "images", "import", "--platform", "linux/amd64", archive); err != nil {
		return err
	}
	if _, err := n.ctr(ctx, "images", "label", ref, "io.cri-containerd.pinned=pinned"); err != nil {
		return fmt.Errorf("%s holds no image %s: %w", archive, ref, err)
	}
	return nil
}

// NodeGuardTable is the nftables table config/node/sandbox-node-guard.nft
// creates.
const NodeGuardTable = "deer-flow-sandbox-node-guard"

// ApplyNodeGuard applies an nft ruleset file (config/node's guard) on the
// node, with its POD_CIDRS set to this node's Pod range.
func (n *Node) ApplyNodeGuard(ctx context.Context, file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	rules := strings.Replace(string(b), "define POD_CIDRS = { 10.88.0.0/16 }", "define POD_CIDRS = { "+PodCIDR+" }", 1)
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f %s: %w: %s", file, err, out)
	}
	return nil
}

// RemoveNodeGuard deletes the guard's table.
func (n *Node) RemoveNodeGuard() {
	_ = exec.Command("nft", "delete", "table", "inet", NodeGuardTable).Run()
}

// Down stops everything Up started and undoes its changes to the machine.
func (n *Node) Down() {
	if n == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Containers first, while containerd still answers; then the parts.
	if out, err := n.ctr(ctx, "tasks", "list", "--quiet"); err == nil {
		for _, id := range strings.Fields(string(out)) {
			_, _ = n.ctr(ctx, "tasks", "kill", "--signal", "SIGKILL", id)
		}
	}
	for i := len(n.procs) - 1; i >= 0; i-- {
		p := n.procs[i]
		_ = syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	// Shims outlive containerd: end the ones serving this node's socket.
	_ = exec.Command("pkill", "-KILL", "-f", "containerd-shim-runc-v2 .*"+n.sock).Run()
	_ = exec.Command(filepath.Join(n.paths.KubeBin, "kube-proxy"), "--cleanup").Run()
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

// extractEntrypoint copies the one executable of a single-layer OCI image
// archive (as test/images/mkimage writes them) to dst: the layer is the blob
// that reads as a tar holding an executable file.
func extractEntrypoint(archive, dst string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			return fmt.Errorf("%s: no layer with an executable: %w", archive, err)
		}
		if !strings.HasPrefix(h.Name, "blobs/sha256/") {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		lr := tar.NewReader(bytes.NewReader(body))
		for {
			lh, err := lr.Next()
			if err != nil {
				break // not a layer, or no executable in it
			}
			if lh.Typeflag == tar.TypeReg && lh.Mode&0o111 != 0 {
				b, err := io.ReadAll(lr)
				if err != nil {
					return err
				}
				return os.WriteFile(dst, b, 0o755)
			}
		}
	}
}

// PodGatewayLinkLocal is the node's link-local IPv6 address on the Pods'
// bridge, or "" when it has none: where a Pod reaches the node over IPv6
// even in an IPv4-only cluster.
func (n *Node) PodGatewayLinkLocal() (string, error) {
	out, err := exec.Command("ip", "-6", "-o", "addr", "show", "dev", bridgeName, "scope", "link").Output()
	if err != nil {
		return "", fmt.Errorf("ip -6 addr show dev %s: %w", bridgeName, err)
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "inet6" && i+1 < len(f) {
			ip, _, err := net.ParseCIDR(f[i+1])
			if err != nil {
				return "", err
			}
			return ip.String(), nil
		}
	}
	return "", nil
}

// GlobalIPv6 is an IPv6 address of global scope this machine (the node)
// has, or "" when it has none.
func GlobalIPv6() string {
	out, err := exec.Command("ip", "-6", "-o", "addr", "show", "scope", "global").Output()
	if err != nil {
		return ""
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "inet6" && i+1 < len(f) {
			if ip, _, err := net.ParseCIDR(f[i+1]); err == nil {
				return ip.String()
			}
		}
	}
	return ""
}
