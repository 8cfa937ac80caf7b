package realnode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

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

// startContainerd writes containerd's configuration (CRI with runc from
// Debian as the default handler, gVisor's runsc as the handler "runsc" when
// make node built it, the bridge CNI, the local pause image pinned) and
// starts it.
func (n *Node) startContainerd(ctx context.Context) error {
	for _, d := range []string{"containerd/root", "containerd/state", "cni/net.d", "cni/ipam", "runc"} {
		if err := os.MkdirAll(filepath.Join(n.State, d), 0o755); err != nil {
			return err
		}
	}
	runc, _ := exec.LookPath("runc")
	runsc, err := n.runscRuntime()
	if err != nil {
		return err
	}
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
%[8]s    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = [%[6]q]
      conf_dir = %[7]q
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
`, filepath.Join(n.State, "containerd/root"), filepath.Join(n.State, "containerd/state"), n.sock, runc,
		filepath.Join(n.State, "runc"), n.paths.CNIBin, filepath.Join(n.State, "cni/net.d"), runsc)
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
