package events

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/auth"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/fairness"
	"github.com/deerflow-sandbox/provisioner/pkg/metrics"
	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// fakeOps records calls; the domain itself is tested against a real API server.
type fakeOps struct {
	calls  []string
	caller api.Caller // of the last create or get
}

func (f *fakeOps) Create(ctx context.Context, s api.Spec, _ time.Duration) (api.Sandbox, error) {
	f.calls = append(f.calls, "create "+s.ID)
	f.caller, _ = api.CallerFrom(ctx)
	return api.Sandbox{ID: s.ID, URL: "http://n:1", Status: "Pending"}, nil
}
func (f *fakeOps) Get(ctx context.Context, id string, _ time.Duration) (api.Sandbox, error) {
	f.calls = append(f.calls, "get "+id)
	f.caller, _ = api.CallerFrom(ctx)
	if id == "missing" {
		return api.Sandbox{}, &api.Error{Kind: api.KindNotFound, Detail: "sandbox missing not found"}
	}
	return api.Sandbox{ID: id, Status: "Running"}, nil
}
func (f *fakeOps) List(context.Context) ([]api.Sandbox, error) {
	f.calls = append(f.calls, "list")
	return []api.Sandbox{}, nil
}
func (f *fakeOps) Destroy(_ context.Context, id string) error {
	f.calls = append(f.calls, "destroy "+id)
	return nil
}
func (f *fakeOps) Reap(context.Context) (api.Reaped, error) {
	f.calls = append(f.calls, "reap")
	return api.Reaped{Removed: []api.ReapedSandbox{}}, nil
}
func (f *fakeOps) Pause(_ context.Context, id string) (api.Sandbox, error) {
	f.calls = append(f.calls, "pause "+id)
	return api.Sandbox{ID: id, Status: api.StatusPaused}, nil
}
func (f *fakeOps) Resume(_ context.Context, id string, _ time.Duration) (api.Sandbox, error) {
	f.calls = append(f.calls, "resume "+id)
	return api.Sandbox{ID: id, Status: "Pending"}, nil
}
func (f *fakeOps) Templates(context.Context) ([]template.Summary, error) { return nil, nil }
func (f *fakeOps) Egress(_ context.Context, id string, c api.EgressChange) (api.Sandbox, error) {
	f.calls = append(f.calls, fmt.Sprintf("egress %s %v for=%s revoke=%v", id, c.Allow, c.For, c.Revoke))
	return api.Sandbox{ID: id}, nil
}

const testKey = "0123456789abcdef-test"

var withKey = map[string]string{"X-API-Key": testKey}

