package auth

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

const key = "0123456789abcdef-key"

// fakeReviewer stands in for the API server's TokenReview in these unit
// tests; the e2e suite verifies real tokens minted by the TokenRequest API.
type fakeReviewer struct {
	calls  atomic.Int32
	tokens map[string]Review
	err    error
}

func (f *fakeReviewer) Review(_ context.Context, token, audience string) (Review, error) {
	f.calls.Add(1)
	if f.err != nil {
		return Review{}, f.err
	}
	r, ok := f.tokens[token]
	if !ok {
		return Review{}, nil
	}
	return r, nil
}

// jwt builds an unsigned token with the given claims: enough for the
// pre-checks, and the fake reviewer decides the rest.
func jwt(aud any, exp time.Time) string {
	claims, _ := json.Marshal(map[string]any{"aud": aud, "exp": exp.Unix(), "sub": "x"})
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc(claims) + "." + enc([]byte("sig"))
}

func TestCheck(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	good := jwt("sandbox-provisioner", now.Add(time.Hour))
	goodList := jwt([]string{"other", "sandbox-provisioner"}, now.Add(time.Hour))
	stranger := jwt("sandbox-provisioner", now.Add(time.Hour+time.Second))
	forged := jwt("sandbox-provisioner", now.Add(2*time.Hour))
	reviewer := &fakeReviewer{tokens: map[string]Review{
		good:     {Authenticated: true, Username: "system:serviceaccount:deer-flow:trigger-oidc", Audiences: []string{"sandbox-provisioner"}},
		goodList: {Authenticated: true, Username: "system:serviceaccount:ops:anyone", Audiences: []string{"sandbox-provisioner"}},
		stranger: {Authenticated: true, Username: "system:serviceaccount:deer-flow:sandbox", Audiences: []string{"sandbox-provisioner"}},
	}}
	settings := Settings{Key: key, Audience: "sandbox-provisioner",
		AllowedSubjects: []string{"system:serviceaccount:deer-flow:trigger-oidc", "system:serviceaccount:ops:*"}}

	tests := []struct {
		name     string
		settings Settings
		creds    Credentials
		code     int
		detail   string // a part of the detail
	}{
		{name: "key", settings: settings, creds: Credentials{Key: key}},
		{name: "wrong key", settings: settings, creds: Credentials{Key: key + "x"}, code: 401, detail: "invalid API key"},
		{name: "wrong key beside a good token", settings: settings, creds: Credentials{Key: "nope", Token: good}, code: 401, detail: "invalid API key"},
		{name: "nothing", settings: settings, code: 401, detail: "no credentials"},
		{name: "token", settings: settings, creds: Credentials{Token: good}},
		{name: "token, audience list, namespace wildcard", settings: settings, creds: Credentials{Token: goodList}},
		{name: "token, subject not allowed", settings: settings, creds: Credentials{Token: stranger}, code: 403, detail: "AUTH_ALLOWED_SUBJECTS"},
		{name: "token for another audience", settings: settings, creds: Credentials{Token: jwt("other", now.Add(time.Hour))}, code: 401, detail: "audience"},
		{name: "expired token", settings: settings, creds: Credentials{Token: jwt("sandbox-provisioner", now.Add(-time.Second))}, code: 401, detail: "expired"},
		{name: "token the API server refuses", settings: settings, creds: Credentials{Token: forged}, code: 401, detail: "did not accept"},
		{name: "not a JWT", settings: settings, creds: Credentials{Token: "abc"}, code: 401, detail: "not a JWT"},
		{name: "claims unreadable", settings: settings, creds: Credentials{Token: "a.%%%.c"}, code: 401, detail: "claims"},
		{name: "tokens off", settings: Settings{Key: key}, creds: Credentials{Token: good}, code: 401, detail: "AUTH_TOKEN_AUDIENCE"},
		{name: "no key configured, key sent", settings: Settings{}, creds: Credentials{Key: "anything"}, code: 401, detail: "PROVISIONER_API_KEY is not set"},
		{name: "no key configured, nothing sent", settings: Settings{}, code: 401, detail: "PROVISIONER_API_KEY is not set"},
		{name: "template key is refused even when matched", settings: Settings{Key: "{{ secret:x:y }}"}, creds: Credentials{Key: "{{ secret:x:y }}"}, code: 401, detail: "unexpanded template"},
		{name: "short key is refused even when matched", settings: Settings{Key: "k1"}, creds: Credentials{Key: "k1"}, code: 401, detail: "shorter than 16 bytes"},
		{name: "no key configured, token still works", settings: Settings{Audience: "sandbox-provisioner", AllowedSubjects: settings.AllowedSubjects}, creds: Credentials{Token: good}},
		{name: "development switch", settings: Settings{Disabled: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := New(tc.settings, reviewer)
			a.now = func() time.Time { return now }
			d := a.Check(context.Background(), tc.creds, "get")
			if d.Code != tc.code || !strings.Contains(d.Detail, tc.detail) {
				t.Errorf("Check = %d %q, want %d with %q", d.Code, d.Detail, tc.code, tc.detail)
			}
			if d.Code != 0 && d.Detail == "" {
				t.Error("a refusal without a detail")
			}
		})
	}
}

