package realnode

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net"
	"os"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// E2BRouter is the E2B router a test deployed with DeployE2BRouter: the
// token key it checks (and the function makes tokens with) and where E2B's
// SDK reaches it.
type E2BRouter struct {
	// Key is the token key: base64 text, as an operator makes one.
	Key []byte
	// Addr is the router's Service, its ClusterIP and port 80, reachable
	// from this machine (kube-proxy runs on it).
	Addr string
	// URL is Addr as E2B_SANDBOX_URL.
	URL string
}

// DeployE2BRouter is what every test of E2B's parts on the real node sets
// up before the function starts, so one place says how: a fresh token key,
// written to keyFile for the function's E2B_TOKEN_KEY_FILE (0600); the
// router from manifest (config/310-router.yaml) with that key
// (DeployRouter); and the router's sandbox policy, built from cfg as the
// function's configuration would (resources.BuildRouterPolicy, which a test
// in test/manifests keeps equal to config/702), in ns. Without the policy
// the router reaches no sandbox that carries the agent.
func DeployE2BRouter(ctx context.Context, client kubernetes.Interface, manifest, ns, keyFile string, cfg config.Objects) (*E2BRouter, error) {
	raw := make([]byte, 36)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("the router's token key: %w", err)
	}
	key := []byte(base64.StdEncoding.EncodeToString(raw))
	if err := os.WriteFile(keyFile, key, 0o600); err != nil {
		return nil, fmt.Errorf("writing the function's token key: %w", err)
	}
	if err := DeployRouter(ctx, client, manifest, ns, key); err != nil {
		return nil, err
	}
	np := resources.BuildRouterPolicy(cfg)
	np.Namespace = ns
	if _, err := client.NetworkingV1().NetworkPolicies(ns).Create(ctx, np, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("the router's sandbox policy %s/%s: %w", ns, np.Name, err)
	}
	svc, err := client.CoreV1().Services(ns).Get(ctx, RouterName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("the router's Service %s/%s: %w", ns, RouterName, err)
	}
	addr := net.JoinHostPort(svc.Spec.ClusterIP, "80")
	return &E2BRouter{Key: key, Addr: addr, URL: "http://" + addr}, nil
}
