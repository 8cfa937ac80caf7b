package e2b

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/auth"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/envd"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// fakeOps is the sandbox operations in memory (a stand-in for
// sandbox.Manager, whose own tests run against a real API server): enough
// to check that this door maps E2B's requests and answers faithfully.
type fakeOps struct {
	mu        sync.Mutex
	sandboxes map[string]api.Sandbox
	specs     map[string]api.Spec
	calls     []string
	notReady  bool
}

func newFake() *fakeOps {
	return &fakeOps{sandboxes: map[string]api.Sandbox{}, specs: map[string]api.Spec{}}
}

func (f *fakeOps) record(op string) { f.calls = append(f.calls, op) }

func (f *fakeOps) visible(ctx context.Context, id string) (api.Sandbox, error) {
	c, _ := api.CallerFrom(ctx)
	sb, ok := f.sandboxes[id]
	if !ok || sb.Principal != c.Principal {
		return api.Sandbox{}, &api.Error{Kind: api.KindNotFound, Detail: "sandbox " + id + " not found"}
	}
	return sb, nil
}

func (f *fakeOps) Create(ctx context.Context, s api.Spec, _ time.Duration) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("create")
	c, _ := api.CallerFrom(ctx)
	sb := api.Sandbox{ID: s.ID, Status: "Running", Ready: !f.notReady, Template: s.Template, Principal: c.Principal,
		CreatedAt: resources.Annotations(s)[keys.AnnotationCreatedAt], Metadata: s.Metadata, Envd: true,
		ExpiresAt: resources.Annotations(s)[keys.AnnotationExpiresAt]}
	if f.notReady {
		sb.WaitTimedOut, sb.Reason = true, "ImagePullBackOff"
	}
	f.sandboxes[s.ID], f.specs[s.ID] = sb, s
	return sb, nil
}

func (f *fakeOps) Get(ctx context.Context, id string, _ time.Duration) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.visible(ctx, id)
}

func (f *fakeOps) List(ctx context.Context) ([]api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, _ := api.CallerFrom(ctx)
	var out []api.Sandbox
	for _, sb := range f.sandboxes {
		if sb.Principal == c.Principal {
			out = append(out, sb)
		}
	}
	return out, nil
}

func (f *fakeOps) Destroy(ctx context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("destroy")
	if _, err := f.visible(ctx, id); err != nil {
		return err
	}
	delete(f.sandboxes, id)
	return nil
}

func (f *fakeOps) Reap(context.Context) (api.Reaped, error) { return api.Reaped{}, nil }

func (f *fakeOps) Pause(ctx context.Context, id string) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("pause")
	sb, err := f.visible(ctx, id)
	if err != nil {
		return sb, err
	}
	if f.specs[id].Template == "bare" {
		return sb, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " is a bare Pod, which cannot be paused"}
	}
	sb.Status, sb.Ready = api.StatusPaused, false
	f.sandboxes[id] = sb
	return sb, nil
}

func (f *fakeOps) Resume(ctx context.Context, id string, _ time.Duration) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("resume")
	sb, err := f.visible(ctx, id)
	if err != nil {
		return sb, err
	}
	sb.Status, sb.Ready = "Running", true
	f.sandboxes[id] = sb
	return sb, nil
}

func (f *fakeOps) Templates(context.Context) ([]template.Summary, error) {
	return []template.Summary{
		{Name: "base", Envd: true, Aliases: []string{"code-interpreter-v1", "shared"}},
		{Name: "pausable", Envd: true, IdleAction: template.IdlePause, Aliases: []string{"shared", "bare"}},
		{Name: "bare", Envd: true},
		{Name: "offline", Envd: true, Egress: "isolated"},
		{Name: "deerflow"},
		{Name: "broken", Error: "bad annotation"},
	}, nil
}

func (f *fakeOps) Egress(context.Context, string, api.EgressChange) (api.Sandbox, error) {
	return api.Sandbox{}, nil
}

func (f *fakeOps) SetTimeout(ctx context.Context, id string, d time.Duration) (api.Sandbox, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.record("timeout " + d.String())
	return f.visible(ctx, id)
}

