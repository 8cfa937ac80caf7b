// Package ownership binds each user_id and thread_id to the principal that
// first used it, so that no principal's sandbox is ever made over another
// principal's data (issue 29, item 4). A create checks both ids before it
// writes anything of the sandbox.
//
// Where ownership lives: one coordination.k8s.io Lease per id, in the
// function's namespace, named by a hash of the id (LeaseName), whose
// holderIdentity is the owning principal. Why a Lease:
//   - the function may create and get Leases but not list, update or delete
//     them (config/201-role.yaml), so a compromised replica can claim an
//     unclaimed id at worst, and never learns the ids or takes one over;
//   - not a ConfigMap: the admission policy's parameters live in one, and
//     the Role grants no ConfigMap rights at all;
//   - not memory: replicas scale to zero and come and go, and all must agree.
//
// First use is atomic: a create of the Lease either makes it (the claim
// wins) or fails with AlreadyExists, after which the winner's Lease is read
// and compared. Two principals racing for one id from any replicas: exactly
// one Create succeeds.
//
// Ownership never changes through the function (it cannot update a Lease),
// so a confirmed owner is cached, bounded, per replica. An operator who
// reassigns an id edits or deletes its Lease and restarts the replicas.
package ownership

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// cacheSize bounds the confirmed owners a replica remembers: a miss costs
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
	// owners caches confirmed owners, Field+"/"+id → principal.
	owners *lru.Cache
}

// New returns the Registry of namespace. It enforces ownership when more
// than one principal may create sandboxes (config.AuthConfig.MultiplePrincipals).
func New(namespace string, auth *config.AuthConfig, client kubernetes.Interface) *Registry {
	return &Registry{namespace: namespace, client: client, enforce: auth.MultiplePrincipals(), owners: lru.New(cacheSize)}
}

// Check lets c create a sandbox for user and thread, or refuses with a
// KindForbidden error naming the field. An id no one owns yet becomes c's
// (first use). It runs before a create writes anything, so a refusal
// leaves no object behind. An administrator may use any id and claims none:
// it acts on every principal's behalf.
//
// The user is checked first, and a refused user claims no thread.
func (r *Registry) Check(ctx context.Context, c api.Caller, user, thread string) error {
	if !r.enforce || c.Admin {
		return nil
	}
	if user == api.DefaultUserID && c.Principal != config.DefaultPrincipal {
		// DeerFlow sends no user_id in single-user mode, and the id becomes
		// "default": that data is PROVISIONER_API_KEY's, whose sandboxes have
		// always used it. No Lease: no other principal may ever claim it.
		return api.Forbiddenf("user_id %q, what a create without user_id gets, belongs to the principal %q (PROVISIONER_API_KEY); send a user_id of your own",
			api.DefaultUserID, config.DefaultPrincipal)
	}
	for _, f := range []struct {
		field Field
		id    string
	}{{User, user}, {Thread, thread}} {
		if f.field == User && f.id == api.DefaultUserID {
			continue
		}
		owner, err := r.owner(ctx, f.field, f.id, c.Principal)
		if err != nil {
			return err
		}
		if owner != c.Principal {
			// The owner is not named: that would tell one tenant another's.
			return api.Forbiddenf("%s %q belongs to another principal; a principal may use only its own user and thread ids, so choose another %s",
				f.field, api.Truncate(f.id), f.field)
		}
	}
	return nil
}

// owner returns the principal that owns id, claiming it for claimant when
// no one does.
func (r *Registry) owner(ctx context.Context, f Field, id, claimant string) (string, error) {
	key := string(f) + "/" + id
	if v, ok := r.owners.Get(key); ok {
		return v.(string), nil
	}
	leases := r.client.CoordinationV1().Leases(r.namespace)
	name := LeaseName(f, id)
	lease, err := leases.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// First use after this version. A live sandbox made before it
		// already holds the id: its principal, not the claimant, owns it.
		holder := claimant
		var live string
		if live, err = r.liveOwner(ctx, f, id); err != nil {
			return "", err
		}
		if live != "" {
			holder = live
		}
		lease, err = leases.Create(ctx, r.lease(f, id, holder), metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			// Another create won the race: its claim stands.
			lease, err = leases.Get(ctx, name, metav1.GetOptions{})
		}
	}
	if err != nil {
		return "", api.Classify(fmt.Errorf("the owner of %s %q (Lease %s): %w", f, api.Truncate(id), name, err), "read or record the owner of a "+string(f))
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return "", api.Errorf(api.KindInternal, nil, "Lease %s records no holderIdentity, so the owner of %s %q is unknown; set it to the owning principal", name, f, api.Truncate(id))
	}
	owner := *lease.Spec.HolderIdentity
	r.owners.Add(key, owner)
	return owner, nil
}

// lease builds the Lease that records holder as the owner of id. It never
// expires: no leaseDurationSeconds, no renewals.
func (r *Registry) lease(f Field, id, holder string) *coordinationv1.Lease {
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      LeaseName(f, id),
			Namespace: r.namespace,
			Labels: map[string]string{
				keys.LabelManagedBy: keys.ManagedByValue,
				keys.LabelOwns:      keysOf[f].owns,
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
		LabelSelector: resources.SelectorAll + "," + keysOf[f].label + "=" + resources.LabelValue(id),
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
