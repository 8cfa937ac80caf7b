package sandbox

import (
	"context"
	"errors"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/quota"
	"github.com/deerflow-sandbox/provisioner/pkg/remove"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sleep"
	"github.com/deerflow-sandbox/provisioner/pkg/slot"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
)

// A cold create writes in this order: the slot (the sandbox's Service,
// owned by nothing: resources.Slot), the quota's count with it, and the
// workload. So no workload exists that the quota has not admitted, even for
// a moment, whatever fails (quota.Counter.Check says why). A new bare Pod
// is owned by its slot from its create (resources.ServiceOwnerRef): two
// writes. A ReplicaSet, or a Pod the create finds, is bound instead: the
// slot updated to be owned by it (bind). An existing Service of the id
// names the sandbox that holds it (existing, reuseBound), or is the slot
// of a racing create of it, which this create waits for (fill: a slot has
// one writer).

// workloadKind is what a cold create's steps need of one workload kind.
type workloadKind struct {
	name string // "Pod" or "ReplicaSet"
	// ensure creates the workload of s, or returns the one of its name
	// that exists (existed), as its own kind's create finds it, for the
	// Service svc. A new bare Pod is owned by svc when own (svc is this
	// create's slot).
	ensure func(ctx context.Context, s api.Spec, svc *corev1.Service, own bool) (workloadObject, bool, error)
	get    func(ctx context.Context, name string) (workloadObject, error)
	// reuse hands an existing workload to this create: checked for s's
	// user, thread and capacity, resumed, marked active, given a token if
	// it is from before tokens.
	reuse func(ctx context.Context, w workloadObject, s api.Spec) (workloadObject, error)
	ref   func(w workloadObject) metav1.OwnerReference
	// found is what the create answers with.
	found func(ctx context.Context, w workloadObject, svc *corev1.Service) (found, error)
}

func (m *Manager) podKind() workloadKind {
	pods := m.client.CoreV1().Pods(m.cfg.Namespace)
	return workloadKind{
		name: "Pod",
		ensure: func(ctx context.Context, s api.Spec, svc *corev1.Service, own bool) (workloadObject, bool, error) {
			pod, existed, err := m.ensurePod(ctx, s, svc, own)
			return pod, existed, err
		},
		get: func(ctx context.Context, name string) (workloadObject, error) {
			return pods.Get(ctx, name, metav1.GetOptions{})
		},
		reuse: func(ctx context.Context, w workloadObject, s api.Spec) (workloadObject, error) {
			pod := w.(*corev1.Pod)
			if err := resources.CheckOwner(pod, "Pod", s); err != nil {
				return nil, err
			}
			if err := resources.CheckCapacity(pod, s); err != nil {
				return nil, err
			}
			return token.Pod(ctx, pods, reuse(ctx, m, pod, pods.Patch))
		},
		ref: func(w workloadObject) metav1.OwnerReference { return resources.PodOwnerRef(w.(*corev1.Pod)) },
		found: func(_ context.Context, w workloadObject, svc *corev1.Service) (found, error) {
			return found{pod: w.(*corev1.Pod), svc: svc}, nil
		},
	}
}

func (m *Manager) replicaSetKind() workloadKind {
	rss := m.client.AppsV1().ReplicaSets(m.cfg.Namespace)
	return workloadKind{
		name: "ReplicaSet",
		ensure: func(ctx context.Context, s api.Spec, _ *corev1.Service, _ bool) (workloadObject, bool, error) {
			rs, existed, err := m.ensureReplicaSet(ctx, s)
			return rs, existed, err
		},
		get: func(ctx context.Context, name string) (workloadObject, error) {
			return rss.Get(ctx, name, metav1.GetOptions{})
		},
		reuse: func(ctx context.Context, w workloadObject, s api.Spec) (workloadObject, error) {
			rs, err := m.reuseReplicaSet(ctx, w.(*appsv1.ReplicaSet), s)
			if err != nil {
				return nil, err
			}
			return token.ReplicaSet(ctx, rss, m.client.CoreV1().Pods(m.cfg.Namespace), reuse(ctx, m, rs, rss.Patch), m.currentPodOf)
		},
		ref: func(w workloadObject) metav1.OwnerReference {
			return resources.ReplicaSetOwnerRef(w.(*appsv1.ReplicaSet))
		},
		found: func(ctx context.Context, w workloadObject, svc *corev1.Service) (found, error) {
			rs := w.(*appsv1.ReplicaSet)
			f := found{rs: rs, svc: svc}
			if resources.Paused(rs) {
				return f, nil
			}
			pod, err := m.currentPodOf(ctx, rs)
			f.pod = pod
			return f, err
		},
	}
}