const (
	aliceKey = "alice-key-0123456789"
	bobKey   = "bob-key-0123456789ab"
)

func newTestAPI(t *testing.T, withKey bool) (*API, *fakeOps, access.Key) {
	t.Helper()
	env := map[string]string{"PROVISIONER_API_KEYS": "alice=" + aliceKey + ",bob=" + bobKey}
	var key access.Key
	if withKey {
		path := filepath.Join(t.TempDir(), "key")
		raw := strings.Repeat("k", 48)
		if err := os.WriteFile(path, []byte(raw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		env["E2B_TOKEN_KEY_FILE"] = path
		key = access.Key(raw)
	}
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	ops := newFake()
	return New(cfg, auth.FromConfig(&cfg.AuthConfig, nil), ops, metrics.New(), fairness.FromConfig(&cfg.FairnessConfig)), ops, key
}

type answer struct {
	code int
	body map[string]any
	list []map[string]any
	hdr  http.Header
}

func call(t *testing.T, a *API, method, path, apiKey, body string) answer {
	t.Helper()
	r := httptest.NewRequest(method, Prefix+path, strings.NewReader(body))
	if apiKey != "" {
		r.Header.Set("X-API-KEY", apiKey)
	}
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	ans := answer{code: w.Code, hdr: w.Header()}
	raw := w.Body.Bytes()
	if len(raw) > 0 && raw[0] == '[' {
		if err := json.Unmarshal(raw, &ans.list); err != nil {
			t.Fatalf("%s %s: body %q: %v", method, path, raw, err)
		}
	} else if len(raw) > 0 {
		if err := json.Unmarshal(raw, &ans.body); err != nil {
			t.Fatalf("%s %s: body %q: %v", method, path, raw, err)
		}
	}
	return ans
}

func TestCreateAnswersE2BsSandboxWithItsTokens(t *testing.T) {
	a, ops, key := newTestAPI(t, true)
	got := call(t, a, "POST", "/v2/sandboxes", aliceKey, `{"templateID":"base","timeout":120,"metadata":{"run":"r1"},"envVars":{"A":"1"},"secure":true}`)
	if got.code != http.StatusCreated {
		t.Fatalf("create: %d %v", got.code, got.body)
	}
	id, _ := got.body["sandboxID"].(string)
	spec := ops.specs[id]
	tok := access.Sandbox{Principal: "alice", ID: id, CreatedAt: resources.Annotations(spec)[keys.AnnotationCreatedAt]}
	want := map[string]any{"templateID": "base", "sandboxID": id, "clientID": clientID, "envdVersion": EnvdVersion,
		"envdAccessToken": key.Token(access.Envd, tok), "trafficAccessToken": key.Token(access.Traffic, tok), "domain": nil}
	if d := cmp.Diff(want, got.body); d != "" {
		t.Errorf("create answer (-want +got):\n%s", d)
	}
	if spec.EnvdTokenHash != access.Hash(key.Token(access.Envd, tok)) {
		t.Error("the agent is not given the hash of the token the create answers")
	}
	if spec.IdleTimeout != 120*time.Second || spec.Env["A"] != "1" || spec.Metadata["run"] != "r1" || spec.ThreadID != OwnerID("alice") || spec.UserID != OwnerID("alice") {
		t.Errorf("spec: idle %s env %v metadata %v user %q thread %q; want 2m, A=1, run=r1, alice's E2B owner id as both", spec.IdleTimeout, spec.Env, spec.Metadata, spec.UserID, spec.ThreadID)
	}
	if len(id) != 20 {
		t.Errorf("id %q: want 20 characters, as E2B's", id)
	}
}

// TestBadCreatesWriteNothing: each refused create answers E2B's error shape
// with the status E2B's SDK maps, and reaches no sandbox operation.
func TestBadCreatesWriteNothing(t *testing.T) {
	a, ops, _ := newTestAPI(t, true)
	cases := []struct {
		name, body string
		code       int
		says       string
	}{
		{"unknown template", `{"templateID":"nope"}`, 404, "template 'nope' not found"},
		{"default template missing agent", `{"templateID":"deerflow"}`, 400, "sandbox.deerflow.dev/envd"},
		{"refused template", `{"templateID":"broken"}`, 400, "bad annotation"},
		{"malformed body", `{"templateID":`, 400, "not a JSON object"},
		{"timeout of the wrong type", `{"templateID":"base","timeout":"soon"}`, 400, `"timeout"`},
		{"timeout above the cap", `{"templateID":"base","timeout":99999999}`, 400, "idle"},
		{"volumes", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/v"}]}`, 400, "volumeMounts"},
		{"network rules", `{"templateID":"base","network":{"denyOut":["0.0.0.0/0"]}}`, 400, "egress is its template's"},
		{"no internet on an open template", `{"templateID":"base","allow_internet_access":false}`, 400, "allow_internet_access"},
		{"auto pause on a deleting template", `{"templateID":"base","autoPause":true}`, 400, "autoPause"},
		{"metadata too long", `{"templateID":"base","metadata":{"k":"` + strings.Repeat("v", 2000) + `"}}`, 400, "metadata value"},
		{"env var name", `{"templateID":"base","envVars":{"1X":"v"}}`, 400, "1X"},
		{"resume on traffic without autoPause", `{"templateID":"pausable","autoResume":{"enabled":true}}`, 400, "autoPause true"},
		{"resume on traffic on a deleting template", `{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`, 400, "autoPause"},
		{"autoResume of the wrong type", `{"templateID":"base","autoResume":true}`, 400, `"autoResume"`},
		{"a pause that keeps memory", `{"templateID":"base","autoPauseMemory":true}`, 400, "autoPauseMemory"},
		{"workload identity", `{"templateID":"base","iam":{"tokens":{"t":{"audience":"a","tokenType":"jwt"}}}}`, 400, "iam"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := call(t, a, "POST", "/sandboxes", aliceKey, c.body)
			msg, _ := got.body["message"].(string)
			if got.code != c.code || got.body["code"] != float64(c.code) || !strings.Contains(msg, c.says) {
				t.Errorf("= %d %v; want %d with a message saying %q", got.code, got.body, c.code, c.says)
			}
		})
	}
	if slices.Contains(ops.calls, "create") {
		t.Errorf("a refused create reached the sandbox operations: %v", ops.calls)
	}
	// What E2B's SDKs send that restates a default asks for nothing: the
	// Python SDK's autoResume on every create, keepMemory false.
	for _, body := range []string{
		`{"templateID":"base","autoResume":{"enabled":false}}`,
		`{"templateID":"base","autoResume":{}}`,
		`{"templateID":"base","autoPauseMemory":false}`,
		`{"templateID":"base","iam":null,"mcp":null}`,
	} {
		if got := call(t, a, "POST", "/sandboxes", aliceKey, body); got.code != 201 {
			t.Errorf("create %s = %d %v, want 201", body, got.code, got.body)
		}
	}
	// Resume on traffic where the template pauses: the Spec says so.
	ops.calls = nil
	if got := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"pausable","autoPause":true,"autoResume":{"enabled":true}}`); got.code != 201 {
		t.Errorf("autoResume on a pausing template: %d %v", got.code, got.body)
	} else if spec := ops.specs[got.body["sandboxID"].(string)]; !spec.AutoResume {
		t.Errorf("autoResume on a pausing template: the Spec does not resume on traffic")
	}
	// Refused here, but allowed where the template says so.
	if got := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"offline","allow_internet_access":false}`); got.code != 201 {
		t.Errorf("allow_internet_access false on an isolated template: %d %v", got.code, got.body)
	}
}

