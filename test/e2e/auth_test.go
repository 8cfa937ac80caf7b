//go:build e2e

package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/events"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

const audience = "sandbox-provisioner-e2e"

// token mints a service-account token with the TokenRequest API, as the
// kubelet or Knative Eventing would get one.
func token(t *testing.T, ns, sa, aud string) string {
	t.Helper()
	ctx := context.Background()
	_, _ = client().CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	tr, err := client().CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{aud}, ExpirationSeconds: ptr.To(int64(600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenRequest for %s/%s: %v", ns, sa, err)
	}
	return tr.Status.Token
}

// withClaims rewrites a token's claims, keeping its signature: what an
// attacker who edits a token gets (the signature no longer matches).
func withClaims(t *testing.T, tok string, edit func(map[string]any)) string {
	t.Helper()
	parts := strings.Split(tok, ".")
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var claims map[string]any
	if err := json.Unmarshal(raw, &claims); err != nil {
		t.Fatal(err)
	}
	edit(claims)
	raw, _ = json.Marshal(claims)
	parts[1] = base64.RawURLEncoding.EncodeToString(raw)
	return strings.Join(parts, ".")
}

// door is one way in: an HTTP route, a CloudEvent type, a POST / operation.
type door struct {
	name   string
	method string
	path   string
	body   string
	event  string // CloudEvent type, for event doors
	// authorized is the answer of an allowed caller (0: 200). An egress
	// grant to an open sandbox is the domain's 409 (a grant never changes
	// a mode): the door let the caller through.
	authorized int
}

// doors are every operation on sandbox id through every door. Its creates
// name a user_id of their own ("u-<id>"): a principal other than default
// may not use the user an omitted user_id becomes (docs/tenancy.md).
func doors(id string) []door {
	create := `{"sandbox_id":"` + id + `","user_id":"u-` + id + `"}`
	grant := `{"allow":["pypi.org"]}`
	d := []door{
		{name: "GET /api/capabilities", method: "GET", path: "/api/capabilities"},
		{name: "POST /api/sandboxes", method: "POST", path: "/api/sandboxes", body: create},
		{name: "GET /api/sandboxes", method: "GET", path: "/api/sandboxes"},
		{name: "GET /api/sandboxes/{id}", method: "GET", path: "/api/sandboxes/" + id},
		{name: "DELETE /api/sandboxes/{id}", method: "DELETE", path: "/api/sandboxes/" + id},
		{name: "POST /api/sandboxes/{id}/pause", method: "POST", path: "/api/sandboxes/" + id + "/pause"},
		{name: "POST /api/sandboxes/{id}/resume", method: "POST", path: "/api/sandboxes/" + id + "/resume"},
		{name: "POST /api/sandboxes/{id}/egress", method: "POST", path: "/api/sandboxes/" + id + "/egress", body: grant, authorized: 409},
		{name: "DELETE /api/sandboxes/{id}/egress", method: "DELETE", path: "/api/sandboxes/" + id + "/egress", body: grant, authorized: 409},
		{name: "GET /api/templates", method: "GET", path: "/api/templates"},
		{name: "POST /api/reap", method: "POST", path: "/api/reap"},
	}
	for _, typ := range events.RequestTypes {
		body, authorized := `{"sandbox_id":"`+id+`"}`, 0
		switch typ {
		case events.TypeCreate:
			body = create
		case events.TypeEgress:
			body, authorized = `{"sandbox_id":"`+id+`","allow":["pypi.org"]}`, 409
		}
		d = append(d, door{name: "event " + typ, method: "POST", path: "/", body: body, event: typ, authorized: authorized})
	}
	for _, op := range []string{"create", "get", "list", "destroy", "pause", "resume", "egress", "reap"} {
		body, authorized := `{"operation":"`+op+`","sandbox_id":"`+id+`"}`, 0
		switch op {
		case "create":
			body = `{"operation":"create","sandbox_id":"` + id + `","user_id":"u-` + id + `"}`
		case "egress":
			body, authorized = `{"operation":"egress","sandbox_id":"`+id+`","allow":["pypi.org"]}`, 409
		}
		d = append(d, door{name: "POST / " + op, method: "POST", path: "/", body: body, authorized: authorized})
	}
	return d
}

func (d door) send(t *testing.T, f *function.Instance, headers map[string]string) function.Response {
	t.Helper()
	h := map[string]string{}
	if d.body != "" {
		h["Content-Type"] = "application/json"
	}
	if d.event != "" {
		h["Ce-Specversion"], h["Ce-Id"], h["Ce-Source"], h["Ce-Type"] = "1.0", uuid.NewString(), "/e2e", d.event
	}
	for k, v := range headers {
		h[k] = v
	}
	var body any
	if d.body != "" {
		body = d.body
	}
	r, err := f.DoWithHeaders(d.method, d.path, body, h)
	if err != nil {
		t.Fatalf("%s: %v", d.name, err)
	}
	return r
}

// TestEveryDoorAuthenticated: on every HTTP route, every event type and every
// POST / operation, reads included, bad credentials are refused (401, or 403
// for a verified subject that is not allowed) and create nothing, and a
// Kubernetes-issued token for an allowed service account is accepted.
func TestEveryDoorAuthenticated(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	allowed := "system:serviceaccount:" + ns + ":trigger-oidc"
	// tok1 is a ReplicaSet sandbox, so that pause and resume succeed too.
	putTemplate(t, ns, rsTemplate("heal", "sandbox:test", nil))
	// The token's principal may reap as config/ lets its PingSource: by an
	// entry that grants it (beside DeerFlow's key, a second principal, the
	// reap is no one's by default).
	f := start(t, ns, map[string]string{"AUTH_TOKEN_AUDIENCE": audience, "AUTH_ALLOWED_SUBJECTS": allowed,
		"PROVISIONER_PRINCIPAL_OPERATIONS": allowed + "=create,get,list,destroy,pause,resume,reap,templates,capabilities,egress"})
	good := token(t, ns, "trigger-oidc", audience)
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }

	// A sandbox that refused requests must leave alone.
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "victim"}), 200, "create the victim")
	victim, err := client().CoreV1().Pods(ns).Get(context.Background(), "sandbox-victim", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}

	creds := []struct {
		name    string
		headers map[string]string
		want    int
	}{
		{"no credentials", nil, 401},
		{"wrong audience", bearer(token(t, ns, "trigger-oidc", "another-audience")), 401},
		// TokenRequest will not mint a token of under ten minutes: an expired
		// one is a real token whose exp was moved into the past.
		{"expired", bearer(withClaims(t, good, func(c map[string]any) { c["exp"] = 1_000_000_000 })), 401},
		{"tampered", bearer(withClaims(t, good, func(c map[string]any) { c["sub"] = "system:serviceaccount:kube-system:admin" })), 401},
		{"not a token", bearer("e30.e30.sig"), 401},
		{"subject not allowed", bearer(token(t, ns, "sandbox", audience)), 403},
		{"wrong key", map[string]string{"X-API-Key": "not-the-key-0123456789"}, 401},
	}
	cases := 0
	for _, d := range doors("victim") {
		for _, c := range creds {
			t.Run(d.name+"/"+c.name, func(t *testing.T) {
				r := d.send(t, f, c.headers)
				if r.Code != c.want || r.Detail() == "" {
					t.Errorf("status %d, want %d with a detail: %s", r.Code, c.want, r.Raw)
				}
			})
			cases++
		}
	}
	if cases < 40 {
		t.Fatalf("only %d refusal cases", cases)
	}
	after, err := client().CoreV1().Pods(ns).Get(context.Background(), "sandbox-victim", metav1.GetOptions{})
	if err != nil || after.UID != victim.UID || after.DeletionTimestamp != nil {
		t.Errorf("the victim sandbox did not survive the refused requests: %v", err)
	}
	if p, s := pods(t, ns, ""), services(t, ns, ""); len(p) != 1 || len(s) != 1 {
		t.Errorf("refused requests changed what exists: %d Pods and %d Services, want the victim's 1 and 1", len(p), len(s))
	}

	// The allowed token works on every door, in an order that creates,
	// reads, destroys, pauses, resumes and reaps.
	// tok1 is the token principal's own: another principal's sandbox
	// would be absent to it.
	createTok1 := door{name: "create tok1", method: "POST", path: "/api/sandboxes", body: `{"sandbox_id":"tok1","user_id":"u-tok1","template":"heal"}`}
	expectCode(t, createTok1.send(t, f, bearer(good)), 200, "create tok1")
	for _, d := range doors("tok1") {
		r := d.send(t, f, bearer(good))
		want := d.authorized
		if want == 0 {
			want = 200
		}
		if r.Code != want {
			t.Errorf("%s with an allowed token: %d %s, want %d", d.name, r.Code, r.Raw, want)
		}
		if strings.Contains(d.name, "DELETE") || d.event == events.TypeDestroy || d.name == "POST / destroy" {
			// Recreate for the next door that reads it.
			expectCode(t, createTok1.send(t, f, bearer(good)), 200, "recreate tok1")
		}
	}
	t.Logf("%d refusal cases over %d doors", cases, len(doors("x")))
}