// errStale: what a create found of its id changed under it (a Service of
// a workload gone, or deleted meanwhile); the create starts over.
var errStale = errors.New("the sandbox's Service changed during the create")

// createKindOnce makes one attempt at a sandbox of kind k.
func (m *Manager) createKindOnce(ctx context.Context, s api.Spec, k workloadKind) (made, error) {
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		if attempt > 0 {
			if err := sleep.For(ctx, time.Duration(attempt)*100*time.Millisecond); err != nil {
				return made{}, api.Classify(err, "create the sandbox")
			}
		}
		writeBy := time.Now().Add(slot.WriteWithin)
		svc, mine, err := m.reserve(ctx, s, k.name)
		var bound workloadObject
		if err == nil && !mine && resources.SandboxOwner(svc.OwnerReferences) == nil && resources.SelectedToken(svc) != "" {
			bound, err = m.boundWorkload(ctx, svc)
		}
		if err == nil {
			if bound != nil {
				if resources.SlotKind(svc) != k.name {
					return made{}, errOtherKind
				}
				return m.reuseBound(ctx, s, k, svc, bound)
			}
			if owner := resources.SandboxOwner(svc.OwnerReferences); owner != nil {
				a, err := m.existing(ctx, s, k, svc, *owner)
				if errors.Is(err, errStale) {
					continue
				}
				return a, err
			}
			var a made
			a, err = m.fill(ctx, s, k, svc, mine, writeBy)
			if err == nil {
				return a, nil
			}
		}
		if !errors.Is(err, errStale) {
			return made{}, err
		}
	}
	return made{}, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " is being created and deleted concurrently; retry"}
}

// reserve makes the sandbox's slot (mine), or returns the Service of the
// id that exists (not mine), for the caller to judge.
//
// DeerFlow creates a sandbox again each time it reuses it, so the id's
// Service often exists. A create of it would be refused only after the API
// server's admission and its NodePort allocator had run, so the quota's
// Service cache (in memory, when a limit is set) is asked first: what it
// holds is read from etcd before it is judged, and a Service it misses is
// refused by the create as before.
func (m *Manager) reserve(ctx context.Context, s api.Spec, kindName string) (*corev1.Service, bool, error) {
	want := resources.Slot(m.cfg.Objects(), s, kindName)
	svcs := m.client.CoreV1().Services(m.cfg.Namespace)
	if m.quota.Holds(want.Name) {
		if existing, err := svcs.Get(ctx, want.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return judge(existing, err, s)
		}
	}
	created, err := svcs.Create(ctx, want, metav1.CreateOptions{})
	switch {
	case err == nil:
		return created, true, nil
	case !apierrors.IsAlreadyExists(err):
		if uerr := m.slots.UndoCut(ctx, err, want); uerr != nil {
			m.audit.Leftover(ctx, s.ID, uerr)
		}
		return nil, false, m.createFailed(err, "Service", s)
	}
	existing, err := svcs.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false, errStale
	}
	return judge(existing, err, s)
}

// judge returns the id's existing Service (read from etcd with err) for
// the caller to judge, or errStale when it is going.
func judge(existing *corev1.Service, err error, s api.Spec) (*corev1.Service, bool, error) {
	switch {
	case err != nil:
		return nil, false, api.Classify(err, "read the existing sandbox Service")
	case !resources.IsSandbox(existing, s.ID):
		return nil, false, &api.Error{Kind: api.KindConflict, Detail: "a Service named " + existing.Name + " exists and is not a sandbox's; choose another sandbox_id"}
	case existing.DeletionTimestamp != nil:
		return nil, false, errStale // being deleted: wait for it to go
	}
	return existing, false, nil
}

// existing answers a create whose id has a Service owned by a workload:
// that workload's sandbox, if it lives and is this create's kind. A
// Service whose workload is gone is removed (the GC would, later), and the
// create starts over.
func (m *Manager) existing(ctx context.Context, s api.Spec, k workloadKind, svc *corev1.Service, owner metav1.OwnerReference) (made, error) {
	if owner.Kind != k.name || owner.Name != resources.PodName(s.ID) {
		live, err := m.ownerLives(ctx, owner, svc, s.ID)
		switch {
		case err != nil:
			return made{}, err
		case live:
			return made{}, errOtherKind
		}
		return made{}, m.dropStale(ctx, svc)
	}
	w, err := k.get(ctx, owner.Name)
	switch {
	case apierrors.IsNotFound(err) || err == nil && (w.GetUID() != owner.UID || w.GetDeletionTimestamp() != nil):
		return made{}, m.dropStale(ctx, svc)
	case err != nil:
		return made{}, api.Classify(err, "read the sandbox "+k.name)
	}
	if w, err = k.reuse(ctx, w, s); err != nil {
		return made{}, err
	}
	svc, err = token.Reselect(ctx, m.client.CoreV1().Services(m.cfg.Namespace), svc, resources.Bind(svc, owner, resources.Token(w), s))
	if err != nil {
		return made{}, err
	}
	f, err := k.found(ctx, w, svc)
	return made{found: f, existed: true}, err
}

