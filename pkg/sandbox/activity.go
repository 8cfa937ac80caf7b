package sandbox

import (
	"context"
	"encoding/json"
	"strconv"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// lifetime is what a Pod's annotations say about its expiry.
type lifetime struct {
	created, lastActivity time.Time
	idle, max             time.Duration
}

func lifetimeOf(obj metav1.Object) (lifetime, bool) {
	a := obj.GetAnnotations()
	created, err1 := time.Parse(time.RFC3339, a[keys.AnnotationCreatedAt])
	last, err2 := time.Parse(time.RFC3339, a[keys.AnnotationLastActivity])
	idle, err3 := strconv.ParseInt(a[keys.AnnotationIdleTimeout], 10, 64)
	max, err4 := strconv.ParseInt(a[keys.AnnotationMaxLifetime], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return lifetime{}, false
	}
	return lifetime{created: created, lastActivity: last, idle: time.Duration(idle) * time.Second, max: time.Duration(max) * time.Second}, true
}

func (l lifetime) expiresAt() time.Time {
	return resources.ExpiresAt(l.created, l.lastActivity, l.idle, l.max)
}

// touch records activity on a sandbox's workload (its bare Pod or its
// ReplicaSet, through patch, that kind's typed Patch), at most once per
// ActivityThrottle, so a busy sandbox is not patched on every request. A
// failed write is logged by the caller's metrics, not returned: activity is
// best effort, the answer is not.
func touch[T metav1.Object](ctx context.Context, m *Manager, obj T, patch func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (T, error)) T {
	data := m.activityPatch(obj)
	if data == nil {
		return obj
	}
	patched, err := patch(ctx, obj.GetName(), types.MergePatchType, data, metav1.PatchOptions{})
	if err != nil {
		return obj
	}
	return patched
}

// activityPatch is the patch that records activity on obj now, or nil when
// there is nothing to record: not ours (DeerFlow's provisioner made it, no
// expiry to extend), or recorded less than ActivityThrottle ago.
func (m *Manager) activityPatch(obj metav1.Object) []byte {
	lt, ok := lifetimeOf(obj)
	if !ok {
		return nil
	}
	now := time.Now().UTC().Truncate(time.Second)
	if now.Sub(lt.lastActivity) < m.cfg.ActivityThrottle {
		return nil
	}
	lt.lastActivity = now
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		keys.AnnotationLastActivity: now.Format(time.RFC3339),
		keys.AnnotationExpiresAt:    lt.expiresAt().Format(time.RFC3339),
	}}})
	return patch
}
