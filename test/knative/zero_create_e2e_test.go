//go:build e2e

package knative

// The create rows of BenchmarkColdStartFromZero (issue 50, item 1): what a
// create sent while the revision is at zero costs, through the route and
// through the Broker, and where one such create's time goes.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// recordedCreate is DeerFlow's recorded create (the golden file's first
// request, no template) with its sandbox_id set to id, and the headers
// DeerFlow sent with it, carrying the deployed function's key.
func recordedCreate(tb testing.TB, id string) ([]byte, map[string]string) {
	tb.Helper()
	r := function.GoldenRequests(tb)[0]
	var body map[string]any
	if err := json.Unmarshal(r.Body, &body); err != nil || body["sandbox_id"] == nil {
		tb.Fatalf("the golden file's first request is not a create: %s (%v)", r.Body, err)
	}
	body["sandbox_id"] = id
	raw, _ := json.Marshal(body)
	h := map[string]string{}
	for k, v := range r.Headers {
		h[k] = v
	}
	h["X-API-Key"] = apiKey
	return raw, h
}

// timedCreate POSTs a create to base's /api/sandboxes and returns how long
// the answer took and what it said; anything but 200 is an error.
func timedCreate(base string, body []byte, headers map[string]string) (time.Duration, map[string]any, error) {
	req, err := http.NewRequest(http.MethodPost, base+"/api/sandboxes", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	start := time.Now()
	resp, err := (&http.Client{Timeout: 90 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("create: %w", err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("create: status %d: %s", resp.StatusCode, raw)
	}
	var got map[string]any
	if err := json.Unmarshal(raw, &got); err != nil {
		return 0, nil, fmt.Errorf("create answered %q: %w", raw, err)
	}
	return took, got, nil
}

// destroyThroughRoute deletes a sandbox made through the route (untimed).
func destroyThroughRoute(tb testing.TB, id string) {
	tb.Helper()
	req, _ := http.NewRequest(http.MethodDelete, fnURL+"/api/sandboxes/"+id, nil)
	req.Header.Set("X-API-Key", apiKey)
	resp, err := (&http.Client{Timeout: 90 * time.Second}).Do(req)
	if err != nil {
		tb.Fatalf("destroy %s: %v", id, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("destroy %s: status %d", id, resp.StatusCode)
	}
}

// zeroPool makes a template with a warm pool of one Pod, removed (with the
// pool) at cleanup; warmPool and poolStands make the pool stand.
func zeroPool(tb testing.TB, name string) {
	tb.Helper()
	ctx := context.Background()
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplatePoolSize: "1", keys.TemplateDeerFlowMounts: "false"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "localhost/sandbox:e2e"}}}},
	}
	if _, err := kube.CoreV1().PodTemplates(ns).Create(ctx, pt, metav1.CreateOptions{}); err != nil {
		tb.Fatalf("template %s: %v", name, err)
	}
	tb.Cleanup(func() {
		_ = kube.CoreV1().PodTemplates(ns).Delete(ctx, name, metav1.DeleteOptions{})
		_ = kube.AppsV1().ReplicaSets(ns).Delete(ctx, "sandbox-pool-"+name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
	})
}

// poolStands makes sure the pool of template name stands one Ready,
// wired Pod: a POST /api/reap through the route makes (or refills) the
// pool's ReplicaSet and wires its Ready Pods; it is sent again until the
// Ready Pod has its Service. It wakes the revision, so call it before the
// wait for zero.
func poolStands(tb testing.TB, name string) {
	tb.Helper()
	ctx := context.Background()
	reap := func() {
		req, _ := http.NewRequest(http.MethodPost, fnURL+"/api/reap", nil)
		req.Header.Set("X-API-Key", apiKey)
		resp, err := (&http.Client{Timeout: 90 * time.Second}).Do(req)
		if err != nil {
			tb.Fatalf("POST /api/reap: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			tb.Fatalf("POST /api/reap: status %d", resp.StatusCode)
		}
	}
	reap()
	eventually(tb, 90*time.Second, "the warm pool of "+name+" stands one Ready, wired Pod", func() (bool, error) {
		l, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelPool + "=" + name})
		if err != nil {
			return false, err
		}
		for _, p := range l.Items {
			if p.DeletionTimestamp != nil || !realnode.Ready(&p) {
				continue
			}
			if _, err := kube.CoreV1().Services(ns).Get(ctx, resources.WireName(&p), metav1.GetOptions{}); err == nil {
				return true, nil
			}
			reap()
			return false, fmt.Errorf("pooled Pod %s Ready, not yet wired", p.Name)
		}
		return false, fmt.Errorf("%d pooled Pods, none Ready", len(l.Items))
	})
}

