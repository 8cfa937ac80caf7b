package router

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
)

const testDomain = "sandboxes.example.test"

// TestHostNamesTheSandbox: with E2B_DOMAIN set, <port>-<id>.<domain> in the
// Host names the sandbox and port (the SDK's getHost, and every URL it
// builds without E2B_SANDBOX_URL), with or without agreeing headers; a Host
// under the domain that names no sandbox, or headers that name another,
// are refused in E2B's shape before any lookup; a Host outside the domain,
// or no domain set, leaves the headers to name it.
func TestHostNamesTheSandbox(t *testing.T) {
	tests := []struct {
		name   string
		domain string
		host   string
		hdr    map[string]string
		code   int
		msg    string // "" for forwarded
	}{
		{name: "the agent's port by host", domain: testDomain, host: "49983-abc." + testDomain, hdr: map[string]string{HeaderAccessToken: envdToken}, code: 204},
		// DNS names are case-insensitive: the Host is read in lower case.
		{name: "by host, in capitals, with a port and a trailing dot", domain: testDomain, host: "49983-ABC." + strings.ToUpper(testDomain) + ".:443", hdr: map[string]string{HeaderAccessToken: envdToken}, code: 204},
		{name: "by host, with the headers agreeing", domain: testDomain, host: "49983-abc." + testDomain, hdr: envd("abc"), code: 204},
		{name: "an app's port by host", domain: testDomain, host: "3000-abc." + testDomain, hdr: map[string]string{HeaderTrafficToken: trafficToken}, code: 204},
		{name: "the headers name another sandbox", domain: testDomain, host: "49983-abc." + testDomain, hdr: envd("bare"), code: 400,
			msg: `header E2b-Sandbox-Id names sandbox "bare", the host "abc"`},
		{name: "the headers name another port", domain: testDomain, host: "3000-abc." + testDomain, hdr: envd("abc"), code: 400,
			msg: `header E2b-Sandbox-Port names port "49983", the host 3000`},
		{name: "a host with no port", domain: testDomain, host: "abc." + testDomain, code: 400, msg: `host "abc.sandboxes.example.test" names no sandbox: want <port>-<sandbox id>.sandboxes.example.test`},
		{name: "a port out of range", domain: testDomain, host: "70000-abc." + testDomain, code: 400, msg: `host "70000-abc.sandboxes.example.test" names no sandbox: want <port>-<sandbox id>.sandboxes.example.test`},
		{name: "two labels", domain: testDomain, host: "49983-abc.x." + testDomain, code: 400, msg: `host "49983-abc.x.sandboxes.example.test" names no sandbox: want <port>-<sandbox id>.sandboxes.example.test`},
		{name: "the domain itself", domain: testDomain, host: testDomain, hdr: envd("abc"), code: 204},
		{name: "a gone sandbox by host", domain: testDomain, host: "49983-gone." + testDomain, hdr: map[string]string{HeaderAccessToken: envdToken}, code: 502, msg: SandboxNotFound},
		{name: "outside the domain: the headers", domain: testDomain, host: "router.deer-flow.svc", hdr: envd("abc"), code: 204},
		{name: "no domain: the host is not read", host: "49983-abc." + testDomain, hdr: map[string]string{HeaderAccessToken: envdToken}, code: 400, msg: "header E2b-Sandbox-Id is missing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) },
				func(o *Options) { o.Domain = tt.domain })
			req := h.request(t, http.MethodPost, strings.NewReader("{}"), tt.hdr)
			req.Host = tt.host
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.code {
				t.Fatalf("= %d, want %d", resp.StatusCode, tt.code)
			}
			if tt.msg == "" {
				return
			}
			var body map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if body["message"] != tt.msg || body["code"] != float64(tt.code) {
				t.Errorf("body %v, want code %d and message %q", body, tt.code, tt.msg)
			}
		})
	}
}

