package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
)

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
