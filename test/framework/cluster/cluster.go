// Package cluster brings up a real Kubernetes control plane for tests and
// benchmarks: kube-apiserver, scheduler, controller-manager and etcd run as
// local processes by kwokctl, with kwok simulating the nodes. The binaries are
// the ones hack/install-tools.sh caches.
package cluster

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/deerflow-sandbox/provisioner/config/node"
	nodev1 "k8s.io/api/node/v1"
	"sigs.k8s.io/yaml"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/retry"
)

// Cluster is one running kwok cluster.
type Cluster struct {
	Name       string
	Workdir    string
	Kubeconfig string
	Config     *rest.Config
	Client     kubernetes.Interface
	kwokctl    string

	apiserverArgs []string
	// schedulerArgs: kube-scheduler's command line, read at StopAPIServer.
	schedulerArgs []string
}

// CacheDir is where hack/ caches tools and images (hack/lib.sh, CACHE_DIR).
func CacheDir() string {
	if d := os.Getenv("SANDBOX_CACHE_DIR"); d != "" {
		return d
	}
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, _ := os.UserHomeDir()
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "sandbox-provisioner")
}

// EnvOr is the environment variable key, or def when it is unset (how the
// tests find what hack/lib.sh lets one override).
func EnvOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Options shape a cluster beyond its kwok nodes' count.
type Options struct {
	// Nodes is how many kwok nodes to add.
	Nodes int
	// APIServerSANs are more names for the API server's certificate: the
	// kubernetes Service's ClusterIP (10.96.0.1), which in-cluster clients
	// dial, when Pods talk to the API server.
	APIServerSANs []string
	// NodeTaint, when set, is put on every kwok node, so that only Pods that
	// tolerate it land there (the Knative cluster keeps them for its real
	// node).
	NodeTaint *corev1.Taint
}

// Up creates a fresh cluster with nodes fake nodes, in a new work directory.
func Up(ctx context.Context, name string, nodes int) (*Cluster, error) {
	return UpWith(ctx, name, Options{Nodes: nodes})
}

