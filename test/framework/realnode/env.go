package realnode

import (
	"os"
	"path/filepath"
)

// FunctionEnv is what the function needs, beyond its base settings, to put
// sandboxes on the real node: the stand-in image, the node's selector and
// toleration, gVisor (config/'s runtime class), no user namespace (this
// node's runtime cannot provide one; the e2e suite shows the kubelet
// refusing), and DeerFlow's host-path mode under base (see HostBase).
func FunctionEnv(base string) map[string]string {
	return map[string]string{
		"SANDBOX_IMAGE":           SandboxImage,
		"SANDBOX_RUNTIME_CLASS":   GVisorRuntimeClass,
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

// NodeBinDir is where the node's own binaries are (containerd's PATH names
// it): a marker of the node's processes that no sandbox may read.
func (n *Node) NodeBinDir() string { return n.paths.NodeBin }
