package sandbox

import (
	"net"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// BuildNetworkPolicy isolates one sandbox: ingress only on the sandbox port and
// only from the configured peers (everyone when none are configured, as a
// NodePort must be reachable), egress anywhere allowed except the denied
// ranges (the cloud metadata address by default). DNS stays open.
func BuildNetworkPolicy(cfg *config.Config, s Spec, pod *corev1.Pod) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(cfg.ContainerPort)
	ingress := networkingv1.NetworkPolicyIngressRule{
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: &port}},
	}
	if len(cfg.IngressFromPodLabels) > 0 || len(cfg.IngressFromNamespace) > 0 {
		peer := networkingv1.NetworkPolicyPeer{}
		if len(cfg.IngressFromPodLabels) > 0 {
			peer.PodSelector = &metav1.LabelSelector{MatchLabels: cfg.IngressFromPodLabels}
		}
		if len(cfg.IngressFromNamespace) > 0 {
			peer.NamespaceSelector = &metav1.LabelSelector{MatchLabels: cfg.IngressFromNamespace}
		}
		ingress.From = []networkingv1.NetworkPolicyPeer{peer}
	}

	var egressPeers []networkingv1.NetworkPolicyPeer
	for _, allow := range cfg.EgressAllowCIDRs {
		block := &networkingv1.IPBlock{CIDR: allow}
		for _, deny := range cfg.EgressDenyCIDRs {
			if cidrWithin(deny, allow) {
				block.Except = append(block.Except, deny)
			}
		}
		egressPeers = append(egressPeers, networkingv1.NetworkPolicyPeer{IPBlock: block})
	}
	egress := []networkingv1.NetworkPolicyEgressRule{{
		Ports: []networkingv1.NetworkPolicyPort{
			{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))},
			{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(53))},
		},
	}}
	if len(egressPeers) > 0 {
		egress = append(egress, networkingv1.NetworkPolicyEgressRule{To: egressPeers})
	}

	return &networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            NetworkPolicyName(s.ID),
			Namespace:       cfg.Namespace,
			Labels:          labels(s),
			OwnerReferences: []metav1.OwnerReference{ownerRef(pod)},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelID: s.ID}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{ingress},
			Egress:      egress,
		},
	}
}

// cidrWithin reports whether inner lies inside outer; the API server refuses
// an except that is not inside its block, or of the other IP family.
func cidrWithin(inner, outer string) bool {
	_, in, err1 := net.ParseCIDR(inner)
	_, out, err2 := net.ParseCIDR(outer)
	if err1 != nil || err2 != nil || len(in.IP) != len(out.IP) {
		return false
	}
	inOnes, _ := in.Mask.Size()
	outOnes, _ := out.Mask.Size()
	return out.Contains(in.IP) && inOnes > outOnes
}
