//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

var nodePortURL = regexp.MustCompile(`^http://127\.0\.0\.1:(3[0-2][0-9]{3})$`)

// TestDeerFlowContract replays the requests DeerFlow's backend really sends.
// recorded is one request DeerFlow's backend really sent.
type recorded = function.Recorded

// goldenRequests reads the recording of DeerFlow's client (contract/).
func goldenRequests(t *testing.T) []recorded { return function.GoldenRequests(t) }

func TestDeerFlowContract(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, nil)

	reqs := goldenRequests(t)
	send := func(r recorded) map[string]any {
		var body any
		if string(r.Body) != "null" {
			body = []byte(r.Body)
		}
		// The recording's key, "k1", is shorter than the 16 bytes a
		// function accepts; DeerFlow sends whatever key it is configured
		// with, so the replay sends ours in its place.
		if _, hasKey := r.Headers["X-API-Key"]; hasKey {
			r.Headers["X-API-Key"] = function.Key
		}
		resp, err := f.DoWithHeaders(r.Method, r.Path, body, r.Headers)
		if err != nil {
			t.Fatal(err)
		}
		want := http.StatusOK
		if _, hasKey := r.Headers["X-API-Key"]; !hasKey {
			want = http.StatusUnauthorized
		}
		if resp.Code != want {
			t.Fatalf("%s %s: status %d, want %d: %s", r.Method, r.Path, resp.Code, want, resp.Raw)
		}
		return resp.Body
	}

	created := send(reqs[0])
	if !nodePortURL.MatchString(created["sandbox_url"].(string)) {
		t.Errorf("sandbox_url %q is not a NodePort URL on NODE_HOST", created["sandbox_url"])
	}
	// DeerFlow always sends /mnt/skills/custom; the Pod must mount it once,
	// from the extra mount's host path.
	pod, err := client().CoreV1().Pods(ns).Get(context.Background(), "sandbox-0123456789abcdef", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		seen[m.MountPath]++
	}
	for p, n := range seen {
		if n != 1 {
			t.Errorf("mount path %s appears %d times", p, n)
		}
	}
	if seen["/mnt/skills/custom"] != 1 || seen["/mnt/acp-workspace"] != 1 || seen["/mnt/user-data"] != 1 {
		t.Errorf("mounts = %v, want /mnt/skills/custom, /mnt/acp-workspace and /mnt/user-data", seen)
	}
	// Every host path is a subPath of the volume for its tenant's root.
	hostPathAt := map[string]string{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		for _, v := range pod.Spec.Volumes {
			if v.Name == m.Name && v.HostPath != nil {
				hostPathAt[m.MountPath] = v.HostPath.Path + "/" + m.SubPath
			}
		}
	}
	if got := hostPathAt["/mnt/skills/custom"]; got != "/.deer-flow/users/user-1/skills_view/custom" {
		t.Errorf("/mnt/skills/custom is backed by %q, want the extra mount's host path", got)
	}

	anon := send(reqs[1])
	if anon["sandbox_id"] != "abcd1234" {
		t.Errorf("anonymous create answered %v", anon)
	}
	got := send(reqs[2])
	if got["sandbox_url"] != created["sandbox_url"] {
		t.Errorf("GET url %v, create url %v", got["sandbox_url"], created["sandbox_url"])
	}
	send(reqs[3])
	listed := send(reqs[4])
	if listed["count"].(float64) != 2 {
		t.Errorf("list count = %v, want 2", listed["count"])
	}
	destroyed := send(reqs[5])
	if diff := cmp.Diff(map[string]any{"ok": true, "sandbox_id": "0123456789abcdef"}, destroyed); diff != "" {
		t.Errorf("delete body (-want +got):\n%s", diff)
	}
	unauth := send(reqs[6])
	if unauth["detail"] == "" {
		t.Errorf("401 without detail")
	}
}

