package sandbox

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/ownership"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// Reap deletes every expired sandbox and every ended Pod (Succeeded/Failed,
// e.g. after activeDeadlineSeconds), with their Services, and keeps the
// warm pools (Pool.Keep). It runs on demand
// (PingSource event, reap event, HTTP) instead of in a loop, because this
// process scales to zero. Each delete carries the UID and resourceVersion it
// judged, so a sandbox touched since, or reaped by a concurrent reaper, is
// left alone and counted once.
//
// The answer names only the sandboxes the caller may see (an
// administrator: all): the reap acts for the operator, but its caller is a
// tenant, and another principal's ids are not its to learn. The audit line
// names them all.
func (m *Manager) Reap(ctx context.Context) (api.Reaped, error) {
	c, err := api.RequireCaller(ctx)
	if err != nil {
		return api.Reaped{}, err
	}
	all, seen, err := m.reap(ctx, c)
	if m.pool != nil {
		// Every few minutes, whoever creates: pools follow their templates.
		m.pool.Keep(ctx, m.templates)
	}
	ids := make([]string, 0, len(all.Removed))
	for _, s := range all.Removed {
		ids = append(ids, s.ID)
	}
	paused := make([]string, 0, len(all.Paused))
	for _, s := range all.Paused {
		paused = append(paused, s.ID)
	}
	m.audit.Record(ctx, "reap", "", api.Outcome(err), err, slog.Any("removed", ids), slog.Any("paused", paused))
	return seen, err
}

// reap is Reap without the audit line: what it did (all), and the part of
// it that c may see (seen). Expiry is the operator's policy, not the
// caller's: it judges every sandbox, whoever created it (the operation
// itself is gated per principal, PROVISIONER_PRINCIPAL_OPERATIONS).
func (m *Manager) reap(ctx context.Context, c api.Caller) (all, seen api.Reaped, err error) {
	// The ownership Leases are listed before the sandboxes, so that every
	// Lease judged was claimed before the sandboxes were listed: its
	// create's slot is in that list (ownership.Snapshot).
	leases, lerr := m.owners.Snapshot(ctx)
	objs, err := m.listAll(ctx, resources.SelectorAll, true)
	if err != nil {
		return api.Reaped{}, api.Reaped{}, err
	}
	pods, svcs := objs.pods, objs.svcs
	now := time.Now()
	type victim struct {
		id, reason string
		obj        workloadObject // the workload, or an orphaned Service
		del        func() error
		pause      bool
	}
	var victims []victim
	live := map[string]bool{}
	// expire deletes an expired workload as judged, then its Service.
	expire := func(id, reason string, obj workloadObject, svc *corev1.Service) {
		victims = append(victims, victim{id: id, reason: reason, obj: obj, del: func() error {
			return m.deleteOwnedService(ctx, m.rm.Workload(ctx, obj, nil, true)(), svc, obj)
		}})
	}
	svcByID := map[string]*corev1.Service{}
	for i := range svcs {
		if id := resources.ServiceID(&svcs[i]); id != "" {
			svcByID[id] = &svcs[i]
		}
	}
	for i := range objs.rss {
		rs := &objs.rss[i]
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
				_, err := m.scale(ctx, rs, 0, true)
				return err
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
			(svc == nil || !resources.Names(svc, p)) && m.leftover(p) {
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
		if resources.ClaimedOwner(s, id) && now.Sub(s.CreationTimestamp.Time) < m.undoWindow() {
			continue // a pooled create's Service, its claim's patch maybe still to come (pooledService)
		}
		if resources.SandboxOwner(s.OwnerReferences) == nil && resources.SelectedToken(s) != "" && !m.slots.Leftover(s) {
			continue // a cold create's slot, its workload maybe still to come (fill)
		}
		uid := s.UID
		victims = append(victims, victim{id: id, reason: "orphaned-service", obj: s, del: func() error {
			return m.client.CoreV1().Services(m.cfg.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{
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
		r := api.ReapedSandbox{ID: v.id, Reason: v.reason}
		for _, out := range []*api.Reaped{&all, &seen} {
			if out == &seen && !c.Sees(v.obj) {
				continue
			}
			if v.pause {
				out.Paused = append(out.Paused, r)
			} else {
				out.Removed = append(out.Removed, r)
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
				m.observer.Reaped("paused")
				m.recorder.Eventf(v.obj, corev1.EventTypeNormal, "SandboxPaused", "Paused idle sandbox %s", v.id)
			case err == nil:
				record(v)
				m.observer.Reaped(v.reason)
				m.recorder.Eventf(v.obj, corev1.EventTypeNormal, "SandboxReaped", "Reaped sandbox %s: %s", v.id, v.reason)
			case apierrors.IsNotFound(err) || apierrors.IsConflict(err) || api.KindOf(err) == api.KindConflict:
				// Reaped by another replica, or touched since we looked: not ours to remove.
			default:
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	errs = append(errs, lerr, m.reclaimIDs(ctx, leases, objs))
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
func (m *Manager) deleteOwnedService(ctx context.Context, err error, svc *corev1.Service, w workloadObject) error {
	if err != nil || svc == nil || resources.OwnerUID(svc.OwnerReferences) != w.GetUID() && !resources.OwnedBy(w, svc) {
		return err
	}
	err = m.client.CoreV1().Services(m.cfg.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{
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
func (m *Manager) reclaimIDs(ctx context.Context, leases *ownership.Snapshot, objs everything) error {
	if leases == nil {
		return nil
	}
	used := map[ownership.Field]sets.Set[string]{ownership.User: sets.New[string](), ownership.Thread: sets.New[string]()}
	note := func(o metav1.Object) {
		l := o.GetLabels()
		used[ownership.User].Insert(l[keys.LabelUser])
		used[ownership.Thread].Insert(l[keys.LabelThread])
	}
	for i := range objs.pods {
		note(&objs.pods[i])
	}
	for i := range objs.rss {
		note(&objs.rss[i])
	}
	for i := range objs.svcs {
		note(&objs.svcs[i])
	}
	_, err := m.owners.Reclaim(ctx, leases, func(f ownership.Field, v string) bool { return used[f].Has(v) })
	return err
}
