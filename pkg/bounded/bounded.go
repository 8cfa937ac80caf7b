// Package bounded counts what is open per key (a principal's requests
// through the router or connections through the egress proxy, the requests
// held for one sandbox) and refuses past a bound. Only keys with something
// open take memory.
package bounded

import "sync"

// Counts is the open count per key; the zero value is ready.
type Counts struct {
	mu sync.Mutex
	n  map[string]int
}

// Take counts one more for key, or refuses (false) when max are open;
// release, called once or more, undoes it once.
func (c *Counts) Take(key string, max int) (release func(), ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	if c.n[key] >= max {
		return nil, false
	}
	c.n[key]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.n[key]--; c.n[key] <= 0 {
				delete(c.n, key)
			}
		})
	}, true
}