func newHandler(t testing.TB, env map[string]string) (*Handler, *fakeOps) {
	t.Setenv("PROVISIONER_API_KEY", testKey)
	for k, v := range env {
		t.Setenv(k, v)
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	ops := &fakeOps{}
	return New(cfg, auth.FromConfig(&cfg.AuthConfig, nil), ops, metrics.New()), ops
}

func binaryEvent(typ, subject, data string, extra map[string]string) *http.Request {
	r := httptest.NewRequest("POST", "/", strings.NewReader(data))
	r.Header.Set("Ce-Specversion", "1.0")
	r.Header.Set("Ce-Id", "id-1")
	r.Header.Set("Ce-Source", "/test")
	r.Header.Set("Ce-Type", typ)
	if subject != "" {
		r.Header.Set("Ce-Subject", subject)
	}
	r.Header.Set("Content-Type", "application/json")
	for k, v := range extra {
		r.Header.Set(k, v)
	}
	return r
}

func TestRouting(t *testing.T) {
	h, ops := newHandler(t, nil)
	key := withKey
	tests := []struct {
		name      string
		req       *http.Request
		wantCode  int
		wantType  string
		wantSubj  string
		wantCalls []string
	}{
		{"create", binaryEvent(TypeCreate, "", `{"sandbox_id":"abc"}`, key), 200, TypeCreated, "abc", []string{"create abc"}},
		{"create by subject", binaryEvent(TypeCreate, "abd", `{}`, key), 200, TypeCreated, "abd", []string{"create abd"}},
		{"get by subject", binaryEvent(TypeGet, "abc", ``, key), 200, TypeStatus, "abc", []string{"get abc"}},
		{"get missing", binaryEvent(TypeGet, "missing", ``, key), 404, "", "", []string{"get missing"}},
		{"list", binaryEvent(TypeList, "", ``, key), 200, TypeListed, "", []string{"list"}},
		{"destroy", binaryEvent(TypeDestroy, "", `{"sandbox_id":"abc"}`, key), 200, TypeDestroyed, "abc", []string{"destroy abc"}},
		{"pause", binaryEvent(TypePause, "", `{"sandbox_id":"abc"}`, key), 200, TypePaused, "abc", []string{"pause abc"}},
		{"resume", binaryEvent(TypeResume, "abc", `{}`, key), 200, TypeResumed, "abc", []string{"resume abc"}},
		{"egress grant", binaryEvent(TypeEgress, "", `{"sandbox_id":"abc","allow":["PyPI.org"],"for":"10m"}`, key), 200, TypeEgressed, "abc", []string{"egress abc [pypi.org] for=10m0s revoke=false"}},
		{"egress revoke by subject", binaryEvent(TypeEgress, "abc", `{"allow":["*.github.com"],"revoke":true}`, key), 200, TypeEgressed, "abc", []string{"egress abc [*.github.com] for=0s revoke=true"}},
		{"egress with the key in the data", binaryEvent(TypeEgress, "abc", `{"allow":["pypi.org"],"api_key":"`+testKey+`"}`, nil), 200, TypeEgressed, "abc", []string{"egress abc [pypi.org] for=0s revoke=false"}},
		{"egress of an IP literal", binaryEvent(TypeEgress, "abc", `{"allow":["203.0.113.10"]}`, key), 422, "", "", nil},
		{"egress revoke with a duration", binaryEvent(TypeEgress, "abc", `{"allow":["pypi.org"],"for":"1m","revoke":true}`, key), 422, "", "", nil},
		{"ping reaps", binaryEvent(TypePing, "", ``, key), 200, TypeReaped, "", []string{"reap"}},
		{"reap", binaryEvent(TypeReap, "", ``, key), 200, TypeReaped, "", []string{"reap"}},
		{"key in the data", binaryEvent(TypeCreate, "", `{"sandbox_id":"abf","api_key":"`+testKey+`"}`, nil), 200, TypeCreated, "abf", []string{"create abf"}},
		{"create without key is refused", binaryEvent(TypeCreate, "", `{"sandbox_id":"abc"}`, nil), 401, "", "", nil},
		{"get without key is refused", binaryEvent(TypeGet, "abc", ``, nil), 401, "", "", nil},
		{"list without key is refused", binaryEvent(TypeList, "", ``, nil), 401, "", "", nil},
		{"ping without key is refused", binaryEvent(TypePing, "", ``, nil), 401, "", "", nil},
		{"wrong key in the data is refused", binaryEvent(TypeDestroy, "abc", `{"api_key":"nope"}`, nil), 401, "", "", nil},
		{"the apikey extension is no credential", binaryEvent(TypeCreate, "", `{"sandbox_id":"abe"}`, map[string]string{"Ce-Apikey": testKey}), 401, "", "", nil},
		{"unknown type", binaryEvent("boson.fn", "", `{"message":"Hello World"}`, nil), 400, "", "", nil},
		{"invalid data", binaryEvent(TypeCreate, "", `{"sandbox_id":"UPPER"}`, key), 422, "", "", nil},
		{"undecodable data", binaryEvent(TypeCreate, "", `{"sandbox_id":`, key), 422, "", "", nil},
		{"missing id", binaryEvent(TypeGet, "", `{}`, key), 422, "", "", nil},
		{"wait beyond the cap", binaryEvent(TypeGet, "abc", `{"wait_seconds":21}`, key), 422, "", "", nil},
		// JSON has no NaN: such data is undecodable, 422 as well.
		{"wait NaN on get", binaryEvent(TypeGet, "abc", `{"wait_seconds":NaN}`, key), 422, "", "", nil},
		{"wait NaN on create", binaryEvent(TypeCreate, "", `{"sandbox_id":"abc","wait_seconds":NaN}`, key), 422, "", "", nil},
		{"malformed event", func() *http.Request {
			r := binaryEvent(TypeGet, "abc", ``, nil)
			r.Header.Del("Ce-Id")
			return r
		}(), 400, "", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ops.calls = nil
			w := httptest.NewRecorder()
			h.ServeHTTP(w, tc.req)
			if w.Code != tc.wantCode {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.wantCode, w.Body)
			}
			if diff := cmp.Diff(tc.wantCalls, ops.calls); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if tc.wantCode != 200 {
				var body map[string]string
				if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body["detail"] == "" {
					t.Errorf("error without detail: %s", w.Body)
				}
				return
			}
			if got := w.Header().Get("Ce-Type"); got != tc.wantType {
				t.Errorf("reply type %q, want %q", got, tc.wantType)
			}
			if got := w.Header().Get("Ce-Subject"); got != tc.wantSubj {
				t.Errorf("reply subject %q, want %q", got, tc.wantSubj)
			}
			if w.Header().Get("Ce-Source") == "" || w.Header().Get("Ce-Id") == "" {
				t.Errorf("reply lacks source or id: %v", w.Header())
			}
		})
	}
}

