// Package ownership binds each user_id and thread_id to the principal that
// first used it, so that no principal's sandbox is ever made over another
// principal's data (issue 29, item 4).
//
// Where ownership lives: one coordination.k8s.io Lease per id, in the
// function's namespace, named by a hash of the id (LeaseName), whose
// holderIdentity is the owning principal. Why a Lease:
//   - the function may create, get, list and delete Leases but not update
//     them (config/201-role.yaml): it cannot move an id from one principal
//     to another in place;
//   - not a ConfigMap: the admission policy's parameters live in one, and
//     the Role grants no ConfigMap rights at all;
//   - not memory: replicas scale to zero and come and go, and all must agree.
//
// A create asks twice (issue 45, finding 3). Check, before it writes
// anything, refuses ids another principal owns and new ids past the
// principal's bound (MAX_OWNED_IDS_PER_PRINCIPAL), writing nothing. Claim,
// once the create's slot is written and the quota has admitted it, and
// before its workload, records the ids it lacks: so a create refused by
// auth, bad input, the quota or the bound writes no Lease, and making one
// costs a create that the quota let through.
//
// First use is atomic: a create of the Lease either makes it (the claim
// wins) or fails with AlreadyExists, after which the winner's Lease is read
// and compared. Two principals racing for one id from any replicas: exactly
// one Create succeeds.
//
// A Lease lives while its id is used: the reap frees one that no sandbox
// has used for Retention (Reclaim). Since an id can then change owner,
// Claim never trusts memory: it reads each Lease after the create's slot
// exists, and a claim of an id without a Lease first lists the live
// sandboxes of the id (liveOwner), which include that slot. Take a create
// that read its principal's Lease just before the reap freed it, and
// another principal's claim just after: that claim either lists the first
// create's slot (and records the first principal), or comes before the
// slot, and then the first create, reading after its slot, finds the new
// Lease and is refused. One owner, whatever the order.
package ownership

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/lru"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// Field is a kind of id that a principal owns, named as the request names it.
type Field string

const (
	// User is a request's user_id.
	User Field = "user_id"
	// Thread is a request's thread_id (the sandbox_id when it sends none).
	Thread Field = "thread_id"
)

// LeasePrefix starts the name of every ownership Lease.
const LeasePrefix = "sandbox-owner-"

// UnusedPrefix starts the name of the Lease that records since when the
// reap has found no sandbox using the id of the ownership Lease with the
// same suffix (Reclaim).
const UnusedPrefix = "sandbox-unused-"

// Retention is how long the reap keeps an id's Lease once no sandbox uses
// the id. An id's data outlives its sandboxes (a user's and a thread's
// directories stay on disk), and a freed id is the next principal's to
// claim, data and all. So the time is far longer than any pause that is
// part of normal use (an idle sandbox is reaped within hours, a user away
// for a holiday has none for weeks), not the few minutes that would do
// against squatting alone: squatting is held by the bound per principal
// (MAX_OWNED_IDS_PER_PRINCIPAL) and by the quota every claim must pass.
const Retention = 30 * 24 * time.Hour

// cacheSize bounds the owners a replica remembers for Check: a miss costs
// one GET, so the bound only has to cover the ids in active use.
const cacheSize = 4096

// LeaseName is the name of the Lease that records who owns id: the prefix,
// "u-" or "t-", and 40 hex characters of the id's SHA-256. A hash, because
// an id may hold '_' and capitals, which no object name can; 160 bits, so
// no two ids share a Lease in practice.
func LeaseName(f Field, id string) string {
	sum := sha256.Sum256([]byte(id))
	return LeasePrefix + keysOf[f].short + "-" + hex.EncodeToString(sum[:])[:40]
}

// fieldKeys are what a Field names: the Lease name's letter, the Lease's
// keys.LabelOwns value, and the annotation and label a sandbox carries it
// in.
type fieldKeys struct{ short, owns, annotation, label string }

var keysOf = map[Field]fieldKeys{
	User:   {"u", keys.OwnsUser, keys.AnnotationUserID, keys.LabelUser},
	Thread: {"t", keys.OwnsThread, keys.AnnotationThreadID, keys.LabelThread},
}

// Registry checks and records who owns each user_id and thread_id.
type Registry struct {
	namespace string
	client    kubernetes.Interface
	// enforce is off while a single principal may create (DeerFlow's one
	// key): every id is then that principal's by construction, and nothing
	// is recorded, so every answer, write and mount is DeerFlow's.
	enforce bool
	// maxIDs bounds the Leases one principal holds (0: no bound).
	maxIDs int
	// owners caches, for Check alone, the owners read from Leases, Field+"/"+id → principal.
	owners *lru.Cache
}

