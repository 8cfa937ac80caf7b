package config

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// E2BConfig is what E2B's SDK needs beside the sandboxes themselves
// (docs/e2b.md): the agent's image, which a template annotated
// sandbox.deerflow.dev/envd puts into its sandbox container by an init
// container; the shared key tokens are made with; and the router's Pods,
// which the sandbox policy lets reach those sandboxes.
type E2BConfig struct {
	// EnvdImage is the envd-compatible agent's image (cmd/envd). Empty: no
	// template may carry the agent (its creates are refused, naming this).
	EnvdImage string `envconfig:"SANDBOX_ENVD_IMAGE"`
	// TokenKeyFile is the file of the key E2B sandboxes' access tokens are
	// made with (a Secret's, shared with the router). Empty: the E2B API
	// answers 503 saying so.
	TokenKeyFile string `envconfig:"E2B_TOKEN_KEY_FILE"`
	// TokenKey is the same key given as a value (config/400-service.yaml
	// takes it from the Secret by env: a Pod without volumes starts sooner).
	// It wins over TokenKeyFile; a Secret created later reaches only Pods
	// started after it.
	TokenKey string `envconfig:"E2B_TOKEN_KEY"`
	// RouterPodLabels select the router's Pods: the only Pods, beside each
	// principal's backends, that a sandbox carrying the agent answers.
	RouterPodLabels map[string]string `envconfig:"SANDBOX_ROUTER_POD_LABELS" default:"app.kubernetes.io/name:sandbox-router"`
	// RouterNamespaceLabels select the router's namespace (empty: the
	// sandboxes' own).
	RouterNamespaceLabels map[string]string `envconfig:"SANDBOX_ROUTER_NAMESPACE_LABELS"`
	// Domain is E2B_DOMAIN, E2B's own addressing (docs/e2b.md): the
	// control plane answers at api.<Domain> on its root path, the router
	// at <port>-<sandbox id>.<Domain>, and create and connect answers carry
	// it. Empty: /e2b and the router's headers only. The router is given
	// the same value.
	Domain string `envconfig:"E2B_DOMAIN"`
}

// ValidE2BDomain accepts E2B_DOMAIN: empty, or a DNS name of at least two
// labels under which api.<domain> and <port>-<id>.<domain> are names.
func ValidE2BDomain(d string) error {
	if d == "" {
		return nil
	}
	if errs := validation.IsDNS1123Subdomain(d); len(errs) > 0 || !strings.Contains(d, ".") {
		return fmt.Errorf("%q must be a lowercase DNS name of two labels or more (sandboxes.example.com), under which api.<domain> and <port>-<sandbox id>.<domain> resolve to the cluster's ingress", d)
	}
	return nil
}

// Validate checks the image reference and that the router's selector
// selects no sandbox.
func (c *E2BConfig) Validate() error {
	var p problems
	if c.EnvdImage != "" && strings.ContainsAny(c.EnvdImage, " \t\n") {
		p.bad("SANDBOX_ENVD_IMAGE", "%q is not an image reference", c.EnvdImage)
	}
	if err := ValidE2BDomain(c.Domain); err != nil {
		p.bad("E2B_DOMAIN", "%v", err)
	}
	if len(c.RouterPodLabels) == 0 || c.RouterPodLabels["app"] == "deer-flow-sandbox" {
		p.bad("SANDBOX_ROUTER_POD_LABELS", "must select the router's Pods alone (an empty selector, or one that selects sandboxes, would let any Pod, or a sandbox, reach the agent)")
	}
	return p.err()
}