// UpWith creates a fresh cluster shaped by o, in a new work directory.
func UpWith(ctx context.Context, name string, o Options) (*Cluster, error) {
	nodes := o.Nodes
	kubeVersion := EnvOr("KUBE_VERSION", "v1.36.3")
	kubeBin := EnvOr("KUBE_BIN_DIR", filepath.Join(CacheDir(), "kube-"+kubeVersion))
	kwokBin := EnvOr("KWOK_BIN_DIR", filepath.Join(CacheDir(), "kwok-"+EnvOr("KWOK_VERSION", "v0.7.0")))
	etcd := EnvOr("ETCD_BIN", filepath.Join(CacheDir(), "etcd-"+EnvOr("ETCD_VERSION", "v3.6.5"), "etcd"))
	for _, f := range []string{kubeBin + "/kube-apiserver", kwokBin + "/kwokctl", kwokBin + "/kwok", etcd} {
		if _, err := os.Stat(f); err != nil {
			return nil, fmt.Errorf("%s is missing; run hack/install-tools.sh (make tools) first: %w", f, err)
		}
	}
	workdir, err := os.MkdirTemp("", "kwok-"+name+"-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Name: name, Workdir: workdir, kwokctl: kwokBin + "/kwokctl",
		Kubeconfig: filepath.Join(workdir, "clusters", name, "kubeconfig.yaml")}
	var configArgs []string
	if len(o.APIServerSANs) > 0 {
		// Only kwokctl's configuration file takes extra SANs.
		conf := "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokctlConfiguration\noptions:\n  kubeApiserverCertSANs: [" +
			strings.Join(o.APIServerSANs, ", ") + "]\n"
		file := filepath.Join(workdir, "kwokctl.yaml")
		if err := os.WriteFile(file, []byte(conf), 0o600); err != nil {
			_ = os.RemoveAll(workdir)
			return nil, err
		}
		configArgs = []string{"--config", file}
	}
	if err := c.run(ctx, append(configArgs, "create", "cluster", "--runtime", "binary",
		"--kube-apiserver-binary", kubeBin+"/kube-apiserver",
		"--kube-scheduler-binary", kubeBin+"/kube-scheduler",
		"--kube-controller-manager-binary", kubeBin+"/kube-controller-manager",
		"--kwok-controller-binary", kwokBin+"/kwok",
		"--etcd-binary", etcd,
		// kwokctl v0.7.0 files a component's later --extra-args under the
		// position of its first one among all --extra-args, and panics when
		// that is past the components seen so far: so each component's
		// first argument comes before any component's second.
		//
		// The API server's default Service range (a /24) runs out long before
		// the load and list tests do.
		"--extra-args", "kube-apiserver=service-cluster-ip-range=10.96.0.0/16",
		// One scheduler and one controller manager, so no leader election:
		// with it, an API server down for longer than the renew deadline
		// (the fault tests and the soak restart it, under load) makes them
		// exit for a lost lease, and nothing would schedule again.
		"--extra-args", "kube-scheduler=leader-elect=false",
		"--extra-args", "kube-controller-manager=leader-elect=false",
		// kwok fakes only its own nodes (kwokctl scale node annotates them),
		// never the real node's status or its Pods'.
		"--extra-args", "kwok-controller=manage-all-nodes=false",
		"--extra-args", "kwok-controller=manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
		// kwokctl hands out its components' ports counting down from 32767,
		// inside the default NodePort range, and the real node's kube-proxy
		// answers 127.0.0.1:<nodePort>. A sandbox Service given the API
		// server's port as its NodePort would take over every connection to
		// the API server, so NodePorts stay below the ports kwokctl uses.
		"--extra-args", "kube-apiserver=service-node-port-range="+NodePortRange,
		// A real node's logs and exec go through the API server to its
		// kubelet: by address (this machine has no DNS for the node's name),
		// as kwok's admin (the kubelet authorizes it with a
		// SubjectAccessReview).
		"--extra-args", "kube-apiserver=kubelet-preferred-address-types=InternalIP",
		"--extra-args", "kube-apiserver=kubelet-client-certificate="+filepath.Join(workdir, "clusters", name, "pki", "admin.crt"),
		"--extra-args", "kube-apiserver=kubelet-client-key="+filepath.Join(workdir, "clusters", name, "pki", "admin.key"),
		// Projected Pod certificates (podCertificate) are behind a gate
		// that is off by default (beta, with its API group's beta version);
		// with it off the API server drops the field before admission, and
		// the admission policy's refusal of it could not be tested.
		"--extra-args", "kube-apiserver=feature-gates=PodCertificateRequest=true",
		"--extra-args", "kube-apiserver=runtime-config=certificates.k8s.io/v1beta1=true",
		"--kubeconfig", filepath.Join(workdir, "kubeconfig-merged"),
		"--timeout", "120s")...); err != nil {
		_ = os.RemoveAll(workdir)
		return nil, err
	}
	c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		c.Down()
		return nil, err
	}
	if err := c.checkPortOutsideNodePorts(); err != nil {
		c.Down()
		return nil, err
	}
	c.Config.QPS, c.Config.Burst = 500, 1000
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		c.Down()
		return nil, err
	}
	if err := c.WaitReady(ctx, 60*time.Second); err != nil {
		c.Down()
		return nil, err
	}
	if err := c.installRuntimeClass(ctx); err != nil {
		c.Down()
		return nil, err
	}
	if nodes > 0 {
		if err := c.run(ctx, "scale", "node", "--replicas", strconv.Itoa(nodes),
			"--param", ".allocatable.cpu=1000", "--param", `.allocatable.memory="4Ti"`,
			"--param", ".allocatable.pods=5000", "--param", `.allocatable["ephemeral-storage"]="10Ti"`); err != nil {
			c.Down()
			return nil, err
		}
	}
	if o.NodeTaint != nil {
		if err := c.taintKwokNodes(ctx, *o.NodeTaint); err != nil {
			c.Down()
			return nil, err
		}
	}
	return c, nil
}

// installRuntimeClass creates config/node's RuntimeClass gvisor, which
// config/ runs sandboxes under: kwok's nodes fake every Pod whatever its
// handler, and the real node registers runsc as that handler.
func (c *Cluster) installRuntimeClass(ctx context.Context) error {
	var rc nodev1.RuntimeClass
	if err := yaml.UnmarshalStrict(node.RuntimeClassGVisor, &rc); err != nil {
		return fmt.Errorf("config/node/runtimeclass-gvisor.yaml: %w", err)
	}
	if _, err := c.Client.NodeV1().RuntimeClasses().Create(ctx, &rc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create the RuntimeClass %s: %w", rc.Name, err)
	}
	return nil
}

// taintKwokNodes puts t on every node kwok fakes.
func (c *Cluster) taintKwokNodes(ctx context.Context, t corev1.Taint) error {
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, n := range nodes.Items {
		if n.Annotations["kwok.x-k8s.io/node"] != "fake" {
			continue
		}
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			cur, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			cur.Spec.Taints = append(cur.Spec.Taints, t)
			_, err = c.Client.CoreV1().Nodes().Update(ctx, cur, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			return fmt.Errorf("tainting kwok node %s: %w", n.Name, err)
		}
	}
	return nil
}

// NodePortRange is the test clusters' NodePort range: below the ports
// kwokctl gives the control plane (it counts down from 32767, skipping the
// ones in use).
const (
	NodePortRange   = "30000-31999"
	minTestNodePort = 30000
	maxTestNodePort = 31999
)

