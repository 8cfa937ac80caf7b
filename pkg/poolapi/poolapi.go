// Package poolapi is the contract between a create and a warm pool: what a
// pool offers (Pool, which package pool implements over ReplicaSets) and
// what a claim writes onto the pooled Pod it takes (Claim). Package sandbox
// claims; neither side imports the other's internals. Pool, claim and wire
// are defined in docs/architecture.md, with a pooled create's writes in
// order.
package poolapi

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// Pool hands out warm Pods; package pool implements it over ReplicaSets,
// and package sandbox claims from it.
type Pool interface {
	// Ready lists the claimable pooled Pods of t whose shape hash is hash
	// (one call); an error means the pool cannot serve (counted there).
	Ready(ctx context.Context, t *template.Template, hash string) ([]*corev1.Pod, error)
	// ClaimFrom turns one of ready into the sandbox c describes, with one
	// conditional write each try, and returns it; nil when none could be
	// had (all taken by racing claims): the create then goes the cold way.
	// Before its first write on a Pod it calls c.Prepare with that Pod; an
	// error there ends the claim at once (nil, counted by no one), but
	// ErrSkip, which passes over that Pod to the next.
	ClaimFrom(ctx context.Context, t *template.Template, hash string, ready []*corev1.Pod, c Claim) *corev1.Pod
	// Missed records a create of a pooled template that needs what a
	// pooled Pod lacks (mounts, env, resources) and so goes the cold way.
	Missed(t *template.Template)
	// Describe fills in how many pooled Pods stand Ready (GET
	// /api/templates). It writes nothing.
	Describe(ctx context.Context, sums []template.Summary, valid []*template.Template)
	// WireOf is pod's wire (its own Service, which kube-proxy already
	// routes to it) when it has one that wires it, nil when pod is not
	// wired yet (no token: claimed as before wires). A wired Pod whose wire
	// is gone (deleted by hand) or does not wire it (edited by hand, then
	// removed) gets ErrSkip: that Pod is not handed out, and t's pool is
	// wired again soon.
	WireOf(ctx context.Context, t *template.Template, pod *corev1.Pod) (*corev1.Service, error)
	// Rewire gives a sandbox claimed from a wired Pod (its Service svc,
	// its Pod pod) a wire again when its own (wire, nil when gone) was
	// deleted or edited by hand, and returns the wire its URL is then
	// (wire as it was when it still wires pod). A create calls it; a read
	// writes nothing.
	Rewire(ctx context.Context, svc, wire *corev1.Service, pod *corev1.Pod) (*corev1.Service, error)
	// Keep makes each valid template's pool exist at its size and shape,
	// and deletes the pools no valid template asks for (the reap). What
	// fails is logged there: the next reap tries again.
	Keep(ctx context.Context, templates *template.Store)
}

// Claim is what a claim writes onto a pooled Pod: the sandbox's labels and
// annotations (identity, owner, lifetimes from now) and its lifetime cap.
// Prepare, when set, runs before the claim's first write on each Pod it
// tries (a pooled create makes the sandbox's Service there: see
// pooled.Create).
type Claim struct {
	Labels, Annotations map[string]string
	MaxLifetime         time.Duration
	Prepare             func(ctx context.Context, pod *corev1.Pod) error
	// Uncertain, when set, is told that a claim's write failed without
	// saying whether it landed, and a read could not tell either: the Pod
	// may be claimed, so its Service must stay (sandbox.Manager.giveUp).
	Uncertain func()
}

// ErrSkip, from a Claim's Prepare (or Pool.WireOf), passes over the Pod at
// hand: the claim goes on to the next.
var ErrSkip = errors.New("this pooled Pod is not handed out")
