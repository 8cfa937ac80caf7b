package resources

import (
	"encoding/json"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ActivityPatch is the merge patch that records activity on obj now, or
// nil when there is nothing to record: not ours (DeerFlow's provisioner
// made it, no expiry to extend), or recorded less than throttle ago. Forced,
// it always records, to the nanosecond, so that the mark always changes.
func ActivityPatch(obj metav1.Object, throttle time.Duration, force bool) []byte {
	lt, ok := LifetimeOf(obj)
	if !ok {
		return nil
	}
	now, layout := time.Now().UTC().Truncate(time.Second), time.RFC3339
	if force {
		now, layout = time.Now().UTC(), time.RFC3339Nano
	} else if now.Sub(lt.LastActivity) < throttle {
		return nil
	}
	lt.LastActivity = now
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		keys.AnnotationLastActivity: now.Format(layout),
		keys.AnnotationExpiresAt:    lt.ExpiresAt().Format(time.RFC3339),
	}}})
	return patch
}
