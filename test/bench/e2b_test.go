//go:build e2e

package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/deerflow-sandbox/provisioner/pkg/envd"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/filesystem/filesystemconnect"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process/processconnect"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/e2bsdk"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// e2bCommand is how to run BenchmarkE2B alone; its table prints it, so a
// figure pasted elsewhere says what produced it.
const e2bCommand = "CI=true flock /tmp/e2e.lock go test -tags e2e -count=1 -run '^$' -bench '^BenchmarkE2B$' -benchtime 1x ./test/bench/"

// e2bRunTarget is issue 48's target for commands.run('true') through the
// router at c=1, p50.
const e2bRunTarget = 10 * time.Millisecond

// BenchmarkE2B measures E2B's SDK (the unmodified e2b package,
// test/e2b/bench.mjs) on the real node under gVisor, through the function's
// /e2b control plane, config/'s router and the agent (issue 48):
//   - Sandbox.create → its first commands.run('true') answered, cold, beside
//     our HTTP API's create → Ready of the same template (POST
//     /api/sandboxes?wait=20s), the two alternating each round;
//   - commands.run('true') round trips at c=1 through the router, beside
//     files.exists (one unary Connect call, no process), alternating;
//   - a 10 MiB files.write's MiB/s, median of 3;
//   - then, from Go with the agent's own generated client, where a run's
//     time goes: /health through the router, filesystem.Stat and
//     process.Start of /bin/bash -l -c true through the router and straight
//     to the Pod, and process.Start of /bin/bash -c true and of /bin/true
//     straight to the Pod, all alternating.
//
// Then the same create → first run from a warm pool of the same image
// (e2bPoolSize Pods standing Ready before the rounds, as many rounds; the
// function's pool_claims_total says how many were claimed).
func BenchmarkE2B(b *testing.B) {
	ctx := context.Background()
	sdk := e2bsdk.Dir(b)
	kc, router, fn, stop := e2bStack(b, "benche2b", "E2B")
	defer stop()
	const tmpl = "e2b"
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: template.ContainerName, Image: realnode.ShellSandboxImage}}}
	pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: tmpl, Namespace: ns, Labels: map[string]string{keys.LabelTemplate: "true"},
		Annotations: map[string]string{keys.TemplateEnvd: "true", keys.TemplateDeerFlowMounts: "false"}}, Template: corev1.PodTemplateSpec{Spec: spec}}
	if _, err := kc.Client.CoreV1().PodTemplates(ns).Create(ctx, pt, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}

	const rounds, runs, uploads = 20, 200, 3
	progress("e2b: %d rounds of Sandbox.create → first commands.run and our HTTP API's create → Ready, alternating; %d commands.run('true') and files.exists; %d uploads of 10 MiB", rounds, runs, uploads)
	defer func() {
		// On failure, the function's last words: a bench.mjs that lost
		// the control plane says only "fetch failed".
		if b.Failed() {
			if data, err := os.ReadFile(fn.LogPath); err == nil {
				lines := strings.Split(strings.TrimSpace(string(data)), "\n")
				b.Logf("the function's log, last lines:\n%s", strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
		}
	}()
	figs := runE2BBench(b, sdk, map[string]string{
		"E2B_API_URL": fn.URL + "/e2b", "E2B_SANDBOX_URL": router.URL, "E2B_API_KEY": function.Key, "E2B_TEMPLATE": tmpl,
		"E2B_BENCH_HTTP_API": fn.URL, "E2B_BENCH_ROUNDS": strconv.Itoa(rounds), "E2B_BENCH_RUNS": strconv.Itoa(runs),
		"E2B_BENCH_UPLOADS": strconv.Itoa(uploads),
	})

	figs.RouterRefusals = routerRefusals(ctx, kc)
	figs.Pool = e2bPooledPass(b, kc, fn, sdk, spec, router.URL)

	progress("e2b: where a run's time goes: %d each of /health, Stat and Start through the router and straight to the Pod, alternating", runs)
	calls := e2bBreakdown(b, kc, fn, tmpl, router.URL, runs)
	fmt.Println(e2bReport(figs, calls))
}

// e2bPoolSize is the warm pool of the pooled pass, and its rounds: each
// round claims a Pod that stood Ready before the pass began.
const e2bPoolSize = 10

// e2bPooled is the pooled pass's figures and how many of its creates the
// pool served.
type e2bPooled struct {
	Figures e2bFigures
	Claimed int
}

// e2bPooledPass makes a template like the cold one with a warm pool,
// waits until its Pods stand Ready (a reap makes the pool), and runs
// bench.mjs's creates against it.
func e2bPooledPass(b *testing.B, kc *cluster.Cluster, fn *function.Instance, sdk string, spec corev1.PodSpec, routerURL string) *e2bPooled {
	ctx := context.Background()
	const tmpl = "e2b-pool"
	pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: tmpl, Namespace: ns, Labels: map[string]string{keys.LabelTemplate: "true"},
		Annotations: map[string]string{keys.TemplateEnvd: "true", keys.TemplateDeerFlowMounts: "false", keys.TemplatePoolSize: strconv.Itoa(e2bPoolSize)}},
		Template: corev1.PodTemplateSpec{Spec: spec}}
	if _, err := kc.Client.CoreV1().PodTemplates(ns).Create(ctx, pt, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	if err := ours(fn, "POST", "/api/reap", nil); err != nil {
		b.Fatal(err)
	}
	progress("e2b: waiting for %d pooled Pods of %s to stand Ready", e2bPoolSize, tmpl)
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelPool + "=" + tmpl})
		if err != nil {
			return false, nil
		}
		n := 0
		for i := range l.Items {
			if p := &l.Items[i]; p.DeletionTimestamp == nil && p.Labels[keys.LabelID] == "" && realnode.Ready(p) {
				n++
			}
		}
		return n >= e2bPoolSize, nil
	})
	if err != nil {
		b.Fatalf("the pool of %s never stood %d Ready: %v", tmpl, e2bPoolSize, err)
	}
	before, err := poolClaims(fn, tmpl)
	if err != nil {
		b.Fatal(err)
	}
	progress("e2b: %d rounds of Sandbox.create → first commands.run from the warm pool", e2bPoolSize)
	figs := runE2BBench(b, sdk, map[string]string{
		"E2B_API_URL": fn.URL + "/e2b", "E2B_SANDBOX_URL": routerURL, "E2B_API_KEY": function.Key, "E2B_TEMPLATE": tmpl,
		"E2B_BENCH_ROUNDS": strconv.Itoa(e2bPoolSize), "E2B_BENCH_RUNS": "5", "E2B_BENCH_UPLOADS": "1",
	})
	after, err := poolClaims(fn, tmpl)
	if err != nil {
		b.Fatal(err)
	}
	return &e2bPooled{Figures: figs, Claimed: int(after - before)}
}

