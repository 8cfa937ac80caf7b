package api

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

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

// RequireCaller is CallerFrom that fails closed: a door that forgot to say
// who is calling gets an internal error, never every sandbox.
func RequireCaller(ctx context.Context) (Caller, error) {
	c, ok := CallerFrom(ctx)
	if !ok {
		return Caller{}, &Error{Kind: KindInternal, Detail: "the request reached the sandbox operations without an authenticated principal"}
	}
	return c, nil
}

// LegacyPrincipal owns the sandboxes that record no principal: those made
// before principals were recorded, when PROVISIONER_API_KEY (principal
// "default") was the only credential that could create one. So DeerFlow's
// backend keeps its sandboxes across an upgrade (a get that answered 404
// would make it create the id again, and that create would be refused).
const LegacyPrincipal = config.DefaultPrincipal

// Sees reports whether c may see obj: an administrator sees everything, a
// principal what records it, and LegacyPrincipal also what records none.
func (c Caller) Sees(obj metav1.Object) bool {
	return c.Admin || (c.Principal != "" && PrincipalOf(obj) == c.Principal)
}

// PrincipalOf is the principal obj records; one that records none is from
// before principals: LegacyPrincipal's.
func PrincipalOf(obj metav1.Object) string {
	if p := obj.GetAnnotations()[keys.AnnotationPrincipal]; p != "" {
		return p
	}
	return LegacyPrincipal
}

// Records is the principal c's sandboxes record, as PrincipalOf reads it
// back: c's own, LegacyPrincipal's for a caller without one.
func (c Caller) Records() string {
	if c.Principal == "" {
		return LegacyPrincipal
	}
	return c.Principal
}