func TestTokenVerdictIsCachedWithinItsExpiry(t *testing.T) {
	now := time.Now()
	tok := jwt("aud", now.Add(30*time.Second))
	r := &fakeReviewer{tokens: map[string]Review{tok: {Authenticated: true, Username: "system:serviceaccount:a:b", Audiences: []string{"aud"}}}}
	a := New(Settings{Audience: "aud", AllowedSubjects: []string{"system:serviceaccount:a:b"}}, r)
	a.now = func() time.Time { return now }
	for range 5 {
		if d := a.Check(context.Background(), Credentials{Token: tok}, "get"); !d.Allowed() {
			t.Fatal(d.Detail)
		}
	}
	if got := r.calls.Load(); got != 1 {
		t.Errorf("%d TokenReviews for one token, want 1", got)
	}
	a.now = func() time.Time { return now.Add(31 * time.Second) } // past exp
	if d := a.Check(context.Background(), Credentials{Token: tok}, "get"); d.Code != 401 {
		t.Errorf("expired cached token: %d, want 401", d.Code)
	}
}

func TestReviewerOutageIs503(t *testing.T) {
	a := New(Settings{Audience: "aud", AllowedSubjects: []string{"system:serviceaccount:a:b"}}, &fakeReviewer{err: errors.New("connection refused")})
	d := a.Check(context.Background(), Credentials{Token: jwt("aud", time.Now().Add(time.Hour))}, "get")
	if d.Code != http.StatusServiceUnavailable {
		t.Errorf("Check = %d %q, want 503", d.Code, d.Detail)
	}
}

func TestSubjectAllowed(t *testing.T) {
	allowed := []string{"system:serviceaccount:deer-flow:a", "system:serviceaccount:knative-eventing:*"}
	got := map[string]bool{}
	for _, u := range []string{
		"system:serviceaccount:deer-flow:a", "system:serviceaccount:deer-flow:b",
		"system:serviceaccount:knative-eventing:pingsource", "system:serviceaccount:knative-eventing:",
		"system:serviceaccount:knative-eventing-x:y", "system:serviceaccount:knative-eventing:a:b", "alice",
	} {
		got[u] = SubjectAllowed(u, allowed)
	}
	want := map[string]bool{
		"system:serviceaccount:deer-flow:a": true, "system:serviceaccount:deer-flow:b": false,
		"system:serviceaccount:knative-eventing:pingsource": true, "system:serviceaccount:knative-eventing:": false,
		"system:serviceaccount:knative-eventing-x:y": false, "system:serviceaccount:knative-eventing:a:b": false, "alice": false,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("SubjectAllowed (-want +got):\n%s", diff)
	}
}

func TestFromRequest(t *testing.T) {
	r, _ := http.NewRequest("GET", "/", nil)
	r.Header.Set("X-API-Key", "k")
	r.Header.Set("Authorization", "Bearer  t.o.k ")
	if diff := cmp.Diff(Credentials{Key: "k", Token: "t.o.k"}, FromRequest(r)); diff != "" {
		t.Error(diff)
	}
	r.Header.Set("Authorization", "Basic abc")
	if got := FromRequest(r).Token; got != "" {
		t.Errorf("Basic auth read as a token: %q", got)
	}
}