func TestACreateThatIsNotReadyIsRemoved(t *testing.T) {
	a, ops, _ := newTestAPI(t, true)
	ops.notReady = true
	got := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"base"}`)
	if got.code != http.StatusGatewayTimeout || !strings.Contains(got.body["message"].(string), "ImagePullBackOff") {
		t.Errorf("= %d %v; want 504 naming the reason", got.code, got.body)
	}
	if len(ops.sandboxes) != 0 || !slices.Contains(ops.calls, "destroy") {
		t.Errorf("left %d sandboxes (calls %v); want it destroyed", len(ops.sandboxes), ops.calls)
	}
}

func TestAnotherKeySeesNothing(t *testing.T) {
	a, ops, _ := newTestAPI(t, true)
	id := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"pausable","metadata":{"owner":"alice"}}`).body["sandboxID"].(string)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/sandboxes/" + id, ""},
		{"DELETE", "/sandboxes/" + id, ""},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":60}`},
		{"POST", "/sandboxes/" + id + "/pause", ""},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":60}`},
		{"GET", "/sandboxes/" + id + "/metrics", ""},
	} {
		got := call(t, a, c.method, c.path, bobKey, c.body)
		if got.code != 404 || got.body["message"] != "sandbox "+id+" not found" {
			t.Errorf("bob %s %s = %d %v; want 404 in E2B's shape", c.method, c.path, got.code, got.body)
		}
	}
	if got := call(t, a, "GET", "/v2/sandboxes", bobKey, ""); got.code != 200 || len(got.list) != 0 {
		t.Errorf("bob's list = %d %v; want empty", got.code, got.list)
	}
	if _, ok := ops.sandboxes[id]; !ok {
		t.Error("bob's calls removed alice's sandbox")
	}
	if got := call(t, a, "GET", "/sandboxes/"+id, "", ""); got.code != 401 || got.body["code"] != float64(401) {
		t.Errorf("no key = %d %v; want 401 in E2B's shape", got.code, got.body)
	}
}

