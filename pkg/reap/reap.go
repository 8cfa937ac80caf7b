// Package reap is the sweep run on demand (docs/architecture.md's glossary:
// reap): it judges every sandbox object of the namespace and removes the
// expired, ended, half-made and orphaned ones, and pauses idle ReplicaSet
// sandboxes. Each delete carries the UID and resourceVersion it judged, so
// a sandbox touched since, or reaped by a concurrent reaper, is left alone
// and counted once. The Manager (package sandbox) gives it what it shares
// with a create: the lists, the pause and the age of a leftover.
package reap

import (
	"context"
	"errors"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/ownership"
	"github.com/deerflow-sandbox/provisioner/pkg/remove"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/slot"
)

// Recorder is the subset of client-go's record.EventRecorder the reap uses.
type Recorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...interface{})
}

// Observer counts what the reap did, by reason ("paused" for a pause).
type Observer interface {
	Reaped(reason string)
}

// Lists is one list of each kind of sandbox object, the Services listed
// before the workloads: every Service bound then has its workload in the
// later lists, so none is taken for an orphan because its workload was
// created between the lists.
type Lists struct {
	Pods        []corev1.Pod
	ReplicaSets []appsv1.ReplicaSet
	Services    []corev1.Service
}

// Reaper reaps one namespace.
type Reaper struct {
	Client    kubernetes.Interface
	Namespace string
	Remover   *remove.Remover
	Slots     slot.Slots
	Owners    *ownership.Registry
	Recorder  Recorder
	Observer  Observer
	// UndoWindow is how long after its create a workload may still be
	// removed by its create's undo (REQUEST_TIMEOUT + SANDBOX_MAX_READY_WAIT).
	UndoWindow time.Duration
	// List lists every sandbox object, the Services first (Lists).
	List func(ctx context.Context) (Lists, error)
	// Leftover reports whether a Pod that no Service names is older than
	// any create that wrote it could have undone it in.
	Leftover func(pod *corev1.Pod) bool
	// Pause scales an idle ReplicaSet sandbox to zero, if unchanged since
	// it was judged.
	Pause func(ctx context.Context, rs *appsv1.ReplicaSet) error
}