// New returns the Registry of namespace. It enforces ownership when more
// than one principal may create sandboxes (config.AuthConfig.MultiplePrincipals),
// each principal owning at most maxIDs ids (0: any number).
func New(namespace string, auth *config.AuthConfig, maxIDs int, client kubernetes.Interface) *Registry {
	return &Registry{namespace: namespace, client: client, enforce: auth.MultiplePrincipals(), maxIDs: maxIDs, owners: lru.New(cacheSize)}
}

// owned is one id a create must own.
type owned struct {
	field Field
	id    string
}

// ids lists what a create by c for user and thread must own, in the order
// they are judged (the user first: a refused user claims no thread), or
// refuses the user that is principal default's. None when ownership is
// off, or for an administrator, which may use any id and claims none: it
// acts on every principal's behalf.
func (r *Registry) ids(c api.Caller, user, thread string) ([]owned, error) {
	if !r.enforce || c.Admin {
		return nil, nil
	}
	if user == api.DefaultUserID && c.Principal != config.DefaultPrincipal {
		// DeerFlow sends no user_id in single-user mode, and the id becomes
		// "default": that data is PROVISIONER_API_KEY's, whose sandboxes have
		// always used it. No Lease: no other principal may ever claim it.
		return nil, api.Forbiddenf("user_id %q, what a create without user_id gets, belongs to the principal %q (PROVISIONER_API_KEY); send a user_id of your own",
			api.DefaultUserID, config.DefaultPrincipal)
	}
	var out []owned
	if user != api.DefaultUserID {
		out = append(out, owned{User, user})
	}
	return append(out, owned{Thread, thread}), nil
}

// refused is the answer to a create naming another principal's id. The
// owner is not named: that would tell one tenant another's.
func refused(o owned) error {
	return api.Forbiddenf("%s %q belongs to another principal; a principal may use only its own user and thread ids, so choose another %s",
		o.field, api.Truncate(o.id), o.field)
}

// Check judges, before a create writes anything, whether c may use user
// and thread: a KindForbidden error names an id another principal owns, a
// KindQuota one says that c would claim a new id past its bound. It writes
// nothing: Claim records the new ids once the create has passed its quota.
// Check may answer from memory; Claim, which decides, never does.
func (r *Registry) Check(ctx context.Context, c api.Caller, user, thread string) error {
	ids, err := r.ids(c, user, thread)
	if err != nil {
		return err
	}
	fresh := 0
	for _, o := range ids {
		owner, err := r.known(ctx, o, c.Principal)
		switch {
		case err != nil:
			return err
		case owner == "":
			fresh++
		case owner != c.Principal:
			return refused(o)
		}
	}
	if fresh == 0 || r.maxIDs == 0 {
		return nil
	}
	return r.withinBound(ctx, c.Principal, fresh)
}

// known is o's owner as its Lease says ("" when it has none). Only an
// answer naming caller is taken from memory: a remembered other owner is
// read again, since the reap may have freed the id since.
func (r *Registry) known(ctx context.Context, o owned, caller string) (string, error) {
	key := string(o.field) + "/" + o.id
	if v, ok := r.owners.Get(key); ok && v.(string) == caller {
		return caller, nil
	}
	name := LeaseName(o.field, o.id)
	lease, err := r.client.CoordinationV1().Leases(r.namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	}
	if err != nil {
		return "", api.Classify(fmt.Errorf("the owner of %s %q (Lease %s): %w", o.field, api.Truncate(o.id), name, err), "read the owner of a "+string(o.field))
	}
	owner, err := holder(lease, o)
	if err == nil {
		r.owners.Add(key, owner)
	}
	return owner, err
}

// withinBound refuses (KindQuota) a create by principal that would claim
// fresh new ids past r.maxIDs. It counts the principal's Leases from the
// API server's watch cache (resourceVersion "0"): a count a moment old only
// lets creates racing at the bound each claim, so the bound may be passed
// by as many ids as the quota admits creates at once, and never by more.
func (r *Registry) withinBound(ctx context.Context, principal string, fresh int) error {
	l, err := r.client.CoordinationV1().Leases(r.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: ownedBy(principal), ResourceVersion: "0"})
	if err != nil {
		return api.Classify(fmt.Errorf("count the user and thread ids that %s owns: %w", principal, err), "count the ids of a principal")
	}
	if len(l.Items)+fresh <= r.maxIDs {
		return nil
	}
	return &api.Error{Kind: api.KindQuota, Detail: fmt.Sprintf(
		"%s owns %d user and thread ids, the limit of MAX_OWNED_IDS_PER_PRINCIPAL; reuse an id of yours, or wait until ids no sandbox has used for %d days are freed (or raise the limit)",
		principal, len(l.Items), int(Retention.Hours()/24))}
}