// boundWorkload is the live bare Pod that owns svc, a Service owned by
// none (resources.OwnedBy), or nil: then svc is a slot still to be filled,
// or left. Only a bare Pod is owned so; a ReplicaSet's slot is not read.
func (m *Manager) boundWorkload(ctx context.Context, svc *corev1.Service) (workloadObject, error) {
	if resources.SlotKind(svc) != "Pod" {
		return nil, nil
	}
	k := m.podKind()
	w, err := k.get(ctx, resources.PodName(svc.Labels[keys.LabelID]))
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, api.Classify(err, "read the sandbox "+k.name)
	case w.GetDeletionTimestamp() != nil || !resources.OwnedBy(w, svc):
		return nil, nil
	}
	return w, nil
}

// reuseBound answers a create with w, a workload owned by its Service svc
// (boundWorkload), checked and marked as any found one (workloadKind.reuse).
func (m *Manager) reuseBound(ctx context.Context, s api.Spec, k workloadKind, svc *corev1.Service, w workloadObject) (made, error) {
	w, err := k.reuse(ctx, w, s)
	if err != nil {
		return made{}, err
	}
	f, err := k.found(ctx, w, svc)
	return made{found: f, existed: true}, err
}

// fill makes or finds the workload of a Service that no workload owns yet
// and binds the two: this create's slot (mine), a leftover slot, or a
// Service of DeerFlow's provisioner (an OwnerlessReference one goes). The quota counts first, with that
// Service as the sandbox's place. A slot the quota refuses goes at once,
// and so does a half-made workload of the id (one without its Service:
// from before slots) that it would have repaired.
//
// A slot has one writer (package slot): a racing create's slot is waited
// for (slot.Slots.Await), then the create starts over. A leftover goes with
// the workload its create may have written (dropLeftoverSlot), unless
// another request has answered with that workload since: then this create
// binds it. This create writes under its own slot only until writeBy
// (slot.WriteWithin), or gives it up and starts over (errStale).
func (m *Manager) fill(ctx context.Context, s api.Spec, k workloadKind, svc *corev1.Service, mine bool, writeBy time.Time) (made, error) {
	if resources.OwnerlessReference(svc) {
		return made{}, m.dropStale(ctx, svc)
	}
	if t := resources.SelectedToken(svc); t != "" && !mine {
		if !m.slots.Leftover(svc) {
			switch {
			case resources.SlotKind(svc) != k.name:
				return made{}, errOtherKind // a create of the other kind holds the id: its sandbox is the answer
			case !resources.SameSandbox(svc, s):
				return made{}, errTaken(s)
			}
			if !m.slots.Await(ctx, svc, s.ID) {
				return made{}, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " is being created by another request; retry"}
			}
			return made{}, errStale // bound (its sandbox is the answer) or given up: start over
		}
		answered, err := m.dropLeftoverSlot(ctx, svc)
		if !answered {
			return made{}, err
		}
		switch {
		case resources.SlotKind(svc) != k.name:
			return made{}, errOtherKind
		case !resources.SameSandbox(svc, s):
			return made{}, errTaken(s)
		}
		s.Token = t
	} else if !mine {
		// Neither this create's slot nor another's: DeerFlow's provisioner's.
		if err := m.judgeLegacy(ctx, s, svc, k.name == "Pod"); err != nil {
			return made{}, err
		}
	}
	wctx := ctx
	if mine {
		var cancel context.CancelFunc
		wctx, cancel = context.WithDeadline(ctx, writeBy)
		defer cancel()
	}
	// late: the window passed, not the request; the create starts over.
	late := func(err error) error {
		if wctx.Err() != nil && ctx.Err() == nil {
			return errStale
		}
		return err
	}
	if quota.Limited(m.cfg.QuotaConfig) {
		if err := m.quota.Check(wctx, s, svc); err != nil {
			if mine {
				m.dropSlot(ctx, svc)
				m.dropHalfMade(ctx, s, k)
				err = late(err)
			}
			return made{}, err
		}
	}
	// The ids are claimed (ownership.Registry.Claim) once the slot exists
	// and the quota has counted it, so a Lease is only ever written by a
	// create the quota admitted; then the request's env Secret, owned by
	// this create's own slot, before the workload that references it. A
	// create that fills another's slot (a leftover answered for since, or
	// DeerFlow's Service) finds its workload there: it writes no Secret.
	var (
		w       workloadObject
		existed bool
		env     *corev1.Secret
	)
	err := m.owners.Claim(wctx, s.Caller, s.UserID, s.ThreadID)
	if err == nil && mine {
		env, err = m.ensureEnvSecret(wctx, s, svc)
	}
	if err == nil {
		w, existed, err = k.ensure(wctx, s, svc, mine)
	}
	if err == nil && existed {
		w, err = k.reuse(ctx, w, s)
	}
	if err != nil {
		// A workload that may exist keeps its slot, and its env Secret:
		// the quota counts it until the next create, destroy or reap of
		// the id removes all of them.
		if mine && !errors.Is(err, remove.ErrMayExist) {
			m.dropSlot(ctx, svc)
			m.dropEnv(ctx, env)
			err = late(err)
		}
		return made{}, err
	}
	if existed && env != nil && !resources.UsesEnvSecret(podSpecOf(w), s.ID) {
		// A half-made workload this create repairs, made without env: its
		// env is not this request's (a Pod's cannot change), so the values
		// are not kept. One that references the Secret (its own went with
		// its Service) gets it back.
		m.dropEnv(ctx, env)
		env = nil
	}
	// A bare Pod made under this create's own slot is owned by it from its
	// create, and the slot selects its token already: nothing to bind.
	bound := svc
	if existed || !mine || !resources.OwnedBy(w, svc) {
		bound, err = m.bind(ctx, svc, w, k.ref(w), s)
	}
	if err != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.RequestTimeout)
		defer cancel()
		var uerr error
		switch {
		case !existed:
			uerr = m.undoCreate(uctx, w, svc, env)
		case mine:
			m.dropSlot(ctx, svc)
			m.dropEnv(ctx, env)
		}
		return made{}, errors.Join(err, uerr)
	}
	f, err := k.found(ctx, w, bound)
	return made{found: f, env: env, existed: existed, repaired: existed && mine}, err
}