func TestReplyTypesNeverEqualRequestTypes(t *testing.T) {
	for req, op := range operations {
		if _, loops := operations[op.replyType]; loops {
			t.Errorf("reply type %s of %s is itself a request type: a broker trigger would loop", op.replyType, req)
		}
	}
}

func TestUnknownTypeNamesSupportedTypes(t *testing.T) {
	h, _ := newHandler(t, nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, binaryEvent("boson.fn", "", `{"message":"Hello World"}`, nil))
	for _, typ := range RequestTypes {
		if !strings.Contains(w.Body.String(), typ) {
			t.Errorf("detail does not name %s: %s", typ, w.Body)
		}
	}
}

// TestEventSettingsActAlikeOnBothDoors: EVENTS_DISABLED and the source
// allow-list treat a CloudEvent and a POST / invocation the same.
func TestEventSettingsActAlikeOnBothDoors(t *testing.T) {
	invoke := func(body string) *http.Request {
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-API-Key", testKey)
		return r
	}
	tests := []struct {
		name   string
		env    map[string]string
		event  *http.Request
		invoke *http.Request
		want   int
	}{
		{"disabled", map[string]string{"EVENTS_DISABLED": "true"},
			binaryEvent(TypeReap, "", ``, withKey), invoke(`{"operation":"reap"}`), 404},
		{"source outside the allow-list", map[string]string{"EVENT_SOURCE_ALLOWLIST": "/pingsources/reap"},
			binaryEvent(TypeReap, "", ``, withKey), invoke(`{"operation":"reap"}`), 403},
		{"source on the allow-list", map[string]string{"EVENT_SOURCE_ALLOWLIST": "/test"},
			binaryEvent(TypeReap, "", ``, withKey), invoke(`{"operation":"reap","source":"/test"}`), 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, ops := newHandler(t, tc.env)
			ew, iw := httptest.NewRecorder(), httptest.NewRecorder()
			h.ServeHTTP(ew, tc.event)
			h.Invoke(iw, tc.invoke)
			if ew.Code != tc.want || iw.Code != tc.want {
				t.Errorf("CloudEvent %d, POST / %d; want %d for both (%s | %s)", ew.Code, iw.Code, tc.want, ew.Body, iw.Body)
			}
			if wantCalls := map[bool]int{true: 2, false: 0}[tc.want == 200]; len(ops.calls) != wantCalls {
				t.Errorf("calls %v, want %d", ops.calls, wantCalls)
			}
		})
	}
}

