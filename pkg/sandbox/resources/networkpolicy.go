package resources

import (
	"net"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// EgressDenyAll is the SANDBOX_EGRESS_MODE that allows no egress at all.
const EgressDenyAll = "deny-all"

// BuildNetworkPolicy is the one policy that isolates every sandbox, selected
// by label, so it exists before any sandbox does and a create writes nothing
// but a Pod and a Service. config/ ships it; the builder is what the function
// ensures on local clusters and what the tests compare config/ with.
//
// Ingress: only the sandbox port, only from the agent backend's Pods (and, in
// NodePort mode, from the node addresses the operator names): never from
// another sandbox. Egress: DNS to the cluster DNS only, and the internet
// except private, link-local, CGNAT and metadata ranges; or nothing at all.
func BuildNetworkPolicy(cfg config.Objects) *networkingv1.NetworkPolicy {
	port := intstr.FromInt32(cfg.ContainerPort)
	backend := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: cfg.IngressFromPodLabels}}
	if len(cfg.IngressFromNamespace) > 0 {
		backend.NamespaceSelector = &metav1.LabelSelector{MatchLabels: cfg.IngressFromNamespace}
	}
	from := []networkingv1.NetworkPolicyPeer{backend}
	if cfg.ServiceType == string(corev1.ServiceTypeNodePort) {
		for _, cidr := range cfg.IngressNodeCIDRs {
			from = append(from, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr}})
		}
	}

	var egress []networkingv1.NetworkPolicyEgressRule // none at all in deny-all mode
	if cfg.EgressMode != EgressDenyAll {
		egress = append(egress, networkingv1.NetworkPolicyEgressRule{
			To: []networkingv1.NetworkPolicyPeer{{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: cfg.DNSNamespaceLabels},
				PodSelector:       &metav1.LabelSelector{MatchLabels: cfg.DNSPodLabels},
			}},
			Ports: []networkingv1.NetworkPolicyPort{
				{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))},
				{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(53))},
			},
		})
		var peers []networkingv1.NetworkPolicyPeer
		for _, allow := range cfg.EgressAllowCIDRs {
			block := &networkingv1.IPBlock{CIDR: allow}
			for _, deny := range cfg.EgressDenyCIDRs {
				if cidrWithin(deny, allow) {
					block.Except = append(block.Except, deny)
				}
			}
			peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: block})
		}
		if len(peers) > 0 {
			egress = append(egress, networkingv1.NetworkPolicyEgressRule{To: peers, Ports: allButDNS()})
		}
	}

	return &networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      cfg.NetworkPolicyName,
			Namespace: cfg.Namespace,
			Labels:    map[string]string{keys.LabelName: "deer-flow", keys.LabelComponent: "sandbox", keys.LabelManagedBy: keys.ManagedByValue},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{keys.LabelApp: keys.LabelAppValue}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  from,
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: &port}},
			}},
			Egress: egress,
		},
	}
}

// cidrWithin reports whether inner lies inside outer; the API server refuses
// an except that is not inside its block, or of the other IP family.
// allButDNS is every TCP and UDP port except 53. Names resolve only through
// the cluster's DNS (the rule above): code in a sandbox that asks another
// resolver directly, to bypass or exfiltrate through DNS, is refused.
func allButDNS() []networkingv1.NetworkPolicyPort {
	var ports []networkingv1.NetworkPolicyPort
	for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
		ports = append(ports,
			networkingv1.NetworkPolicyPort{Protocol: ptr.To(proto), Port: ptr.To(intstr.FromInt32(1)), EndPort: ptr.To[int32](52)},
			networkingv1.NetworkPolicyPort{Protocol: ptr.To(proto), Port: ptr.To(intstr.FromInt32(54)), EndPort: ptr.To[int32](65535)})
	}
	return ports
}

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
