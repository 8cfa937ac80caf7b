// Package kube builds the Kubernetes client: a token given as a value
// (K8S_TOKEN), else the Pod's mounted ServiceAccount token, else a
// kubeconfig, with K8S_API_SERVER overriding the server; and the transform
// the caches of sandbox objects store them with. Nothing else.
package kube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// UserAgent identifies us in API server audit logs.
const UserAgent = "deerflow-sandbox-provisioner"

// RESTConfig returns how to reach the API server: K8S_TOKEN when set (and
// nothing else then: a token that cannot be used is an error, not a reason
// to try other credentials), else the in-cluster configuration when
// present, else KUBECONFIG_PATH, then the usual kubeconfig search
// ($KUBECONFIG, ~/.kube/config).
func RESTConfig(c config.ClientConfig) (*rest.Config, error) {
	rc, err := tokenConfig(c, os.Getenv)
	if err != nil {
		return nil, err
	}
	if rc == nil {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		if c.KubeconfigPath != "" {
			if fi, statErr := os.Stat(c.KubeconfigPath); statErr != nil {
				return nil, fmt.Errorf("KUBECONFIG_PATH %s: %w", c.KubeconfigPath, statErr)
			} else if fi.IsDir() {
				return nil, fmt.Errorf("KUBECONFIG_PATH %s is a directory; mount the kubeconfig file itself", c.KubeconfigPath)
			}
			rules.ExplicitPath = c.KubeconfigPath
		}
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("no in-cluster ServiceAccount and no usable kubeconfig: %w", err)
		}
	}
	if c.APIServer != "" {
		// Keep verifying the server's certificate: the override changes where
		// we connect, not whom we trust, unless the operator says otherwise.
		rc.Host = c.APIServer
		if c.APIServerInsecure {
			rc.TLSClientConfig.Insecure = true
			rc.TLSClientConfig.CAFile, rc.TLSClientConfig.CAData = "", nil
		}
	}
	// Protobuf, not JSON: Pods, Services and NetworkPolicies all speak it,
	// and it costs a fraction of JSON's CPU and garbage to encode and decode,
	// which is what a list of a thousand Pods mostly is.
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	rc.QPS, rc.Burst = c.ClientQPS, c.ClientBurst
	rc.UserAgent = UserAgent
	rc.WarningHandlerWithContext = slogWarnings{}
	return rc, nil
}

// tokenConfig is the configuration of a token given as a value
// (K8S_TOKEN, with K8S_CA_CERT), to the API server K8S_API_SERVER names or
// else the in-cluster one (KUBERNETES_SERVICE_HOST and _PORT, which the
// kubelet sets in every container); nil without a token.
func tokenConfig(c config.ClientConfig, getenv func(string) string) (*rest.Config, error) {
	if c.Token == "" {
		return nil, nil
	}
	host := c.APIServer
	if host == "" {
		h, p := getenv("KUBERNETES_SERVICE_HOST"), getenv("KUBERNETES_SERVICE_PORT")
		if h == "" || p == "" {
			return nil, errors.New("K8S_TOKEN is set but the API server is unknown: set K8S_API_SERVER (outside a cluster) or run in a Pod (KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT)")
		}
		host = "https://" + net.JoinHostPort(h, p)
	}
	return &rest.Config{
		Host:            host,
		BearerToken:     strings.TrimSpace(c.Token),
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte(c.CACert)},
	}, nil
}

// slogWarnings sends the API server's warnings (deprecations, Pod Security
// "would violate" notices) to our structured log instead of klog's stderr.
type slogWarnings struct{}

func (slogWarnings) HandleWarningHeaderWithContext(ctx context.Context, code int, agent, text string) {
	if code == 299 && text != "" {
		reqid.Logger(ctx).WarnContext(ctx, "Kubernetes API warning", "warning", text)
	}
}

// NewClient builds a clientset; wrap, if not nil, instruments its transport.
// Its calls are logged at debug level, each with its request's id (traced).
func NewClient(rc *rest.Config, wrap func(http.RoundTripper) http.RoundTripper) (kubernetes.Interface, error) {
	rc = rest.CopyConfig(rc)
	if wrap != nil {
		rc.Wrap(wrap)
	}
	rc.Wrap(func(rt http.RoundTripper) http.RoundTripper { return traced{rt} })
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("building the Kubernetes client: %w", err)
	}
	return cs, nil
}

// Ping asks the API server whether it is ready to serve, within timeout.
func Ping(ctx context.Context, client kubernetes.Interface, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	body, err := client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return fmt.Errorf("API server not ready: %w", err)
	}
	if string(body) != "ok" {
		return errors.New("API server not ready: " + string(body))
	}
	return nil
}

// InClusterClient is the client of an always-on component (the egress
// proxy, the E2B router): its Pod's ServiceAccount, or outside a cluster (a
// local run) the usual kubeconfig. Unlike the function's (NewClient), it
// has client-go's defaults: such a component reads through informers.
func InClusterClient() (kubernetes.Interface, error) {
	rc, err := rest.InClusterConfig()
	if err != nil {
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(clientcmd.NewDefaultClientConfigLoadingRules(), nil).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("no in-cluster config and no usable kubeconfig: %w", err)
		}
	}
	rc.UserAgent = UserAgent
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, nil
}
