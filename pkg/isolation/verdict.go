package isolation

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// verdict is the last judgement of one check in this replica.
type verdict struct {
	group   singleflight.Group
	mu      sync.Mutex
	checked time.Time // zero: never checked
	err     error     // nil: in force
	rv      string    // the resourceVersion the verdict is about
}

func (v *verdict) last() (checked time.Time, rv string, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.checked, v.rv, v.err
}

func (v *verdict) store(err error, rv string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.checked, v.err, v.rv = time.Now(), err, rv
}

// fresh is the verdict if it is younger than ttl (ok false: none, or stale).
func (v *verdict) fresh(ttl time.Duration) (err error, ok bool) {
	checked, _, err := v.last()
	return err, !checked.IsZero() && time.Since(checked) < ttl
}

// run makes check, one at a time per replica, bounded by timeout; a caller
// that gives up does not cancel the check the others wait for.
func (v *verdict) run(ctx context.Context, timeout time.Duration, action string, check func(context.Context) error) error {
	ch := v.group.DoChan("check", func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		return nil, check(cctx)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return api.Classify(ctx.Err(), action)
	}
}
