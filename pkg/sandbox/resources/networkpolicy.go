package resources

import (
	"net"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// EgressDenyAll is the SANDBOX_EGRESS_MODE that allows no egress at all.
const EgressDenyAll = "deny-all"

// BuildNetworkPolicy is the one policy that isolates every sandbox, selected
// by label, so it exists before any sandbox does, pooled Pods included. It
// admits no ingress at all: who may connect to a sandbox is each principal's
// own policy's to say (BuildIngressPolicy), so a pooled Pod, which no
// principal owns until it is claimed, answers no one (the kubelet's probes
// come from the node, which NetworkPolicy does not judge). config/ ships it;
// the builder is what the function ensures on local clusters and what the
// tests compare config/ with.
//
// Egress: DNS to the cluster DNS only, and the internet except private,
// link-local, CGNAT and metadata ranges; or nothing at all.
func BuildNetworkPolicy(cfg config.Objects) *networkingv1.NetworkPolicy {
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
			Egress:      egress,
		},
	}
}

// ComponentIngressValue is app.kubernetes.io/component of the policies that
// admit a principal's backends (BuildIngressPolicy, BuildLegacyIngressPolicy).
const ComponentIngressValue = "sandbox-ingress"

// IngressPolicyName names the policy that admits principal's backends to
// its sandboxes: the shared policy's name and the principal's label value,
// so it is one object per principal, whatever the principal's name holds.
func IngressPolicyName(cfg config.Objects, principal string) string {
	return cfg.NetworkPolicyName + "-" + PrincipalLabelValue(principal)
}

// LegacyIngressPolicyName names the policy that admits the "default"
// principal's backends to sandboxes that record no principal: DeerFlow's
// provisioner made them, before this one.
func LegacyIngressPolicyName(cfg config.Objects) string { return cfg.NetworkPolicyName + "-legacy" }

// BuildIngressPolicy admits sources to the sandbox port of principal's
// sandboxes: the Pods that carry its label, which a create writes on the
// Pod and a claim on the pooled Pod it takes. One per principal, not per
// sandbox, so a principal's first create writes it and no other create
// writes anything. With no sources it admits no one.
func BuildIngressPolicy(cfg config.Objects, principal string, sources []config.IngressSource) *networkingv1.NetworkPolicy {
	np := buildIngress(cfg, IngressPolicyName(cfg, principal), metav1.LabelSelector{MatchLabels: map[string]string{
		keys.LabelApp: keys.LabelAppValue, keys.LabelPrincipal: PrincipalLabelValue(principal)}}, sources)
	RecordPrincipal(np, api.Spec{Caller: api.Caller{Principal: principal}})
	return np
}

// BuildLegacyIngressPolicy admits sources (the "default" principal's) to
// sandboxes that record no principal and are no pooled Pod: DeerFlow's own
// from before this provisioner, which "default" owns.
func BuildLegacyIngressPolicy(cfg config.Objects, sources []config.IngressSource) *networkingv1.NetworkPolicy {
	return buildIngress(cfg, LegacyIngressPolicyName(cfg), metav1.LabelSelector{
		MatchLabels: map[string]string{keys.LabelApp: keys.LabelAppValue},
		MatchExpressions: []metav1.LabelSelectorRequirement{
			{Key: keys.LabelPrincipal, Operator: metav1.LabelSelectorOpDoesNotExist},
			{Key: keys.LabelPool, Operator: metav1.LabelSelectorOpDoesNotExist},
		}}, sources)
}

func buildIngress(cfg config.Objects, name string, pods metav1.LabelSelector, sources []config.IngressSource) *networkingv1.NetworkPolicy {
	var from []networkingv1.NetworkPolicyPeer
	for _, s := range sources {
		if s.CIDR != "" {
			from = append(from, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: s.CIDR}})
			continue
		}
		from = append(from, networkingv1.NetworkPolicyPeer{PodSelector: s.Pods.DeepCopy(), NamespaceSelector: s.Namespaces.DeepCopy()})
	}
	var rules []networkingv1.NetworkPolicyIngressRule
	if len(from) > 0 {
		port := intstr.FromInt32(cfg.ContainerPort)
		rules = []networkingv1.NetworkPolicyIngressRule{{From: from, Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: &port}}}}
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta: metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: cfg.Namespace,
			Labels:    map[string]string{keys.LabelName: "deer-flow", keys.LabelComponent: ComponentIngressValue, keys.LabelManagedBy: keys.ManagedByValue},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: pods,
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress:     rules,
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