// TestMissingOrTemplateKeyFailsClosed: a function whose key is unset or an
// unexpanded template refuses the API and events, saying which variable.
func TestMissingOrTemplateKeyFailsClosed(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	for _, key := range []string{"", "{{ secret:x:y }}", "short-key"} {
		t.Run(fmt.Sprintf("key %q", key), func(t *testing.T) {
			f := start(t, ns, map[string]string{"PROVISIONER_API_KEY": key})
			for _, d := range doors("k1") {
				r := d.send(t, f, map[string]string{"X-API-Key": key})
				if r.Code != 401 || !strings.Contains(r.Detail(), "PROVISIONER_API_KEY") {
					t.Errorf("%s: %d %s, want 401 naming PROVISIONER_API_KEY", d.name, r.Code, r.Raw)
				}
			}
			if len(pods(t, ns, "")) != 0 {
				t.Error("a refused request created a Pod")
			}
		})
	}
}

// TestSandboxBoundToItsOwner: a sandbox belongs to the principal that
// created it and to its user and thread. Another user's (or thread's)
// create of an existing id is refused (409) and learns nothing of it;
// another principal's create is refused the same way, and its get, pause
// and resume answer 404 and its destroy 200 (as for an id that never
// existed) without touching the sandbox, on the HTTP API, CloudEvents and
// POST /. Get and destroy touch only objects that carry the sandbox labels.
func TestSandboxBoundToItsOwner(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	putTemplate(t, ns, rsTemplate("heal", "sandbox:test", nil))
	// default reaps below, granted as to config/'s PingSource.
	f := start(t, ns, map[string]string{"PROVISIONER_API_KEYS": "bob=" + bobKey,
		"PROVISIONER_PRINCIPAL_OPERATIONS": "default=create,get,list,destroy,pause,resume,reap,templates,capabilities"})
	ctx := context.Background()
	a := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "shared1", "user_id": "alice", "thread_id": "t1", "template": "heal"})
	expectCode(t, a, 200, "alice's create")
	url := a.Body["sandbox_url"].(string)
	before, err := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-shared1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	bob := map[string]string{"X-API-Key": bobKey}
	for _, other := range []struct {
		body    map[string]any
		headers map[string]string
		want    int
	}{
		{map[string]any{"sandbox_id": "shared1", "user_id": "bob", "thread_id": "t1"}, nil, 409},
		{map[string]any{"sandbox_id": "shared1", "user_id": "alice", "thread_id": "t2"}, nil, 409},
		{map[string]any{"sandbox_id": "shared1", "user_id": "bob", "thread_id": "t1", "operation": "create"}, nil, 409},
		// Another principal, with alice's own user and thread: the user is
		// another principal's (default's), 403 before the id is looked at.
		{map[string]any{"sandbox_id": "shared1", "user_id": "alice", "thread_id": "t1", "template": "heal"}, bob, 403},
		{map[string]any{"sandbox_id": "shared1", "user_id": "alice", "thread_id": "t1", "operation": "create"}, bob, 403},
	} {
		headers := map[string]string{"X-API-Key": function.Key}
		if other.headers != nil {
			headers = other.headers
		}
		path := "/api/sandboxes"
		if _, invoke := other.body["operation"]; invoke {
			path = "/"
		}
		r, err := f.DoWithHeaders("POST", path, other.body, headers)
		if err != nil {
			t.Fatal(err)
		}
		if r.Code != other.want || r.Detail() == "" {
			t.Errorf("create by %v (%s): %d %s, want %d with a detail", other.body, path, r.Code, r.Raw, other.want)
		}
		if strings.Contains(string(r.Raw), url) {
			t.Errorf("the refusal reveals alice's sandbox: %s", r.Raw)
		}
	}
	for name, d := range byIDDoors("shared1") {
		r := d.send(t, f, bob)
		want := 404
		if strings.HasSuffix(name, "destroy") {
			want = 200
		}
		if r.Code != want || strings.Contains(string(r.Raw), url) {
			t.Errorf("bob's %s of alice's sandbox: %d %s, want %d revealing nothing", name, r.Code, r.Raw, want)
		}
	}
	after, err := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-shared1", metav1.GetOptions{})
	if err != nil || after.UID != before.UID || after.DeletionTimestamp != nil || after.Annotations["sandbox.deerflow.dev/user-id"] != "alice" ||
		after.Spec.Replicas == nil || *after.Spec.Replicas != 1 {
		t.Errorf("alice's sandbox changed: %v", err)
	}
	if _, err := client().CoreV1().Services(ns).Get(ctx, "sandbox-shared1-svc", metav1.GetOptions{}); err != nil {
		t.Errorf("alice's Service is gone: %v", err)
	}
	expectCode(t, mustDo(t, f, "GET", "/api/sandboxes/shared1", nil), 200, "alice still gets hers")

	// A Pod that merely has a sandbox's name: the function's own, say.
	foreign := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-provisioner-x", Labels: map[string]string{"app": "sandbox-provisioner"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "provisioner:1"}}},
	}
	if _, err := client().CoreV1().Pods(ns).Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	expectCode(t, mustDo(t, f, "DELETE", "/api/sandboxes/provisioner-x", nil), 200, "destroy of an id with no sandbox")
	expectCode(t, mustDo(t, f, "GET", "/api/sandboxes/provisioner-x", nil), 404, "get of an id with no sandbox")
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "provisioner-x"}), 409, "create over a foreign Pod")
	expectCode(t, mustDo(t, f, "POST", "/api/reap", nil), 200, "reap")
	still, err := client().CoreV1().Pods(ns).Get(ctx, "sandbox-provisioner-x", metav1.GetOptions{})
	if err != nil || still.DeletionTimestamp != nil {
		t.Errorf("the foreign Pod was touched: %v", err)
	}
}

