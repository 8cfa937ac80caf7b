// Package eventlimit bounds how many Kubernetes Events a replica writes.
//
// Events are advice for `kubectl describe`; the API server they are written
// to is shared with everything else in the cluster, and every Event is a
// write. client-go's own spam filter limits Events per object, and each
// sandbox is a new object, so a burst of creates would otherwise add one
// write per create. Beyond the budget an Event is dropped and counted: the
// Prometheus metrics remain the complete record.
package eventlimit

import (
	"golang.org/x/time/rate"
	"k8s.io/apimachinery/pkg/runtime"
)

// Recorder is the subset of client-go's record.EventRecorder the function
// uses.
type Recorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...interface{})
}

// Limited passes Events to its Recorder within a token-bucket budget.
type Limited struct {
	next    Recorder
	limit   *rate.Limiter
	dropped func()
}

// New allows qps Events per second with bursts of burst; dropped is called
// for each Event beyond that.
func New(next Recorder, qps float64, burst int, dropped func()) *Limited {
	return &Limited{next: next, limit: rate.NewLimiter(rate.Limit(qps), burst), dropped: dropped}
}

// Eventf records the Event if the budget allows, else counts it dropped.
func (l *Limited) Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...interface{}) {
	if !l.limit.Allow() {
		l.dropped()
		return
	}
	l.next.Eventf(object, eventtype, reason, messageFmt, args...)
}