// poolClaims is how many creates of template the function's pool has
// served (pool_claims_total, results wired and hit).
func poolClaims(fn *function.Instance, template string) (float64, error) {
	resp, err := fn.Client.Get(fn.URL + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var n float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "sandbox_provisioner_pool_claims_total{") || !strings.Contains(line, `template="`+template+`"`) ||
			!(strings.Contains(line, `result="hit"`) || strings.Contains(line, `result="wired"`)) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("pool_claims_total: %q: %w", line, err)
		}
		n += v
	}
	return n, sc.Err()
}

// e2bFigures is bench.mjs's report and what BenchmarkE2B adds to it.
type e2bFigures struct {
	e2bsdk.BenchReport
	// What the router logged as refused or failed during the run: why a
	// first run failed.
	RouterRefusals []string
	// Pool is the pooled pass.
	Pool *e2bPooled
}

// runE2BBench runs node bench.mjs in dir with env, bounded, and returns its
// figures; its progress (stderr) goes to this process's stderr as it comes.
func runE2BBench(b *testing.B, dir string, env map[string]string) e2bFigures {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	cmd := e2bsdk.Command(ctx, dir, env, "bench.mjs")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		b.Fatalf("node bench.mjs: %v\n%s", err, out.String())
	}
	report, err := e2bsdk.ParseBenchReport(out.Bytes())
	if err != nil {
		b.Fatalf("node bench.mjs printed no figures: %v\n%s", err, out.String())
	}
	return e2bFigures{BenchReport: report}
}

// e2bCall is one kind of call the breakdown times, and its samples.
type e2bCall struct {
	name string
	do   func(ctx context.Context) error
	ds   []time.Duration
}

// headerTransport adds fixed headers to every request: the sandbox's
// name, port and token, as the SDK sends them.
type headerTransport struct {
	base    http.RoundTripper
	headers map[string]string
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.headers {
		r.Header.Set(k, v)
	}
	return h.base.RoundTrip(r)
}