// ownedBy selects the ownership Leases that the function recorded for
// principal.
func ownedBy(principal string) string {
	return labels.Set{keys.LabelManagedBy: keys.ManagedByValue, keys.LabelPrincipal: resources.PrincipalLabelValue(principal)}.String()
}

// Claim lets c create a sandbox for user and thread, recording each id no
// one owns yet as c's (first use), or refuses with a KindForbidden error
// naming the field. It runs once the create's slot (its Service) exists
// and the quota has counted it, and before the workload is written: a
// refusal leaves no workload, and the create removes its slot. Every
// Lease is read from the API server, never from memory (see the package
// comment). A claim is not undone: the reap frees an id no sandbox uses.
func (r *Registry) Claim(ctx context.Context, c api.Caller, user, thread string) error {
	ids, err := r.ids(c, user, thread)
	if err != nil {
		return err
	}
	for _, o := range ids {
		owner, err := r.owner(ctx, o, c.Principal)
		if err != nil {
			return err
		}
		if owner != c.Principal {
			return refused(o)
		}
	}
	return nil
}

// owner returns the principal that owns o, claiming it for claimant when
// no one does.
func (r *Registry) owner(ctx context.Context, o owned, claimant string) (string, error) {
	leases := r.client.CoordinationV1().Leases(r.namespace)
	name := LeaseName(o.field, o.id)
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// First use, or the first since the reap freed the id. A live
		// sandbox (or a create's slot) already holds it: the principal of
		// the oldest, not the claimant, owns it.
		holder := claimant
		var live string
		if live, err = r.liveOwner(ctx, o.field, o.id); err != nil {
			return "", err
		}
		if live != "" {
			holder = live
		}
		lease, err = leases.Create(ctx, r.lease(o.field, o.id, holder), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// Another create won the race: its claim stands.
			lease, err = leases.Get(ctx, name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return "", api.Classify(fmt.Errorf("the owner of %s %q (Lease %s): %w", o.field, api.Truncate(o.id), name, err), "read or record the owner of a "+string(o.field))
	}
	owner, err := holder(lease, o)
	if err != nil {
		return "", err
	}
	r.owners.Add(string(o.field)+"/"+o.id, owner)
	return owner, nil
}

// holder is the principal lease records as o's owner.
func holder(lease *coordinationv1.Lease, o owned) (string, error) {
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return "", api.Errorf(api.KindInternal, nil, "Lease %s records no holderIdentity, so the owner of %s %q is unknown; set it to the owning principal", lease.Name, o.field, api.Truncate(o.id))
	}
	return *lease.Spec.HolderIdentity, nil
}

// lease builds the Lease that records holder as the owner of id. It never
// expires by itself (no leaseDurationSeconds, no renewals): the reap frees
// it (Reclaim). Its principal label is what the bound counts and what
// marks it as the function's to free; a Lease an operator writes without
// one is kept.
func (r *Registry) lease(f Field, id, holder string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      LeaseName(f, id),
			Namespace: r.namespace,
			Labels: map[string]string{
				keys.LabelManagedBy: keys.ManagedByValue,
				keys.LabelOwns:      keysOf[f].owns,
				keys.LabelPrincipal: resources.PrincipalLabelValue(holder),
			},
			Annotations: map[string]string{keysOf[f].annotation: id},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder},
	}
}

// liveOwner is the principal of the oldest live sandbox that uses id, or ""
// when none does: at the upgrade to ownership, ids already in use belong to
// the principal whose sandbox used them first (a sandbox that records no
// principal is api.LegacyPrincipal's). Every sandbox's Service carries its
// user and thread labels and its principal, so one list by label finds
// them; a sandbox of DeerFlow's own provisioner carries no such label and
// is the operator's to adopt (docs/tenancy.md).
func (r *Registry) liveOwner(ctx context.Context, f Field, id string) (string, error) {
	l, err := r.client.CoreV1().Services(r.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: resources.SelectorAllWith(labels.Set{keysOf[f].label: resources.LabelValue(id)}),
	})
	if err != nil {
		return "", fmt.Errorf("list the sandboxes that use %s %q: %w", f, api.Truncate(id), err)
	}
	items := l.Items
	if len(items) == 0 {
		return "", nil
	}
	oldest := slices.MinFunc(items, func(a, b corev1.Service) int {
		if c := a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	if p, ok := oldest.Annotations[keys.AnnotationPrincipal]; ok && p != "" {
		return p, nil
	}
	return api.LegacyPrincipal, nil
}
