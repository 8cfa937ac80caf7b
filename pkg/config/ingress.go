package config

import (
	"fmt"
	"net"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// IngressSource is one place a principal's backends connect from: a CIDR
// (backends outside the cluster, or the nodes' addresses where the policy
// agent judges NodePort traffic after kube-proxy's SNAT), or the Pods a
// selector picks, in the sandboxes' namespace or in the namespaces a second
// selector picks.
type IngressSource struct {
	CIDR       string                `json:"cidr,omitempty"`
	Pods       *metav1.LabelSelector `json:"pods,omitempty"`
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"` // nil: the sandboxes' own namespace
}

// ParsePrincipalIngress reads PROVISIONER_PRINCIPAL_INGRESS:
// "principal=source|source;principal2=source", where a principal is an API
// key's name, a group's, or a service account's username, and a source is
// "cidr:<CIDR>" or "pods:<label selector>[@<namespace label selector>]"
// (parseEntries). Sources are separated by '|' because a label selector
// holds ',' and '='. It refuses, naming the principal, a source that does
// not parse and a Pod selector that could pick sandboxes: one that is empty
// in the sandboxes' own namespace, or that names app=deer-flow-sandbox.
func ParsePrincipalIngress(raw string) (map[string][]IngressSource, error) {
	out := map[string][]IngressSource{}
	validKey := func(who string) error {
		if validPrincipal(who) != nil && validGroup(who) != nil {
			return fmt.Errorf("%q is not a principal or group: use an API key's or group's name, or system:serviceaccount:<namespace>:<name>", who)
		}
		return nil
	}
	err := parseEntries("PROVISIONER_PRINCIPAL_INGRESS", raw, ";", "principal=source[|source...]", validKey, func(who, list string) error {
		var sources []IngressSource
		for _, raw := range strings.Split(list, "|") {
			s, err := parseIngressSource(strings.TrimSpace(raw))
			if err != nil {
				return err
			}
			sources = append(sources, s)
		}
		out[who] = sources
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// parseSelector is metav1.ParseToLabelSelector with empty lists left nil,
// as the API server returns them.
func parseSelector(raw string) (*metav1.LabelSelector, error) {
	sel, err := metav1.ParseToLabelSelector(raw)
	if err != nil {
		return nil, err
	}
	if len(sel.MatchLabels) == 0 {
		sel.MatchLabels = nil
	}
	if len(sel.MatchExpressions) == 0 {
		sel.MatchExpressions = nil
	}
	return sel, nil
}

func parseIngressSource(raw string) (IngressSource, error) {
	kind, rest, _ := strings.Cut(raw, ":")
	switch kind {
	case "cidr":
		ip, network, err := net.ParseCIDR(rest)
		if err != nil {
			return IngressSource{}, fmt.Errorf("source %q: %q is not a CIDR such as 203.0.113.0/24", raw, rest)
		}
		if !ip.Equal(network.IP) {
			return IngressSource{}, fmt.Errorf("source %q has host bits set; write the network, %s", raw, network)
		}
		return IngressSource{CIDR: rest}, nil
	case "pods":
		pods, nsSel, scoped := strings.Cut(rest, "@")
		sel, err := parseSelector(pods)
		if err != nil {
			return IngressSource{}, fmt.Errorf("source %q: the Pod selector %q does not parse: %w", raw, pods, err)
		}
		s := IngressSource{Pods: sel}
		if scoped {
			if s.Namespaces, err = parseSelector(nsSel); err != nil {
				return IngressSource{}, fmt.Errorf("source %q: the namespace selector %q does not parse: %w", raw, nsSel, err)
			}
		}
		if sel.MatchLabels["app"] == "deer-flow-sandbox" {
			return IngressSource{}, fmt.Errorf("source %q selects sandboxes; a sandbox must never reach another", raw)
		}
		if !scoped && len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
			return IngressSource{}, fmt.Errorf("source %q selects every Pod of the sandboxes' namespace, sandboxes included; name the backend's labels", raw)
		}
		return s, nil
	}
	return IngressSource{}, fmt.Errorf("source %q must be cidr:<CIDR> or pods:<selector>[@<namespace selector>]", raw)
}

// IngressSources is where the sandboxes of principal (as it owns them: its
// group's name when it has one) may be reached from. An entry of
// PROVISIONER_PRINCIPAL_INGRESS decides. Without one:
//   - with one creating principal (multi false: DeerFlow's single key), the
//     agent backend's Pods (SANDBOX_INGRESS_FROM_*) and, in NodePort mode,
//     SANDBOX_INGRESS_NODE_CIDRS, as before principals had sources;
//   - "default" (PROVISIONER_API_KEY, DeerFlow's backend) likewise;
//   - a service account, the agent backend's Pods of its own namespace;
//   - any other principal, nothing: its sandboxes answer no one until its
//     sources are set (fail closed: a backend is never guessed).
func (c *IsolationConfig) IngressSources(principal string, multi bool) []IngressSource {
	if list, ok := c.principalIngress()[principal]; ok {
		return list
	}
	if !multi || principal == DefaultPrincipal {
		return c.backendSources()
	}
	if ns, ok := serviceAccountNamespace(principal); ok {
		return []IngressSource{{
			Pods:       &metav1.LabelSelector{MatchLabels: c.IngressFromPodLabels},
			Namespaces: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}},
		}}
	}
	return nil
}

// backendSources are the agent backend's Pods, and the node addresses that
// NodePort clients arrive from.
func (c *IsolationConfig) backendSources() []IngressSource {
	s := IngressSource{Pods: &metav1.LabelSelector{MatchLabels: c.IngressFromPodLabels}}
	if len(c.IngressFromNamespace) > 0 {
		s.Namespaces = &metav1.LabelSelector{MatchLabels: c.IngressFromNamespace}
	}
	out := []IngressSource{s}
	if c.ServiceType == "NodePort" {
		for _, cidr := range c.IngressNodeCIDRs {
			out = append(out, IngressSource{CIDR: cidr})
		}
	}
	return out
}

// principalIngress is PROVISIONER_PRINCIPAL_INGRESS parsed (Validate has
// refused one that does not parse).
func (c *IsolationConfig) principalIngress() map[string][]IngressSource {
	m, _ := ParsePrincipalIngress(c.PrincipalIngress)
	return m
}

// serviceAccountNamespace is the namespace of a service account's username.
func serviceAccountNamespace(principal string) (string, bool) {
	rest, ok := strings.CutPrefix(principal, "system:serviceaccount:")
	if !ok {
		return "", false
	}
	ns, _, ok := strings.Cut(rest, ":")
	return ns, ok && ns != ""
}