func TestEndpointsAndLifecycle(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, nil)

	h := mustDo(t, f, "GET", "/health", nil)
	if diff := cmp.Diff(map[string]any{"status": "ok"}, h.Body); diff != "" || h.Code != 200 {
		t.Errorf("/health %d (-want +got):\n%s", h.Code, diff)
	}
	caps := mustDo(t, f, "GET", "/api/capabilities", nil)
	expectCode(t, caps, 200, "capabilities")
	for _, k := range []string{"lark_cli_init_image", "lark_cli_broker_image"} {
		if _, ok := caps.Body[k].(bool); !ok {
			t.Errorf("capabilities lacks boolean %s: %s", k, caps.Raw)
		}
	}

	cr := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "life1", "thread_id": "th-1", "user_id": "u1"})
	expectCode(t, cr, 200, "create")
	url := cr.Body["sandbox_url"].(string)
	if !nodePortURL.MatchString(url) {
		t.Fatalf("sandbox_url %q", url)
	}
	svc, err := client().CoreV1().Services(ns).Get(context.Background(), "sandbox-life1-svc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("http://127.0.0.1:%d", svc.Spec.Ports[0].NodePort); url != want {
		t.Errorf("url %s, want the real NodePort %s", url, want)
	}
	eventually(t, 30*time.Second, "sandbox Running", func() (bool, error) {
		g := mustDo(t, f, "GET", "/api/sandboxes/life1", nil)
		return g.Code == 200 && g.Body["status"] == "Running", nil
	})
	l := mustDo(t, f, "GET", "/api/sandboxes", nil)
	expectCode(t, l, 200, "list")
	if l.Body["count"].(float64) != 1 {
		t.Errorf("list = %s", l.Raw)
	}
	d := mustDo(t, f, "DELETE", "/api/sandboxes/life1", nil)
	expectCode(t, d, 200, "delete")
	eventually(t, 30*time.Second, "Pod and Service gone", func() (bool, error) {
		return len(pods(t, ns, "sandbox-id=life1")) == 0 && len(services(t, ns, "sandbox-id=life1")) == 0, nil
	})
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/life1", nil), 200, "second delete")
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/never-existed", nil), 200, "delete of an unknown id")
	g := mustDo(t, f, "GET", "/api/sandboxes/life1", nil)
	expectCode(t, g, 404, "get after delete")
	if g.Detail() == "" {
		t.Error("404 without detail")
	}
}

func TestIdempotentAndConcurrentCreate(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, nil)
	body := map[string]any{"sandbox_id": "same1", "thread_id": "t"}
	first := mustDo(t, f, "POST", "/api/sandboxes", body)
	expectCode(t, first, 200, "first create")
	again := mustDo(t, f, "POST", "/api/sandboxes", body)
	expectCode(t, again, 200, "second create")
	if first.Body["sandbox_url"] != again.Body["sandbox_url"] {
		t.Errorf("idempotent create changed the URL: %v then %v", first.Body["sandbox_url"], again.Body["sandbox_url"])
	}

	const n = 20
	var wg sync.WaitGroup
	urls := make([]string, n)
	codes := make([]int, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := f.Do("POST", "/api/sandboxes", map[string]any{"sandbox_id": "race1"})
			if err != nil {
				t.Error(err)
				return
			}
			codes[i] = r.Code
			urls[i], _ = r.Body["sandbox_url"].(string)
		}()
	}
	wg.Wait()
	for i := range codes {
		if codes[i] != 200 || urls[i] != urls[0] || urls[i] == "" {
			t.Errorf("create %d: status %d url %q (first url %q)", i, codes[i], urls[i], urls[0])
		}
	}
	if p, s := len(pods(t, ns, "sandbox-id=race1")), len(services(t, ns, "sandbox-id=race1")); p != 1 || s != 1 {
		t.Errorf("after %d concurrent creates: %d Pods and %d Services, want 1 and 1", n, p, s)
	}
}

