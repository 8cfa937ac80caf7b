package auth

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestPrincipals: each key is its own principal, verified tokens are their
// subjects, administrators are flagged, and each principal runs only the
// operations PROVISIONER_PRINCIPAL_OPERATIONS gives it; grouped credentials
// (PROVISIONER_PRINCIPAL_GROUPS) own as their group and are still judged by
// their own names.
func TestPrincipals(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	const (
		createSA = "system:serviceaccount:deer-flow:create-trigger"
		getSA    = "system:serviceaccount:deer-flow:get-trigger"
		pingSA   = "system:serviceaccount:knative-eventing:pingsource"
		alice    = "alice-key-0123456789"
		bob      = "bob-key-0123456789ab"
		ops      = "ops-key-0123456789ab"
	)
	tokens := map[string]string{}
	reviews := map[string]Review{}
	for i, sa := range []string{createSA, getSA, pingSA} {
		tok := jwt("aud", now.Add(time.Hour+time.Duration(i)*time.Second))
		tokens[sa] = tok
		reviews[tok] = Review{Authenticated: true, Username: sa, Audiences: []string{"aud"}}
	}
	a := New(Settings{
		Key:             key,
		Keys:            map[string]string{"alice": alice, "bob": bob, "ops": ops},
		Audience:        "aud",
		AllowedSubjects: []string{createSA, getSA, pingSA},
		Admins:          []string{"ops"},
		Operations: map[string][]string{
			createSA: {"create"}, getSA: {"get"}, pingSA: {"reap"},
			"bob": {"get", "list"},
		},
		Groups: map[string]string{createSA: "events", getSA: "events"},
	}, &fakeReviewer{tokens: reviews})
	a.now = func() time.Time { return now }

	type verdict struct {
		Code      int
		Principal Principal
	}
	tests := []struct {
		name   string
		creds  Credentials
		op     string
		want   verdict
		detail string
	}{
		{name: "the single key is default", creds: Credentials{Key: key}, op: "create", want: verdict{Principal: Principal{Name: "default", Identity: "default"}}},
		{name: "a named key", creds: Credentials{Key: alice}, op: "destroy", want: verdict{Principal: Principal{Name: "alice", Identity: "alice"}}},
		{name: "an administrator's key", creds: Credentials{Key: ops}, op: "list", want: verdict{Principal: Principal{Name: "ops", Admin: true, Identity: "ops"}}},
		{name: "a key limited to reads may read", creds: Credentials{Key: bob}, op: "list", want: verdict{Principal: Principal{Name: "bob", Identity: "bob"}}},
		{name: "a key limited to reads may not create", creds: Credentials{Key: bob}, op: "create", want: verdict{Code: 403}, detail: "bob may not run \"create\""},
		{name: "the create Trigger creates", creds: Credentials{Token: tokens[createSA]}, op: "create", want: verdict{Principal: Principal{Name: "events", Identity: createSA}}},
		{name: "the create Trigger may not destroy", creds: Credentials{Token: tokens[createSA]}, op: "destroy", want: verdict{Code: 403}, detail: "PROVISIONER_PRINCIPAL_OPERATIONS"},
		{name: "the get Trigger may not create", creds: Credentials{Token: tokens[getSA]}, op: "create", want: verdict{Code: 403}, detail: "only get"},
		{name: "the get Trigger gets", creds: Credentials{Token: tokens[getSA]}, op: "get", want: verdict{Principal: Principal{Name: "events", Identity: getSA}}},
		{name: "the PingSource reaps", creds: Credentials{Token: tokens[pingSA]}, op: "reap", want: verdict{Principal: Principal{Name: pingSA, Identity: pingSA}}},
		{name: "the PingSource may not list", creds: Credentials{Token: tokens[pingSA]}, op: "list", want: verdict{Code: 403}, detail: "only reap"},
		{name: "a wrong key names no principal", creds: Credentials{Key: alice + "x"}, op: "get", want: verdict{Code: 401}, detail: "invalid API key"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := a.Check(context.Background(), tc.creds, tc.op)
			if diff := cmp.Diff(tc.want, verdict{d.Code, d.Principal}); diff != "" {
				t.Errorf("Check (-want +got):\n%s\ndetail: %s", diff, d.Detail)
			}
			if !strings.Contains(d.Detail, tc.detail) {
				t.Errorf("detail %q, want it to contain %q", d.Detail, tc.detail)
			}
		})
	}
}

