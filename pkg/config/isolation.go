package config

import (
	"net"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/deerflow-sandbox/provisioner/pkg/egress"
)

// ServiceHeadless is the SANDBOX_SERVICE_TYPE of sandbox Services without a
// virtual IP (clusterIP: None): the Service's DNS name resolves to the
// sandbox Pod itself. For large fleets: the API server's ClusterIP
// allocator costs more per Service the more there are, and kube-proxy
// programs nothing for a headless Service on any node.
const ServiceHeadless = "Headless"

// IsolationConfig is how a sandbox is reached and what it may reach: its
// Service (and the host in NodePort URLs), and the shared NetworkPolicy's
// ingress, egress and DNS.
type IsolationConfig struct {
	ServiceType string `envconfig:"SANDBOX_SERVICE_TYPE" default:"NodePort"` // NodePort, ClusterIP or ServiceHeadless
	NodeHost    string `envconfig:"NODE_HOST" default:"host.docker.internal"`
	// One shared NetworkPolicy isolates every sandbox (see
	// sandbox.BuildNetworkPolicy and config/701-networkpolicy-sandboxes.yaml).
	// With SANDBOX_NETWORK_POLICY on, no sandbox is created until it exists.
	// SANDBOX_NETWORK_POLICY_ENSURE (local clusters: make run) has the
	// function create it, and update it when it differs from the settings.
	NetworkPolicy        bool              `envconfig:"SANDBOX_NETWORK_POLICY" default:"true"`
	NetworkPolicyName    string            `envconfig:"SANDBOX_NETWORK_POLICY_NAME" default:"deer-flow-sandbox-isolation"`
	EnsureNetworkPolicy  bool              `envconfig:"SANDBOX_NETWORK_POLICY_ENSURE" default:"false"`
	IngressFromPodLabels map[string]string `envconfig:"SANDBOX_INGRESS_FROM_POD_LABELS" default:"app.kubernetes.io/name:deer-flow-backend"`
	IngressFromNamespace map[string]string `envconfig:"SANDBOX_INGRESS_FROM_NAMESPACE_LABELS"`
	IngressNodeCIDRs     []string          `envconfig:"SANDBOX_INGRESS_NODE_CIDRS"`
	// EgressMode is the egress of sandboxes whose template names none
	// (egress.Mode; the names before modes, internet and deny-all, still
	// mean open and isolated), EgressAllow the names an allowlist sandbox
	// may reach through the egress proxy when its template lists none.
	EgressMode  string `envconfig:"SANDBOX_EGRESS_MODE" default:"open"`
	EgressAllow string `envconfig:"SANDBOX_EGRESS_ALLOW"`
	// The egress proxy: its Service (whose ClusterIP allowlist sandboxes
	// are given as HTTP(S)_PROXY), its port, and its Pods' labels (the
	// only egress the allowlist policy admits).
	EgressProxyService   string            `envconfig:"SANDBOX_EGRESS_PROXY_SERVICE" default:"sandbox-egress-proxy"`
	EgressProxyPort      int32             `envconfig:"SANDBOX_EGRESS_PROXY_PORT" default:"3128"`
	EgressProxyPodLabels map[string]string `envconfig:"SANDBOX_EGRESS_PROXY_POD_LABELS" default:"app.kubernetes.io/name:sandbox-egress-proxy"`
	EgressDenyCIDRs      []string          `envconfig:"SANDBOX_EGRESS_DENY_CIDRS" default:"10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,169.254.0.0/16,100.64.0.0/10,169.254.169.254/32,169.254.170.2/32,100.100.100.200/32,168.63.129.16/32,fc00::/7,fe80::/10,fd00:ec2::254/128"`
	EgressAllowCIDRs     []string          `envconfig:"SANDBOX_EGRESS_ALLOW_CIDRS" default:"0.0.0.0/0,::/0"`
	DNSNamespaceLabels   map[string]string `envconfig:"SANDBOX_DNS_NAMESPACE_LABELS" default:"kubernetes.io/metadata.name:kube-system"`
	DNSPodLabels         map[string]string `envconfig:"SANDBOX_DNS_POD_LABELS" default:"k8s-app:kube-dns"`
	// PrincipalIngress is where each principal's backends connect from
	// (ParsePrincipalIngress): each principal's sandboxes answer its own
	// sources alone, through a NetworkPolicy of the principal's own that
	// its first create writes (IngressSources says what applies without an
	// entry).
	PrincipalIngress string `envconfig:"PROVISIONER_PRINCIPAL_INGRESS"`
	// NetworkPolicyCheckTTL is how long a create trusts the last check of the
	// shared NetworkPolicy (present, and what the function would build)
	// before it reads the policy again: a deleted or altered policy stops
	// creates this much later at most.
	NetworkPolicyCheckTTL time.Duration `envconfig:"SANDBOX_NETWORK_POLICY_CHECK_TTL" default:"2s"`
}

