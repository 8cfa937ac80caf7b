package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	nodev1 "k8s.io/api/node/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	confignode "github.com/deerflow-sandbox/provisioner/config/node"
)

const (
	// GVisorRuntimeClass is the RuntimeClass config/node/runtimeclass-gvisor.yaml
	// defines and Up applies when the node runs gVisor.
	GVisorRuntimeClass = "gvisor"
	// GVisorHandler is the node's containerd runtime handler for gVisor.
	GVisorHandler = "runsc"
	// GVisorPlatform is how runsc's kernel (the Sentry) intercepts the
	// sandbox's system calls here. systrap (seccomp SIGSYS traps, with a
	// fast path) is gVisor's default and needs nothing of the machine:
	// `runsc do uname -r` takes 0.20 s here. kvm does not work on this
	// machine although /dev/kvm exists and creates VMs and vCPUs: the
	// sandbox boots and execs the application, then spins at 90% CPU and
	// never finishes (`runsc --platform=kvm do uname -r` gave no output in
	// 10 minutes; nested virtualisation, the CPU shows no vmx or svm). ptrace
	// works (0.27 s) but is slower: every system call is two context switches
	// to the tracer.
	GVisorPlatform = "systrap"
)

// gvisorParts says why the node cannot register the runsc handler, or nil.
func gvisorParts(p Paths) error {
	for _, f := range []string{"runsc", "containerd-shim-runsc-v1"} {
		if _, err := os.Stat(filepath.Join(p.GVisorBin, f)); err != nil {
			return fmt.Errorf("%s is missing: hack/install-node.sh (make node) builds gVisor: %w", filepath.Join(p.GVisorBin, f), err)
		}
	}
	return nil
}

// GVisor says why this node has no runsc handler and no RuntimeClass
// gvisor, or nil when it has both.
func (n *Node) GVisor() error { return n.gvisorErr }

// runscRuntime writes runsc's configuration for containerd's runsc shim
// (the file its ConfigPath option names) and returns the handler's section
// of containerd's configuration, or "" when gVisor is not installed.
//
// The shim reads binary_name, root and log_path (a directory: one
// runsc-shim-<id>.log per container); runsc_config holds runsc's own flags,
// which it passes to every runsc command:
//   - platform: see GVisorPlatform;
//   - network "sandbox": gVisor's own network stack (netstack) inside the
//     Pod's network namespace, which the CNI set up; the host's stack never
//     parses the sandbox's packets;
//   - oci-seccomp: the Pod's seccomp profile (RuntimeDefault) applies inside
//     gVisor too, to the sandbox's calls into the Sentry, as runc applies it
//     to calls into the node's kernel: one more layer, and the attack
//     table's syscall rows are refused under both runtimes for the same
//     reason (runsc ignores the profile without it);
//   - overlay2, not set, is runsc's default root:self: the root filesystem's
//     writes go to a tmpfs inside the sandbox, backed by a file in the
//     container's root directory, so the image on the node is never
//     written and the kubelet counts the writes against the Pod's ephemeral
//     storage. root:memory would move them into the Pod's memory to save
//     the ~5 ms the backing file takes to create per container, which the
//     create → Ready benchmark cannot tell from its noise.
//
// runsc's own logs (debug-log: one file per runsc command, boot, gofer,
// create, start, state, kill, …, thousands of files in one directory per
// benchmark run) are written only with RUNSC_DEBUG_LOG=1: they are for
// debugging a sandbox that fails, not needed to run one, and every runsc
// command the shim makes on the way to a Ready sandbox would write one.
// Without them runsc still writes its panics to the Pod's log directory
// (gvisor_panic.log, the shim's --panic-log), and the shim still logs.
//
// runsc manages cgroups itself and handles this machine's cgroup v1
// hierarchy (cgroupfs, as the kubelet's); it applies the Pod's limits to its
// sandbox process.
func (n *Node) runscRuntime() (string, error) {
	if n.gvisorErr = gvisorParts(n.paths); n.gvisorErr != nil {
		return "", nil
	}
	dir := filepath.Join(n.State, "runsc")
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return "", err
	}
	config := fmt.Sprintf(`binary_name = %q
root = %q
log_path = %q

[runsc_config]
  platform = %q
  network = 'sandbox'
  oci-seccomp = 'true'
`, filepath.Join(n.paths.GVisorBin, "runsc"), filepath.Join(dir, "root"), filepath.Join(dir, "logs")+"/", GVisorPlatform)
	if os.Getenv("RUNSC_DEBUG_LOG") == "1" {
		config += fmt.Sprintf("  debug-log = %q\n", filepath.Join(dir, "logs")+"/")
	}
	path := filepath.Join(dir, "runsc.toml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return "", err
	}
	return fmt.Sprintf(`      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s]
        runtime_type = 'io.containerd.runsc.v1'
        runtime_path = %[2]q
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.%[1]s.options]
          TypeUrl = 'io.containerd.runsc.v1.options'
          ConfigPath = %[3]q
`, GVisorHandler, filepath.Join(n.paths.GVisorBin, "containerd-shim-runsc-v1"), path), nil
}

// applyRuntimeClass creates config/node's RuntimeClass gvisor in the
// cluster when the node has the runsc handler, and leaves one that exists
// as it is. Without gVisor it creates nothing: a cluster that cannot run
// the class does not claim it.
func (n *Node) applyRuntimeClass(ctx context.Context) error {
	if n.gvisorErr != nil {
		return nil
	}
	var rc nodev1.RuntimeClass
	if err := yaml.UnmarshalStrict(confignode.RuntimeClassGVisor, &rc); err != nil {
		return fmt.Errorf("config/node/runtimeclass-gvisor.yaml: %w", err)
	}
	if rc.Name != GVisorRuntimeClass || rc.Handler != GVisorHandler {
		return fmt.Errorf("config/node/runtimeclass-gvisor.yaml defines %s with handler %s, want %s with %s", rc.Name, rc.Handler, GVisorRuntimeClass, GVisorHandler)
	}
	_, err := n.cluster.Client.NodeV1().RuntimeClasses().Create(ctx, &rc, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}