// podSpecOf is the Pod spec of a workload: a Pod's own, or a ReplicaSet's
// Pod template's.
func podSpecOf(w workloadObject) *corev1.PodSpec {
	if rs, ok := w.(*appsv1.ReplicaSet); ok {
		return &rs.Spec.Template.Spec
	}
	return &w.(*corev1.Pod).Spec
}

// judgeLegacy decides whether s's create may adopt svc, a Service with no
// owner and no token: one DeerFlow's provisioner made (it sets neither,
// nor a principal), which selects the Pod sandbox-<id> by id alone.
// Adopting binds it, node port and all, to the create's workload, so it is
// default's (DeerFlow's own sandboxes, config.DefaultPrincipal) and only
// with the Pod it was made for: a cold Pod create (coldPod) of default
// whose Pod of the id exists. Another principal's create gets what a taken
// id answers (409), so no guessed id hands it DeerFlow's Service. Default's
// create of another workload (a ReplicaSet, a pooled claim) answers with
// that Pod (errOtherKind); a Service whose Pod is gone names no sandbox
// and goes (errStale: the create starts over with a slot of its own).
func (m *Manager) judgeLegacy(ctx context.Context, s api.Spec, svc *corev1.Service, coldPod bool) error {
	if s.Caller.Records() != config.DefaultPrincipal || api.PrincipalOf(svc) != config.DefaultPrincipal {
		return errTaken(s)
	}
	pod, err := m.client.CoreV1().Pods(m.cfg.Namespace).Get(ctx, resources.PodName(s.ID), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err) || err == nil && pod.DeletionTimestamp != nil:
		return m.dropStale(ctx, svc)
	case err != nil:
		return api.Classify(err, "read the Pod of a sandbox Service made by DeerFlow's provisioner")
	case !coldPod:
		return errOtherKind
	}
	return nil
}

// errTaken is the answer to a create whose id holds another's sandbox.
func errTaken(s api.Spec) error {
	return &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " exists for another user or thread; choose another sandbox_id"}
}

