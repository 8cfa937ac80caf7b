package sandbox

import (
	"context"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// touch records activity on a sandbox's workload (its bare Pod or its
// ReplicaSet, through patch, that kind's typed Patch), at most once per
// ActivityThrottle, so a busy sandbox is not patched on every request. A
// failed write is logged by the caller's metrics, not returned: activity is
// best effort, the answer is not.
func touch[T metav1.Object](ctx context.Context, m *Manager, obj T, patch func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (T, error)) T {
	return touchAs(ctx, m, obj, patch, false)
}

// reuse is touch for a create that answers with a workload it found. A
// workload young enough that the create which wrote it may still undo it
// (a failed create removes what it wrote: undoWorkload) is marked however
// recently it was, to the nanosecond, so that the mark always changes:
// that undo sees that another request answered for the workload, and
// leaves it. A claimed pooled Pod is as young as its claim (SandboxSince).
func reuse[T metav1.Object](ctx context.Context, m *Manager, obj T, patch func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (T, error)) T {
	return touchAs(ctx, m, obj, patch, time.Since(resources.SandboxSince(obj)) < m.undoWindow())
}

func touchAs[T metav1.Object](ctx context.Context, m *Manager, obj T, patch func(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (T, error), force bool) T {
	data := resources.ActivityPatch(obj, m.cfg.ActivityThrottle, force)
	if data == nil {
		return obj
	}
	patched, err := patch(ctx, obj.GetName(), types.MergePatchType, data, metav1.PatchOptions{})
	if err != nil {
		return obj
	}
	return patched
}

// undoWindow is how long after its create a workload may still be removed
// by the create that wrote it, should that create end without its answer:
// the request's deadline and its longest wait for Ready.
func (m *Manager) undoWindow() time.Duration { return m.cfg.RequestTimeout + m.cfg.MaxReadyWait }
