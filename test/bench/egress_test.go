//go:build e2e

package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// BenchmarkEgress measures what the egress proxy costs (issue 46), on the
// real node under gVisor, against the public host of the fake internet:
//   - an HTTPS request's time to first byte, each on a new connection, from
//     inside an open sandbox straight to the host (by address: an open
//     sandbox's DNS is the cluster's stand-in) and from inside an allowlist
//     sandbox through the proxy (by name: the proxy resolves it, its CONNECT
//     and ClientHello check included), at c=1 and c=8, rounds alternating;
//   - create → Ready of an allowlist sandbox against an open one,
//     alternating.
//
// Targets: +5 ms p50 at c=1 and +20 % at c=8 for the first byte; create →
// Ready within 10 % of open's.
func BenchmarkEgress(b *testing.B) {
	ctx := context.Background()
	kc, err := cluster.UpWith(ctx, "benchegress", cluster.Options{APIServerSANs: []string{"10.96.0.1"}}) // the proxy is an in-cluster client
	if err != nil {
		b.Fatal(err)
	}
	defer kc.Down()
	env, down := realNodeEnv(b, kc, "egress proxy")
	defer down()
	if err := realnode.DeployProxy(ctx, kc.Client, filepath.Join("..", "..", "config", "300-egress-proxy.yaml"), ns); err != nil {
		b.Fatal(err)
	}
	env["SANDBOX_NETWORK_POLICY_ENSURE"] = "true"
	fn, err := function.StartBinary(binary(b), env, filepath.Join(b.TempDir(), "fn.log"))
	if err != nil {
		b.Fatal(err)
	}
	defer fn.Stop()
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: template.ContainerName, Image: realnode.SandboxImage}}}
	pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: "allowlist", Namespace: ns, Labels: map[string]string{keys.LabelTemplate: "true"},
		Annotations: map[string]string{keys.TemplateEgress: "allowlist", keys.TemplateEgressAllow: realnode.AllowedName}}, Template: corev1.PodTemplateSpec{Spec: spec}}
	if _, err := kc.Client.CoreV1().PodTemplates(ns).Create(ctx, pt, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	create := func(id, tmpl string) (time.Duration, string) {
		body := map[string]any{"sandbox_id": id}
		if tmpl != "" {
			body["template"] = tmpl
		}
		start := time.Now()
		r, err := fn.Do("POST", "/api/sandboxes?wait=20s", body)
		took := time.Since(start)
		if err != nil || r.Code != 200 || r.Body["ready"] != true {
			b.Fatalf("create %s: %v %d %s", id, err, r.Code, r.Raw)
		}
		pods, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "sandbox-id=" + id})
		if err != nil || len(pods.Items) != 1 {
			b.Fatalf("the Pod of %s: %v", id, err)
		}
		return took, pods.Items[0].Status.PodIP
	}
	destroy := func(id string) {
		if r, err := fn.Do("DELETE", "/api/sandboxes/"+id, nil); err != nil || r.Code != 200 {
			b.Fatalf("destroy %s: %v", id, err)
		}
	}

	// Create → Ready, alternating, one sandbox on the node at a time.
	const creates = 10
	var openCreate, allowCreate []time.Duration
	progress("egress: %d creates → Ready each, open and allowlist alternating", creates)
	for i := 0; i < creates; i++ {
		d, _ := create(fmt.Sprintf("co%d", i), "")
		openCreate = append(openCreate, d)
		destroy(fmt.Sprintf("co%d", i))
		d, _ = create(fmt.Sprintf("ca%d", i), "allowlist")
		allowCreate = append(allowCreate, d)
		destroy(fmt.Sprintf("ca%d", i))
	}

	// Time to first byte, from inside one sandbox of each mode.
	_, openIP := create("ttfb-open", "")
	_, allowIP := create("ttfb-allow", "allowlist")
	time.Sleep(6 * time.Second) // the policy agent's window for new Pods (docs/security.md)
	direct := "https://" + realnode.PublicIP + "/v1/sandbox"
	proxied := "https://" + realnode.AllowedName + "/v1/sandbox"
	type row struct {
		c                  int
		direct, proxied    []time.Duration
		cpuDirect, cpuProx cpuUse // what each part of the machine used, over the rounds
	}
	var rows []row
	timed := func(into cpuUse, f func() []time.Duration) []time.Duration {
		before, err := sampleCPU(0)
		if err != nil {
			b.Fatal(err)
		}
		out := f()
		after, err := sampleCPU(0)
		if err != nil {
			b.Fatal(err)
		}
		into.add(before, after)
		return out
	}
	for _, c := range []int{1, 8} {
		const rounds, perRound = 5, 40
		progress("egress: HTTPS time to first byte at c=%d, %d rounds of %d, direct and proxied alternating", c, rounds, perRound)
		r := row{c: c, cpuDirect: cpuUse{}, cpuProx: cpuUse{}}
		for i := 0; i < rounds; i++ {
			r.direct = append(r.direct, timed(r.cpuDirect, func() []time.Duration { return firstBytes(b, openIP, direct, perRound, c) })...)
			r.proxied = append(r.proxied, timed(r.cpuProx, func() []time.Duration { return firstBytes(b, allowIP, proxied, perRound, c) })...)
		}
		rows = append(rows, r)
	}

	var md strings.Builder
	fmt.Fprintf(&md, "\n| egress (real node, gVisor) | n | open p50 ms | allowlist p50 ms | difference | open p95 ms | allowlist p95 ms |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&md, "| HTTPS first byte, new connection, c=%d (direct vs through the proxy) | %d | %.1f | %.1f | %+.1f ms (%.2f×) | %s | %s |\n",
			r.c, len(r.proxied), pct(r.direct, .5), pct(r.proxied, .5), pct(r.proxied, .5)-pct(r.direct, .5), pct(r.proxied, .5)/pct(r.direct, .5),
			pctText(r.direct, .95, "%.1f"), pctText(r.proxied, .95, "%.1f"))
	}
	fmt.Fprintf(&md, "| create → Ready | %d | %.0f | %.0f | %+.0f ms (%.2f×) | %s | %s |\n", len(allowCreate),
		pct(openCreate, .5), pct(allowCreate, .5), pct(allowCreate, .5)-pct(openCreate, .5), pct(allowCreate, .5)/pct(openCreate, .5),
		pctText(openCreate, .95, "%.0f"), pctText(allowCreate, .95, "%.0f"))
	fmt.Fprintf(&md, "\nTargets (issue 46): first byte ≤ +5 ms p50 at c=1 and ≤ +20 %% at c=8; create → Ready within 10 %% of open.\n")
	last := rows[len(rows)-1]
	fmt.Fprintf(&md, "\nCPU per request at c=%d (ms, /proc), by part of the machine:\n\n| CPU of | direct | through the proxy |\n|---|---|---|\n", last.c)
	names := []string{"machine"}
	for k := range last.cpuProx {
		if k != "machine" {
			names = append(names, k)
		}
	}
	sort.Slice(names[1:], func(i, j int) bool { return last.cpuProx[names[1+i]] > last.cpuProx[names[1+j]] })
	for _, k := range names {
		fmt.Fprintf(&md, "| %s | %.2f | %.2f |\n", k, 1000*last.cpuDirect[k]/float64(len(last.direct)), 1000*last.cpuProx[k]/float64(len(last.proxied)))
	}
	fmt.Println(md.String())
}

// firstBytes asks the sandbox at podIP (the stand-in's timing action) for n
// requests to url, c at a time, and returns their times to first byte.
func firstBytes(b *testing.B, podIP, url string, n, c int) []time.Duration {
	b.Helper()
	body, _ := json.Marshal(map[string]any{"op": "timing", "url": url, "n": n, "concurrency": c, "timeout_ms": 60000})
	resp, err := (&http.Client{Timeout: 90 * time.Second}).Post("http://"+net.JoinHostPort(podIP, "8080")+"/v1/exec", "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	var r struct {
		OK    bool     `json:"ok"`
		Error string   `json:"error"`
		Items []string `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || !r.OK || len(r.Items) != n {
		b.Fatalf("timing %s from %s: %v %s (%d samples)", url, podIP, err, r.Error, len(r.Items))
	}
	out := make([]time.Duration, 0, n)
	for _, s := range r.Items {
		us, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, time.Duration(us)*time.Microsecond)
	}
	return out
}