// e2bBreakdown makes one sandbox through the E2B API and times, n each at
// c=1, alternating call by call: what the router adds (/health and Stat
// through it against Stat straight to the Pod's agent) and what starting
// a process costs (Start of the SDK's /bin/bash -l -c true through the
// router and straight to the Pod, of /bin/bash -c true, and of /bin/true:
// without the login shell, and without any shell). Each client is HTTP/1.1
// with keep-alive and Connect's JSON codec, as the SDK's.
func e2bBreakdown(b *testing.B, kc *cluster.Cluster, fn *function.Instance, tmpl, routerURL string, n int) []*e2bCall {
	b.Helper()
	ctx := context.Background()
	r, err := fn.DoWithHeaders("POST", "/e2b/sandboxes", map[string]any{"templateID": tmpl, "timeout": 600}, map[string]string{"X-API-Key": function.Key})
	if err != nil || r.Code != http.StatusCreated {
		b.Fatalf("E2B create: %v %d %s", err, r.Code, r.Raw)
	}
	id, _ := r.Body["sandboxID"].(string)
	token, _ := r.Body["envdAccessToken"].(string)
	if id == "" || token == "" {
		b.Fatalf("E2B create answered no sandboxID or envdAccessToken: %s", r.Raw)
	}
	defer func() {
		if r, err := fn.DoWithHeaders("DELETE", "/e2b/sandboxes/"+id, nil, map[string]string{"X-API-Key": function.Key}); err != nil || r.Code != http.StatusNoContent {
			b.Errorf("E2B kill %s: %v %d %s", id, err, r.Code, r.Raw)
		}
	}()
	pods, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelID + "=" + id})
	if err != nil || len(pods.Items) != 1 || pods.Items[0].Status.PodIP == "" {
		b.Fatalf("the Pod of %s: %v (%d Pods)", id, err, len(pods.Items))
	}
	direct := "http://" + net.JoinHostPort(pods.Items[0].Status.PodIP, strconv.Itoa(envd.Port))
	client := func(headers map[string]string) *http.Client {
		return &http.Client{Timeout: 30 * time.Second, Transport: headerTransport{base: &http.Transport{MaxIdleConnsPerHost: 4}, headers: headers}}
	}
	viaRouter := client(map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": strconv.Itoa(envd.Port), envd.TokenHeader: token})
	toPod := client(map[string]string{envd.TokenHeader: token})
	fsRouter := filesystemconnect.NewFilesystemClient(viaRouter, routerURL, connect.WithProtoJSON())
	fsPod := filesystemconnect.NewFilesystemClient(toPod, direct, connect.WithProtoJSON())
	procRouter := processconnect.NewProcessClient(viaRouter, routerURL, connect.WithProtoJSON())
	procPod := processconnect.NewProcessClient(toPod, direct, connect.WithProtoJSON())

	health := func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, "GET", routerURL+"/health", nil)
		if err != nil {
			return err
		}
		resp, err := viaRouter.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusNoContent {
			return fmt.Errorf("/health through the router: %d", resp.StatusCode)
		}
		return nil
	}
	stat := func(c filesystemconnect.FilesystemClient) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := c.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: "/tmp"}))
			return err
		}
	}
	start := func(c processconnect.ProcessClient, cmd string, args ...string) func(context.Context) error {
		return func(ctx context.Context) error { return runToEnd(ctx, c, cmd, args...) }
	}
	calls := []*e2bCall{
		{name: "GET /health through the router (no RPC)", do: health},
		{name: "filesystem.Stat through the router", do: stat(fsRouter)},
		{name: "filesystem.Stat straight to the Pod's agent", do: stat(fsPod)},
		{name: "process.Start `/bin/bash -l -c true` through the router (what commands.run sends)", do: start(procRouter, "/bin/bash", "-l", "-c", "true")},
		{name: "process.Start `/bin/bash -l -c true` straight to the Pod's agent", do: start(procPod, "/bin/bash", "-l", "-c", "true")},
		{name: "process.Start `/bin/bash -c true` straight to the Pod's agent (no login shell)", do: start(procPod, "/bin/bash", "-c", "true")},
		{name: "process.Start `/bin/true` straight to the Pod's agent (no shell)", do: start(procPod, "/bin/true")},
	}
	const warmup = 5
	for i := -warmup; i < n; i++ {
		for _, c := range calls {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			t := time.Now()
			err := c.do(cctx)
			d := time.Since(t)
			cancel()
			if err != nil {
				b.Fatalf("%s: %v", c.name, err)
			}
			if i >= 0 {
				c.ds = append(c.ds, d)
			}
		}
	}
	return calls
}