// TestPodLostThenCreatedOrReaped: a sandbox whose Pod is deleted alone,
// as a node failure or an operator would, keeps its Service (the Pod was
// owned by it: issue 49), and nothing of it is lost for good. A create of
// the id makes it whole again (a new Pod, owned by its Service); lost
// again, the reap removes the Service left alone. Deleting the Service
// alone takes its Pod with it (the garbage collector).
func TestPodLostThenCreatedOrReaped(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, nil)
	ctx := context.Background()
	zero := int64(0)
	lose := func() {
		t.Helper()
		if err := client().CoreV1().Pods(ns).Delete(ctx, "sandbox-gc1", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the Pod gone", func() (bool, error) { return len(pods(t, ns, "sandbox-id=gc1")) == 0, nil })
	}
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "gc1"}), 200, "create")
	lose()
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "gc1"}), 200, "create after the Pod was lost")
	svcs, ps := services(t, ns, "sandbox-id=gc1"), pods(t, ns, "sandbox-id=gc1")
	if len(svcs) != 1 || len(ps) != 1 || !resources.OwnedBy(&ps[0], &svcs[0]) {
		t.Fatalf("after the create: %d Services, %d Pods; want one Pod owned by one Service", len(svcs), len(ps))
	}
	lose()
	// The reap takes a Service that owns no Pod for a slot until it is a
	// leftover (a few seconds): it is asked again until then.
	eventually(t, 60*time.Second, "the reap removed the Service of the lost Pod", func() (bool, error) {
		expectCode(t, mustDo(t, f, "POST", "/api/reap", nil), 200, "reap")
		return len(services(t, ns, "sandbox-id=gc1")) == 0, nil
	})
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "gc1"}), 200, "create after the reap")
	if err := client().CoreV1().Services(ns).Delete(ctx, "sandbox-gc1-svc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the Pod garbage-collected with its Service", func() (bool, error) {
		return len(pods(t, ns, "sandbox-id=gc1")) == 0, nil
	})
}

func TestListCostsOneCallPerKind(t *testing.T) {
	ns := namespace(t)
	// No Kubernetes Events: their asynchronous writes would be counted too.
	f := start(t, ns, map[string]string{"EMIT_KUBERNETES_EVENTS": "false", "SANDBOX_NETWORK_POLICY": "false", "MAX_SANDBOXES": "0"})
	const n = 300
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			r, err := f.Do("POST", "/api/sandboxes", map[string]any{"sandbox_id": fmt.Sprintf("l%03d", i)})
			if err != nil || r.Code != 200 {
				t.Errorf("create %d: %v %d %s", i, err, r.Code, r.Raw)
			}
		}()
	}
	wg.Wait()
	proxy.Reset()
	l := mustDo(t, f, "GET", "/api/sandboxes", nil)
	calls := proxy.Counts()
	expectCode(t, l, 200, "list")
	if l.Body["count"].(float64) != n {
		t.Errorf("list count %v, want %d", l.Body["count"], n)
	}
	total := proxy.Total()
	if total > 3 {
		t.Errorf("list of %d sandboxes made %d API calls (%v), want at most 3 (one per kind: Pods, ReplicaSets, Services)", n, total, calls)
	}
}

