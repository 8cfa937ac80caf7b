package httpapi

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/auth"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// unavailable is a domain that is always down, to check the status mapping.
type unavailable struct{}

func (unavailable) Create(context.Context, api.Spec, time.Duration) (api.Sandbox, error) {
	return api.Sandbox{}, &api.Error{Kind: api.KindUnavailable, Detail: "down"}
}
func (unavailable) Get(context.Context, string, time.Duration) (api.Sandbox, error) {
	return api.Sandbox{}, &api.Error{Kind: api.KindTimeout, Detail: "slow"}
}
func (unavailable) List(context.Context) ([]api.Sandbox, error) { return nil, nil }
func (unavailable) Destroy(context.Context, string) error       { return nil }
func (unavailable) Reap(context.Context) (api.Reaped, error)    { return api.Reaped{}, nil }
func (unavailable) Pause(context.Context, string) (api.Sandbox, error) {
	return api.Sandbox{}, nil
}
func (unavailable) Resume(context.Context, string, time.Duration) (api.Sandbox, error) {
	return api.Sandbox{}, nil
}
func (unavailable) Templates(context.Context) ([]template.Summary, error) { return nil, nil }
func (unavailable) Egress(context.Context, string, api.EgressChange) (api.Sandbox, error) {
	return api.Sandbox{}, &api.Error{Kind: api.KindNotFound, Detail: "sandbox not found"}
}

func newAPI(t *testing.T, env map[string]string) *API {
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	return New(cfg, auth.FromConfig(&cfg.AuthConfig, nil), unavailable{}, metrics.New())
}

const key = "0123456789abcdef-key"

func TestAuthFailsClosed(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		key  string
		want int
	}{
		{"no key configured", nil, "", 401},
		{"no key configured, key sent", nil, "anything", 401},
		{"development switch on loopback", map[string]string{"PROVISIONER_AUTH_DISABLED": "true", "LISTEN_ADDRESS": "127.0.0.1:8080"}, "", 200},
		{"right key", map[string]string{"PROVISIONER_API_KEY": key}, key, 200},
		{"wrong key", map[string]string{"PROVISIONER_API_KEY": key}, strings.ToUpper(key), 401},
		{"prefix of the key", map[string]string{"PROVISIONER_API_KEY": key}, key[:len(key)-1], 401},
		{"short key, matched", map[string]string{"PROVISIONER_API_KEY": "k1"}, "k1", 401},
		{"template key, matched", map[string]string{"PROVISIONER_API_KEY": "{{ secret:x:y }}"}, "{{ secret:x:y }}", 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := newAPI(t, tc.env)
			r := httptest.NewRequest("GET", "/api/sandboxes", nil)
			if tc.key != "" {
				r.Header.Set("X-API-Key", tc.key)
			}
			w := httptest.NewRecorder()
			a.ServeHTTP(w, r)
			if w.Code != tc.want || (w.Code != 200 && !strings.Contains(w.Body.String(), "detail")) {
				t.Errorf("status %d, want %d: %s", w.Code, tc.want, w.Body)
			}
		})
	}
}

func TestTransientErrorsAreNever404(t *testing.T) {
	a := newAPI(t, map[string]string{"PROVISIONER_API_KEY": key})
	for path, want := range map[string]int{"/api/sandboxes/abc": http.StatusGatewayTimeout} {
		r := httptest.NewRequest("GET", path, nil)
		r.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		a.ServeHTTP(w, r)
		if w.Code != want || strings.Contains(w.Body.String(), "NotFound") {
			t.Errorf("GET %s: %d %s, want %d", path, w.Code, w.Body, want)
		}
	}
	r := httptest.NewRequest("POST", "/api/sandboxes", strings.NewReader(`{"sandbox_id":"abc"}`))
	r.Header.Set("X-API-Key", key)
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Errorf("create while unavailable: %d %v", w.Code, w.Header())
	}
}

