package sandbox

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// A sandbox records the principal that created it: an API key's name or a
// verified token's service-account username, in clear in an annotation and
// as a hash in a label (a username is not a valid label value), which list
// and the per-principal quota select on. Both are on the workload (Pod or
// ReplicaSet, and a ReplicaSet's Pods) and on the Service
// (keys.AnnotationPrincipal, keys.LabelPrincipal).

// seesSandbox judges a sandbox by what carries its identity: its workload,
// or, when only its Service is left, the Service.
func seesSandbox(c api.Caller, f found) bool {
	if w := f.workload(); w != nil {
		return c.Sees(w)
	}
	return f.svc != nil && c.Sees(f.svc)
}

// fetchVisible is fetch as the caller sees it: another principal's sandbox
// is absent (hidden says it exists), exactly as one that never existed, so
// that its id, state and URL stay unknown to the caller.
func (m *Manager) fetchVisible(ctx context.Context, id string) (f found, hidden bool, err error) {
	c, err := api.RequireCaller(ctx)
	if err != nil {
		return found{}, false, err
	}
	if f, err = m.fetch(ctx, id); err != nil {
		return found{}, false, err
	}
	if f.pod != nil && f.rs == nil && f.svc == nil && m.leftover(f.pod) {
		// Left by a create that failed and could not undo: no sandbox
		// (get answers 404), whoever wrote it; destroy removes it.
		return found{stray: f.pod}, false, nil
	}
	if !seesSandbox(c, f) {
		// Another principal's sandbox holds the id. A stray Pod beside it
		// (a failed create of the id) is still the caller's to destroy
		// when it is the caller's own.
		var rest found
		if f.stray != nil && (c.Sees(f.stray) || m.leftover(f.stray)) {
			rest.stray = f.stray
		}
		return rest, f.workload() != nil || f.svc != nil, nil
	}
	if f.stray != nil && !c.Sees(f.stray) {
		f.stray = nil
	}
	return f, false, nil
}

// leftover reports whether pod, which no Service of its sandbox names, is
// older than any create that wrote it could have undone it in: what a
// failed create that could not undo left (see undoMade). A pooled Pod's
// age counts from its claim: the reap lists Services before Pods, and a
// claim between the two lists (Service first, then the Pod's claim) shows
// it an old Pod that no listed Service names.
func (m *Manager) leftover(pod *corev1.Pod) bool {
	return time.Since(resources.SandboxSince(pod)) > m.undoWindow()
}