// checkPortOutsideNodePorts fails when the API server landed inside the
// NodePort range, where kube-proxy could redirect its port to a sandbox.
func (c *Cluster) checkPortOutsideNodePorts() error {
	u, err := url.Parse(c.Config.Host)
	if err != nil {
		return fmt.Errorf("API server address %q: %w", c.Config.Host, err)
	}
	if port, err := strconv.Atoi(u.Port()); err == nil && port >= minTestNodePort && port <= maxTestNodePort {
		return fmt.Errorf("kwokctl put the API server on port %d, inside the NodePort range %s; "+
			"close whatever holds the ports above %d and run again", port, NodePortRange, maxTestNodePort)
	}
	return nil
}

func (c *Cluster) run(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, c.kwokctl, append([]string{"--name", c.Name}, args...)...)
	cmd.Env = append(os.Environ(), "KWOK_WORKDIR="+c.Workdir, "KWOK_KUBE_VERSION="+EnvOr("KUBE_VERSION", "v1.36.3"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("kwokctl %v: %w\n%s", args, err, out.String())
	}
	return nil
}

// PKIDir holds the cluster's CA (ca.crt, ca.key), which signs the real
// node's client certificates.
func (c *Cluster) PKIDir() string { return filepath.Join(c.Workdir, "clusters", c.Name, "pki") }

// WaitReady waits until the API server answers /readyz.
func (c *Cluster) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		cancel()
		if err == nil && string(body) == "ok" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("API server not ready after %s: %v", timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// StopAPIServer kills the kube-apiserver (etcd, the controllers and kwok
// stay up): an API server outage. kwokctl's own stop/start would do, but a
// kwok controller restarted that way stops moving Pods to Running.
func (c *Cluster) StopAPIServer() error {
	pidFile := filepath.Join(c.Workdir, "clusters", c.Name, "pids", "kube-apiserver.pid")
	raw, err := os.ReadFile(pidFile)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return fmt.Errorf("%s: %w", pidFile, err)
	}
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return err
	}
	c.apiserverArgs = strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	if spid, err := c.pid("kube-scheduler"); err == nil {
		if raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", spid)); err == nil {
			c.schedulerArgs = strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		}
	}
	proc, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	if err := proc.Kill(); err != nil {
		return err
	}
	// Wait until the port is closed, so callers really see an outage.
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
			return nil
		}
		if st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); strings.Contains(string(st), ") Z ") {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver %d did not exit", pid)
}

// StartAPIServer runs the kube-apiserver stopped by StopAPIServer again, with
// the same arguments, and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	if len(c.apiserverArgs) == 0 {
		return fmt.Errorf("kube-apiserver was not stopped by StopAPIServer")
	}
	if err := c.start("kube-apiserver", c.apiserverArgs); err != nil {
		return err
	}
	if err := c.WaitReady(ctx, 60*time.Second); err != nil {
		return err
	}
	go c.superviseScheduler(time.Minute)
	return nil
}

// start starts a component of the cluster with args, as kwokctl did, and
// records its pid.
func (c *Cluster) start(name string, args []string) error {
	dir := filepath.Join(c.Workdir, "clusters", c.Name)
	logf, err := os.OpenFile(filepath.Join(dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	go func() { _ = cmd.Wait() }()
	return os.WriteFile(filepath.Join(dir, "pids", name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644)
}

// pid is the recorded pid of a component of the cluster.
func (c *Cluster) pid(name string) (int, error) {
	raw, err := os.ReadFile(filepath.Join(c.Workdir, "clusters", c.Name, "pids", name+".pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(raw)))
}

// superviseScheduler starts kube-scheduler again, with its own arguments,
// should it exit within d of an API server restart, as a control plane's
// supervisor (the kubelet of a static Pod, systemd) would. It does exit on
// its own there: a bind whose answer the outage cut, retried, can leave
// its cache "corrupted" ("Pod updated on a different node than previously
// added to"), and it then stops; without it no Pod is scheduled again.
func (c *Cluster) superviseScheduler(d time.Duration) {
	if len(c.schedulerArgs) == 0 {
		return
	}
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(500 * time.Millisecond) {
		pid, err := c.pid("kube-scheduler")
		if err != nil {
			return
		}
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err == nil && !strings.Contains(string(st), ") Z ") {
			continue
		}
		if err := c.start("kube-scheduler", c.schedulerArgs); err != nil {
			return
		}
	}
}

// Down deletes the cluster and its work directory.
func (c *Cluster) Down() {
	_ = c.run(context.Background(), "delete", "cluster")
	_ = os.RemoveAll(c.Workdir)
}

// EnsureNamespace creates ns if it does not exist.
func (c *Cluster) EnsureNamespace(ctx context.Context, ns string) error {
	_, err := c.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return nil
}