// TestOperationsPerPrincipal: a key limited to get is refused (403 with a
// detail) on every other route, before the domain is called.
func TestOperationsPerPrincipal(t *testing.T) {
	const readerKey = "reader-key-0123456789"
	a := newAPI(t, map[string]string{"PROVISIONER_API_KEY": key, "PROVISIONER_API_KEYS": "reader=" + readerKey,
		"PROVISIONER_PRINCIPAL_OPERATIONS": "reader=get"})
	got := map[string]int{}
	for _, route := range []struct{ method, path string }{
		{"GET", "/api/sandboxes/abc"}, {"POST", "/api/sandboxes"}, {"GET", "/api/sandboxes"}, {"DELETE", "/api/sandboxes/abc"},
		{"POST", "/api/sandboxes/abc/pause"}, {"POST", "/api/sandboxes/abc/resume"}, {"POST", "/api/reap"},
		{"GET", "/api/templates"}, {"GET", "/api/capabilities"},
	} {
		r := httptest.NewRequest(route.method, route.path, strings.NewReader(`{"sandbox_id":"abc"}`))
		r.Header.Set("X-API-Key", readerKey)
		w := httptest.NewRecorder()
		a.ServeHTTP(w, r)
		got[route.method+" "+route.path] = w.Code
		if w.Code == 403 && !strings.Contains(w.Body.String(), "PROVISIONER_PRINCIPAL_OPERATIONS") {
			t.Errorf("%s %s: 403 without a detail naming the setting: %s", route.method, route.path, w.Body)
		}
	}
	want := map[string]int{
		"GET /api/sandboxes/abc": http.StatusGatewayTimeout, // reached the (unavailable) domain
		"POST /api/sandboxes":    403, "GET /api/sandboxes": 403, "DELETE /api/sandboxes/abc": 403,
		"POST /api/sandboxes/abc/pause": 403, "POST /api/sandboxes/abc/resume": 403, "POST /api/reap": 403,
		"GET /api/templates": 403, "GET /api/capabilities": 403,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}

// TestWaitThatIsNoNumberIs422: ?wait= spellings that strconv.ParseFloat
// takes but that are no decimal seconds are refused as invalid before the
// domain is called (the stand-in domain answers 504, as a wait whose
// deadline is already past did).
func TestWaitThatIsNoNumberIs422(t *testing.T) {
	a := newAPI(t, map[string]string{"PROVISIONER_API_KEY": key})
	type result struct {
		Code     int
		NamesArg bool
	}
	for _, wait := range []string{"NaN", "Inf", "-Inf", "0x1p3"} {
		t.Run(wait, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/api/sandboxes/abc?wait="+wait, nil)
			r.Header.Set("X-API-Key", key)
			w := httptest.NewRecorder()
			a.ServeHTTP(w, r)
			got := result{w.Code, strings.Contains(w.Body.String(), "wait")}
			if diff := cmp.Diff(result{http.StatusUnprocessableEntity, true}, got); diff != "" {
				t.Errorf("GET ?wait=%s (-want +got):\n%s\nbody: %s", wait, diff, w.Body)
			}
		})
	}
}

// TestEgressBodies: a grant or revoke that names no host, an IP, a bad
// duration or an unknown field is a 4xx whose detail says what to fix,
// before the domain is asked; a good one reaches it (here: not found).
func TestEgressBodies(t *testing.T) {
	a := newAPI(t, map[string]string{"PROVISIONER_API_KEY": key})
	type result struct {
		Code   int
		Detail bool
	}
	for _, tc := range []struct {
		method, body, says string
		want               int
	}{
		{"POST", `{"allow":["pypi.org"],"for":"10m"}`, "not found", http.StatusNotFound},
		{"DELETE", `{"allow":["pypi.org"]}`, "not found", http.StatusNotFound},
		{"POST", `{"allow":[]}`, "allow", http.StatusUnprocessableEntity},
		{"POST", `{"allow":["10.0.0.1"]}`, "IP address", http.StatusUnprocessableEntity},
		{"POST", `{"allow":["pypi.org"],"for":"forever"}`, "for", http.StatusUnprocessableEntity},
		{"POST", `{"allow":["pypi.org"],"for":"0.5s"}`, "for", http.StatusUnprocessableEntity},
		{"DELETE", `{"allow":["pypi.org"],"for":"10m"}`, "revoke", http.StatusUnprocessableEntity},
		{"POST", `{"allow":["pypi.org"],"mode":"open"}`, "unknown field", http.StatusBadRequest},
		{"POST", `not json`, "JSON object", http.StatusBadRequest},
	} {
		r := httptest.NewRequest(tc.method, "/api/sandboxes/abc/egress", strings.NewReader(tc.body))
		r.Header.Set("X-API-Key", key)
		w := httptest.NewRecorder()
		a.ServeHTTP(w, r)
		got := result{w.Code, strings.Contains(w.Body.String(), tc.says)}
		if diff := cmp.Diff(result{tc.want, true}, got); diff != "" {
			t.Errorf("%s %s (-want +got):\n%s\nbody: %s", tc.method, tc.body, diff, w.Body)
		}
	}
}

// counting is the unavailable domain that counts the creates it was asked
// for and, while hold is set, tells started and holds each until hold
// closes (for at most a few seconds, so that a create admitted by mistake
// fails the test rather than hanging it).
type counting struct {
	unavailable
	creates atomic.Int32
	started chan struct{}
	hold    chan struct{}
}