// runToEnd starts cmd with args through c and reads its events to the end
// one, which must say it exited 0.
func runToEnd(ctx context.Context, c processconnect.ProcessClient, cmd string, args ...string) error {
	stream, err := c.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: cmd, Args: args}}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		if end := stream.Msg().GetEvent().GetEnd(); end != nil {
			if !end.GetExited() || end.GetExitCode() != 0 {
				return fmt.Errorf("%s %v ended %s (exit %d)", cmd, args, end.GetStatus(), end.GetExitCode())
			}
			return nil
		}
	}
	if err := stream.Err(); err != nil {
		return err
	}
	return fmt.Errorf("%s %v: the stream ended without an end event", cmd, args)
}

// e2bReport is BenchmarkE2B's table, as Markdown.
func e2bReport(f e2bFigures, calls []*e2bCall) string {
	var md strings.Builder
	fmt.Fprintf(&md, "\n<!-- %s -->\n", e2bCommand)
	fmt.Fprintf(&md, "| E2B (real node, gVisor, template %q) | n | p50 ms | p99 ms |\n|---|---|---|---|\n", f.Template)
	line := func(name string, ds []time.Duration) {
		fmt.Fprintf(&md, "| %s | %d | %.1f | %s |\n", name, len(ds), pct(ds, .5), pctText(ds, .99, "%.1f"))
	}
	line("`Sandbox.create` → first `commands.run('true')` answered, cold", f.CreateToRun.Durations())
	line("&nbsp;&nbsp;of which `Sandbox.create`", f.Create.Durations())
	line("&nbsp;&nbsp;of which the first `commands.run('true')`", f.FirstRun.Durations())
	if f.HTTPCreate != nil {
		line("our HTTP API's create → Ready, same template, same rounds (alternating)", f.HTTPCreate.Durations())
	}
	if p := f.Pool; p != nil {
		line(fmt.Sprintf("`Sandbox.create` → first `commands.run('true')` answered, from a warm pool (%d of %d creates claimed a pooled Pod)", p.Claimed, p.Figures.Rounds),
			p.Figures.CreateToRun.Durations())
		line("&nbsp;&nbsp;of which `Sandbox.create`", p.Figures.Create.Durations())
		line("&nbsp;&nbsp;of which the first `commands.run('true')` (the router gives the agent its token's hash first)", p.Figures.FirstRun.Durations())
	}
	run := f.RunTrue.Durations()
	line("`commands.run('true')` through the router, c=1", run)
	line("`files.exists('/tmp')` through the router, c=1 (one unary Connect call: filesystem.Stat), alternating with the runs", f.Exists.Durations())
	for _, c := range calls {
		line(c.name, c.ds)
	}
	fmt.Fprintf(&md, "| 10 MiB `files.write` | %d | %.1f MiB/s (median) | samples %v MiB/s |\n", f.Upload.N, f.Upload.Median, f.Upload.Samples)
	if len(f.FirstRunFailures) > 0 {
		fmt.Fprintf(&md, "\nThe first `commands.run` after `Sandbox.create` failed %d times in %d rounds (then retried every 100 ms; the rounds' times include the retries):\n", len(f.FirstRunFailures), f.Rounds)
		for _, m := range f.FirstRunFailures {
			fmt.Fprintf(&md, "- %s\n", m)
		}
	}
	if len(f.RouterRefusals) > 0 {
		fmt.Fprintf(&md, "\nThe router's refusals and failures in the SDK's run (its log, %d lines; the first 10):\n", len(f.RouterRefusals))
		for _, l := range f.RouterRefusals[:min(10, len(f.RouterRefusals))] {
			fmt.Fprintf(&md, "- `%s`\n", l)
		}
	}
	met := "met"
	if pct(run, .5) > float64(e2bRunTarget.Microseconds())/1000 {
		met = "not met"
	}
	fmt.Fprintf(&md, "\nTarget (issue 48): `commands.run('true')` through the router ≤ %d ms p50 at c=1: %s (%.1f ms).\n", e2bRunTarget.Milliseconds(), met, pct(run, .5))
	return md.String()
}