// TestConcurrentWaitsAreCapped: 200 concurrent get-with-wait requests to one
// replica open at most MAX_CONCURRENT_WAITS watches (counted at the API
// proxy; one principal's, as here, at most half of them); the rest get 429
// with Retry-After; the process stays within the memory limit config/ gives
// it.
func TestConcurrentWaitsAreCapped(t *testing.T) {
	ns := namespace(t)
	const cap, n = 20, 200
	bin, err := function.Binary()
	if err != nil {
		t.Fatal(err)
	}
	env := function.BaseEnv(kubeconfig, ns)
	env["MAX_CONCURRENT_WAITS"] = strconv.Itoa(cap)
	env["SANDBOX_NODE_SELECTOR"] = "pool:nowhere" // never scheduled, so never ready: every wait runs its course
	f, err := function.StartBinary(bin, env, filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "wait1"}), 200, "create")

	proxy.Reset()
	// Watches open before the waits: every running function's quota cache.
	open := proxy.OpenWatches()
	var (
		mu    sync.Mutex
		codes = map[int]int{}
		wg    sync.WaitGroup
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := f.Do("GET", "/api/sandboxes/wait1?wait=3", nil)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				codes[-1]++
				return
			}
			codes[r.Code]++
			if r.Code == 429 && r.Header.Get("Retry-After") == "" {
				t.Errorf("429 without Retry-After")
			}
		}()
	}
	wg.Wait()
	t.Logf("answers %v; most watches open at once: %d, %d of them before the waits", codes, proxy.MaxWatches(), open)
	if codes[200]+codes[429] != n || codes[429] == 0 || codes[200] == 0 {
		t.Errorf("answers %v, want only 200 and 429 (some of each)", codes)
	}
	// One principal sent every wait, so it may hold half the slots
	// (package waitlimit): more would mean a flood of one tenant's waits
	// could take every slot from the rest.
	if w := proxy.MaxWatches() - open; w > cap/2 || w == 0 {
		t.Errorf("%d watches for one principal's waits open at once, want between 1 and %d (half of MAX_CONCURRENT_WAITS %d)", w, cap/2, cap)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", f.PID()))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if kb, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			v, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(kb), "kB")))
			t.Logf("peak RSS %d KiB", v)
			if v == 0 || v > 256*1024 {
				t.Errorf("peak RSS %d KiB exceeds the 256Mi limit in config/400-service.yaml", v)
			}
		}
	}
}