// bind makes svc the Service of w (resources.Bind). A racing create of the
// same sandbox may have bound it first: then it is read again. A slot
// deleted meanwhile (its create was refused) is errStale. A workload owned
// by svc (resources.OwnedBy) needs none: svc only selects its token.
func (m *Manager) bind(ctx context.Context, svc *corev1.Service, w workloadObject, ref metav1.OwnerReference, s api.Spec) (*corev1.Service, error) {
	svcs := m.client.CoreV1().Services(m.cfg.Namespace)
	if resources.OwnedBy(w, svc) {
		return token.Reselect(ctx, svcs, svc, resources.Bind(svc, ref, resources.Token(w), s))
	}
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		if owner := resources.SandboxOwner(svc.OwnerReferences); owner != nil && owner.UID == w.GetUID() {
			return token.Reselect(ctx, svcs, svc, resources.Bind(svc, ref, resources.Token(w), s))
		} else if owner != nil {
			return nil, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " is being created concurrently; retry"}
		}
		updated, err := svcs.Update(ctx, resources.Bind(svc, ref, resources.Token(w), s), metav1.UpdateOptions{})
		if err == nil {
			return updated, nil
		}
		if !apierrors.IsConflict(err) {
			if apierrors.IsNotFound(err) {
				return nil, errStale
			}
			return nil, api.Classify(err, "bind the sandbox Service to its "+ref.Kind)
		}
		if svc, err = svcs.Get(ctx, svc.Name, metav1.GetOptions{}); err != nil {
			if apierrors.IsNotFound(err) {
				return nil, errStale
			}
			return nil, api.Classify(err, "read the sandbox Service")
		}
	}
	return nil, &api.Error{Kind: api.KindConflict, Detail: "the Service of sandbox " + s.ID + " is changing concurrently; retry"}
}

// dropStale removes svc, a Service that holds an id for nothing (its
// workload gone, or a leftover slot), with its UID and resourceVersion as
// read, so a Service changed since stays; then the create starts over.
func (m *Manager) dropStale(ctx context.Context, svc *corev1.Service) error {
	if err := m.rm.Service(ctx, svc, true); err != nil {
		return api.Classify(err, "replace a stale sandbox Service")
	}
	return errStale
}

// dropLeftoverSlot removes svc, a leftover slot (slotLeftover), with the
// workload its create may have written (remove.ErrMayExist): the one of the
// slot's kind and id that carries its token, first, so that the quota
// counts the slot until that workload's deletion has started. A workload
// that another request has answered with since (remove.Remover.Undo) stays,
// and so does its slot: answered is true; so does a workload owned by svc
// (a whole sandbox). Otherwise the error is errStale (the create starts
// over) or why the removal failed.
func (m *Manager) dropLeftoverSlot(ctx context.Context, svc *corev1.Service) (answered bool, err error) {
	k := m.podKind()
	if resources.SlotKind(svc) == "ReplicaSet" {
		k = m.replicaSetKind()
	}
	w, err := k.get(ctx, resources.PodName(svc.Labels[keys.LabelID]))
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, api.Classify(err, "read the workload of a leftover sandbox Service")
	case w.GetDeletionTimestamp() == nil && resources.OwnedBy(w, svc):
		return true, nil // not a leftover: a sandbox whose workload owns its Service (boundWorkload)
	case w.GetDeletionTimestamp() == nil && resources.Token(w) == resources.SelectedToken(svc):
		removed, err := m.rm.Undo(ctx, w)
		if err != nil {
			return false, api.Classify(err, "remove the workload of a leftover sandbox Service")
		}
		if !removed {
			return true, nil
		}
	}
	return false, m.dropStale(ctx, svc)
}

// dropSlot removes the slot this create made (slot.Slots.Drop); one that
// a racing create of the id bound since (a leftover it filled) stays.
func (m *Manager) dropSlot(ctx context.Context, svc *corev1.Service) {
	if err := m.slots.Drop(ctx, svc); err != nil {
		m.audit.Leftover(ctx, svc.Labels[keys.LabelID], err)
	}
}

// dropHalfMade removes the workload of s's id that a refused create would
// have repaired: s's own, named by no Service (the refused slot is gone),
// unless another request has answered for it meanwhile (undoWorkload).
func (m *Manager) dropHalfMade(ctx context.Context, s api.Spec, k workloadKind) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.RequestTimeout)
	defer cancel()
	w, err := k.get(uctx, resources.PodName(s.ID))
	if err != nil || w.GetDeletionTimestamp() != nil || resources.CheckOwner(w, k.name, s) != nil {
		return
	}
	if _, err := m.client.CoreV1().Services(m.cfg.Namespace).Get(uctx, resources.ServiceName(s.ID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		return
	}
	if _, err := m.rm.Undo(uctx, w); err != nil {
		m.audit.Leftover(ctx, s.ID, err)
	}
}