// broker is what a sender needs to post into the Broker: its ingress URL,
// a Pod of DeerFlow's backend to post from, and a token for its audience.
type broker struct {
	url, audience string
	pod           *corev1.Pod
}

// newBroker reads the Broker's address and starts the sender Pod (as
// postEvent does for the tests, with a testing.TB).
func newBroker(tb testing.TB) *broker {
	tb.Helper()
	ctx := context.Background()
	u, err := dyn.Resource(brokers).Namespace(ns).Get(ctx, "default", metav1.GetOptions{})
	if err != nil {
		tb.Fatalf("the Broker: %v", err)
	}
	br := &broker{}
	br.url, _, _ = unstructured.NestedString(u.Object, "status", "address", "url")
	br.audience, _, _ = unstructured.NestedString(u.Object, "status", "address", "audience")
	if br.url == "" || br.audience == "" {
		tb.Fatalf("the Broker has no address (%q) or audience (%q)", br.url, br.audience)
	}
	const name = "bench-sender"
	br.pod = backendPod(tb, name, backendSA)
	tb.Cleanup(func() { _ = kube.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{}) })
	return br
}

// post sends a binary-mode CloudEvent from the sender Pod and returns the
// ingress's status and how long the POST took, measured here around the
// sender's exec (a local request to the Pod) so the token and the headers
// are made before the clock starts.
func (br *broker) post(tb testing.TB, ceType, data string) (int, time.Duration) {
	tb.Helper()
	tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), backendSA, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{br.audience}, ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	headers := map[string]string{
		"Authorization":  "Bearer " + tr.Status.Token,
		"Content-Type":   "application/json",
		"Ce-Specversion": "1.0",
		"Ce-Type":        ceType,
		"Ce-Source":      "/test/knative/bench",
		"Ce-Id":          fmt.Sprintf("bench-%d", time.Now().UnixNano()),
	}
	action, _ := json.Marshal(map[string]any{"op": "http", "url": br.url, "method": http.MethodPost, "headers": headers, "body": data, "timeout_ms": 90000})
	start := time.Now()
	resp, err := (&http.Client{Timeout: 120 * time.Second}).Post("http://"+br.pod.Status.PodIP+":8080/v1/exec", "application/json", bytes.NewReader(action))
	if err != nil {
		tb.Fatalf("exec in %s: %v", br.pod.Name, err)
	}
	var out strings.Builder
	_, _ = bufio.NewReader(resp.Body).WriteTo(&out)
	resp.Body.Close()
	took := time.Since(start)
	var res struct {
		OK            bool
		Error, Output string
	}
	if err := json.Unmarshal([]byte(out.String()), &res); err != nil || !res.OK {
		tb.Fatalf("POST to the Broker from %s: %s", br.pod.Name, out.String())
	}
	var code int
	if _, err := fmt.Sscan(res.Output, &code); err != nil {
		tb.Fatalf("POST to the Broker: %q", res.Output)
	}
	return code, took
}

// sandboxAppears starts watching for sandbox id's Pod and returns a
// channel that receives the moment the watch first sees it.
func sandboxAppears(tb testing.TB, ctx context.Context, id string) <-chan time.Time {
	tb.Helper()
	w, err := kube.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: sandboxSel + "," + keys.LabelID + "=" + id})
	if err != nil {
		tb.Fatalf("watch sandbox %s: %v", id, err)
	}
	seen := make(chan time.Time, 1)
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if ev.Type == watch.Added || ev.Type == watch.Modified {
				seen <- time.Now()
				return
			}
		}
	}()
	return seen
}

