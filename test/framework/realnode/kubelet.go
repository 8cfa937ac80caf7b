package realnode

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// startKubelet starts the node's kubelet. Its disk eviction thresholds are
// absolute (2Gi), not the kubelet's percentages: this node shares a
// developer's or CI machine's disk with Go's caches, and 5 % of a large
// disk (12.6 GB of 252 GB; kind sets 0 %) tainted the node with disk
// pressure while gigabytes were free, failing every later test for a
// reason that is not theirs.
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
evictionHard: {memory.available: 100Mi, nodefs.available: 2Gi, imagefs.available: 2Gi}
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

func (n *Node) waitNodeReady(ctx context.Context) error {
	err := poll(ctx, 90*time.Second, "node "+Name+" Ready", func(ctx context.Context) (bool, error) {
		node, err := n.cluster.Client.CoreV1().Nodes().Get(ctx, Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, c := range node.Status.Conditions {
			if c.Type == corev1.NodeReady {
				if !heartbeatSince(c, n.since) {
					return false, fmt.Errorf("Ready=%s, written by an earlier kubelet at %s", c.Status, c.LastHeartbeatTime)
				}
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
