package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

func TestE2BFlagsGoTogether(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    e2bFlags
		ok   bool
	}{
		{"none", e2bFlags{}, true},
		{"all", e2bFlags{"310.yaml", "702.yaml", "key", "client.env"}, true},
		{"no policy", e2bFlags{"310.yaml", "", "key", "client.env"}, false},
		{"no key file", e2bFlags{"310.yaml", "702.yaml", "", "client.env"}, false},
		{"key file alone", e2bFlags{"", "", "key", ""}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.e.check(); (err == nil) != tc.ok {
				t.Errorf("check() = %v, want ok %v", err, tc.ok)
			}
		})
	}
}

func TestRouterURL(t *testing.T) {
	for _, tc := range []struct {
		name, ip string
		port     int32
		want     string
		fails    bool
	}{
		{"HTTP's port", "10.96.0.20", 80, "http://10.96.0.20", false},
		{"another port", "10.96.0.20", 8080, "http://10.96.0.20:8080", false},
		{"IPv6", "fd00::20", 80, "http://[fd00::20]", false},
		{"IPv6 and a port", "fd00::20", 8080, "http://[fd00::20]:8080", false},
		{"headless", corev1.ClusterIPNone, 80, "", true},
		{"no address", "", 80, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := &corev1.Service{Spec: corev1.ServiceSpec{ClusterIP: tc.ip, Ports: []corev1.ServicePort{{Port: tc.port}}}}
			got, err := routerURL(svc)
			if (err != nil) != tc.fails || got != tc.want {
				t.Errorf("routerURL = %q, %v; want %q (fails %v)", got, err, tc.want, tc.fails)
			}
		})
	}
}

// TestTokenKey: a usable key in the cluster is kept (an earlier run's
// sandboxes keep their tokens); none, or one the router would refuse, is
// replaced by a fresh one of 48 random bytes.
func TestTokenKey(t *testing.T) {
	const ns = "deer-flow"
	good := []byte("an-earlier-run-s-key-0123456789-abcdefghijklmnop")
	for _, tc := range []struct {
		name     string
		secret   map[string][]byte // nil: no Secret
		wantKept bool
	}{
		{"none", nil, false},
		{"usable", map[string][]byte{"key": good}, true},
		{"too short", map[string][]byte{"key": []byte("short")}, false},
		{"no key item", map[string][]byte{"other": good}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			if tc.secret != nil {
				s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: realnode.RouterKeySecret, Namespace: ns}, Data: tc.secret}
				if _, err := client.CoreV1().Secrets(ns).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			key, kept, err := tokenKey(context.Background(), client, ns)
			if err != nil {
				t.Fatal(err)
			}
			if kept != tc.wantKept {
				t.Errorf("kept = %v, want %v", kept, tc.wantKept)
			}
			if kept && string(key) != string(good) {
				t.Errorf("kept key %q, want the Secret's %q", key, good)
			}
			if _, err := access.ParseKey(key); err != nil {
				t.Errorf("the key is not usable: %v", err)
			}
			if !kept && len(key) != 64 {
				t.Errorf("a fresh key has %d characters, want 64 (48 bytes, base64)", len(key))
			}
		})
	}
	a, _, _ := tokenKey(context.Background(), fake.NewClientset(), ns)
	b, _, _ := tokenKey(context.Background(), fake.NewClientset(), ns)
	if string(a) == string(b) {
		t.Error("two fresh keys are equal")
	}
}

// TestApplyPolicyAndTemplate: config/702's policy lands in the namespace
// given (not the file's), replacing an older one; the base template is put
// back as this node needs it.
func TestApplyPolicyAndTemplate(t *testing.T) {
	const ns = "run-ns"
	file := filepath.Join("..", "..", "..", "..", "..", "config", "702-networkpolicy-router.yaml")
	client := fake.NewClientset()
	ctx := context.Background()
	for range 2 { // create, then update
		if err := applyPolicy(ctx, client, file, ns); err != nil {
			t.Fatal(err)
		}
		if err := putBaseTemplate(ctx, client, ns); err != nil {
			t.Fatal(err)
		}
	}
	nps, err := client.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nps.Items) != 1 || nps.Items[0].Name != "deer-flow-sandbox-isolation-router" {
		t.Fatalf("policies in %s: %+v, want config/702's alone", ns, nps.Items)
	}
	if got := nps.Items[0].Spec.PodSelector.MatchLabels["sandbox.deerflow.dev/envd"]; got != "true" {
		t.Errorf("the policy selects envd=%q, want config/702's selector", got)
	}
	pt, err := client.CoreV1().PodTemplates(ns).Get(ctx, BaseTemplate, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := baseTemplate(ns)
	if diff := cmp.Diff(want.Template, pt.Template); diff != "" {
		t.Errorf("base template (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(want.Annotations, pt.Annotations); diff != "" {
		t.Errorf("base template's annotations (-want +got):\n%s", diff)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := applyPolicy(ctx, client, bad, ns); err == nil {
		t.Error("applyPolicy took a ConfigMap for a NetworkPolicy")
	}
}
