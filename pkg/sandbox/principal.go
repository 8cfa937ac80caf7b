package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// A sandbox records the principal that created it: an API key's name or a
// verified token's service-account username, in clear in an annotation and
// as a hash in a label (a username is not a valid label value), which list
// and the per-principal quota select on. Both are on the workload (Pod or
// ReplicaSet, and a ReplicaSet's Pods) and on the Service
// (keys.AnnotationPrincipal, keys.LabelPrincipal).

// Caller is who an operation runs for. The front doors put it in the
// request's context once the request is authenticated; an operation
// without one fails closed.
type Caller struct {
	Principal string
	// Admin sees (gets, lists, destroys, pauses, resumes) every sandbox,
	// those created before principals were recorded included.
	Admin bool
}

type callerKey struct{}

// WithCaller returns ctx carrying c.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller ctx carries.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok && c.Principal != ""
}

// callerOf is CallerFrom that fails closed: a door that forgot to say who
// is calling gets an internal error, never every sandbox.
func callerOf(ctx context.Context) (Caller, error) {
	c, ok := CallerFrom(ctx)
	if !ok {
		return Caller{}, &Error{Kind: KindInternal, Detail: "the request reached the sandbox operations without an authenticated principal"}
	}
	return c, nil
}

// PrincipalLabelValue is the label value for a principal: always a hash, so
// that every name (a username has ':') maps to one form, and no key name can
// pose as another principal's hash.
func PrincipalLabelValue(principal string) string {
	sum := sha256.Sum256([]byte(principal))
	return "p-" + hex.EncodeToString(sum[:])[:40]
}

// LegacyPrincipal owns the sandboxes that record no principal: those made
// before principals were recorded, when PROVISIONER_API_KEY (principal
// "default") was the only credential that could create one. So DeerFlow's
// backend keeps its sandboxes across an upgrade (a get that answered 404
// would make it create the id again, and that create would be refused).
const LegacyPrincipal = "default"

// sees reports whether c may see obj: an administrator sees everything, a
// principal what records it, and LegacyPrincipal also what records none.
func (c Caller) sees(obj metav1.Object) bool {
	owner, ok := obj.GetAnnotations()[keys.AnnotationPrincipal]
	if !ok {
		owner = LegacyPrincipal
	}
	return c.Admin || (c.Principal != "" && owner == c.Principal)
}

// seesSandbox judges a sandbox by what carries its identity: its workload,
// or, when only its Service is left, the Service.
func (c Caller) seesSandbox(f found) bool {
	if w := f.workload(); w != nil {
		return c.sees(w)
	}
	return f.svc != nil && c.sees(f.svc)
}

// recordPrincipal writes the creating principal onto an object being built.
func recordPrincipal(obj metav1.Object, s Spec) {
	if s.Caller.Principal == "" {
		return
	}
	l, a := obj.GetLabels(), obj.GetAnnotations()
	if l == nil {
		l = map[string]string{}
	}
	if a == nil {
		a = map[string]string{}
	}
	l[keys.LabelPrincipal] = PrincipalLabelValue(s.Caller.Principal)
	a[keys.AnnotationPrincipal] = s.Caller.Principal
	obj.SetLabels(l)
	obj.SetAnnotations(a)
}

// buildPod is BuildPod with the creating principal recorded.
func buildPod(cfg *config.Config, s Spec) *corev1.Pod {
	pod := BuildPod(cfg, s)
	recordPrincipal(pod, s)
	return pod
}

// fetchVisible is fetch as the caller sees it: another principal's sandbox
// is absent (hidden says it exists), exactly as one that never existed, so
// that its id, state and URL stay unknown to the caller.
func (m *Manager) fetchVisible(ctx context.Context, id string) (f found, hidden bool, err error) {
	c, err := callerOf(ctx)
	if err != nil {
		return found{}, false, err
	}
	if f, err = m.fetch(ctx, id); err != nil {
		return found{}, false, err
	}
	if !c.seesSandbox(f) {
		return found{}, f.workload() != nil || f.svc != nil, nil
	}
	if f.stray != nil && !c.sees(f.stray) {
		f.stray = nil
	}
	return f, false, nil
}

// listSelector selects the sandboxes the caller may list: all of them for
// an administrator, those labelled with its principal otherwise (the
// annotation is checked again on each: the label is a hash). The legacy
// principal's include those that record none, which no label selects: it
// lists every sandbox and List keeps what it sees.
func listSelector(c Caller) string {
	if c.Admin || c.Principal == LegacyPrincipal {
		return selectorAll
	}
	return selectorAll + "," + keys.LabelPrincipal + "=" + PrincipalLabelValue(c.Principal)
}
