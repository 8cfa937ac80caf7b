//go:build e2e

package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/deerflow-sandbox/provisioner/pkg/envd"
	"github.com/deerflow-sandbox/provisioner/pkg/envd/gen/process/processconnect"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// timelineCommand is how to run BenchmarkRealNodeTimeline alone; its table
// prints it.
const timelineCommand = "CI=true flock /tmp/e2e.lock go test -tags e2e -count=1 -run '^$' -bench '^BenchmarkRealNodeTimeline$' -benchtime 1x ./test/bench/"

// timelineSamples is each kind's number of creates: a p99 needs 100.
// BENCH_TIMELINE_N sets fewer for a quick look; the table then prints the
// maximum of n in the p99's place.
func timelineSamples() int {
	if n, err := strconv.Atoi(os.Getenv("BENCH_TIMELINE_N")); err == nil && n > 0 {
		return n
	}
	return 100
}

// The steps of a create, in order. Each is the moment this process saw
// it, from the create's request: the Pod's changes as its watch delivered
// them (each is the kubelet's or the API server's status write, a few
// milliseconds after the fact), the function's answer as it arrived, and
// the first answer at the sandbox's address.
const (
	stepWritten   = "the API writes (the Pod exists)"
	stepScheduled = "scheduled (spec.nodeName)"
	stepSandboxed = "the sandbox started by runsc (PodReadyToStartContainers)"
	stepStarted   = "container started (state running)"
	stepReady     = "Ready (the Pod's condition)"
	stepAnswered  = "the create answered (`ready: true`; E2B: 201)"
	stepReached   = "first answer at the sandbox's address"
	stepRan       = "first commands.run answered (E2B)"
)

var timelineSteps = []string{stepWritten, stepScheduled, stepSandboxed, stepStarted, stepReady, stepAnswered, stepReached, stepRan}

// timeline is one create's steps, each the time since its request.
type timeline map[string]time.Duration

// timelineKind is one kind of create the benchmark times.
type timelineKind struct {
	name   string
	slug   string // name in a sandbox id and a metric's unit
	pooled bool
	e2b    bool
	tmpl   string
	steps  []timeline
}

// BenchmarkRealNodeTimeline times, on the real node under gVisor, where a
// create's time goes, step by step, for four kinds of create: DeerFlow's
// (POST /api/sandboxes?wait=20s) cold and from a warm pool, and E2B's
// (POST /e2b/sandboxes, then process.Start of `/bin/bash -l -c true`
// through the router, what the SDK's commands.run sends) cold and from a
// warm pool. It prints each step's p50 and p99 per kind.
//
// A DeerFlow sandbox's address is its URL's node port on this machine, what
// DeerFlow gets in NodePort mode (the default); it is polled from the
// host every 5 ms on a new connection from the moment the Pod exists, so a
// sandbox that answers before Ready shows as such. The host is admitted by
// the policy agent as every node is; that a tenant's own backend Pod is
// answered right after `ready: true` is TestReadyMeansReachable's.
//
// One sandbox at a time: each is destroyed, and its Pod gone, before the
// next; a pooled create waits first until the pool stands a Ready Pod,
// wired (awaitPool).
func BenchmarkRealNodeTimeline(b *testing.B) {
	ctx := context.Background()
	kc, router, fn, stop := e2bStackIn(b, "benchtime", "timeline", "NodePort")
	defer stop()
	images := map[bool]string{false: realnode.SandboxImage, true: realnode.ShellSandboxImage}
	kinds := []*timelineKind{
		{name: "DeerFlow, cold", slug: "deerflow-cold", tmpl: "tl-cold"},
		{name: "DeerFlow, pooled", slug: "deerflow-pooled", tmpl: "tl-pool", pooled: true},
		{name: "E2B, cold", slug: "e2b-cold", tmpl: "tl-e2b", e2b: true},
		{name: "E2B, pooled", slug: "e2b-pooled", tmpl: "tl-e2b-pool", e2b: true, pooled: true},
	}
	for _, k := range kinds {
		ann := map[string]string{}
		if k.e2b {
			ann[keys.TemplateEnvd], ann[keys.TemplateDeerFlowMounts] = "true", "false"
		}
		if k.pooled {
			// A pooled Pod belongs to no user or thread yet: a pool's
			// template mounts none of DeerFlow's directories.
			ann[keys.TemplatePoolSize], ann[keys.TemplateDeerFlowMounts] = "2", "false"
		}
		pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: k.tmpl, Namespace: ns, Labels: map[string]string{keys.LabelTemplate: "true"}, Annotations: ann},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: template.ContainerName, Image: images[k.e2b]}}}}}
		if _, err := kc.Client.CoreV1().PodTemplates(ns).Create(ctx, pt, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	n := timelineSamples()
	for _, k := range kinds {
		progress("timeline: %d creates, %s", n, k.name)
		for i := range n {
			if k.pooled {
				awaitPool(b, kc, fn, k.tmpl)
			}
			id := fmt.Sprintf("tl%d-%s", i, k.slug)
			k.steps = append(k.steps, timeOne(b, kc, fn, router.URL, k, id))
		}
	}
	fmt.Println(timelineReport(kinds, n))
	for _, k := range kinds {
		b.ReportMetric(pct(stepOf(k.steps, stepReady), .5), k.slug+"-ready-p50-ms")
		// An E2B sandbox's first answer is its first run; it has no
		// node-port row to report (a 0 would be a figure of record).
		if k.e2b {
			b.ReportMetric(pct(stepOf(k.steps, stepRan), .5), k.slug+"-ran-p50-ms")
		} else {
			b.ReportMetric(pct(stepOf(k.steps, stepReached), .5), k.slug+"-reached-p50-ms")
		}
	}
}

