//go:build e2e

package knative

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/test/framework/e2bsdk"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// TestE2BThroughTheRoute (issue 48): E2B's SDK, the unmodified e2b package
// (test/e2b), drives sandboxes of the function deployed as config/ deploys
// it on real Knative: the control plane at FUNCTION_URL/e2b through the
// KIngress, the router config/310 deploys, reached at its Service, the key
// make deploy-local generated into the Secret sandbox-e2b-key, the agent's
// image make deploy-local pushed, and config/'s admission policy,
// LimitRange and quota. (config/'s LimitRange once got the agent's Pods
// refused here while every test without it admitted them.) test/e2b's
// bench.mjs creates two sandboxes, runs commands in each, uploads a file,
// and kills them. Stand-in, said here: the template's image
// (realnode.ShellSandboxImage, DeerFlow's sandbox stand-in with a shell,
// built here, never pulled).
func TestE2BThroughTheRoute(t *testing.T) {
	need(t)
	dir := e2bsdk.Dir(t)
	ctx := context.Background()
	const name = "e2b-route"
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplateEnvd: "true", keys.TemplateDeerFlowMounts: "false"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: realnode.ShellSandboxImage}}}},
	}
	if _, err := kube.CoreV1().PodTemplates(ns).Create(ctx, pt, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the template %s: %v", name, err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().PodTemplates(ns).Delete(ctx, name, metav1.DeleteOptions{}) })
	router, err := kube.CoreV1().Services(ns).Get(ctx, "sandbox-router", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the router's Service, which config/310-router.yaml deploys: %v", err)
	}

	// Every replica's template watch sees the new template within moments;
	// the bench's first create is retried by nobody, so wait for it here.
	eventually(t, 30*time.Second, "the template "+name+" listed", func() (bool, error) {
		r := call(t, "GET", "/api/templates", nil)
		return strings.Contains(string(r.Raw), `"`+name+`"`), nil
	})
	runCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	out, err := e2bsdk.Command(runCtx, dir, map[string]string{
		"E2B_API_URL": fnURL + "/e2b", "E2B_SANDBOX_URL": "http://" + net.JoinHostPort(router.Spec.ClusterIP, "80"),
		"E2B_API_KEY": apiKey, "E2B_TEMPLATE": name, "E2B_BENCH_ROUNDS": "2", "E2B_BENCH_RUNS": "5", "E2B_BENCH_UPLOADS": "1",
	}, "bench.mjs").CombinedOutput()
	t.Logf("node bench.mjs through FUNCTION_URL/e2b and the router:\n%s", out)
	if err != nil {
		t.Fatalf("E2B's SDK against the Knative deployment: %v", err)
	}
	report, err := e2bsdk.ParseBenchReport(out)
	if err != nil {
		t.Fatal(err)
	}
	if report.Create.N != 2 || report.RunTrue.N != 5 || len(report.FirstRunFailures) != 0 {
		t.Errorf("bench.mjs made %d creates and %d runs with first-run failures %v; want 2, 5 and none", report.Create.N, report.RunTrue.N, report.FirstRunFailures)
	}
	// Nothing is left behind: the SDK's kill removed both.
	eventually(t, 60*time.Second, "no sandbox of "+name+" left", func() (bool, error) {
		l, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=deer-flow-sandbox"})
		if err != nil {
			return false, err
		}
		for _, p := range l.Items {
			if p.Annotations[keys.AnnotationTemplate] == name && p.DeletionTimestamp == nil {
				return false, nil
			}
		}
		return true, nil
	})
}
