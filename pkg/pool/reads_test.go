package pool

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/auth"
	"github.com/deerflow-sandbox/provisioner/pkg/httpapi"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
)

// TestTemplateReadsWriteNothing: GET /api/templates and GET
// /api/capabilities, through the HTTP door over sandbox.Manager and a pool,
// make no write, although a pooled template has no pool yet and a pool of a
// template that is gone stands: any principal that may read must not be
// able to make, resize or delete pools (and churn their Pods) by reading.
// The reap is what keeps them: after it, the pool exists and the other is
// gone.
func TestTemplateReadsWriteNothing(t *testing.T) {
	const key = "0123456789abcdef-key"
	t.Setenv("PROVISIONER_API_KEY", key)
	cfg, tmpl, _ := claimCluster(t) // a pooled template "warm", no pooled Pod
	orphan := Build(cfg.Objects(), pooled(t, cfg, 1))
	orphan.Name = Name("gone")
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "warm", Namespace: ns, UID: tmpl.UID, Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplatePoolSize: "2", keys.TemplateDeerFlowMounts: "false"}},
		Template: tmpl.Pod,
	}
	cs := clientset(pt, orphan)
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(New(cfg, cs, nil, nil)))
	door := httpapi.New(cfg, auth.FromConfig(&cfg.AuthConfig, nil), doorOps{m}, metrics.New())

	for _, path := range []string{"/api/templates", "/api/capabilities"} {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		door.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, w.Code, w.Body)
		}
	}
	if diff := cmp.Diff([]string(nil), writes(cs)); diff != "" {
		t.Errorf("writes of the template reads (-want +got):\n%s", diff)
	}

	if _, err := m.Reap(api.WithCaller(context.Background(), api.Caller{Principal: "ops", Admin: true})); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if rs, err := cs.AppsV1().ReplicaSets(ns).Get(ctx, Name("warm"), metav1.GetOptions{}); err != nil || *rs.Spec.Replicas != 2 {
		t.Errorf("after the reap, the pool of warm: %v %v; want 2 replicas", rs, err)
	}
	if _, err := cs.AppsV1().ReplicaSets(ns).Get(ctx, orphan.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after the reap, the pool of a template that is gone: %v; want it deleted", err)
	}
}

// doorOps is the Manager as the doors see it; egress grants (package
// grant) are not this test's.
type doorOps struct{ *sandbox.Manager }

func (doorOps) Egress(context.Context, string, api.EgressChange) (api.Sandbox, error) {
	return api.Sandbox{}, &api.Error{Kind: api.KindUnavailable, Detail: "grants are not part of this test"}
}