func (c *counting) Create(ctx context.Context, s api.Spec, wait time.Duration) (api.Sandbox, error) {
	c.creates.Add(1)
	if c.hold != nil {
		c.started <- struct{}{}
		select {
		case <-c.hold:
		case <-time.After(3 * time.Second):
		}
	}
	return c.unavailable.Create(ctx, s, wait)
}

const bobKey = "bob-key-0123456789abcdef"

func fairAPI(t *testing.T, env map[string]string, ops api.Operations) *API {
	t.Helper()
	env["PROVISIONER_API_KEY"], env["PROVISIONER_API_KEYS"] = key, "bob="+bobKey
	cfg := configtest.Load(t, env)
	return New(cfg, auth.FromConfig(&cfg.AuthConfig, nil), ops, metrics.New())
}

func createAs(a *API, k string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/api/sandboxes", strings.NewReader(`{"sandbox_id":"abc"}`))
	r.Header.Set("X-API-Key", k)
	w := httptest.NewRecorder()
	a.ServeHTTP(w, r)
	return w
}

// TestPrincipalOverItsRateIsRefused: once bob has spent his burst his next
// create is 429 with Retry-After and a detail naming the setting, and
// reaches no domain (nothing written); requests that fail to authenticate
// spent none of it, and the default key, another principal, goes on.
func TestPrincipalOverItsRateIsRefused(t *testing.T) {
	ops := &counting{}
	a := fairAPI(t, map[string]string{"PRINCIPAL_REQUESTS_PER_SECOND": "0.001", "PRINCIPAL_REQUEST_BURST": "2"}, ops)
	var got []int
	for _, k := range []string{"wrong-key-0123456789", "", "wrong-key-0123456789", bobKey, bobKey, bobKey, key} {
		w := createAs(a, k)
		got = append(got, w.Code)
		if w.Code == http.StatusTooManyRequests && (w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "PRINCIPAL_REQUESTS_PER_SECOND")) {
			t.Errorf("429 without Retry-After or a detail naming the setting: %v %s", w.Header(), w.Body)
		}
	}
	want := []int{401, 401, 401, 503, 503, 429, 503} // 503: the stand-in domain was reached
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if n := ops.creates.Load(); n != 3 {
		t.Errorf("the domain was asked for %d creates, want 3 (bob's two and default's)", n)
	}
}

// TestPrincipalOverItsRequestsInProgressIsRefused: with bob's one request
// in progress (PRINCIPAL_MAX_CONCURRENT_REQUESTS=1) his next is 429 before
// the domain, while the default key's request is served; once his first
// ends he is served again.
func TestPrincipalOverItsRequestsInProgressIsRefused(t *testing.T) {
	ops := &counting{started: make(chan struct{}, 4), hold: make(chan struct{})}
	a := fairAPI(t, map[string]string{"PRINCIPAL_MAX_CONCURRENT_REQUESTS": "1"}, ops)
	first := make(chan int)
	go func() { first <- createAs(a, bobKey).Code }()
	<-ops.started
	got := map[string]int{}
	w := createAs(a, bobKey)
	got["bob's second"] = w.Code
	if w.Code == http.StatusTooManyRequests && (w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "PRINCIPAL_MAX_CONCURRENT_REQUESTS")) {
		t.Errorf("429 without Retry-After or a detail naming the setting: %v %s", w.Header(), w.Body)
	}
	done := make(chan int)
	go func() { done <- createAs(a, key).Code }()
	<-ops.started
	close(ops.hold)
	got["default's"], got["bob's first"] = <-done, <-first
	ops.hold = nil
	got["bob's third"] = createAs(a, bobKey).Code
	want := map[string]int{"bob's first": 503, "bob's second": 429, "default's": 503, "bob's third": 503}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
}

// TestTheGateIsShared: a Gate given with WithGate is the one the API
// admits through, so a principal's share spent on another door counts.
func TestTheGateIsShared(t *testing.T) {
	cfg := configtest.Load(t, map[string]string{"PROVISIONER_API_KEY": key})
	gate := fairness.New(fairness.Limits{RequestsPerSecond: 0.001, Burst: 1, MaxInProgress: 10})
	if _, refused := gate.Admit(context.Background(), config.DefaultPrincipal); refused != nil {
		t.Fatal(refused.Detail)
	}
	ops := &counting{}
	a := New(cfg, auth.FromConfig(&cfg.AuthConfig, nil), ops, metrics.New(), WithGate(gate))
	if w := createAs(a, key); w.Code != http.StatusTooManyRequests || ops.creates.Load() != 0 {
		t.Errorf("create after the shared burst was spent: %d %s, %d creates; want 429 and none", w.Code, w.Body, ops.creates.Load())
	}
}