func TestHalfPresentSandboxRepaired(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	// DeerFlow's provisioner records no principal: its leftovers are the
	// administrators' to see and adopt.
	f := start(t, ns, map[string]string{"PROVISIONER_ADMINS": "default"})
	ctx := context.Background()

	// Pod without Service. A Pod created since issue 49 is owned by its
	// Service, so the garbage collector would take it with the Service:
	// this one is made as the previous version made it, owned by nothing.
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "half1"}), 200, "create")
	if _, err := client().CoreV1().Pods(ns).Patch(ctx, "sandbox-half1", types.MergePatchType, []byte(`{"metadata":{"ownerReferences":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := client().CoreV1().Services(ns).Delete(ctx, "sandbox-half1-svc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	l := mustDo(t, f, "GET", "/api/sandboxes", nil)
	if !strings.Contains(string(l.Raw), `"missing":["service"]`) {
		t.Errorf("list does not show the missing Service: %s", l.Raw)
	}
	g := mustDo(t, f, "GET", "/api/sandboxes/half1", nil)
	expectCode(t, g, 200, "get of a half-present sandbox")
	if g.Body["status"] == "Running" {
		t.Errorf("a sandbox without a Service reported Running")
	}
	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "half1"})
	expectCode(t, r, 200, "repairing create")
	if !nodePortURL.MatchString(r.Body["sandbox_url"].(string)) || len(services(t, ns, "sandbox-id=half1")) != 1 {
		t.Errorf("create did not repair the Service: %s", r.Raw)
	}

	// Service without Pod, as DeerFlow's provisioner leaves one (no owner).
	orphan := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-half2-svc", Labels: map[string]string{"app": "deer-flow-sandbox", "sandbox-id": "half2"}},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"sandbox-id": "half2"},
			Ports: []corev1.ServicePort{{Name: "http", Port: 8080, TargetPort: intstr.FromInt32(8080)}}},
	}
	orphan, err := client().CoreV1().Services(ns).Create(ctx, orphan, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l = mustDo(t, f, "GET", "/api/sandboxes", nil)
	var listed api.ListResponse
	if err := json.Unmarshal(l.Raw, &listed); err != nil {
		t.Fatal(err)
	}
	var half2 *api.Sandbox
	for i := range listed.Sandboxes {
		if listed.Sandboxes[i].ID == "half2" {
			half2 = &listed.Sandboxes[i]
		}
	}
	if half2 == nil || half2.Status != api.StatusNotFound {
		t.Fatalf("list does not show the Pod-less sandbox as NotFound: %s", l.Raw)
	}
	r = mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "half2"})
	expectCode(t, r, 200, "repairing create")
	// DeerFlow's Service is adopted only with its Pod (issue 45: a Service
	// alone proves nothing of whose it was): without one it is replaced by
	// a Service of the new Pod's own, so its node port is not kept.
	old := fmt.Sprintf("http://127.0.0.1:%d", orphan.Spec.Ports[0].NodePort)
	if url, _ := r.Body["sandbox_url"].(string); url == old || !nodePortURL.MatchString(url) {
		t.Errorf("repaired Service URL %v, want a node port of a new Service, not the Pod-less one's %s", r.Body["sandbox_url"], old)
	}
	// The new Service is the create's slot, and the new Pod names it as its
	// owner from its create (issue 49).
	svc := services(t, ns, "sandbox-id=half2")
	if len(svc) != 1 || svc[0].UID == orphan.UID || len(svc[0].OwnerReferences) != 0 {
		t.Fatalf("Services of half2 after the repair: %+v; want one new Service, owned by nothing", svc)
	}
	if p := pods(t, ns, "sandbox-id=half2"); len(p) != 1 || !resources.OwnedBy(&p[0], &svc[0]) {
		t.Errorf("Pods of half2 after the repair: %+v; want one, owned by the new Service %s", p, svc[0].UID)
	}
}

func TestBadInputsRefusedWithDetail(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, map[string]string{"MAX_REQUEST_BODY_BYTES": "4096"})
	long := strings.Repeat("a", 60)
	mount := func(host, container string) map[string]any {
		return map[string]any{"sandbox_id": "bad1", "extra_mounts": []any{map[string]any{"host_path": host, "container_path": container, "read_only": true}}}
	}
	cases := []struct {
		name    string
		method  string
		path    string
		body    any
		headers map[string]string
		want    int
	}{
		{name: "id with capitals", body: map[string]any{"sandbox_id": "ABC"}, want: 422},
		{name: "id with dots", body: map[string]any{"sandbox_id": "a..b"}, want: 422},
		{name: "id with slash", body: map[string]any{"sandbox_id": "a/b"}, want: 422},
		{name: "empty id", body: map[string]any{"sandbox_id": ""}, want: 422},
		{name: "missing id", body: map[string]any{"thread_id": "t"}, want: 422},
		{name: "id too long", body: map[string]any{"sandbox_id": long}, want: 422},
		{name: "id leading dash", body: map[string]any{"sandbox_id": "-abc"}, want: 422},
		{name: "bad thread id", body: map[string]any{"sandbox_id": "ok1", "thread_id": "../etc"}, want: 422},
		{name: "thread id too long", body: map[string]any{"sandbox_id": "ok1", "thread_id": strings.Repeat("t", 65)}, want: 422},
		{name: "bad user id", body: map[string]any{"sandbox_id": "ok1", "user_id": "a b"}, want: 422},
		{name: "empty user id", body: map[string]any{"sandbox_id": "ok1", "user_id": ""}, want: 422},
		{name: "mount outside base dir", body: mount("/etc", "/mnt/acp-workspace"), want: 422},
		{name: "mount escaping base dir", body: mount("/.deer-flow/../etc", "/mnt/acp-workspace"), want: 422},
		{name: "mount relative", body: mount(".deer-flow/x", "/mnt/acp-workspace"), want: 422},
		{name: "mount base prefix trick", body: mount("/.deer-flow-evil/x", "/mnt/acp-workspace"), want: 422},
		{name: "mount not allow-listed", body: mount("/.deer-flow/x", "/etc"), want: 422},
		{name: "mount of another user's data", body: mount("/.deer-flow/users/mallory/threads/t/acp-workspace", "/mnt/acp-workspace"), want: 422},
		{name: "mount of another thread's data", body: mount("/.deer-flow/threads/other/user-data", "/mnt/acp-workspace"), want: 422},
		{name: "mount container traversal", body: mount("/.deer-flow/x", "/mnt/acp-workspace/../../etc"), want: 422},
		{name: "mount duplicated", body: map[string]any{"sandbox_id": "bad1", "extra_mounts": []any{
			map[string]any{"host_path": "/.deer-flow/a", "container_path": "/mnt/acp-workspace"},
			map[string]any{"host_path": "/.deer-flow/b", "container_path": "/mnt/acp-workspace"}}}, want: 422},
		{name: "too many mounts", body: map[string]any{"sandbox_id": "bad1", "extra_mounts": func() []any {
			var ms []any
			for i := 0; i < 11; i++ {
				ms = append(ms, map[string]any{"host_path": fmt.Sprintf("/.deer-flow/%d", i), "container_path": "/mnt/acp-workspace"})
			}
			return ms
		}()}, want: 422},
		{name: "malformed JSON", body: `{"sandbox_id": "x"`, want: 400},
		{name: "not an object", body: `["sandbox_id"]`, want: 422},
		{name: "empty body", body: ``, want: 400},
		{name: "trailing data", body: `{"sandbox_id":"x"} {}`, want: 400},
		{name: "id wrong type", body: map[string]any{"sandbox_id": 12}, want: 422},
		{name: "boolean wrong type", body: map[string]any{"sandbox_id": "x1", "include_legacy_skills": "yes"}, want: 422},
		{name: "mounts wrong type", body: map[string]any{"sandbox_id": "x1", "extra_mounts": "/mnt"}, want: 422},
		{name: "max_shell_sessions zero", body: map[string]any{"sandbox_id": "x1", "max_shell_sessions": 0}, want: 422},
		{name: "max_shell_sessions string", body: map[string]any{"sandbox_id": "x1", "max_shell_sessions": "4"}, want: 422},
		{name: "cpu over bound", body: map[string]any{"sandbox_id": "x1", "cpu": "64"}, want: 422},
		{name: "oversized body", body: `{"sandbox_id":"x1","pad":"` + strings.Repeat("x", 5000) + `"}`, want: 413},
		{name: "wrong key", headers: map[string]string{"X-API-Key": "nope"}, body: map[string]any{"sandbox_id": "x1"}, want: 401},
		{name: "missing key", headers: map[string]string{}, body: map[string]any{"sandbox_id": "x1"}, want: 401},
		{name: "get bad id", method: "GET", path: "/api/sandboxes/UPPER", want: 422},
		{name: "delete bad id", method: "DELETE", path: "/api/sandboxes/a.b", want: 422},
		{name: "bad wait", path: "/api/sandboxes?wait=forever", body: map[string]any{"sandbox_id": "x1"}, want: 422},
		{name: "unknown endpoint", method: "GET", path: "/api/nope", want: 404},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method, path := tc.method, tc.path
			if method == "" {
				method = "POST"
			}
			if path == "" {
				path = "/api/sandboxes"
			}
			headers := tc.headers
			if headers == nil {
				headers = map[string]string{"X-API-Key": function.Key}
			}
			r, err := f.DoWithHeaders(method, path, tc.body, headers)
			if err != nil {
				t.Fatal(err)
			}
			if r.Code != tc.want {
				t.Errorf("status %d, want %d: %s", r.Code, tc.want, r.Raw)
			}
			if r.Detail() == "" {
				t.Errorf("no detail in %s", r.Raw)
			}
		})
	}
	if len(cases) < 25 {
		t.Fatalf("only %d bad inputs", len(cases))
	}
	if p, s := pods(t, ns, ""), services(t, ns, ""); len(p) != 0 || len(s) != 0 {
		t.Errorf("bad inputs created %d Pods and %d Services", len(p), len(s))
	}
}

func TestAPIServerDownIsUnavailableNotNotFound(t *testing.T) {
	ns := namespace(t)
	f := start(t, ns, map[string]string{"REQUEST_TIMEOUT": "5s"})
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "out1"}), 200, "create")
	restore := outage(t)
	waitReadiness(t, f, http.StatusServiceUnavailable)
	for _, rq := range []struct{ method, path string }{
		{"GET", "/api/sandboxes/out1"}, {"GET", "/api/sandboxes"}, {"DELETE", "/api/sandboxes/out1"}, {"POST", "/api/sandboxes"},
	} {
		var body any
		if rq.method == "POST" {
			body = map[string]any{"sandbox_id": "out2"}
		}
		r := mustDo(t, f, rq.method, rq.path, body)
		if r.Code < 500 || r.Detail() == "" || strings.Contains(string(r.Raw), api.StatusNotFound) {
			t.Errorf("%s %s during outage: %d %s; want a 5xx with a detail and no NotFound", rq.method, rq.path, r.Code, r.Raw)
		}
	}
	if h := mustDo(t, f, "GET", "/health", nil); h.Code != 200 {
		t.Errorf("/health during outage: %d", h.Code)
	}
	restore()
	waitReadiness(t, f, http.StatusOK)
	g := mustDo(t, f, "GET", "/api/sandboxes/out1", nil)
	expectCode(t, g, 200, "get after the outage")
}

// TestRecreateOfExistingSandboxIsCheap: DeerFlow calls create on every reuse,
// so an existing sandbox costs reads, not failed writes.
func TestRecreateOfExistingSandboxIsCheap(t *testing.T) {
	ns := namespace(t)
	// A template read (once per SANDBOX_TEMPLATE_CACHE_TTL per replica
	// until its template watch has synced) is kept out of the measured
	// request: the first create makes it, and it holds for a minute. So
	// does the re-check of the shared NetworkPolicy (one read per
	// SANDBOX_NETWORK_POLICY_CHECK_TTL).
	// A short request deadline and wait bound: the window in which the
	// first create may still undo its sandbox (sandbox.undoWindow, their
	// sum) is two seconds here, so the test can wait it out.
	f := start(t, ns, map[string]string{"EMIT_KUBERNETES_EVENTS": "false", "SANDBOX_TEMPLATE_CACHE_TTL": "1m", "SANDBOX_NETWORK_POLICY_CHECK_TTL": "1m",
		"REQUEST_TIMEOUT": "1s", "SANDBOX_MAX_READY_WAIT": "1s"})
	body := map[string]any{"sandbox_id": "reuse1", "thread_id": "t"}
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", body), 200, "create")
	proxy.Reset()
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", body), 200, "re-create in the undo window")
	// Within the window one more: the reuse marks the Pod (a PATCH), so
	// that the first create, should it fail still, leaves it alone.
	if total, c := proxy.Total(), proxy.Counts(); total > 4 || c["PATCH pods"] != 1 {
		t.Errorf("re-create in the undo window made %d API calls (%v), want at most 4, one the Pod's mark", total, c)
	}
	time.Sleep(2500 * time.Millisecond)
	proxy.Reset()
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", body), 200, "re-create")
	// The Service read (the replica's Service cache showed it: no create
	// refused as AlreadyExists, which would run the API server's admission
	// and NodePort allocator), the Pod read, and no more.
	if total, c := proxy.Total(), proxy.Counts(); total > 3 || c["POST services"] != 0 {
		t.Errorf("re-create of an existing sandbox made %d API calls (%v), want at most 3 and no Service create", total, c)
	}
}