// timeOne makes the sandbox id of kind k, times its steps and destroys it.
func timeOne(b *testing.B, kc *cluster.Cluster, fn *function.Instance, routerURL string, k *timelineKind, id string) timeline {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	pods := kc.Client.CoreV1().Pods(ns)
	var (
		mu sync.Mutex
		tl = timeline{}
	)
	mark := func(step string, start time.Time) {
		mu.Lock()
		defer mu.Unlock()
		if _, seen := tl[step]; !seen {
			tl[step] = time.Since(start)
		}
	}
	// An E2B create names its sandbox itself: its Pod is the one with a
	// sandbox id (one sandbox at a time; a pool's Pods have none).
	sel := keys.LabelID + "=" + id
	if k.e2b {
		sel = keys.LabelID
	}
	w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	start := time.Now()
	ready := make(chan *corev1.Pod, 1)
	go func() {
		var polling bool
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted || p.DeletionTimestamp != nil {
				continue
			}
			mark(stepWritten, start)
			if p.Spec.NodeName != "" {
				mark(stepScheduled, start)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReadyToStartContainers && c.Status == corev1.ConditionTrue {
					mark(stepSandboxed, start)
				}
			}
			for _, s := range p.Status.ContainerStatuses {
				if s.Name == template.ContainerName && s.State.Running != nil {
					mark(stepStarted, start)
				}
			}
			if !polling && !k.e2b {
				polling = true
				go pollAddress(ctx, kc, p.Labels[keys.LabelID], func() { mark(stepReached, start) })
			}
			if realnode.Ready(p) {
				mark(stepReady, start)
				select {
				case ready <- p:
				default:
				}
			}
		}
	}()

	var destroy func()
	if k.e2b {
		key := map[string]string{"X-API-Key": function.Key}
		r, err := fn.DoWithHeaders("POST", "/e2b/sandboxes", map[string]any{"templateID": k.tmpl, "timeout": 300}, key)
		if err != nil || r.Code != http.StatusCreated {
			b.Fatalf("E2B create of %s: %v %d %s", k.tmpl, err, r.Code, r.Raw)
		}
		mark(stepAnswered, start)
		id, _ = r.Body["sandboxID"].(string)
		token, _ := r.Body["envdAccessToken"].(string)
		destroy = func() {
			if r, err := fn.DoWithHeaders("DELETE", "/e2b/sandboxes/"+id, nil, key); err != nil || r.Code != http.StatusNoContent {
				b.Fatalf("E2B kill %s: %v %d %s", id, err, r.Code, r.Raw)
			}
		}
		if err := firstRun(ctx, routerURL, id, token); err != nil {
			b.Fatalf("the first commands.run in %s: %v", id, err)
		}
		mark(stepRan, start)
	} else {
		r, err := fn.Do("POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": id, "template": k.tmpl})
		if err != nil || r.Code != 200 || r.Body["ready"] != true {
			b.Fatalf("create %s of %s: %v %d %s", id, k.tmpl, err, r.Code, r.Raw)
		}
		mark(stepAnswered, start)
		destroy = func() {
			if err := ours(fn, "DELETE", "/api/sandboxes/"+id, nil); err != nil {
				b.Fatal(err)
			}
		}
	}
	select {
	case <-ready:
	case <-ctx.Done():
		b.Fatalf("%s: the watch never showed its Pod Ready", id)
	}
	// The address answers within moments of the answer, or the row says
	// how late: wait for it before the next create. (An E2B sandbox's
	// first answer is its first commands.run, already in.)
	if !k.e2b {
		if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			mu.Lock()
			defer mu.Unlock()
			_, ok := tl[stepReached]
			return ok, nil
		}); err != nil {
			b.Fatalf("%s: its address never answered: %v", id, err)
		}
	}
	destroy()
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 45*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: keys.LabelID + "=" + id})
		return err == nil && len(l.Items) == 0, nil
	}); err != nil {
		b.Fatalf("%s: its Pod did not go: %v", id, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if k.pooled {
		// A claimed Pod was scheduled and started before its create.
		delete(tl, stepScheduled)
		delete(tl, stepSandboxed)
		delete(tl, stepStarted)
	}
	return tl
}

// pollAddress polls the node port of sandbox id's URL from the host every
// 5 ms, each GET /v1/sandbox on a new connection with a 200 ms timeout,
// until one answers 200; then calls reached. The URL's Service is the
// sandbox's own, or the wire of the pooled Pod it claimed (its URL's).
func pollAddress(ctx context.Context, kc *cluster.Cluster, id string, reached func()) {
	var url string
	client := &http.Client{Timeout: 200 * time.Millisecond, Transport: &http.Transport{DisableKeepAlives: true}}
	_ = wait.PollUntilContextCancel(ctx, 5*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		if url == "" {
			svc, err := kc.Client.CoreV1().Services(ns).Get(ctx, resources.ServiceName(id), metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			if wire := svc.Annotations[keys.AnnotationURLService]; wire != "" {
				if svc, err = kc.Client.CoreV1().Services(ns).Get(ctx, wire, metav1.GetOptions{}); err != nil {
					return false, nil
				}
			}
			if len(svc.Spec.Ports) == 0 || svc.Spec.Ports[0].NodePort == 0 {
				return false, nil
			}
			url = nodePortURL(realnode.HostIP(), svc) + "/v1/sandbox"
		}
		resp, err := client.Get(url)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			reached()
			return true, nil
		}
		return false, nil
	})
}

