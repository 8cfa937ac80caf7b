//go:build e2e

package bench

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/envd"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// wakeRounds is how many times BenchmarkE2BWake pauses its sandbox and
// wakes it with a request (issue 60 asks for at least 20 on the real node).
const wakeRounds = 20

// BenchmarkE2BWake measures resume on traffic on the real node under
// gVisor: an E2B sandbox made with autoPause and autoResume on a template
// that pauses (kind ReplicaSet, idle-action pause) is paused through E2B's
// API (POST /sandboxes/{id}/pause, answered once its Pod is gone) and
// then sent one request through the router (the agent's /health, with the
// envd token), wakeRounds times. It prints, p50 and the maximum (p99 from
// 100 samples), the time from that request to its 200 (the router's
// resume, the cold start of the next Pod, its Ready, the forward), beside
// the same request once the sandbox is awake (a warm request through the
// router: the waker is out of the path).
//
//	CI=true go test -tags e2e -count=1 -run '^$' -bench '^BenchmarkE2BWake$' -benchtime 1x ./test/bench/
func BenchmarkE2BWake(b *testing.B) {
	ctx := context.Background()
	kc, router, fn, stop := e2bStack(b, "benchwake", "resume on traffic")
	defer stop()
	const tmpl = "e2b-wake"
	pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: tmpl, Namespace: ns, Labels: map[string]string{keys.LabelTemplate: "true"},
		Annotations: map[string]string{keys.TemplateEnvd: "true", keys.TemplateDeerFlowMounts: "false", keys.TemplateKind: template.KindReplicaSet, keys.TemplateIdleAction: template.IdlePause}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: template.ContainerName, Image: realnode.ShellSandboxImage}}}}}
	if _, err := kc.Client.CoreV1().PodTemplates(ns).Create(ctx, pt, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	key := map[string]string{"X-API-Key": function.Key}
	r, err := fn.DoWithHeaders("POST", "/e2b/sandboxes", map[string]any{"templateID": tmpl, "timeout": 3600, "autoPause": true, "autoResume": map[string]any{"enabled": true}}, key)
	if err != nil || r.Code != http.StatusCreated {
		b.Fatalf("E2B create: %v %d %s", err, r.Code, r.Raw)
	}
	id, _ := r.Body["sandboxID"].(string)
	token, _ := r.Body["envdAccessToken"].(string)
	defer fn.DoWithHeaders("DELETE", "/e2b/sandboxes/"+id, nil, key)
	client := &http.Client{Timeout: 90 * time.Second}
	health := func() (time.Duration, error) {
		req, err := http.NewRequest("GET", router.URL+"/health", nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(envd.Port))
		req.Header.Set(envd.TokenHeader, token)
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return 0, fmt.Errorf("/health through the router: %d", resp.StatusCode)
		}
		return time.Since(t0), nil
	}
	progress("wake: %d rounds of pause, then one request through the router that wakes it", wakeRounds)
	var woken, warm []time.Duration
	for i := 0; i < wakeRounds; i++ {
		if r, err := fn.DoWithHeaders("POST", "/e2b/sandboxes/"+id+"/pause", nil, key); err != nil || r.Code != http.StatusNoContent {
			b.Fatalf("round %d: pause: %v %d %s", i, err, r.Code, r.Raw)
		}
		// Paused once its Pod is gone: before that, the router may still
		// reach the Pod on its way out.
		deadline := time.Now().Add(2 * time.Minute)
		for {
			pods, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelID + "=" + id})
			if err == nil && len(pods.Items) == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("round %d: the paused sandbox's Pod is not gone after 2 minutes: %v", i, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		d, err := health()
		if err != nil {
			b.Fatalf("round %d: the waking request: %v", i, err)
		}
		woken = append(woken, d)
		for j := 0; j < 5; j++ {
			d, err := health()
			if err != nil {
				b.Fatalf("round %d: a warm request: %v", i, err)
			}
			warm = append(warm, d)
		}
		progress("wake: round %d/%d: paused → first 200 at the router %.0f ms", i+1, wakeRounds, float64(d.Microseconds())/1000)
	}
	var md strings.Builder
	fmt.Fprintf(&md, "# Benchmark E2BWake %s\n\n| measure | n | p50 ms | p99 ms |\n|---|---|---|---|\n", time.Now().UTC().Format(time.RFC3339))
	fmt.Fprintf(&md, "| paused → first 200 at the router (the request that wakes it) | %d | %.1f | %s |\n", len(woken), pct(woken, .5), pctText(woken, .99, "%.1f"))
	fmt.Fprintf(&md, "| the same request once awake (warm, through the router) | %d | %.1f | %s |\n", len(warm), pct(warm, .5), pctText(warm, .99, "%.1f"))
	fmt.Fprintf(&md, "\nTarget: paused → first byte ≤ 1,500 ms p50 under gVisor. A pause here keeps the volumes, not the processes: each wake is a cold start of the sandbox's next Pod.\n")
	fmt.Println(md.String())
	b.ReportMetric(pct(woken, .5), "wake-p50-ms")
	b.ReportMetric(pct(warm, .5), "warm-p50-ms")
}