func TestListFiltersAndPages(t *testing.T) {
	a, _, _ := newTestAPI(t, true)
	var ids []string
	for _, m := range []string{`{"run":"a b","n":"1"}`, `{"run":"a b","n":"2"}`, `{"run":"c"}`} {
		ids = append(ids, call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"pausable","metadata":`+m+`}`).body["sandboxID"].(string))
	}
	call(t, a, "POST", "/sandboxes/"+ids[1]+"/pause", aliceKey, "")
	idsOf := func(l []map[string]any) []string {
		var out []string
		for _, s := range l {
			out = append(out, s["sandboxID"].(string))
		}
		slices.Sort(out)
		return out
	}
	sorted := func(s ...string) []string { s = slices.Clone(s); slices.Sort(s); return s }
	// The SDK encodes pairs, then the whole query value: a%3Db%2520... arrives.
	for _, c := range []struct {
		name, query string
		want        []string
	}{
		{"all", "", sorted(ids...)},
		{"metadata with a space", "?metadata=run%3Da%252520b", sorted(ids[0], ids[1])},
		{"two pairs", "?metadata=run%3Da%252520b%26n%3D2", sorted(ids[1])},
		{"running", "?state=running", sorted(ids[0], ids[2])},
		{"paused", "?state=paused", sorted(ids[1])},
	} {
		got := call(t, a, "GET", "/v2/sandboxes"+c.query, aliceKey, "")
		if d := cmp.Diff(c.want, idsOf(got.list)); got.code != 200 || d != "" {
			t.Errorf("%s: %d (-want +got):\n%s", c.name, got.code, d)
		}
	}
	all := sorted(ids...)
	first := call(t, a, "GET", "/v2/sandboxes?limit=2", aliceKey, "")
	next := first.hdr.Get("X-Next-Token")
	second := call(t, a, "GET", "/v2/sandboxes?limit=2&nextToken="+next, aliceKey, "")
	if d := cmp.Diff(all, sorted(append(idsOf(first.list), idsOf(second.list)...)...)); d != "" || next == "" || second.hdr.Get("X-Next-Token") != "" {
		t.Errorf("pages: next %q then %q (-want +got):\n%s", next, second.hdr.Get("X-Next-Token"), d)
	}
	if got := call(t, a, "GET", "/v2/sandboxes?state=sleeping", aliceKey, ""); got.code != 400 {
		t.Errorf("state=sleeping = %d; want 400", got.code)
	}
}

// TestListOrdersByStartTime: E2B's v2 list is ordered by start time,
// newest first unless order=asc, across pages (a page ends where the last
// one did, whatever sandboxes came and went), filtered by startedAfter (at
// or after); bad parameters are 400 in E2B's shape.
func TestListOrdersByStartTime(t *testing.T) {
	a, ops, _ := newTestAPI(t, true)
	base := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	var ids []string // in start order; the last two start in the same second
	for _, at := range []time.Duration{0, time.Minute, 2 * time.Minute, 2 * time.Minute} {
		id := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"pausable"}`).body["sandboxID"].(string)
		ops.mu.Lock()
		sb := ops.sandboxes[id]
		sb.CreatedAt = base.Add(at).Format(time.RFC3339)
		ops.sandboxes[id] = sb
		ops.mu.Unlock()
		ids = append(ids, id)
	}
	if ids[3] < ids[2] { // ties go by id
		ids[2], ids[3] = ids[3], ids[2]
	}
	pages := func(query string) (got []string) {
		t.Helper()
		next := ""
		for range 10 {
			q := query
			if next != "" {
				q += "&nextToken=" + next
			}
			r := call(t, a, "GET", "/v2/sandboxes?limit=2"+q, aliceKey, "")
			if r.code != 200 {
				t.Fatalf("list %s: %d", q, r.code)
			}
			for _, s := range r.list {
				got = append(got, s["sandboxID"].(string))
			}
			if next = r.hdr.Get("X-Next-Token"); next == "" {
				return got
			}
		}
		t.Fatalf("list %s: more than 10 pages", query)
		return nil
	}
	rev := slices.Clone(ids)
	slices.Reverse(rev)
	if d := cmp.Diff(rev, pages("")); d != "" {
		t.Errorf("newest first by default (-want +got):\n%s", d)
	}
	if d := cmp.Diff(ids, pages("&order=asc")); d != "" {
		t.Errorf("order=asc (-want +got):\n%s", d)
	}
	after := url.QueryEscape(base.Add(time.Minute).Format(time.RFC3339))
	if d := cmp.Diff(ids[1:], pages("&order=asc&startedAfter="+after)); d != "" {
		t.Errorf("startedAfter, at or after (-want +got):\n%s", d)
	}
	for _, q := range []string{"order=up", "startedAfter=yesterday", "nextToken=%21%21", "nextToken=bm9kb3Q"} {
		if r := call(t, a, "GET", "/v2/sandboxes?"+q, aliceKey, ""); r.code != 400 {
			t.Errorf("%s: %d, want 400", q, r.code)
		}
	}
}

