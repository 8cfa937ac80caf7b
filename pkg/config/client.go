package config

import (
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ClientConfig is the Kubernetes API client: which API server, how it is
// trusted, the namespace the sandboxes live in, and the client's rate.
type ClientConfig struct {
	Namespace      string `envconfig:"K8S_NAMESPACE" default:"deer-flow"`
	KubeconfigPath string `envconfig:"KUBECONFIG_PATH"`
	APIServer      string `envconfig:"K8S_API_SERVER"`
	// APIServerInsecure skips TLS verification for K8S_API_SERVER. Off unless
	// asked for: DeerFlow's provisioner always skipped it, we never do silently.
	APIServerInsecure bool `envconfig:"K8S_API_SERVER_INSECURE" default:"false"`
	// Token and CACert are the ServiceAccount token and the API server's CA
	// bundle, given as values (config/400-service.yaml takes them from the
	// ServiceAccount's token Secret by env, docs/security.md says why): with
	// no volume to mount, the kubelet starts a Pod about 300 ms sooner, which
	// a create from zero waits for. Unset: the Pod's mounted token (or a
	// kubeconfig outside a cluster).
	Token  string `envconfig:"K8S_TOKEN"`
	CACert string `envconfig:"K8S_CA_CERT"`
	// CreateNamespace lets the function create K8S_NAMESPACE; off so that the
	// default Role needs no cluster-wide verbs.
	CreateNamespace bool `envconfig:"CREATE_NAMESPACE" default:"false"`
	// Client-side rate limit towards the API server, per replica. The API
	// server's priority and fairness is the real guard; this keeps one busy
	// replica from crowding out the rest of the cluster. Sized for the work:
	// a create or a destroy is two calls (the quota reads a watch-backed
	// cache), so 200/s lets a replica create about 100 sandboxes a second,
	// more than one API server here accepts; 50/s capped it near 12.
	ClientQPS   float32 `envconfig:"K8S_CLIENT_QPS" default:"200"`
	ClientBurst int     `envconfig:"K8S_CLIENT_BURST" default:"400"`
}

// Validate checks the namespace, the API server's URL and the rate.
func (c *ClientConfig) Validate() error {
	var p problems
	if msgs := validation.IsDNS1123Label(c.Namespace); len(msgs) > 0 {
		p.bad("K8S_NAMESPACE", "%q is not a namespace name: %s", c.Namespace, strings.Join(msgs, "; "))
	}
	if c.APIServer != "" {
		if u, err := url.Parse(c.APIServer); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			p.bad("K8S_API_SERVER", "%q must be an http(s) URL", c.APIServer)
		}
	}
	if c.Token != "" && c.CACert == "" && !c.APIServerInsecure {
		p.bad("K8S_TOKEN", "needs K8S_CA_CERT, the API server's CA bundle (the token Secret's ca.crt), to verify whom the token is sent to")
	}
	if c.ClientQPS <= 0 || c.ClientBurst < 1 {
		p.bad("K8S_CLIENT_QPS", "QPS and K8S_CLIENT_BURST must be positive")
	}
	return p.err()
}
