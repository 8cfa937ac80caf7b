package resources

import (
	"maps"
	"net"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// BuildNetworkPolicy is the one policy that isolates every sandbox, selected
// by label, so it exists before any sandbox does, pooled Pods included. It
// admits nothing, in or out: who may connect to a sandbox is each
// principal's own policy's to say (BuildIngressPolicy), so a pooled Pod,
// which no principal owns until it is claimed, answers no one (the
// kubelet's probes come from the node, which NetworkPolicy does not
// judge); what a sandbox may reach is its egress mode's policy's
// (BuildEgressPolicies), so an isolated sandbox, which no such policy
// selects, reaches nothing. config/ ships it; the builder is what the
// function ensures on local clusters and what the tests compare config/
// with.
func BuildNetworkPolicy(cfg config.Objects) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: sharedMeta(cfg, cfg.NetworkPolicyName),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{keys.LabelApp: keys.LabelAppValue}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

func sharedMeta(cfg config.Objects, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name:      name,
		Namespace: cfg.Namespace,
		Labels:    map[string]string{keys.LabelName: "deer-flow", keys.LabelComponent: "sandbox", keys.LabelManagedBy: keys.ManagedByValue},
	}
}

// EgressPolicyName names the policy that gives sandboxes in mode their
// egress.
func EgressPolicyName(cfg config.Objects, mode egress.Mode) string {
	return cfg.NetworkPolicyName + "-egress-" + string(mode)
}

// BuildEgressPolicies are the policies that give each egress mode what it
// may reach, beside the shared policy that denies everything; config/
// ships them with it. Each selects sandboxes by their mode's label; a
// sandbox from before modes has none and gets the deployment's default
// mode's policy, so an upgrade neither opens nor closes anything.
//
//   - open: DNS to the cluster DNS only, and the internet except private,
//     link-local, CGNAT and metadata ranges on every other port;
//   - allowlist: the egress proxy's Pods on its port, nothing else (no DNS:
//     the proxy resolves names itself);
//   - isolated: no policy, so nothing.
func BuildEgressPolicies(cfg config.Objects) []*networkingv1.NetworkPolicy {
	dns := networkingv1.NetworkPolicyEgressRule{
		To: []networkingv1.NetworkPolicyPeer{{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: cfg.DNSNamespaceLabels},
			PodSelector:       &metav1.LabelSelector{MatchLabels: cfg.DNSPodLabels},
		}},
		Ports: []networkingv1.NetworkPolicyPort{
			{Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(intstr.FromInt32(53))},
			{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(53))},
		},
	}
	open := []networkingv1.NetworkPolicyEgressRule{dns}
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
		open = append(open, networkingv1.NetworkPolicyEgressRule{To: peers, Ports: allButDNS()})
	}
	proxy := []networkingv1.NetworkPolicyEgressRule{{
		To:    []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: cfg.EgressProxyPodLabels}}},
		Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(intstr.FromInt32(cfg.EgressProxyPort))}},
	}}
	build := func(mode egress.Mode, rules []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{
			TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
			ObjectMeta: sharedMeta(cfg, EgressPolicyName(cfg, mode)),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: modeSelector(cfg.DefaultEgress(), mode),
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress:      rules,
			},
		}
	}
	return []*networkingv1.NetworkPolicy{build(egress.Open, open), build(egress.Allowlist, proxy)}
}

// SharedPolicies are the policies every sandbox depends on, which config/
// ships and the function checks before a create: BuildNetworkPolicy's,
// then BuildEgressPolicies'.
func SharedPolicies(cfg config.Objects) []*networkingv1.NetworkPolicy {
	return append([]*networkingv1.NetworkPolicy{BuildNetworkPolicy(cfg)}, BuildEgressPolicies(cfg)...)
}

// EgressOf is the egress of a sandbox made from t (nil: no template): the
// template's mode and list where it names them, else the deployment's.
func EgressOf(cfg config.Objects, t *template.Template) api.Egress {
	e := api.Egress{Mode: cfg.DefaultEgress(), Allow: cfg.DefaultEgressAllow()}
	if t != nil && t.Egress != "" {
		e.Mode = t.Egress
	}
	if t != nil && t.EgressAllow != nil {
		e.Allow = t.EgressAllow
	}
	if e.Mode != egress.Allowlist {
		e.Allow = nil
	}
	return e
}

// modeSelector selects the sandboxes in mode: those labelled so, and, when
// mode is the deployment's default, those with no mode label (made before
// modes).
func modeSelector(def, mode egress.Mode) metav1.LabelSelector {
	sel := metav1.LabelSelector{MatchLabels: map[string]string{keys.LabelApp: keys.LabelAppValue}}
	if mode != def {
		sel.MatchLabels[keys.LabelEgress] = string(mode)
		return sel
	}
	var others []string
	for _, m := range egress.Modes {
		if m != mode {
			others = append(others, string(m))
		}
	}
	sel.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: keys.LabelEgress, Operator: metav1.LabelSelectorOpNotIn, Values: others}}
	return sel
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

// RouterPolicyName names the policy that admits the E2B router to the
// sandboxes that carry the agent.
func RouterPolicyName(cfg config.Objects) string { return cfg.NetworkPolicyName + "-router" }

// BuildRouterPolicy admits the router's Pods (SANDBOX_ROUTER_POD_LABELS, in
// SANDBOX_ROUTER_NAMESPACE_LABELS or the sandboxes' namespace) to the
// sandboxes that carry the agent (keys.LabelEnvd), on TCP: the agent's port
// and whatever port the sandbox's container exposes, which the router
// checks before it forwards, with the sandbox's token. No other sandbox is
// selected, so a DeerFlow sandbox answers its principal's backends alone,
// as before; and nothing here lets a sandbox reach the router (its egress
// policy does not, and the router's own policy admits no sandbox). It is
// not one of SharedPolicies: a create does not need it (without it the
// router reaches nothing, which fails closed), and a deployment without
// E2B need not ship it.
func BuildRouterPolicy(cfg config.Objects) *networkingv1.NetworkPolicy {
	peer := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: maps.Clone(cfg.RouterPodLabels)}}
	if len(cfg.RouterNamespaceLabels) > 0 {
		peer.NamespaceSelector = &metav1.LabelSelector{MatchLabels: maps.Clone(cfg.RouterNamespaceLabels)}
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: sharedMeta(cfg, RouterPolicyName(cfg)),
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{
				MatchLabels:      map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelEnvd: "true"},
				MatchExpressions: []metav1.LabelSelectorRequirement{{Key: keys.LabelPool, Operator: metav1.LabelSelectorOpDoesNotExist}},
			},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{peer},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: ptr.To(corev1.ProtocolTCP)}},
			}},
		},
	}
}