func TestPauseAndConnect(t *testing.T) {
	a, ops, key := newTestAPI(t, true)
	id := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"pausable"}`).body["sandboxID"].(string)
	bare := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"bare"}`).body["sandboxID"].(string)
	if got := call(t, a, "POST", "/v2/sandboxes/"+id+"/connect", aliceKey, `{"timeout":30}`); got.code != 200 {
		t.Errorf("connect to a running sandbox = %d %v; want 200", got.code, got.body)
	}
	// A connect never shortens a running sandbox's end (the SDK's default
	// 300 s, sent every minute by DeerFlow's E2B provider, against the
	// template's hour): only a later end is set.
	if slices.Contains(ops.calls, "timeout 30s") {
		t.Errorf("a connect shortened a running sandbox's end: %v", ops.calls)
	}
	if got := call(t, a, "POST", "/v2/sandboxes/"+id+"/connect", aliceKey, `{"timeout":86400}`); got.code != 200 || !slices.Contains(ops.calls, "timeout 24h0m0s") {
		t.Errorf("connect with a later end = %d, calls %v; want 200 and the end moved", got.code, ops.calls)
	}
	if got := call(t, a, "POST", "/sandboxes/"+id+"/pause", aliceKey, ""); got.code != 204 {
		t.Errorf("pause = %d %v; want 204", got.code, got.body)
	}
	if got := call(t, a, "POST", "/sandboxes/"+id+"/pause", aliceKey, ""); got.code != 409 {
		t.Errorf("pause again = %d %v; want 409 (the SDK's already paused)", got.code, got.body)
	}
	if got := call(t, a, "POST", "/sandboxes/"+bare+"/pause", aliceKey, ""); got.code != 400 || !strings.Contains(got.body["message"].(string), "bare Pod") {
		t.Errorf("pause of a bare sandbox = %d %v; want 400 (409 would tell the SDK it is paused)", got.code, got.body)
	}
	got := call(t, a, "POST", "/v2/sandboxes/"+id+"/connect", aliceKey, `{"timeout":30}`)
	sb := ops.sandboxes[id]
	tok := key.Token(access.Envd, access.Sandbox{Principal: "alice", ID: id, CreatedAt: sb.CreatedAt})
	if got.code != 201 || got.body["envdAccessToken"] != tok || sb.Status != "Running" {
		t.Errorf("connect to a paused sandbox = %d %v (status %s); want 201 with its token, resumed", got.code, got.body, sb.Status)
	}
	if !slices.Contains(ops.calls, "timeout 30s") {
		t.Errorf("connect's timeout was not set: %v", ops.calls)
	}
	if got := call(t, a, "POST", "/sandboxes/"+id+"/timeout", aliceKey, `{"timeout":0}`); got.code != 400 {
		t.Errorf("timeout 0 = %d; want 400", got.code)
	}
	if got := call(t, a, "DELETE", "/sandboxes/"+id, aliceKey, ""); got.code != 204 {
		t.Errorf("kill = %d; want 204", got.code)
	}
	if got := call(t, a, "DELETE", "/sandboxes/"+id, aliceKey, ""); got.code != 404 {
		t.Errorf("kill again = %d; want 404 (the SDK's false)", got.code)
	}
}