// steps records the first moment each step was seen; print shows them
// relative to start (the moment the request was sent).
type steps struct {
	start time.Time
	mu    sync.Mutex
	at    map[string]time.Time
}

func (s *steps) mark(name string, when time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.at[name]; !ok {
		s.at[name] = when
	}
}

// watchRevisionPods records, as a watch sees them, the steps of the
// revision's new Pod: created, scheduled, each container started and
// ready, the Pod Ready. The watch's own delay (a few ms on one node) is in
// each figure. Pods that exist when it starts (at zero replicas, the last
// Pod may still be terminating) are not the new one. It returns the name
// of the Pod it saw.
func watchRevisionPods(tb testing.TB, ctx context.Context, rev string, s *steps) func() string {
	tb.Helper()
	sel := "serving.knative.dev/revision=" + rev
	l, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		tb.Fatalf("list the revision's Pods: %v", err)
	}
	old := map[string]bool{}
	for _, p := range l.Items {
		old[p.Name] = true
	}
	w, err := kube.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: l.ResourceVersion})
	if err != nil {
		tb.Fatalf("watch the revision's Pods: %v", err)
	}
	var mu sync.Mutex
	var name string
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted || old[p.Name] || p.DeletionTimestamp != nil {
				continue
			}
			now := time.Now()
			mu.Lock()
			if name == "" {
				name = p.Name
			}
			mine := name == p.Name
			mu.Unlock()
			if !mine {
				continue
			}
			s.mark("revision Pod created (seen by a watch)", now)
			for _, c := range p.Status.Conditions {
				if c.Status != corev1.ConditionTrue {
					continue
				}
				switch c.Type {
				case corev1.PodScheduled:
					s.mark("Pod scheduled", now)
				case corev1.PodReady:
					s.mark("Pod Ready (queue-proxy's readiness passes)", now)
				}
			}
			for _, c := range p.Status.ContainerStatuses {
				if c.State.Running != nil {
					s.mark("container "+c.Name+" started", now)
				}
				if c.Ready {
					s.mark("container "+c.Name+" ready", now)
				}
			}
		}
	}()
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return name
	}
}

// logSteps adds the function's own log lines of Pod pod (the provisioner
// container), timed by their "time" field, up to the answer.
func logSteps(tb testing.TB, pod string, s *steps, until time.Duration) {
	tb.Helper()
	raw, err := kube.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "provisioner"}).DoRaw(context.Background())
	if err != nil {
		tb.Logf("logs of %s: %v", pod, err)
		return
	}
	for _, l := range strings.Split(string(raw), "\n") {
		var line map[string]any
		if json.Unmarshal([]byte(l), &line) != nil {
			continue
		}
		ts, _ := line["time"].(string)
		when, err := time.Parse(time.RFC3339Nano, ts)
		// Lines of this request only: not the Pod's earlier life.
		if err != nil || when.Before(s.start.Add(-time.Minute)) || when.Sub(s.start) > until+time.Second {
			continue
		}
		msg, _ := line["msg"].(string)
		var extra []string
		// An API call (debug) by its method, path, status and time, so that
		// each is a step of its own.
		for _, k := range []string{"operation", "status", "duration_ms", "sandbox_id", "host", "method", "path", "code", "ms"} {
			if v, ok := line[k]; ok {
				extra = append(extra, fmt.Sprintf("%s=%v", k, v))
			}
		}
		name := "function log: " + msg
		if len(extra) > 0 {
			name += " (" + strings.Join(extra, " ") + ")"
		}
		s.mark(name, when)
	}
}

// print writes the steps in the order they happened.
func (s *steps) print(title string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	type row struct {
		name string
		at   time.Duration
	}
	var rows []row
	for n, t := range s.at {
		rows = append(rows, row{n, t.Sub(s.start)})
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].at < rows[j].at })
	fmt.Printf("\n%s\n\n| step | at (ms after the request was sent) | since the step before (ms) |\n|---|---|---|\n", title)
	var prev time.Duration
	for _, r := range rows {
		fmt.Printf("| %s | %.0f | %.0f |\n", r.name, ms(r.at), ms(r.at-prev))
		prev = r.at
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
