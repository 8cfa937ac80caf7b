package fairness

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// clocked is a Gate whose clock stands still until the test moves it.
func clocked(l Limits) (*Gate, *time.Time) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	g := New(l)
	g.now = func() time.Time { return now }
	return g, &now
}

// verdict is one Admit's outcome, for comparing sequences.
type verdict struct {
	Admitted   bool
	Names      string // the setting a refusal names
	RetryAfter time.Duration
}

func admit(g *Gate, principal string) (verdict, func()) {
	release, no := g.Admit(context.Background(), principal)
	if no != nil {
		v := verdict{RetryAfter: no.RetryAfter}
		for _, s := range []string{"PRINCIPAL_REQUESTS_PER_SECOND", "PRINCIPAL_MAX_CONCURRENT_REQUESTS"} {
			if strings.Contains(no.Detail, s) && strings.Contains(no.Detail, principal) {
				v.Names = s
			}
		}
		return v, nil
	}
	return verdict{Admitted: true}, release
}

// TestRateIsPerPrincipal: a principal that has spent its burst is refused,
// naming the setting and when to retry, while another principal is
// admitted; a second later its bucket has a token again.
func TestRateIsPerPrincipal(t *testing.T) {
	g, now := clocked(Limits{RequestsPerSecond: 1, Burst: 2, MaxInProgress: 100})
	var got []verdict
	for _, p := range []string{"bob", "bob", "bob", "alice", "alice"} {
		v, release := admit(g, p)
		if release != nil {
			release()
		}
		got = append(got, v)
	}
	*now = now.Add(time.Second)
	v, _ := admit(g, "bob")
	got = append(got, v)
	want := []verdict{{Admitted: true}, {Admitted: true}, {Names: "PRINCIPAL_REQUESTS_PER_SECOND", RetryAfter: time.Second},
		{Admitted: true}, {Admitted: true}, {Admitted: true}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("verdicts (-want +got):\n%s", diff)
	}
}

// TestRequestsInProgressArePerPrincipal: a principal with its most
// requests in progress is refused until one ends, another principal is
// not, and a release called twice gives back one place.
func TestRequestsInProgressArePerPrincipal(t *testing.T) {
	g, _ := clocked(Limits{RequestsPerSecond: 1000, Burst: 1000, MaxInProgress: 2})
	_, first := admit(g, "bob")
	admit(g, "bob")
	var got []verdict
	v, _ := admit(g, "bob")
	got = append(got, v)
	v, _ = admit(g, "alice")
	got = append(got, v)
	first()
	first()
	v, _ = admit(g, "bob")
	got = append(got, v)
	v, _ = admit(g, "bob")
	got = append(got, v)
	want := []verdict{{Names: "PRINCIPAL_MAX_CONCURRENT_REQUESTS", RetryAfter: time.Second}, {Admitted: true},
		{Admitted: true}, {Names: "PRINCIPAL_MAX_CONCURRENT_REQUESTS", RetryAfter: time.Second}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("verdicts (-want +got):\n%s", diff)
	}
	if n := g.InProgress("bob"); n != 2 {
		t.Errorf("bob has %d requests in progress, want 2", n)
	}
}

// TestShortWaitsAreQueued: a request whose token comes within maxQueue
// waits for it rather than being refused; one whose caller gives up while
// it waits is refused and leaves nothing in progress.
func TestShortWaitsAreQueued(t *testing.T) {
	g := New(Limits{RequestsPerSecond: 10, Burst: 1, MaxInProgress: 10}) // a token every 100 ms
	if release, no := g.Admit(context.Background(), "bob"); no != nil {
		t.Fatalf("first request refused: %s", no.Detail)
	} else {
		release()
	}
	start := time.Now()
	release, no := g.Admit(context.Background(), "bob")
	if no != nil {
		t.Fatalf("a request 100 ms from its token was refused: %s", no.Detail)
	}
	release()
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("admitted after %s, want it to have waited for its token (about 100 ms)", waited)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, no := g.Admit(ctx, "bob"); no == nil {
		t.Errorf("a request whose caller gave up while it waited was admitted")
	}
	if n := g.InProgress("bob"); n != 0 {
		t.Errorf("%d requests in progress after the caller gave up, want 0", n)
	}
}

// TestRetryAfterIsWholeSeconds: Retry-After is the wait rounded up, at
// least one second; the status is 429.
func TestRetryAfterIsWholeSeconds(t *testing.T) {
	got := map[time.Duration]string{}
	for _, d := range []time.Duration{0, 300 * time.Millisecond, time.Second, 2500 * time.Millisecond} {
		h := http.Header{}
		code, detail := (&Refusal{Detail: "slow down", RetryAfter: d}).Answer(h)
		if code != http.StatusTooManyRequests || detail != "slow down" {
			t.Errorf("Answer = %d %q, want 429 and the detail", code, detail)
		}
		got[d] = h.Get("Retry-After")
	}
	want := map[time.Duration]string{0: "1", 300 * time.Millisecond: "1", time.Second: "1", 2500 * time.Millisecond: "3"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Retry-After (-want +got):\n%s", diff)
	}
}

// TestIdlePrincipalsAreForgotten: past pruneAbove principals the idle
// ones are forgotten, and one with a request in progress is kept.
func TestIdlePrincipalsAreForgotten(t *testing.T) {
	g, _ := clocked(Limits{RequestsPerSecond: 1, Burst: 1, MaxInProgress: 1})
	if _, release := admit(g, "busy"); release == nil {
		t.Fatal("busy refused")
	}
	for i := range 2 * pruneAbove {
		g.shareOf(fmt.Sprint("p", i)) // a new principal's bucket is full: idle at once
	}
	if n := len(g.shares); n > pruneAbove+1 {
		t.Errorf("the Gate remembers %d principals, want at most %d", n, pruneAbove+1)
	}
	if v, _ := admit(g, "busy"); v.Names != "PRINCIPAL_MAX_CONCURRENT_REQUESTS" {
		t.Errorf("busy's request in progress was forgotten: %+v", v)
	}
}