func TestInvoke(t *testing.T) {
	h, ops := newHandler(t, nil)
	tests := []struct {
		body, contentType, key string
		wantCode               int
		wantCalls              []string
	}{
		{`{"message":"Hello World"}`, "application/json", testKey, 400, nil},
		{`not json`, "application/json", testKey, 400, nil},
		{`{"operation":"explode"}`, "application/json", testKey, 400, nil},
		{`{"operation":"create","sandbox_id":"abc"}`, "application/json", testKey, 200, []string{"create abc"}},
		{`{"operation":"get","sandbox_id":"abc"}`, "application/json; charset=utf-8", testKey, 200, []string{"get abc"}},
		{`{"operation":"list"}`, "application/json", testKey, 200, []string{"list"}},
		{`{"operation":"destroy","sandbox_id":"abc"}`, "application/json", testKey, 200, []string{"destroy abc"}},
		{`{"operation":"reap"}`, "application/json", testKey, 200, []string{"reap"}},
		{`{"operation":"egress","sandbox_id":"abc","allow":["pypi.org"],"for":"1m","source":"/me"}`, "application/json", testKey, 200, []string{"egress abc [pypi.org] for=1m0s revoke=false"}},
		{`{"operation":"list","api_key":"` + testKey + `"}`, "application/json", "", 200, []string{"list"}},
		{`{"operation":"list"}`, "application/json", "", 401, nil},
		{`{"operation":"list","api_key":"wrong-key-wrong-key"}`, "application/json", "", 401, nil},
		// A web page can send these cross-site without a preflight.
		{`{"operation":"list"}`, "text/plain", testKey, 415, nil},
		{`{"operation":"list"}`, "application/x-www-form-urlencoded", testKey, 415, nil},
		{`{"operation":"list"}`, "", testKey, 415, nil},
	}
	for _, tc := range tests {
		ops.calls = nil
		w := httptest.NewRecorder()
		r := httptest.NewRequest("POST", "/", bytes.NewBufferString(tc.body))
		if tc.contentType != "" {
			r.Header.Set("Content-Type", tc.contentType)
		}
		if tc.key != "" {
			r.Header.Set("X-API-Key", tc.key)
		}
		h.Invoke(w, r)
		if w.Code != tc.wantCode {
			t.Errorf("%s (%s): status %d, want %d: %s", tc.body, tc.contentType, w.Code, tc.wantCode, w.Body)
		}
		if diff := cmp.Diff(tc.wantCalls, ops.calls); diff != "" {
			t.Errorf("%s: calls (-want +got):\n%s", tc.body, diff)
		}
		if strings.Contains(w.Body.String(), testKey) {
			t.Errorf("%s: the answer echoes the key: %s", tc.body, w.Body)
		}
	}
}

