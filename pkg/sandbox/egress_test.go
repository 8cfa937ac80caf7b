package sandbox

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// proxyService is the egress proxy's Service as config/ ships it, with the
// ClusterIP the API server would give it.
func proxyService(ns string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-egress-proxy", Namespace: ns},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.99", Ports: []corev1.ServicePort{{Name: "proxy", Port: 3128, Protocol: corev1.ProtocolTCP}}}}
}

// TestAllowlistSandbox: an allowlist create labels its Pod with the mode
// (what the policies select), points it at the proxy by address, records
// its list on the Service (what the proxy judges by), and answers it. The
// fake clientset stands in for the API server.
func TestAllowlistSandbox(t *testing.T) {
	cfg := testConfig(t, map[string]string{"SANDBOX_EGRESS_MODE": "allowlist", "SANDBOX_EGRESS_ALLOW": "pypi.org,*.github.com"})
	client := fake.NewClientset(append(sharedPolicies(cfg), proxyService(cfg.Namespace))...)
	m := NewManager(cfg, client)
	ctx := api.WithCaller(context.Background(), api.Caller{Principal: "default"})
	s := ownerSpec("egress1")
	sb, err := m.Create(ctx, s, 0)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&api.EgressView{Mode: egress.Allowlist, Allow: []string{"*.github.com", "pypi.org"}}, sb.Egress); diff != "" {
		t.Errorf("create's egress (-want +got):\n%s", diff)
	}
	pod, err := client.CoreV1().Pods(cfg.Namespace).Get(ctx, resources.PodName("egress1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Labels[keys.LabelEgress]; got != "allowlist" {
		t.Errorf("the Pod's mode label = %q, want allowlist", got)
	}
	env := map[string]string{}
	for _, e := range pod.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	for _, name := range []string{"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"} {
		if env[name] != "http://10.96.0.99:3128" {
			t.Errorf("%s = %q, want the proxy's ClusterIP", name, env[name])
		}
	}

	svc, err := client.CoreV1().Services(cfg.Namespace).Get(ctx, resources.ServiceName("egress1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if svc.Annotations[keys.AnnotationEgressAllow] != "*.github.com,pypi.org" || svc.Labels[keys.LabelEgress] != "allowlist" {
		t.Errorf("the Service records %v %v", svc.Labels, svc.Annotations)
	}
}

// TestEgressRefusals: an allowlist create without the proxy's Service
// writes no sandbox object.
func TestEgressRefusals(t *testing.T) {
	ctx := api.WithCaller(context.Background(), api.Caller{Principal: "default"})
	t.Run("allowlist without the proxy", func(t *testing.T) {
		cfg := testConfig(t, map[string]string{"SANDBOX_EGRESS_MODE": "allowlist"})
		client := fake.NewClientset(sharedPolicies(cfg)...)
		m := NewManager(cfg, client)
		_, err := m.Create(ctx, ownerSpec("lost1"), 0)
		if api.KindOf(err) != api.KindUnavailable || !strings.Contains(api.DetailOf(err), "sandbox-egress-proxy") {
			t.Errorf("create: %v, want unavailable naming the proxy's Service", err)
		}
		if got := objectsLeft(t, client); len(got) != 0 {
			t.Errorf("left behind: %v", got)
		}
	})
}