// firstRun is the SDK's first commands.run('true') in sandbox id: a
// process.Start of `/bin/bash -l -c true` through the router, on a new
// connection, read to its end event.
func firstRun(ctx context.Context, routerURL, id, token string) error {
	hc := &http.Client{Timeout: 30 * time.Second, Transport: headerTransport{base: &http.Transport{DisableKeepAlives: true},
		headers: map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": strconv.Itoa(envd.Port), envd.TokenHeader: token}}}
	return runToEnd(ctx, processconnect.NewProcessClient(hc, routerURL, connect.WithProtoJSON()), "/bin/bash", "-l", "-c", "true")
}

// awaitPool waits until the pool of tmpl stands a Ready Pod that no one
// has claimed and a reap has wired (a Service of its own whose node port
// kube-proxy has programmed): the pool's steady state, which config/'s
// PingSource's reap reaches each minute. It reaps every half second
// meanwhile, as the first reap after a template appears makes its pool.
func awaitPool(b *testing.B, kc *cluster.Cluster, fn *function.Instance, tmpl string) {
	b.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelPool + "=" + tmpl})
		if err != nil {
			return false, nil
		}
		for i := range l.Items {
			if p := &l.Items[i]; p.DeletionTimestamp == nil && p.Labels[keys.LabelID] == "" && p.Labels[keys.LabelToken] != "" && realnode.Ready(p) {
				return true, nil
			}
		}
		return false, ours(fn, "POST", "/api/reap", nil)
	})
	if err != nil {
		b.Fatalf("the pool of %s stood no Ready, wired Pod: %v", tmpl, err)
	}
}

// stepOf is every create's time to step, of those that had it.
func stepOf(tls []timeline, step string) []time.Duration {
	var ds []time.Duration
	for _, tl := range tls {
		if d, ok := tl[step]; ok {
			ds = append(ds, d)
		}
	}
	return ds
}

// timelineReport is BenchmarkRealNodeTimeline's table, as Markdown.
func timelineReport(kinds []*timelineKind, n int) string {
	var md strings.Builder
	fmt.Fprintf(&md, "\nwhere a create's time goes, real node, gVisor, one sandbox at a time, n=%d each (ms from the create's request; p50 / p99):\n\n| step |", n)
	for _, k := range kinds {
		fmt.Fprintf(&md, " %s |", k.name)
	}
	md.WriteString("\n|---|" + strings.Repeat("---|", len(kinds)) + "\n")
	for _, step := range timelineSteps {
		fmt.Fprintf(&md, "| %s |", step)
		for _, k := range kinds {
			ds := stepOf(k.steps, step)
			if len(ds) == 0 {
				md.WriteString(" — |")
				continue
			}
			fmt.Fprintf(&md, " %.0f / %s |", pct(ds, .5), pctText(ds, .99, "%.0f"))
		}
		md.WriteString("\n")
	}
	fmt.Fprintf(&md, "\nA pooled create's Pod was scheduled and started before its request (—). Command: `%s`\n", timelineCommand)
	return md.String()
}
