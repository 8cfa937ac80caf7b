// Package fairness shares one replica between principals. Every door of
// the function (the HTTP API, CloudEvents, POST /), and the E2B router for
// each request it forwards, admits an authenticated request through one
// Gate per replica before it runs: each principal has a token bucket
// (PRINCIPAL_REQUESTS_PER_SECOND, PRINCIPAL_REQUEST_BURST) and a bound on
// the requests it has in progress (PRINCIPAL_MAX_CONCURRENT_REQUESTS).
// Without it one principal's flood would take the replica's API client
// (one rate for everyone), its wait permits and its CPU from every other
// tenant. A request beyond either bound is refused before it reads or
// writes anything, with 429 and Retry-After.
//
// A request that finds its principal's bucket empty waits for its token
// when that takes at most maxQueue, as client-go's own limiter would, so
// that a burst from an honest client is smoothed rather than refused; only
// one that would wait longer is refused. Requests that fail to
// authenticate are no principal's and are not counted here: the
// TokenReview limiter (package auth) bounds what they cost.
package fairness

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
)

// maxQueue is the longest a request waits for its principal's next token
// before it is refused instead. Short, because the wait comes on top of
// the request's own deadline (REQUEST_TIMEOUT plus its wait), which the
// func runtime's write timeout leaves a margin of only two seconds.
const maxQueue = 500 * time.Millisecond

// pruneAbove is how many principals a Gate remembers before it forgets the
// idle ones (nothing in progress, a full bucket: the state a new principal
// starts in, so forgetting it changes no answer). Principals are
// authenticated, but a wildcard subject admits any number of them.
const pruneAbove = 1024

// Limits are one principal's bounds on one replica.
type Limits struct {
	RequestsPerSecond float64
	Burst             int
	MaxInProgress     int
}

// Gate admits requests by principal. It is safe for concurrent use.
type Gate struct {
	limits Limits
	now    func() time.Time

	mu     sync.Mutex
	shares map[string]*share
}

// share is one principal's state on this replica.
type share struct {
	bucket     *rate.Limiter
	inProgress int
}

// New returns a Gate applying limits to each principal.
func New(limits Limits) *Gate {
	return &Gate{limits: limits, now: time.Now, shares: map[string]*share{}}
}

// FromConfig returns the Gate the configuration describes (which
// config.Validate has checked).
func FromConfig(c *config.FairnessConfig) *Gate {
	return New(Limits{RequestsPerSecond: c.PrincipalRequestsPerSecond, Burst: c.PrincipalRequestBurst,
		MaxInProgress: c.PrincipalMaxConcurrentRequests})
}

// Refusal says why a request was not admitted and when to try again.
type Refusal struct {
	Detail     string
	RetryAfter time.Duration
}

// Answer sets Retry-After on h, in whole seconds and at least one, and
// returns the status (429) and the detail to answer with: each door writes
// them its own way.
func (r *Refusal) Answer(h http.Header) (int, string) {
	h.Set("Retry-After", strconv.Itoa(int(max(1, math.Ceil(r.RetryAfter.Seconds())))))
	return http.StatusTooManyRequests, r.Detail
}

// Admit admits one request of principal, waiting for its token up to
// maxQueue, or refuses it. release ends the request (calling it again does
// nothing); it is nil with a refusal.
func (g *Gate) Admit(ctx context.Context, principal string) (release func(), refused *Refusal) {
	g.mu.Lock()
	s := g.shareOf(principal)
	if s.inProgress >= g.limits.MaxInProgress {
		g.mu.Unlock()
		return nil, &Refusal{RetryAfter: time.Second, Detail: fmt.Sprintf(
			"%s already has %d requests in progress on this replica, the most one principal may (PRINCIPAL_MAX_CONCURRENT_REQUESTS); wait for their answers before sending more, and retry after Retry-After",
			principal, s.inProgress)}
	}
	now := g.now()
	r := s.bucket.ReserveN(now, 1)
	delay := r.DelayFrom(now)
	if delay > maxQueue {
		r.CancelAt(now)
		g.mu.Unlock()
		return nil, &Refusal{RetryAfter: delay, Detail: fmt.Sprintf(
			"%s is sending requests faster than this replica admits from one principal (PRINCIPAL_REQUESTS_PER_SECOND %g, bursts of PRINCIPAL_REQUEST_BURST %d); slow down, and retry after Retry-After",
			principal, g.limits.RequestsPerSecond, g.limits.Burst)}
	}
	s.inProgress++
	g.mu.Unlock()

	var once sync.Once
	release = func() {
		once.Do(func() {
			g.mu.Lock()
			s.inProgress--
			g.mu.Unlock()
		})
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-ctx.Done():
			r.CancelAt(g.now()) // its token goes back to the principal's next request
			release()
			return nil, &Refusal{RetryAfter: delay, Detail: fmt.Sprintf("the request ended while it waited for its turn among %s's requests: %v", principal, ctx.Err())}
		case <-t.C:
		}
	}
	return release, nil
}

// InProgress is how many requests of principal are in progress now.
func (g *Gate) InProgress(principal string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	if s, ok := g.shares[principal]; ok {
		return s.inProgress
	}
	return 0
}

// shareOf is principal's share, made on its first request; g.mu is held.
func (g *Gate) shareOf(principal string) *share {
	if s, ok := g.shares[principal]; ok {
		return s
	}
	if len(g.shares) >= pruneAbove {
		now := g.now()
		for p, s := range g.shares {
			if s.inProgress == 0 && s.bucket.TokensAt(now) >= float64(g.limits.Burst) {
				delete(g.shares, p)
			}
		}
	}
	s := &share{bucket: rate.NewLimiter(rate.Limit(g.limits.RequestsPerSecond), g.limits.Burst)}
	g.shares[principal] = s
	return s
}
