// Package waitlimit bounds the requests of one replica that wait for a
// sandbox to become ready: MAX_CONCURRENT_WAITS in all, because each holds
// an API watch, and at most half of them (at least one) per principal,
// because the permits are shared among tenants: one principal's flood of
// waiting requests must not leave every other principal's wait refused.
// (A wait permit: see docs/architecture.md's glossary.)
package waitlimit

import (
	"fmt"
	"sync"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// Limiter holds one replica's wait permits. It is safe for concurrent use.
type Limiter struct {
	mu          sync.Mutex
	total, used int
	share       int
	held        map[string]int // principal -> slots held
}

// New returns total slots (at least one), half of them (at least one) per
// principal.
func New(total int) *Limiter {
	total = max(total, 1)
	return &Limiter{total: total, share: max(total/2, 1), held: map[string]int{}}
}

// Take takes a slot for principal, or refuses at once (KindQuota, as a
// 429 with Retry-After) saying which bound it met. release gives it back;
// calling it again does nothing.
func (s *Limiter) Take(principal string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.used >= s.total:
		return nil, &api.Error{Kind: api.KindQuota, Detail: fmt.Sprintf(
			"this replica is already waiting for %d sandboxes (MAX_CONCURRENT_WAITS); retry, or ask without a wait", s.total)}
	case s.held[principal] >= s.share:
		return nil, &api.Error{Kind: api.KindQuota, Detail: fmt.Sprintf(
			"you already hold %d of this replica's %d wait slots, the most one principal may (half of MAX_CONCURRENT_WAITS); retry, or ask without a wait",
			s.held[principal], s.total)}
	}
	s.used++
	s.held[principal]++
	var once sync.Once
	return func() { once.Do(func() { s.give(principal) }) }, nil
}

func (s *Limiter) give(principal string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used--
	if s.held[principal]--; s.held[principal] <= 0 {
		delete(s.held, principal)
	}
}

// Holding is how many slots principal holds now.
func (s *Limiter) Holding(principal string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held[principal]
}
