// Package quota keeps the sandbox limits (MAX_SANDBOXES, per user, per
// principal) with zero overshoot across any number of replicas: a create
// counts after its own Service is written and before its workload, against
// every sandbox Service committed before it (Check says why that is
// enough). The count comes from the Service cache (cache.go), not from a
// list per create. docs/architecture.md places the count in a create's
// writes and defines the terms.
package quota

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"k8s.io/client-go/kubernetes"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// Error is a quota refusal; Contended says whether racing creates (not
// long-lived sandboxes) fill the limit, so that another round may succeed.
type Error struct {
	Err       *api.Error
	Scope     string // total, user or principal
	Contended bool
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Counter counts sandboxes for the limits of one namespace.
type Counter struct {
	cfg       config.QuotaConfig
	namespace string
	client    kubernetes.Interface
	// cache holds the sandbox Services (nil without a limit); running
	// says Run started it.
	cache   *serviceCache
	running atomic.Bool
}

// New returns the counter of cfg's limits over namespace's sandboxes. It
// watches nothing until Run.
func New(cfg config.QuotaConfig, namespace string, client kubernetes.Interface) *Counter {
	c := &Counter{cfg: cfg, namespace: namespace, client: client}
	if Limited(cfg) {
		c.cache = newServiceCache(client, namespace)
	}
	return c
}

// Run starts the Service cache (once; later calls do nothing) until ctx
// ends. A counter that was never run lists instead.
func (c *Counter) Run(ctx context.Context) {
	if c.cache != nil && c.running.CompareAndSwap(false, true) {
		go c.cache.run(ctx)
	}
}

// Synced waits, at most within, until the Service cache has its first list.
func (c *Counter) Synced(ctx context.Context, within time.Duration) bool {
	return c.cache != nil && c.cache.synced(ctx, within)
}

// Holds reports whether the Service cache holds a sandbox Service named
// name: a hint only (the cache may be behind), false when there is no cache.
func (c *Counter) Holds(name string) bool {
	held, known := c.cached(name)
	return known && held
}

// Lacks reports whether the Service cache, in sync, holds no sandbox
// Service named name: a hint only (a Service made a moment ago may not be
// in it yet), false when there is no cache or it has not synced.
func (c *Counter) Lacks(name string) bool {
	held, known := c.cached(name)
	return known && !held
}

// cached looks name up in the Service cache; known is false when there is
// no cache or it has not synced.
func (c *Counter) cached(name string) (held, known bool) {
	if c.cache == nil || !c.running.Load() || !c.cache.informer.HasSynced() {
		return false, false
	}
	_, ok, _ := c.cache.informer.GetStore().GetByKey(c.namespace + "/" + name)
	return ok, true
}

// Full refuses, before a create writes anything, a create that the
// Service cache already shows over a limit with sandboxes that are not
// racing creates (a refusal that is not Contended): a principal at its
// limit writes nothing, not even the slot Check would count it with. It is
// only a shortcut: nil whenever the cache is not running and in sync, the
// count cannot be made, or the limit is full only of young sandboxes that
// may yet withdraw; the create then goes on to its slot, whose count
// (Check) is what keeps the overshoot at zero. A sandbox of the id in the
// cache means room, as for any create of an existing id.
func (c *Counter) Full(ctx context.Context, s api.Spec) error {
	if c.cache == nil || !c.running.Load() || !c.cache.informer.HasSynced() {
		return nil
	}
	var qe *Error
	if err := c.Check(ctx, s, nil); errors.As(err, &qe) && !qe.Contended {
		return qe
	}
	return nil
}

// settled is how old a sandbox must be to count as a long-lived one rather
// than a racing create that may yet withdraw.
const settled = 3 * time.Second

// cacheWait bounds how long a count waits for the Service cache to hold the
// create's own Service (normally a few milliseconds: one watch event)
// before it lists instead; a cold replica's first list counts against it.
const cacheWait = 2 * time.Second

// endedPhases selects the Pods that will never run again.
const endedPhases = "status.phase!=Pending,status.phase!=Running,status.phase!=Unknown"

// Limited reports whether any quota is set, so that creates count.
func Limited(cfg config.QuotaConfig) bool {
	return cfg.MaxSandboxes > 0 || cfg.MaxSandboxesPerUser > 0 || cfg.MaxSandboxesPerPrincipal > 0
}

// Check counts sandboxes once this call's Service (own) exists, before its
// workload may.
//
// What is counted: sandbox Services. A create writes its sandbox's Service
// first, as the sandbox's slot (owned by nothing yet), counts here with it,
// and only once admitted writes the workload (a bare Pod or a ReplicaSet,
// or the claim of a pooled Pod) and binds the slot to it; refused, it
// removes the slot and never writes a workload. A destroy, the reap and a
// failed create's undo delete the workload before its Service. So every
// sandbox workload, from its create until its deletion starts, has a
// Service that was admitted here and is not being deleted: the Services
// counted bound the workloads. A create whose workload write was cut gives
// up its slot only once the write must have landed and is not there
// (remove.Remover.UndoCut), since a write the API server had already sent
// to etcd can land after a read made at once. (Half-made workloads,
// without their Service, come only from before slots, from a Service
// deleted by hand, or from a cut write landing later than
// remove.WriteLands; a create of such an id counts before it repairs, and
// the next create, destroy or reap of it removes it.) A Service whose Pod has ended (Succeeded or Failed, as
// activeDeadlineSeconds leaves it) or that is being deleted does not count.
// Unclaimed pooled Pods are the pool's, counted by its own limit.
//
// Why there is no overshoot, from any number of replicas: own is this
// call's Service, and the count holds every sandbox Service committed
// before it (see below). Of any set of racing creates, the one whose
// Service was committed last therefore sees all the others, so the
// Services admitted, and with them the workloads, never exceed the limit,
// not even for a moment. Racing creates at the limit can refuse each
// other; Create then retries a few rounds with random backoff. The caller
// deletes its slot on refusal.
//
// Where the count comes from: the Service cache (serviceCache), a watch of the
// sandbox Services in this replica. Watch events come in resourceVersion
// order and the cache applies each before its handler runs, so once the
// cache has seen own's resourceVersion it holds every Service committed
// before own: what a list "not older than own" would return, without the
// list. Its cost does not grow with the number of sandboxes: the quick
// bound is the size of the cache, the exact count a walk over it in memory,
// and only a count over the limit asks the API server for the ended Pods
// (from its watch cache; one that is missed only counts a sandbox too
// many). Far below the limit it need not even wait for own (see
// boundedBy). When the cache cannot show own within cacheWait (not started, a
// cold replica's first list, a broken watch), the count lists the Services
// instead, as fresh as own.
//
// A refusal is an *Error; the API server's errors are classified (api.Classify).
//
// With own nil it is the look for room a retry makes before it creates
// again: the sandbox the retry would create counts as one more, and a
// sandbox of this id that someone else created meanwhile means room (it is
// never refused).
func (c *Counter) Check(ctx context.Context, s api.Spec, own *corev1.Service) error {
	prospective := 0
	if own == nil {
		prospective = 1
	}
	var (
		svcs   []metav1.Object
		cached bool
	)
	if c.cache != nil && c.running.Load() {
		if own != nil && c.cfg.MaxSandboxesPerUser == 0 && c.cfg.MaxSandboxesPerPrincipal == 0 && c.cache.boundedBy(own, c.cfg.MaxSandboxes) {
			// Far enough below the limit that no write since the cache's
			// state could fill it: no wait for own's watch event, which
			// on a busy node comes milliseconds after own's create.
			return nil
		}
		if own == nil {
			cached = c.cache.synced(ctx, cacheWait)
		} else {
			cached = c.cache.seen(ctx, own, cacheWait)
		}
	}
	user, principal := resources.LabelValue(s.UserID), resources.PrincipalLabelValue(s.Caller.Principal)
	switch {
	case cached && c.cfg.MaxSandboxesPerUser == 0 && c.cfg.MaxSandboxesPerPrincipal == 0 && c.cache.size()+prospective <= c.cfg.MaxSandboxes:
		return nil // the cache holds no more Services than the limit: neither can the sandboxes be over it
	case cached && c.cfg.MaxSandboxes == 0 && c.cfg.MaxSandboxesPerPrincipal == 0:
		svcs = c.cache.services(user)
	case cached:
		svcs = c.cache.services("")
	default:
		var after metav1.Object
		if own != nil {
			after = own
		}
		l, err := listFresh(ctx, after, metav1.ListOptions{LabelSelector: resources.SelectorAll}, c.client.CoreV1().Services(c.namespace).List)
		if err != nil {
			return api.Classify(err, "count sandboxes for the quota")
		}
		for i := range l.Items {
			svcs = append(svcs, &l.Items[i])
		}
	}
	if own == nil {
		for _, o := range svcs {
			if o.GetLabels()[keys.LabelID] == s.ID && o.GetDeletionTimestamp() == nil {
				return nil
			}
		}
	}
	t := tally(svcs, own, user, principal, prospective, nil)
	if !t.over(c.cfg) {
		return nil
	}
	// Over the limit: the Services of ended Pods do not count. Ending is for
	// good, so a stale list only misses some (counting too many, never too
	// few): any version the API server's cache holds will do.
	ended, err := c.client.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: resources.SelectorAll, FieldSelector: endedPhases, ResourceVersion: "0"})
	if err != nil {
		return api.Classify(err, "count sandboxes for the quota")
	}
	// gone holds each ended Pod's UID (its Service is owned by it) and,
	// for a Pod owned by its Service (a cold Pod's), that Service's UID.
	gone := map[types.UID]bool{}
	for _, p := range ended.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			gone[p.UID] = true
			if u := resources.OwningService(&p); u != "" {
				gone[u] = true
			}
		}
	}
	if len(gone) > 0 {
		t = tally(svcs, own, user, principal, prospective, gone)
	}
	if c.cfg.MaxSandboxes > 0 && t.total > c.cfg.MaxSandboxes {
		return &Error{Scope: "total", Contended: t.settledTotal < c.cfg.MaxSandboxes, Err: &api.Error{Kind: api.KindQuota, Detail: fmt.Sprintf(
			"the provisioner's limit of %d sandboxes in total is reached; destroy a sandbox or raise MAX_SANDBOXES", c.cfg.MaxSandboxes)}}
	}
	if c.cfg.MaxSandboxesPerUser > 0 && t.mine > c.cfg.MaxSandboxesPerUser {
		return &Error{Scope: "user", Contended: t.settledMine < c.cfg.MaxSandboxesPerUser, Err: &api.Error{Kind: api.KindQuota, Detail: fmt.Sprintf(
			"user %s has reached the limit of %d sandboxes per user; destroy one or raise MAX_SANDBOXES_PER_USER", s.UserID, c.cfg.MaxSandboxesPerUser)}}
	}
	if c.cfg.MaxSandboxesPerPrincipal > 0 && t.ours > c.cfg.MaxSandboxesPerPrincipal {
		return &Error{Scope: "principal", Contended: t.settledOurs < c.cfg.MaxSandboxesPerPrincipal, Err: &api.Error{Kind: api.KindQuota, Detail: fmt.Sprintf(
			"%s has reached the limit of %d sandboxes per principal; destroy one or raise MAX_SANDBOXES_PER_PRINCIPAL", s.Caller.Principal, c.cfg.MaxSandboxesPerPrincipal)}}
	}
	return nil
}