func TestDefaultOperationsEntry(t *testing.T) {
	a := New(Settings{Key: key, Keys: map[string]string{"ci": "ci-key-0123456789abc"},
		Operations: map[string][]string{"*": {"get", "list"}, "default": {"create", "get"}}}, nil)
	got := map[string]int{}
	for _, c := range []struct{ key, op string }{{key, "create"}, {key, "list"}, {"ci-key-0123456789abc", "list"}, {"ci-key-0123456789abc", "create"}} {
		got[c.key[:2]+" "+c.op] = a.Check(context.Background(), Credentials{Key: c.key}, c.op).Code
	}
	want := map[string]int{"01 create": 0, "01 list": 403, "ci list": 0, "ci create": 403}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("codes (-want +got):\n%s", diff)
	}
}

func TestDisabledIsAnonymousAdministrator(t *testing.T) {
	d := New(Settings{Disabled: true}, nil).Check(context.Background(), Credentials{}, "destroy")
	if diff := cmp.Diff(Decision{Principal: Principal{Name: "anonymous", Admin: true, Identity: "anonymous"}}, d); diff != "" {
		t.Error(diff)
	}
}

// TestRefusedTokenIsCachedBriefly: a forged token the API server refused is
// refused again without a TokenReview for 30 s, then reviewed again.
func TestRefusedTokenIsCachedBriefly(t *testing.T) {
	now := time.Now()
	forged := jwt("aud", now.Add(time.Hour))
	r := &fakeReviewer{}
	a := New(Settings{Audience: "aud", AllowedSubjects: []string{"system:serviceaccount:a:b"}}, r)
	a.now = func() time.Time { return now }
	for range 5 {
		if d := a.Check(context.Background(), Credentials{Token: forged}, "get"); d.Code != 401 || !strings.Contains(d.Detail, "did not accept") {
			t.Fatalf("forged token: %d %q", d.Code, d.Detail)
		}
	}
	if got := r.calls.Load(); got != 1 {
		t.Errorf("%d TokenReviews for one forged token within 30 s, want 1", got)
	}
	a.now = func() time.Time { return now.Add(31 * time.Second) }
	a.Check(context.Background(), Credentials{Token: forged}, "get")
	if got := r.calls.Load(); got != 2 {
		t.Errorf("%d TokenReviews after the refusal expired, want 2", got)
	}
}

// TestTokenCachesAreBounded: a flood of distinct tokens, refused or
// accepted, keeps at most cacheMax of each.
func TestTokenCachesAreBounded(t *testing.T) {
	now := time.Now()
	reviews := map[string]Review{}
	var good, forged []string
	for i := range cacheMax + 100 {
		g := jwt("aud", now.Add(time.Hour+time.Duration(i)*time.Second))
		reviews[g] = Review{Authenticated: true, Username: "system:serviceaccount:a:b", Audiences: []string{"aud"}}
		good = append(good, g)
		forged = append(forged, jwt("aud", now.Add(2*time.Hour+time.Duration(i)*time.Second)))
	}
	a := New(Settings{Audience: "aud", AllowedSubjects: []string{"system:serviceaccount:a:b"}, ReviewQPS: 1e9, ReviewBurst: 1 << 30}, &fakeReviewer{tokens: reviews})
	a.now = func() time.Time { return now }
	for i := range good {
		a.Check(context.Background(), Credentials{Token: good[i]}, "get")
		a.Check(context.Background(), Credentials{Token: forged[i]}, "get")
	}
	if n, m := len(a.accepted.Keys()), len(a.refused.Keys()); n > cacheMax || m > cacheMax || n == 0 || m == 0 {
		t.Errorf("caches hold %d accepted and %d refused tokens, want 1..%d each", n, m, cacheMax)
	}
}

// TestTokenReviewsAreRateLimited: a flood of distinct forged tokens sends at
// most the limiter's burst (plus its rate) of TokenReviews; the rest are
// refused with 503 at once, without waiting.
func TestTokenReviewsAreRateLimited(t *testing.T) {
	r := &fakeReviewer{}
	a := New(Settings{Audience: "aud", AllowedSubjects: []string{"system:serviceaccount:a:b"}, ReviewQPS: 1, ReviewBurst: 5}, r)
	start := time.Now()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := a.Check(context.Background(), Credentials{Token: jwt("aud", start.Add(time.Hour+time.Duration(i)*time.Second))}, "get")
			mu.Lock()
			codes[d.Code]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if max := int32(5 + 1 + elapsed.Seconds()); r.calls.Load() > max {
		t.Errorf("%d TokenReviews in %s, want at most %d", r.calls.Load(), elapsed, max)
	}
	if codes[503] == 0 || codes[401]+codes[503] != 200 || elapsed > 2*time.Second {
		t.Errorf("answers %v in %s, want 401s and quick 503s only", codes, elapsed)
	}
	t.Logf("answers %v, %d reviews, %s", codes, r.calls.Load(), elapsed)
}