func TestWithoutAKeyEverythingIs503(t *testing.T) {
	a, ops, _ := newTestAPI(t, false)
	got := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"base"}`)
	if got.code != 503 || !strings.Contains(got.body["message"].(string), "E2B_TOKEN_KEY") {
		t.Errorf("= %d %v; want 503 naming E2B_TOKEN_KEY", got.code, got.body)
	}
	if len(ops.calls) != 0 {
		t.Errorf("calls %v; want none", ops.calls)
	}
}

func TestUnknownEndpointsSaySo(t *testing.T) {
	a, _, _ := newTestAPI(t, true)
	got := call(t, a, "POST", "/templates", aliceKey, `{}`)
	if got.code != 404 || !strings.Contains(got.body["message"].(string), "no template builds") {
		t.Errorf("= %d %v; want 404 saying what is offered", got.code, got.body)
	}
}

// TestEnvdVersionIsTheAgents: the version this API reports is the one the
// agent implements; the SDK turns features on and off by it.
func TestEnvdVersionIsTheAgents(t *testing.T) {
	if EnvdVersion != envd.Version {
		t.Errorf("e2b.EnvdVersion = %q, the agent's envd.Version = %q: keep them equal", EnvdVersion, envd.Version)
	}
}

// TestAKeyMadeAfterStartIsFound: the Secret is optional in the function's
// manifest, so an operator may create it after the function started; the
// API finds it without a restart (reading at most once a second while it
// is missing).
func TestAKeyMadeAfterStartIsFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	t.Setenv("PROVISIONER_API_KEYS", "alice="+aliceKey)
	t.Setenv("E2B_TOKEN_KEY_FILE", path)
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	a := New(cfg, auth.FromConfig(&cfg.AuthConfig, nil), newFake(), metrics.New(), fairness.FromConfig(&cfg.FairnessConfig))
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	a.keys.now = func() time.Time { return now }
	codes := []int{call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"base"}`).code}
	if err := os.WriteFile(path, []byte(strings.Repeat("k", 48)), 0o600); err != nil {
		t.Fatal(err)
	}
	codes = append(codes, call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"base"}`).code) // within the second: not read again
	now = now.Add(time.Second)
	codes = append(codes, call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"base"}`).code)
	if d := cmp.Diff([]int{503, 503, 201}, codes); d != "" {
		t.Errorf("creates before, just after and a second after the key appeared (-want +got):\n%s", d)
	}
}

