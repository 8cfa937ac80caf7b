package kube

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// TestTokenConfig: a token given as a value reaches the API server its
// settings or the Pod's environment name, verified with the CA bundle given
// beside it; without a token there is nothing to say.
func TestTokenConfig(t *testing.T) {
	inPod := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
	cases := []struct {
		name    string
		cfg     config.ClientConfig
		env     map[string]string
		want    *rest.Config
		wantErr string
	}{{
		name: "no token: the mounted one or a kubeconfig decides",
		env:  inPod,
	}, {
		name: "in a Pod: the cluster's API server, the token's trailing newline dropped",
		cfg:  config.ClientConfig{Token: "tok\n", CACert: "CA"},
		env:  inPod,
		want: &rest.Config{Host: "https://10.96.0.1:443", BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("CA")}},
	}, {
		name: "an IPv6 service address",
		cfg:  config.ClientConfig{Token: "tok", CACert: "CA"},
		env:  map[string]string{"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"},
		want: &rest.Config{Host: "https://[fd00::1]:443", BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("CA")}},
	}, {
		name: "K8S_API_SERVER names the server",
		cfg:  config.ClientConfig{Token: "tok", CACert: "CA", APIServer: "https://api.example:6443"},
		want: &rest.Config{Host: "https://api.example:6443", BearerToken: "tok", TLSClientConfig: rest.TLSClientConfig{CAData: []byte("CA")}},
	}, {
		name:    "no server known",
		cfg:     config.ClientConfig{Token: "tok", CACert: "CA"},
		wantErr: "K8S_API_SERVER",
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := tokenConfig(c.cfg, func(k string) string { return c.env[k] })
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one naming %s", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("tokenConfig (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRESTConfigUsesTheGivenToken: the token given as a value is what the
// client sends, protobuf and the rate as for any other credentials; a token
// without its CA bundle is refused by the settings.
func TestRESTConfigUsesTheGivenToken(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	rc, err := RESTConfig(config.ClientConfig{Token: "tok", CACert: "CA", ClientQPS: 5, ClientBurst: 10})
	if err != nil {
		t.Fatal(err)
	}
	if rc.BearerToken != "tok" || rc.BearerTokenFile != "" || rc.Host != "https://10.96.0.1:443" || rc.QPS != 5 || rc.ContentType != "application/vnd.kubernetes.protobuf" {
		t.Errorf("RESTConfig = host %s token %q file %q qps %v content %s; want the given token to the cluster's server, with the usual client settings",
			rc.Host, rc.BearerToken, rc.BearerTokenFile, rc.QPS, rc.ContentType)
	}
	// A token that cannot be used is an error: no other credentials are
	// tried, not even a usable kubeconfig.
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(kc, []byte("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: https://kc.example}}]\n"+
		"users: [{name: u, user: {token: other}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KUBECONFIG", kc)
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	if rc, err := RESTConfig(config.ClientConfig{Token: "tok", CACert: "CA", ClientQPS: 5, ClientBurst: 10}); err == nil {
		t.Errorf("a token with no API server to send it to gave %s; want an error, not the kubeconfig", rc.Host)
	}
	c := config.ClientConfig{Namespace: "ns", Token: "tok", ClientQPS: 1, ClientBurst: 1}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "K8S_CA_CERT") {
		t.Errorf("a token without its CA bundle: %v, want an error naming K8S_CA_CERT", err)
	}
}

// TestStripManagedFields: an object loses its managedFields and keeps the
// rest; a tombstone passes unchanged.
func TestStripManagedFields(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-a", Labels: map[string]string{"app": "x"},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "sandbox-provisioner", Operation: metav1.ManagedFieldsOperationUpdate}}}}
	got, err := StripManagedFields(pod)
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-a", Labels: map[string]string{"app": "x"}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	tomb := cache.DeletedFinalStateUnknown{Key: "ns/sandbox-a", Obj: pod}
	if got, err := StripManagedFields(tomb); err != nil || !cmp.Equal(got, tomb) {
		t.Errorf("a tombstone = %v, %v; want it unchanged", got, err)
	}
}