// Reap is the sweep without the audit line: what it did (all), and the
// part of it that c may see (seen). Expiry is the operator's policy, not the
// caller's: it judges every sandbox, whoever created it (the operation
// itself is gated per principal, PROVISIONER_PRINCIPAL_OPERATIONS).
func (r *Reaper) Reap(ctx context.Context, c api.Caller) (all, seen api.Reaped, err error) {
	// The ownership Leases are listed before the sandboxes, so that every
	// Lease judged was claimed before the sandboxes were listed: its
	// create's slot is in that list (ownership.Snapshot).
	leases, lerr := r.Owners.Snapshot(ctx)
	objs, err := r.List(ctx)
	if err != nil {
		return api.Reaped{}, api.Reaped{}, err
	}
	pods, svcs := objs.Pods, objs.Services
	now := time.Now()
	type victim struct {
		id, reason string
		obj        remove.Object // the workload, or an orphaned Service
		del        func() error
		pause      bool
	}
	var victims []victim
	live := map[string]bool{}
	// expire deletes an expired workload as judged, then its Service.
	expire := func(id, reason string, obj remove.Object, svc *corev1.Service) {
		victims = append(victims, victim{id: id, reason: reason, obj: obj, del: func() error {
			return r.deleteOwnedService(ctx, r.Remover.Workload(ctx, obj, nil, true)(), svc, obj)
		}})
	}
	svcByID := map[string]*corev1.Service{}
	for i := range svcs {
		if id := resources.ServiceID(&svcs[i]); id != "" {
			svcByID[id] = &svcs[i]
		}
	}
	for i := range objs.ReplicaSets {
		rs := &objs.ReplicaSets[i]
		id := resources.ReplicaSetID(rs)
		if id == "" {
			continue
		}
		live[id] = true
		if rs.Labels[keys.LabelManagedBy] != keys.ManagedByValue || rs.DeletionTimestamp != nil {
			continue
		}
		reason, pause := resources.ReplicaSetExpiry(rs, now)
		if reason == "" {
			continue
		}
		if pause {
			victims = append(victims, victim{id: id, reason: reason, obj: rs, pause: true, del: func() error {
				return r.Pause(ctx, rs)
			}})
			continue
		}
		expire(id, reason, rs, svcByID[id])
	}
	for i := range pods {
		p := &pods[i]
		id := p.Labels[keys.LabelID]
		live[id] = true
		if p.Labels[keys.LabelManagedBy] != keys.ManagedByValue || p.DeletionTimestamp != nil || resources.PodID(p) == "" {
			continue
		}
		reason := resources.ExpiryReason(p, now)
		if svc := svcByID[id]; reason == "" && p.Labels[keys.LabelWorkload] != keys.WorkloadReplicaSetValue &&
			(svc == nil || !resources.Names(svc, p)) && r.Leftover(p) {
			// Named by no Service: left by a failed create that could not
			// undo (undoMade), or a stray beside a claimed Pod of its id.
			reason = "half-made"
		}
		if reason == "" {
			continue
		}
		expire(id, reason, p, svcByID[id])
	}
	for i := range svcs {
		s := &svcs[i]
		id := s.Labels[keys.LabelID]
		if live[id] || s.Labels[keys.LabelManagedBy] != keys.ManagedByValue || s.DeletionTimestamp != nil || resources.ServiceID(s) == "" {
			continue
		}
		if resources.ClaimedOwner(s, id) && now.Sub(s.CreationTimestamp.Time) < r.UndoWindow {
			continue // a pooled create's Service, its claim's patch maybe still to come (pooled.Create)
		}
		if resources.SandboxOwner(s.OwnerReferences) == nil && resources.SelectedToken(s) != "" && !r.Slots.Leftover(s) {
			continue // a cold create's slot, its workload maybe still to come (fill)
		}
		uid := s.UID
		victims = append(victims, victim{id: id, reason: "orphaned-service", obj: s, del: func() error {
			return r.Client.CoreV1().Services(r.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{
				Preconditions: &metav1.Preconditions{UID: &uid},
			})
		}})
	}

	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 16)
	)
	all, seen = api.Reaped{Removed: []api.ReapedSandbox{}}, api.Reaped{Removed: []api.ReapedSandbox{}}
	// record adds one outcome to all, and to seen when c may see it.
	record := func(v victim) {
		done := api.ReapedSandbox{ID: v.id, Reason: v.reason}
		for _, out := range []*api.Reaped{&all, &seen} {
			if out == &seen && !c.Sees(v.obj) {
				continue
			}
			if v.pause {
				out.Paused = append(out.Paused, done)
			} else {
				out.Removed = append(out.Removed, done)
			}
		}
	}
	for _, v := range victims {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := v.del()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && v.pause:
				record(v)
				r.Observer.Reaped("paused")
				r.Recorder.Eventf(v.obj, corev1.EventTypeNormal, "SandboxPaused", "Paused idle sandbox %s", v.id)
			case err == nil:
				record(v)
				r.Observer.Reaped(v.reason)
				r.Recorder.Eventf(v.obj, corev1.EventTypeNormal, "SandboxReaped", "Reaped sandbox %s: %s", v.id, v.reason)
			case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || api.KindOf(err) == api.KindConflict:
				// Reaped by another replica, or touched since we looked: not ours to remove.
			default:
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	errs = append(errs, lerr, r.reclaimIDs(ctx, leases, objs))
	all.Count, seen.Count = len(all.Removed), len(seen.Removed)
	if err := errors.Join(errs...); err != nil {
		return all, seen, api.Classify(err, "reap expired sandboxes")
	}
	return all, seen, nil
}

// deleteOwnedService follows a successful delete of the workload w with its
// Service, whichever owns the other. The GC would remove a Service owned by
// w only eventually, and one that owns w never: a later reap must not find
// it and report this sandbox again.
func (r *Reaper) deleteOwnedService(ctx context.Context, err error, svc *corev1.Service, w remove.Object) error {
	if err != nil || svc == nil || resources.OwnerUID(svc.OwnerReferences) != w.GetUID() && !resources.OwnedBy(w, svc) {
		return err
	}
	err = r.Client.CoreV1().Services(r.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{
		Preconditions: metav1.NewUIDPreconditions(string(svc.UID)),
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// reclaimIDs frees the user and thread ids that no sandbox has used for
// ownership.Retention (ownership.Registry.Reclaim): used means carried by
// any sandbox object listed, a slot or a paused sandbox's Service included.
func (r *Reaper) reclaimIDs(ctx context.Context, leases *ownership.Snapshot, objs Lists) error {
	if leases == nil {
		return nil
	}
	used := map[ownership.Field]sets.Set[string]{ownership.User: sets.New[string](), ownership.Thread: sets.New[string]()}
	note := func(o metav1.Object) {
		l := o.GetLabels()
		used[ownership.User].Insert(l[keys.LabelUser])
		used[ownership.Thread].Insert(l[keys.LabelThread])
	}
	for i := range objs.Pods {
		note(&objs.Pods[i])
	}
	for i := range objs.ReplicaSets {
		note(&objs.ReplicaSets[i])
	}
	for i := range objs.Services {
		note(&objs.Services[i])
	}
	_, err := r.Owners.Reclaim(ctx, leases, func(f ownership.Field, v string) bool { return used[f].Has(v) })
	return err
}