// TestTheKeyAsAValue: E2B_TOKEN_KEY (the Secret by env, as config/ gives
// it) is the key, and wins over E2B_TOKEN_KEY_FILE; a value too short to be
// a key turns the API off, saying which setting.
func TestTheKeyAsAValue(t *testing.T) {
	cases := []struct {
		name, value string
		want        int
		says        string
	}{
		{name: "a key", value: strings.Repeat("v", 48) + "\n", want: 201},
		{name: "too short", value: "short", want: 503, says: "E2B_TOKEN_KEY is no usable key"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("PROVISIONER_API_KEYS", "alice="+aliceKey)
			t.Setenv("E2B_TOKEN_KEY", c.value)
			t.Setenv("E2B_TOKEN_KEY_FILE", filepath.Join(t.TempDir(), "missing"))
			cfg, err := config.Load()
			if err != nil {
				t.Fatal(err)
			}
			a := New(cfg, auth.FromConfig(&cfg.AuthConfig, nil), newFake(), metrics.New(), fairness.FromConfig(&cfg.FairnessConfig))
			got := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"base"}`)
			if got.code != c.want {
				t.Fatalf("create = %d %v; want %d", got.code, got.body, c.want)
			}
			if c.says != "" && !strings.Contains(got.body["message"].(string), c.says) {
				t.Errorf("message %q; want it to say %q", got.body["message"], c.says)
			}
			if c.want == 201 && !cmp.Equal(a.key(), access.Key(strings.Repeat("v", 48))) {
				t.Errorf("the key in use is %q; want E2B_TOKEN_KEY's, without its newline", a.key())
			}
		})
	}
}

// TestIsAPIHost: E2B's control plane host is api.<E2B_DOMAIN>, in any
// case, with or without a port or the root's dot; nothing is without a
// domain.
func TestIsAPIHost(t *testing.T) {
	for _, tc := range []struct {
		host, domain string
		want         bool
	}{
		{"api.sandboxes.example.com", "sandboxes.example.com", true},
		{"API.Sandboxes.Example.com:443", "sandboxes.example.com", true},
		{"api.sandboxes.example.com.", "sandboxes.example.com", true},
		{"49983-abc.sandboxes.example.com", "sandboxes.example.com", false},
		{"api.sandboxes.example.com.evil.test", "sandboxes.example.com", false},
		{"xapi.sandboxes.example.com", "sandboxes.example.com", false},
		{"api.sandboxes.example.com", "", false},
		{"127.0.0.1:8080", "sandboxes.example.com", false},
	} {
		if got := IsAPIHost(tc.host, tc.domain); got != tc.want {
			t.Errorf("IsAPIHost(%q, %q) = %v, want %v", tc.host, tc.domain, got, tc.want)
		}
	}
}

// TestAnswersCarryTheDomain: with E2B_DOMAIN set, create, connect and get
// answer it as the sandbox's domain (the SDK builds <port>-<id>.<domain>
// from it); without, null, as before.
func TestAnswersCarryTheDomain(t *testing.T) {
	for _, domain := range []string{"", "sandboxes.example.com"} {
		t.Run("domain "+domain, func(t *testing.T) {
			t.Setenv("E2B_DOMAIN", domain)
			a, _, _ := newTestAPI(t, true)
			var want any
			if domain != "" {
				want = domain
			}
			created := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"base"}`)
			if created.code != http.StatusCreated || created.body["domain"] != want {
				t.Fatalf("create = %d, domain %v; want 201 and %v", created.code, created.body["domain"], want)
			}
			id, _ := created.body["sandboxID"].(string)
			for _, c := range []struct{ method, path string }{{"POST", "/sandboxes/" + id + "/connect"}, {"GET", "/sandboxes/" + id}} {
				got := call(t, a, c.method, c.path, aliceKey, `{"timeout":60}`)
				if got.code >= 300 || got.body["domain"] != want {
					t.Errorf("%s %s = %d, domain %v; want %v", c.method, c.path, got.code, got.body["domain"], want)
				}
			}
		})
	}
}