// FuzzEvent sends arbitrary event attributes and data: the handler must
// answer every one without panicking, and never with a 5xx (the fake domain
// never fails, so any 5xx would be ours).
func FuzzEvent(f *testing.F) {
	f.Add(TypeCreate, "", `{"sandbox_id":"abc"}`, false)
	f.Add(TypeGet, "abc", ``, false)
	f.Add("boson.fn", "", `{"message":"Hello World"}`, true)
	f.Add(TypeDestroy, "../x", `{"sandbox_id":1}`, true)
	h, _ := newHandler(f, nil)
	f.Fuzz(func(t *testing.T, typ, subject, data string, structured bool) {
		var r *http.Request
		if structured {
			ev := map[string]any{"specversion": "1.0", "id": "1", "source": "/f", "type": typ, "subject": subject, "datacontenttype": "application/json"}
			if json.Valid([]byte(data)) {
				ev["data"] = json.RawMessage(data)
			}
			raw, _ := json.Marshal(ev)
			r = httptest.NewRequest("POST", "/", bytes.NewReader(raw))
			r.Header.Set("Content-Type", "application/cloudevents+json")
			r.Header.Set("X-API-Key", testKey)
		} else {
			if strings.ContainsAny(typ+subject, "\r\n\x00") {
				return
			}
			r = binaryEvent(typ, subject, data, withKey)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code >= 500 {
			t.Fatalf("status %d for type %q subject %q data %q: %s", w.Code, typ, subject, data, w.Body)
		}
	})
}

// TestEventIDIsTheRequestID: an event delivered over HTTP is logged under its
// own id, once, not beside the id its HTTP delivery got, and answers with it.
func TestEventIDIsTheRequestID(t *testing.T) {
	h, _ := newHandler(t, nil)
	var logs bytes.Buffer
	r := binaryEvent(TypeList, "", `{}`, withKey)
	r = r.WithContext(reqid.With(r.Context(), slog.New(slog.NewJSONHandler(&logs, nil)), "http-id"))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if got := w.Header().Get(reqid.Header); got != "id-1" {
		t.Errorf("%s = %q, want the event id id-1", reqid.Header, got)
	}
	line, _, _ := strings.Cut(logs.String(), "\n")
	if n := strings.Count(line, `"request_id"`); n != 1 || !strings.Contains(line, `"request_id":"id-1"`) {
		t.Errorf("log record has %d request_id fields, want one with the event id: %s", n, line)
	}
}

// TestPrincipalsOnTheEventDoors: a CloudEvent or a POST / invocation runs
// as the principal its credential names, and only the operations that
// principal may run; the domain receives that principal.
func TestPrincipalsOnTheEventDoors(t *testing.T) {
	const readerKey = "reader-key-0123456789"
	h, ops := newHandler(t, map[string]string{
		"PROVISIONER_API_KEYS":             "reader=" + readerKey,
		"PROVISIONER_PRINCIPAL_OPERATIONS": "reader=get",
		"PROVISIONER_ADMINS":               "default",
	})
	reader := map[string]string{"X-API-Key": readerKey}
	invoke := func(body string, headers map[string]string) *http.Request {
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		return r
	}
	type result struct {
		Code   int
		Caller api.Caller
	}
	tests := []struct {
		name   string
		req    *http.Request
		invoke bool
		want   result
		detail string
	}{
		{name: "reader creates by event", req: binaryEvent(TypeCreate, "", `{"sandbox_id":"abc"}`, reader), want: result{Code: 403}, detail: "reader may not run"},
		{name: "reader creates by POST /", req: invoke(`{"operation":"create","sandbox_id":"abc"}`, reader), invoke: true, want: result{Code: 403}, detail: "reader may not run"},
		{name: "reader creates with the key in the data", req: invoke(`{"operation":"create","sandbox_id":"abc","api_key":"`+readerKey+`"}`, nil), invoke: true, want: result{Code: 403}, detail: "PROVISIONER_PRINCIPAL_OPERATIONS"},
		{name: "reader gets", req: binaryEvent(TypeGet, "abc", ``, reader), want: result{Code: 200, Caller: api.Caller{Principal: "reader"}}},
		{name: "the administrator creates", req: binaryEvent(TypeCreate, "", `{"sandbox_id":"abc"}`, withKey), want: result{Code: 200, Caller: api.Caller{Principal: "default", Admin: true}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ops.caller, ops.calls = api.Caller{}, nil
			w := httptest.NewRecorder()
			if tc.invoke {
				h.Invoke(w, tc.req)
			} else {
				h.ServeHTTP(w, tc.req)
			}
			if diff := cmp.Diff(tc.want, result{w.Code, ops.caller}); diff != "" {
				t.Errorf("(-want +got):\n%s\nbody: %s", diff, w.Body)
			}
			if !strings.Contains(w.Body.String(), tc.detail) {
				t.Errorf("body %s, want a detail containing %q", w.Body, tc.detail)
			}
			if tc.want.Code != 200 && len(ops.calls) != 0 {
				t.Errorf("a refused request reached the domain: %v", ops.calls)
			}
		})
	}
}

// tokenReviewer verifies the tokens it knows, as the API server's
// TokenReview would.
type tokenReviewer map[string]string // token -> username

func (r tokenReviewer) Review(_ context.Context, token, audience string) (auth.Review, error) {
	if u, ok := r[token]; ok {
		return auth.Review{Authenticated: true, Username: u, Audiences: []string{audience}}, nil
	}
	return auth.Review{}, nil
}

// unsignedJWT is a token whose claims pass the pre-checks (audience,
// expiry); tokenReviewer decides the rest.
func unsignedJWT(aud string, exp time.Time) string {
	claims, _ := json.Marshal(map[string]any{"aud": aud, "exp": exp.Unix()})
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(claims) + "." + enc([]byte("sig"))
}

// TestBrokeredEventNeverAuthenticatesByDataKey: an event that carries a
// bearer token (what a Broker delivers with Knative's OIDC) runs as the
// token's subject whatever api_key its data carries, and one whose token
// fails is refused rather than let in by that key; a direct invocation
// without a token (kn func invoke, in both formats) still authenticates by
// the key in its data.
func TestBrokeredEventNeverAuthenticatesByDataKey(t *testing.T) {
	const (
		trigger  = "system:serviceaccount:deer-flow:create-oidc"
		aliceKey = "alice-key-0123456789"
	)
	good, forged := unsignedJWT("sandbox-provisioner", time.Now().Add(time.Hour)), unsignedJWT("sandbox-provisioner", time.Now().Add(2*time.Hour))
	t.Setenv("PROVISIONER_API_KEY", testKey)
	for k, v := range map[string]string{"PROVISIONER_API_KEYS": "alice=" + aliceKey, "AUTH_TOKEN_AUDIENCE": "sandbox-provisioner", "AUTH_ALLOWED_SUBJECTS": trigger} {
		t.Setenv(k, v)
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	ops := &fakeOps{}
	h := New(cfg, auth.FromConfig(&cfg.AuthConfig, tokenReviewer{good: trigger}), ops, metrics.New())
	bearer := func(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }
	withAlice := `{"sandbox_id":"abc","api_key":"` + aliceKey + `"}`
	invoke := func(body string, headers map[string]string) *http.Request {
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		for k, v := range headers {
			r.Header.Set(k, v)
		}
		return r
	}
	type result struct {
		Code   int
		Caller api.Caller
	}
	tests := []struct {
		name   string
		req    *http.Request
		invoke bool
		want   result
	}{
		{name: "a verified token beside alice's key in the data", req: binaryEvent(TypeCreate, "", withAlice, bearer(good)),
			want: result{Code: 200, Caller: api.Caller{Principal: trigger}}},
		{name: "a forged token beside alice's key in the data", req: binaryEvent(TypeCreate, "", withAlice, bearer(forged)), want: result{Code: 401}},
		{name: "a token that is no JWT beside alice's key in the data", req: binaryEvent(TypeCreate, "", withAlice, bearer("abc")), want: result{Code: 401}},
		{name: "POST / with a verified token beside alice's key", req: invoke(`{"operation":"create","sandbox_id":"abc","api_key":"`+aliceKey+`"}`, bearer(good)), invoke: true,
			want: result{Code: 200, Caller: api.Caller{Principal: trigger}}},
		{name: "kn func invoke --format cloudevent, the key in the data", req: binaryEvent(TypeCreate, "", withAlice, nil),
			want: result{Code: 200, Caller: api.Caller{Principal: "alice"}}},
		{name: "kn func invoke --format http, the key in the data", req: invoke(`{"operation":"create","sandbox_id":"abc","api_key":"`+aliceKey+`"}`, nil), invoke: true,
			want: result{Code: 200, Caller: api.Caller{Principal: "alice"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ops.caller, ops.calls = api.Caller{}, nil
			w := httptest.NewRecorder()
			if tc.invoke {
				h.Invoke(w, tc.req)
			} else {
				h.ServeHTTP(w, tc.req)
			}
			if diff := cmp.Diff(tc.want, result{w.Code, ops.caller}); diff != "" {
				t.Errorf("(-want +got):\n%s\nbody: %s", diff, w.Body)
			}
			if tc.want.Code != 200 && len(ops.calls) != 0 {
				t.Errorf("a refused event reached the domain: %v", ops.calls)
			}
		})
	}
}

// TestPrincipalOverItsShareIsRefusedOnEveryEventDoor: once the key's
// principal has spent its burst, a CloudEvent and a POST / invocation
// alike get 429 with Retry-After and a detail naming the setting, and
// reach no operation; events that fail to authenticate spent none of it.
func TestPrincipalOverItsShareIsRefusedOnEveryEventDoor(t *testing.T) {
	h, ops := newHandler(t, map[string]string{"PRINCIPAL_REQUESTS_PER_SECOND": "0.001", "PRINCIPAL_REQUEST_BURST": "2"})
	invoke := func(id string) *http.Request {
		r := httptest.NewRequest("POST", "/", strings.NewReader(`{"operation":"create","sandbox_id":"`+id+`"}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("X-API-Key", testKey)
		return r
	}
	wrong := map[string]string{"X-API-Key": "wrong-key-0123456789"}
	var got []int
	for _, step := range []struct {
		event bool
		r     *http.Request
	}{
		{true, binaryEvent(TypeCreate, "", `{"sandbox_id":"x1"}`, wrong)},
		{true, binaryEvent(TypeCreate, "", `{"sandbox_id":"x2"}`, wrong)},
		{true, binaryEvent(TypeCreate, "", `{"sandbox_id":"a1"}`, withKey)},
		{false, invoke("a2")},
		{true, binaryEvent(TypeCreate, "", `{"sandbox_id":"a3"}`, withKey)},
		{false, invoke("a4")},
	} {
		w := httptest.NewRecorder()
		if step.event {
			h.ServeHTTP(w, step.r)
		} else {
			h.Invoke(w, step.r)
		}
		got = append(got, w.Code)
		if w.Code == http.StatusTooManyRequests && (w.Header().Get("Retry-After") == "" || !strings.Contains(w.Body.String(), "PRINCIPAL_REQUESTS_PER_SECOND")) {
			t.Errorf("429 without Retry-After or a detail naming the setting: %v %s", w.Header(), w.Body)
		}
	}
	if diff := cmp.Diff([]int{401, 401, 200, 200, 429, 429}, got); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"create a1", "create a2"}, ops.calls); diff != "" {
		t.Errorf("operations run (-want +got):\n%s", diff)
	}
}

// TestEventsShareTheGate: a Gate given with WithGate is the one events
// are admitted through, so a share spent on the HTTP door counts here.
func TestEventsShareTheGate(t *testing.T) {
	t.Setenv("PROVISIONER_API_KEY", testKey)
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	gate := fairness.New(fairness.Limits{RequestsPerSecond: 0.001, Burst: 1, MaxInProgress: 10})
	if _, refused := gate.Admit(context.Background(), config.DefaultPrincipal); refused != nil {
		t.Fatal(refused.Detail)
	}
	ops := &fakeOps{}
	h := New(cfg, auth.FromConfig(&cfg.AuthConfig, nil), ops, metrics.New(), WithGate(gate))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, binaryEvent(TypeCreate, "", `{"sandbox_id":"a1"}`, withKey))
	if w.Code != http.StatusTooManyRequests || len(ops.calls) != 0 {
		t.Errorf("event after the shared burst was spent: %d %s, calls %v; want 429 and none", w.Code, w.Body, ops.calls)
	}
}
