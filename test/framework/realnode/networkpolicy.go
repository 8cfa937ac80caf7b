package realnode

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// policyAgentImage is the reference hack/node-images.sh gives the patched
// kube-network-policies.
func policyAgentImage() string {
	v := os.Getenv("KNP_VERSION")
	if v == "" {
		v = "v0.7.0"
	}
	return "localhost/kube-network-policies:" + v + "-xtq"
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
			return replacePod(ctx, cs, &corev1.Pod{
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
			})
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