// TestE2BReport: the run target is judged on the runs' p50 (met at or
// under 10 ms, not met over it), the warm-pool rows say how many creates
// the pool served, our HTTP API's row is there only when measured, and the
// table carries the command that produced it.
func TestE2BReport(t *testing.T) {
	ms := func(xs ...float64) e2bsdk.Summary { return e2bsdk.Summary{N: len(xs), Samples: xs} }
	httpFig := ms(900, 1000)
	tests := []struct {
		name    string
		runs    e2bsdk.Summary
		http    *e2bsdk.Summary
		want    []string
		wantNot []string
	}{
		{name: "met at the target", runs: ms(5, 10, 10, 30), want: []string{"≤ 10 ms p50 at c=1: met (10.0 ms)"}, wantNot: []string{"our HTTP API"}},
		{name: "not met just over it", runs: ms(5, 10.1, 10.1, 30), http: &httpFig,
			want: []string{"≤ 10 ms p50 at c=1: not met (10.1 ms)", "| our HTTP API's create → Ready, same template, same rounds (alternating) | 2 | 900.0 | max 1000.0 (n=2) |"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := e2bFigures{BenchReport: e2bsdk.BenchReport{Template: "e2b", RunTrue: tc.runs, HTTPCreate: tc.http, CreateToRun: ms(1500), Create: ms(1400), FirstRun: ms(100), Exists: ms(2)},
				Pool: &e2bPooled{Claimed: 2, Figures: e2bFigures{BenchReport: e2bsdk.BenchReport{Rounds: 2, CreateToRun: ms(200, 240), Create: ms(150, 170), FirstRun: ms(50, 70)}}}}
			got := e2bReport(f, []*e2bCall{{name: "filesystem.Stat straight to the Pod's agent", ds: []time.Duration{time.Millisecond}}})
			for _, w := range append(tc.want, e2bCommand, "| `Sandbox.create` → first `commands.run('true')` answered, from a warm pool (2 of 2 creates claimed a pooled Pod) | 2 | 200.0 | max 240.0 (n=2) |",
				"| filesystem.Stat straight to the Pod's agent | 1 | 1.0 | max 1.0 (n=1) |") {
				if !strings.Contains(got, w) {
					t.Errorf("the report lacks %q:\n%s", w, got)
				}
			}
			for _, w := range tc.wantNot {
				if strings.Contains(got, w) {
					t.Errorf("the report has %q:\n%s", w, got)
				}
			}
		})
	}
}

// routerRefusals is the router Pods' log lines at warning level or above
// (a refusal says its status and reason): why a request through it failed.
func routerRefusals(ctx context.Context, kc *cluster.Cluster) []string {
	pods, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + realnode.RouterName})
	if err != nil {
		return []string{"listing the router's Pods: " + err.Error()}
	}
	var out []string
	for _, p := range pods.Items {
		raw, err := kc.Client.CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			out = append(out, p.Name+": its log: "+err.Error())
			continue
		}
		for _, l := range strings.Split(string(raw), "\n") {
			if strings.Contains(l, `"level":"WARN"`) || strings.Contains(l, `"level":"ERROR"`) {
				out = append(out, p.Name+": "+l)
			}
		}
	}
	return out
}

// e2bStack is what every E2B benchmark stands on: a cluster named name
// with the real node joined (skipping, for what, when it cannot start),
// the router with a fresh token key and its sandbox policy, and the
// function with that key and the agent's image; stop takes all of it down.
func e2bStack(b *testing.B, name, what string) (*cluster.Cluster, *realnode.E2BRouter, *function.Instance, func()) {
	b.Helper()
	return e2bStackIn(b, name, what, "ClusterIP")
}

// e2bStackIn is e2bStack with the sandbox Services of mode (the router
// reaches Pods by address in any).
func e2bStackIn(b *testing.B, name, what, mode string) (*cluster.Cluster, *realnode.E2BRouter, *function.Instance, func()) {
	b.Helper()
	ctx := context.Background()
	kc, err := cluster.UpWith(ctx, name, cluster.Options{APIServerSANs: []string{"10.96.0.1"}}) // the router is an in-cluster client
	if err != nil {
		b.Fatal(err)
	}
	env, down := realNodeEnv(b, kc, what)
	stop := func() { down(); kc.Down() }
	// Where the key the function and the router make and check tokens
	// with is written, for the function.
	keyFile := filepath.Join(b.TempDir(), "key")
	env["SANDBOX_SERVICE_TYPE"] = mode
	env["SANDBOX_ENVD_IMAGE"] = realnode.EnvdImage
	env["E2B_TOKEN_KEY_FILE"] = keyFile
	// The router's sandbox policy is built from this configuration.
	cfg, err := loadConfig(env)
	if err != nil {
		stop()
		b.Fatal(err)
	}
	router, err := realnode.DeployE2BRouter(ctx, kc.Client, filepath.Join("..", "..", "config", "310-router.yaml"), ns, keyFile, cfg.Objects())
	if err != nil {
		stop()
		b.Fatal(err)
	}
	fn, err := function.StartBinary(binary(b), env, filepath.Join(b.TempDir(), "fn.log"))
	if err != nil {
		stop()
		b.Fatal(err)
	}
	return kc, router, fn, func() { fn.Stop(); stop() }
}
