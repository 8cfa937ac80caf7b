package ownership

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// Snapshot is the reap's list of the Leases, taken before it lists the
// sandboxes: a Lease in it was claimed before the list of sandboxes, so
// the create that claimed it had its slot by then, and that list shows the
// id as used unless its sandbox has gone since.
type Snapshot struct{ leases []coordinationv1.Lease }

// Snapshot lists the Leases Reclaim judges; nil while ownership is off
// (nothing is recorded then, so the reap lists nothing more).
func (r *Registry) Snapshot(ctx context.Context) (*Snapshot, error) {
	if !r.enforce {
		return nil, nil
	}
	l, err := r.client.CoordinationV1().Leases(r.namespace).List(ctx, metav1.ListOptions{
		LabelSelector: labels.Set{keys.LabelManagedBy: keys.ManagedByValue}.String()})
	if err != nil {
		return nil, api.Classify(fmt.Errorf("list the ownership Leases: %w", err), "list the owners of user and thread ids")
	}
	return &Snapshot{leases: l.Items}, nil
}

// Used reports whether a sandbox listed after the Snapshot carries
// labelValue (resources.LabelValue of an id) as its f label.
type Used func(f Field, labelValue string) bool

// Reclaim frees the ids of snap that no sandbox has used for Retention,
// and returns how many. No Lease records when its id was last used (the
// function cannot update one), so a second Lease does: the first reap that
// finds an id unused creates its marker (UnusedPrefix, same suffix), whose
// creation time is the start of the wait; a reap that finds the id used
// again removes the marker; one that finds the marker Retention old
// deletes the Lease, as listed (its UID and resourceVersion: one an
// operator edited since stays), then the marker. A sandbox that comes and
// goes between two reaps is not seen: reaps run every few minutes, against
// a wait of days.
//
// Only the Leases the function recorded (they carry the principal label)
// are judged: an operator's own records (tenancy.md's recipe) are kept.
func (r *Registry) Reclaim(ctx context.Context, snap *Snapshot, used Used) (int, error) {
	if snap == nil {
		return 0, nil
	}
	markers := map[string]*coordinationv1.Lease{}
	var owners []*coordinationv1.Lease
	for i := range snap.leases {
		l := &snap.leases[i]
		switch {
		case strings.HasPrefix(l.Name, UnusedPrefix):
			markers[strings.TrimPrefix(l.Name, UnusedPrefix)] = l
		case strings.HasPrefix(l.Name, LeasePrefix) && l.Labels[keys.LabelPrincipal] != "":
			owners = append(owners, l)
		}
	}
	leases := r.client.CoordinationV1().Leases(r.namespace)
	var errs []error
	freed := 0
	for _, l := range owners {
		o, ok := idOf(l)
		if !ok {
			continue // no id recorded: not one the function made
		}
		suffix := strings.TrimPrefix(l.Name, LeasePrefix)
		marker := markers[suffix]
		delete(markers, suffix)
		switch {
		case used(o.field, resources.LabelValue(o.id)):
			if marker != nil {
				errs = append(errs, r.drop(ctx, marker))
			}
		case marker == nil:
			_, err := leases.Create(ctx, r.marker(suffix), metav1.CreateOptions{})
			if err != nil && !apierrors.IsAlreadyExists(err) {
				errs = append(errs, fmt.Errorf("mark Lease %s unused: %w", l.Name, err))
			}
		case marker.CreationTimestamp.IsZero() || time.Since(marker.CreationTimestamp.Time) < Retention:
			// Unused, not yet for long enough.
		default:
			err := leases.Delete(ctx, l.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &l.UID, ResourceVersion: &l.ResourceVersion}})
			switch {
			case err == nil:
				freed++
				r.owners.Remove(string(o.field) + "/" + o.id)
				errs = append(errs, r.drop(ctx, marker))
			case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
				// Freed by another reaper, or edited since: not ours to judge now.
			default:
				errs = append(errs, fmt.Errorf("free Lease %s: %w", l.Name, err))
			}
		}
	}
	for _, marker := range markers {
		// Its Lease is gone (freed, or deleted by hand): the wait it
		// recorded is over.
		errs = append(errs, r.drop(ctx, marker))
	}
	if err := errors.Join(errs...); err != nil {
		return freed, api.Classify(err, "free unused user and thread ids")
	}
	return freed, nil
}

// idOf is the id an ownership Lease records, from its label and annotation.
func idOf(l *coordinationv1.Lease) (owned, bool) {
	for f, k := range keysOf {
		if l.Labels[keys.LabelOwns] == k.owns {
			id, ok := l.Annotations[k.annotation]
			return owned{f, id}, ok && id != ""
		}
	}
	return owned{}, false
}

// marker builds the Lease that records since when the id of the ownership
// Lease LeasePrefix+suffix has been unused. It carries no id and no
// principal: the bound does not count it.
func (r *Registry) marker(suffix string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Name: UnusedPrefix + suffix, Namespace: r.namespace,
		Labels: map[string]string{keys.LabelManagedBy: keys.ManagedByValue},
	}}
}

// drop deletes a marker as listed; one already gone is no error.
func (r *Registry) drop(ctx context.Context, marker *coordinationv1.Lease) error {
	err := r.client.CoordinationV1().Leases(r.namespace).Delete(ctx, marker.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(marker.UID))})
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("remove marker %s: %w", marker.Name, err)
}