// DefaultEgress is the mode of a sandbox whose template names none.
func (c *IsolationConfig) DefaultEgress() egress.Mode {
	m, _ := egressMode(c.EgressMode) // validated at start-up
	return m
}

// DefaultEgressAllow is the list of an allowlist sandbox whose template
// lists no names.
func (c *IsolationConfig) DefaultEgressAllow() []string {
	names, _ := egress.ParseNames(c.EgressAllow) // validated at start-up
	return names
}

// egressMode reads SANDBOX_EGRESS_MODE, with the names it had before
// DeerFlow's modes: internet (open) and deny-all (isolated).
func egressMode(s string) (egress.Mode, error) {
	switch s {
	case "internet":
		return egress.Open, nil
	case "deny-all":
		return egress.Isolated, nil
	}
	return egress.ParseMode(s)
}

// Validate checks the Service type, the host, the policy's name and
// selectors, the egress mode and every CIDR.
func (c *IsolationConfig) Validate() error {
	var p problems
	if c.ServiceType != "NodePort" && c.ServiceType != "ClusterIP" && c.ServiceType != ServiceHeadless {
		p.bad("SANDBOX_SERVICE_TYPE", "%q must be NodePort, ClusterIP or %s", c.ServiceType, ServiceHeadless)
	}
	if _, err := egressMode(c.EgressMode); err != nil {
		p.bad("SANDBOX_EGRESS_MODE", "%v", err)
	}
	if _, err := egress.ParseNames(c.EgressAllow); err != nil {
		p.bad("SANDBOX_EGRESS_ALLOW", "%v", err)
	}
	if msgs := validation.IsDNS1035Label(c.EgressProxyService); len(msgs) > 0 {
		p.bad("SANDBOX_EGRESS_PROXY_SERVICE", "%q: %s", c.EgressProxyService, strings.Join(msgs, "; "))
	}
	if c.EgressProxyPort < 1 || c.EgressProxyPort > 65535 {
		p.bad("SANDBOX_EGRESS_PROXY_PORT", "%d is not a port", c.EgressProxyPort)
	}
	if len(c.EgressProxyPodLabels) == 0 || c.EgressProxyPodLabels["app"] == "deer-flow-sandbox" {
		p.bad("SANDBOX_EGRESS_PROXY_POD_LABELS", "must select the egress proxy's Pods alone (an empty selector, or one that selects sandboxes, would let an allowlist sandbox reach them)")
	}
	if c.NetworkPolicy && len(c.IngressFromPodLabels) == 0 {
		p.bad("SANDBOX_INGRESS_FROM_POD_LABELS", "must select the agent backend's Pods (an empty selector would admit every Pod, sandboxes included)")
	}
	if c.IngressFromPodLabels["app"] == "deer-flow-sandbox" {
		p.bad("SANDBOX_INGRESS_FROM_POD_LABELS", "selects sandboxes; a sandbox must never reach another")
	}
	if _, err := ParsePrincipalIngress(c.PrincipalIngress); err != nil {
		p.join(err) // it names the setting
	}
	if msgs := validation.IsDNS1123Subdomain(c.NetworkPolicyName); len(msgs) > 0 {
		p.bad("SANDBOX_NETWORK_POLICY_NAME", "%q: %s", c.NetworkPolicyName, strings.Join(msgs, "; "))
	}
	if c.NetworkPolicyCheckTTL < 0 || c.NetworkPolicyCheckTTL > time.Minute {
		p.bad("SANDBOX_NETWORK_POLICY_CHECK_TTL", "%s must be between 0 (read on every create) and 1m", c.NetworkPolicyCheckTTL)
	}
	for _, list := range []struct {
		name  string
		cidrs []string
	}{{"SANDBOX_EGRESS_DENY_CIDRS", c.EgressDenyCIDRs}, {"SANDBOX_EGRESS_ALLOW_CIDRS", c.EgressAllowCIDRs}, {"SANDBOX_INGRESS_NODE_CIDRS", c.IngressNodeCIDRs}} {
		for _, cidr := range list.cidrs {
			ip, network, err := net.ParseCIDR(cidr)
			switch {
			case err != nil:
				p.bad(list.name, "%q is not a CIDR such as 169.254.169.254/32", cidr)
			case !ip.Equal(network.IP):
				// The API server refuses a NetworkPolicy ipBlock with host
				// bits set, so every create would fail later.
				p.bad(list.name, "%q has host bits set; write the network, %s", cidr, network)
			}
		}
	}
	if c.NodeHost == "" || strings.ContainsAny(c.NodeHost, "/ @?#") {
		p.bad("NODE_HOST", "%q must be a bare host name or address", c.NodeHost)
	}
	return p.err()
}