// counted is one count of sandboxes: in total, of one user and of one
// principal, and of those the ones older than settled (not this call's own).
type counted struct{ total, mine, ours, settledTotal, settledMine, settledOurs int }

func (c counted) over(cfg config.QuotaConfig) bool {
	return cfg.MaxSandboxes > 0 && c.total > cfg.MaxSandboxes || cfg.MaxSandboxesPerUser > 0 && c.mine > cfg.MaxSandboxesPerUser ||
		cfg.MaxSandboxesPerPrincipal > 0 && c.ours > cfg.MaxSandboxesPerPrincipal
}

// tally counts the sandbox Services svcs (a user's only, or everyone's):
// not being deleted, not of a Pod in gone nor in gone itself (the owner
// of an ended Pod).
func tally(svcs []metav1.Object, own *corev1.Service, user, principal string, prospective int, gone map[types.UID]bool) counted {
	c := counted{total: prospective, mine: prospective, ours: prospective}
	cutoff := time.Now().Add(-settled)
	for _, o := range svcs {
		svc, ok := o.(*corev1.Service)
		if !ok || resources.ServiceID(svc) == "" || svc.DeletionTimestamp != nil || gone[resources.OwnerUID(svc.OwnerReferences)] || gone[svc.UID] {
			continue
		}
		old := (own == nil || svc.UID != own.UID) && svc.CreationTimestamp.Time.Before(cutoff)
		c.total++
		if old {
			c.settledTotal++
		}
		if svc.Labels[keys.LabelUser] == user {
			c.mine++
			if old {
				c.settledMine++
			}
		}
		if svc.Labels[keys.LabelPrincipal] == principal {
			c.ours++
			if old {
				c.settledOurs++
			}
		}
	}
	return c
}

// listFresh lists as of no earlier than own's creation. That is all the
// zero-overshoot argument needs (of two racing creates, the one committed
// later sees the other), and unlike a consistent read it needs no round trip
// to etcd for its current revision nor waits for writes made after ours: the
// watch cache answers as soon as it holds our object. Should the cache lag
// too far behind, the consistent read that etcd can serve is the fallback.
// Without own, it is that consistent read.
func listFresh[T any](ctx context.Context, own metav1.Object, opts metav1.ListOptions, list func(context.Context, metav1.ListOptions) (T, error)) (T, error) {
	if own != nil && own.GetResourceVersion() != "" {
		fresh := opts
		fresh.ResourceVersion, fresh.ResourceVersionMatch = own.GetResourceVersion(), metav1.ResourceVersionMatchNotOlderThan
		l, err := list(ctx, fresh)
		if !apierrors.HasStatusCause(err, metav1.CauseTypeResourceVersionTooLarge) {
			return l, err
		}
	}
	return list(ctx, opts)
}