// sign is the SDK's signature (its getSignature), written from its rule:
// "v1_" and the unpadded base64 SHA-256 of path:operation:user:token[:exp].
func sign(path, op, user, token string, exp int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// TestSignedFileURLs: a signed /files URL (files.downloadUrl, uploadUrl)
// works with neither header nor token, the router checking the signature
// and handing the agent the sandbox's envd token; a bad signature,
// another sandbox's, another operation's, or one past its expiry, is 401
// in E2B's shape and reaches nothing.
func TestSignedFileURLs(t *testing.T) {
	bareToken := testKey.Token(access.Envd, access.Sandbox{Principal: "bob", ID: "bare", CreatedAt: "2026-11-28T11:00:00Z"})
	future, past := time.Now().Add(time.Hour).Unix(), time.Now().Add(-time.Minute).Unix()
	tests := []struct {
		name   string
		method string
		query  url.Values
		code   int
		msg    string
	}{
		{name: "a download", method: http.MethodGet, query: url.Values{"path": {"/home/user/a.txt"}, "username": {"user"}, "signature": {sign("/home/user/a.txt", "read", "user", envdToken, 0)}}, code: 200},
		{name: "a download before its expiry", method: http.MethodGet, query: url.Values{"path": {"a.txt"}, "signature": {sign("a.txt", "read", "", envdToken, future)}, "signature_expiration": {strconv.FormatInt(future, 10)}}, code: 200},
		{name: "an upload", method: http.MethodPost, query: url.Values{"path": {"b.txt"}, "signature": {sign("b.txt", "write", "", envdToken, 0)}}, code: 200},
		{name: "expired", method: http.MethodGet, query: url.Values{"path": {"a.txt"}, "signature": {sign("a.txt", "read", "", envdToken, past)}, "signature_expiration": {strconv.FormatInt(past, 10)}}, code: 401, msg: "signature is already expired"},
		{name: "an expiry moved later", method: http.MethodGet, query: url.Values{"path": {"a.txt"}, "signature": {sign("a.txt", "read", "", envdToken, past)}, "signature_expiration": {strconv.FormatInt(future, 10)}}, code: 401, msg: "invalid signature"},
		{name: "another path", method: http.MethodGet, query: url.Values{"path": {"/etc/shadow"}, "signature": {sign("a.txt", "read", "", envdToken, 0)}}, code: 401, msg: "invalid signature"},
		{name: "a download signature used to upload", method: http.MethodPost, query: url.Values{"path": {"a.txt"}, "signature": {sign("a.txt", "read", "", envdToken, 0)}}, code: 401, msg: "invalid signature"},
		{name: "another sandbox's signature", method: http.MethodGet, query: url.Values{"path": {"a.txt"}, "signature": {sign("a.txt", "read", "", bareToken, 0)}}, code: 401, msg: "invalid signature"},
		{name: "another user", method: http.MethodGet, query: url.Values{"path": {"a.txt"}, "username": {"root"}, "signature": {sign("a.txt", "read", "user", envdToken, 0)}}, code: 401, msg: "invalid signature"},
		{name: "no signature: the token is needed", method: http.MethodGet, query: url.Values{"path": {"a.txt"}}, code: 401, msg: "sandbox abc port 49983 needs its token in X-Access-Token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got struct{ token, path string }
			h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
				got.token, got.path = r.Header.Get(HeaderAccessToken), r.URL.Path
				w.WriteHeader(http.StatusOK)
			}, func(o *Options) { o.Domain = testDomain })
			u := h.router.URL + FilesPath + "?" + tt.query.Encode()
			req, err := http.NewRequest(tt.method, u, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = "49983-abc." + testDomain
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tt.code {
				t.Fatalf("= %d, want %d", resp.StatusCode, tt.code)
			}
			if tt.code == 200 {
				if diff := cmp.Diff(struct{ token, path string }{envdToken, FilesPath}, got, cmp.AllowUnexported(got)); diff != "" {
					t.Errorf("what the agent got (-want +got):\n%s", diff)
				}
				return
			}
			var body map[string]any
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if body["message"] != tt.msg {
				t.Errorf("message %q, want %q", body["message"], tt.msg)
			}
			if n := h.hits.Load(); n != 0 {
				t.Errorf("a refused signed URL reached the sandbox %d times", n)
			}
		})
	}
}
