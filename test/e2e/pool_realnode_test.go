//go:build e2e

package e2e

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// TestRealPoolClaimAnswers: on the real node, a pooled Pod stands Ready
// for real (its probe passed in the kubelet), a create claims it, answers
// Ready at once, and the sandbox answers at its URL from that same Pod.
func TestRealPoolClaimAnswers(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	f := start(t, ns, realEnv(t, ns, map[string]string{"SANDBOX_INGRESS_NODE_CIDRS": "10.88.0.1/32"}))
	putTemplate(t, ns, pooledTemplate("warm", 1, corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: realnode.SandboxImage}}}))
	keepPools(t, f)
	eventually(t, 90*time.Second, "a Ready pooled Pod on the real node", func() (bool, error) {
		return poolReady(t, ns, "warm") == 1, nil
	})
	began := time.Now()
	r := mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "realpool", "template": "warm"})
	took := time.Since(began)
	if r.Code != 200 || r.Body["pooled"] != true || r.Body["ready"] != true || r.Body["status"] != "Running" {
		t.Fatalf("create from the pool on the real node: %d %s", r.Code, r.Raw)
	}
	t.Logf("create from the pool → Ready in %s", took.Round(time.Millisecond))
	pod := runningPod(t, ns, "realpool")
	if pod.Labels[pooledLabel] != "true" {
		t.Fatalf("sandbox Pod %s is not the claimed one", pod.Name)
	}
	url, _ := r.Body["sandbox_url"].(string)
	began = time.Now()
	answers(t, url+"/v1/sandbox", pod.Name) // the stand-in names the Pod it runs in
	t.Logf("%s answered %s after the create", url, time.Since(began).Round(time.Millisecond))
	// The pool refills on the real node.
	eventually(t, 90*time.Second, "the pool refilled", func() (bool, error) {
		return poolReady(t, ns, "warm") == 1, nil
	})
}
