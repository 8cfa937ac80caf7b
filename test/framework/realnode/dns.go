package realnode

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

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
	if err := ensureService(ctx, cs, svc); err != nil {
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
	if err := replacePod(ctx, cs, pod); err != nil {
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
