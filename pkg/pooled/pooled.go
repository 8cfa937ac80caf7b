// Package pooled makes a pooled create's Service (docs/architecture.md's
// glossary: pool, claim, wire): before its Pod is claimed, owned by the Pod
// about to be claimed, and counted by the quota. Package sandbox decides
// whether a create is served from a pool and answers it; the pool
// (poolapi.Pool) makes the claim's write, and calls Create.Prepare before
// it on each Pod it tries.
//
// Why the Service comes first: a claim takes its Pod out of the pool's
// ReplicaSet, whose controller at once makes another, and the node starts
// it. On a small node that start takes the CPU the API server needs for
// the Service (a NodePort Service create measured 31 ms p50 right after
// the claim, 8 ms before it; make bench's pool rows). Made first, the
// Service also settles races for the id before a pooled Pod is spent, and
// a refused quota spends none. The claim then waits for the Service's
// first EndpointSlice (follow.AwaitSlice), so that the slice lists the claimed
// Pod without the EndpointSlice controller's one-second retry.
//
// Between the two writes the Service's owner is a pooled Pod that does not
// yet carry the id. A racing create of the id finds the Service, takes it
// as the winner's (package sandbox: errOtherKind) and waits for the claim
// to land (reuseOtherKind); a claim that never lands (its replica stopped
// between the writes) leaves a Service that a create replaces once it is
// older than any create could be (ownerLives).
package pooled

import (
	"context"
	"errors"
	"maps"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/follow"
	"github.com/deerflow-sandbox/provisioner/pkg/ownership"
	"github.com/deerflow-sandbox/provisioner/pkg/poolapi"
	"github.com/deerflow-sandbox/provisioner/pkg/quota"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// Maker makes the pooled creates' Services of one namespace.
type Maker struct {
	Client      kubernetes.Interface
	Namespace   string
	Objects     config.Objects
	QuotaConfig config.QuotaConfig
	Quota       *quota.Counter
	Owners      *ownership.Registry
	Pool        poolapi.Pool
	// Ensure creates the Service, adopting or replacing an existing one;
	// one that holds the id for another sandbox is the Manager's
	// errOtherKind (sandbox.Manager.ensureService).
	Ensure func(ctx context.Context, s api.Spec, owner metav1.OwnerReference, want *corev1.Service) (*corev1.Service, error)
}

// Start begins the pooled create of s: its Prepare goes to the claim.
func (mk *Maker) Start(s api.Spec) *Create { return &Create{mk: mk, s: s} }

// Create is one pooled create's Service, handed from Pod to Pod while its
// claim tries them.
type Create struct {
	mk  *Maker
	s   api.Spec
	Svc *corev1.Service // the Service this create made, owned by the Pod it tries
	// Wire is the wire Svc names for the URL (nil: Svc is the URL's).
	Wire *corev1.Service
	Err  error // why a Prepare ended the claim
	// Uncertain: a claim's write may have landed unseen; the Service stays
	// (the quota counts it), and the reap removes it if no claim did.
	Uncertain bool
	// claimed: the ids are this create's principal's (ownership.Registry.Claim).
	claimed bool
}

// Prepare is the claim's Prepare: the Service made (and the quota counted)
// before the first Pod, handed over to each next Pod the claim tries when
// the one before was taken by another claim.
//
// A Pod with a token keeps it (the admission policy pins it), so the
// Service selects that token. A wired Pod (resources.Wires) gets a
// reference Service (resources.Reference): its URL is the wire's, whose
// endpoint kube-proxy has already programmed; there is no slice to wait
// for. A Pod not wired yet is claimed as an unwired one; one whose wire
// was deleted or edited by hand is passed over (poolapi.ErrSkip: the pool
// wires it again).
func (c *Create) Prepare(ctx context.Context, pod *corev1.Pod) error {
	owner := resources.PodOwnerRef(pod)
	svcs := c.mk.Client.CoreV1().Services(c.mk.Namespace)
	s := c.s
	if t := resources.Token(pod); t != "" {
		s.Token = t
	}
	wire, err := c.mk.Pool.WireOf(ctx, c.s.Resolved, pod)
	if errors.Is(err, poolapi.ErrSkip) {
		return err
	} else if err != nil {
		c.Err = err
		return err
	}
	want := resources.BuildService(c.mk.Objects, s, owner)
	if wire != nil {
		want = resources.Reference(want, wire)
	}
	if c.Svc != nil {
		if resources.OwnerUID(c.Svc.OwnerReferences) == pod.UID {
			return nil
		}
		var err error
		// The same selector (a reference's none, or the same token and
		// pin) is handed over; an update may not change what a Service
		// selects, and an unwired Pod's Service selects that Pod's name.
		if resources.URLService(c.Svc) == resources.URLService(want) && maps.Equal(c.Svc.Spec.Selector, want.Spec.Selector) {
			upd := c.Svc.DeepCopy()
			upd.OwnerReferences = []metav1.OwnerReference{owner}
			var svc *corev1.Service
			if svc, err = svcs.Update(ctx, upd, metav1.UpdateOptions{}); err == nil {
				c.Svc, c.Wire = svc, wire
				return nil
			}
		} else {
			// Another shape (wired or not), token or pin: made again below. The
			// quota counts it again too.
			err = svcs.Delete(ctx, c.Svc.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(c.Svc.UID))})
			if apierrors.IsConflict(err) {
				err = nil // already replaced
			}
		}
		if err != nil && !apierrors.IsNotFound(err) {
			c.Err = api.Classify(err, "hand the sandbox Service to another pooled Pod")
			return c.Err
		}
		// Removed with the Pod it named (the garbage collector follows a
		// pooled Pod deleted meanwhile), or just now: made again below,
		// counted again.
		c.Svc, c.Wire = nil, nil
	}
	svc, err := c.mk.Ensure(ctx, s, owner, want)
	if err != nil {
		c.Err = err
		return err
	}
	c.Svc, c.Wire = svc, nil
	if wire != nil && resources.URLService(svc) == wire.Name {
		c.Wire = wire
	}
	if quota.Limited(c.mk.QuotaConfig) {
		if err := c.mk.Quota.Check(ctx, c.s, svc); err != nil {
			c.Err = err
			return err
		}
	}
	// The ids, once the quota has admitted the Service and before a Pod is
	// claimed, as a cold create claims them before its workload (ensurePod).
	if !c.claimed {
		if err := c.mk.Owners.Claim(ctx, c.s.Caller, c.s.UserID, c.s.ThreadID); err != nil {
			c.Err = err
			return err
		}
		c.claimed = true
	}
	if c.Wire == nil {
		follow.AwaitSlice(ctx, c.mk.Client.DiscoveryV1().EndpointSlices(c.mk.Namespace), svc)
	}
	return nil
}

// Drop removes the Service of a claim that got no Pod: no Pod of this id
// will carry it. It runs past the request's end, which may be what ended
// the claim; a Service replaced or removed since is not this create's.
func (c *Create) Drop(ctx context.Context) error {
	if c.Svc == nil {
		return nil
	}
	err := c.mk.Client.CoreV1().Services(c.mk.Namespace).Delete(context.WithoutCancel(ctx), c.Svc.Name,
		metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(c.Svc.UID))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return api.Classify(err, "remove the Service of a claim that got no Pod")
	}
	return nil
}