// TestCreateByAlias: a template's alias (sandbox.deerflow.dev/aliases)
// creates its sandboxes, as DeerFlow's E2B provider asks for
// code-interpreter-v1: the sandbox is the template's, and the answer names
// the alias; a template's own name wins over another's alias; an alias two
// templates claim is refused, naming both, and creates nothing.
func TestCreateByAlias(t *testing.T) {
	a, ops, _ := newTestAPI(t, true)
	got := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"code-interpreter-v1"}`)
	id, _ := got.body["sandboxID"].(string)
	if got.code != http.StatusCreated || got.body["templateID"] != "base" || got.body["alias"] != "code-interpreter-v1" || ops.specs[id].Template != "base" {
		t.Errorf("create by alias = %d %v (spec template %q); want 201 of template base, alias code-interpreter-v1", got.code, got.body, ops.specs[id].Template)
	}
	got = call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"bare"}`)
	id, _ = got.body["sandboxID"].(string)
	if got.code != http.StatusCreated || ops.specs[id].Template != "bare" || got.body["alias"] != nil {
		t.Errorf("create of bare (another's alias too) = %d %v; want template bare itself", got.code, got.body)
	}
	n := len(ops.calls)
	got = call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"shared"}`)
	if msg, _ := got.body["message"].(string); got.code != 400 || !strings.Contains(msg, "base and pausable") {
		t.Errorf("create by an alias two templates claim = %d %v; want 400 naming both", got.code, got.body)
	}
	if slices.Contains(ops.calls[n:], "create") {
		t.Errorf("a refused alias reached the sandbox operations: %v", ops.calls[n:])
	}
}

// TestASandboxPastItsEndEndsWhenAsked: an E2B call on a sandbox whose time
// is up carries out what it is due first, as the reap would later: one
// that pauses is paused (getInfo says so, connect resumes it), any other
// is deleted (404, and kill finds nothing). One still within its time is
// left alone.
func TestASandboxPastItsEndEndsWhenAsked(t *testing.T) {
	cases := []struct {
		name       string
		pauses     bool
		endsIn     time.Duration
		wantCode   int
		wantState  string
		wantCalls  []string
		wantExists bool
	}{
		{"within its time", false, time.Minute, 200, "running", nil, true},
		{"past its end, pauses", true, -time.Second, 200, "paused", []string{"pause"}, true},
		{"past its end, deleted", false, -time.Second, 404, "", []string{"destroy"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, ops, _ := newTestAPI(t, true)
			id := call(t, a, "POST", "/sandboxes", aliceKey, `{"templateID":"pausable"}`).body["sandboxID"].(string)
			ops.mu.Lock()
			sb := ops.sandboxes[id]
			sb.Pauses, sb.ExpiresAt = c.pauses, time.Now().Add(c.endsIn).UTC().Format(time.RFC3339)
			ops.sandboxes[id] = sb
			ops.calls = nil
			ops.mu.Unlock()
			got := call(t, a, "GET", "/sandboxes/"+id, aliceKey, "")
			if got.code != c.wantCode || c.wantState != "" && got.body["state"] != c.wantState {
				t.Errorf("getInfo = %d %v; want %d, state %q", got.code, got.body, c.wantCode, c.wantState)
			}
			ops.mu.Lock()
			defer ops.mu.Unlock()
			if diff := cmp.Diff(c.wantCalls, ops.calls); diff != "" {
				t.Errorf("operations (-want +got):\n%s", diff)
			}
			if _, ok := ops.sandboxes[id]; ok != c.wantExists {
				t.Errorf("the sandbox exists: %v; want %v", ok, c.wantExists)
			}
		})
	}
}
