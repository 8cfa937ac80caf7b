package sandbox

import (
	"context"
	"errors"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/admission"
	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/follow"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/quota"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sleep"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
)

// maxConvergeAttempts bounds the create-or-adopt loops. Each round trip that
// loses a race learns the winner's state, so a handful is plenty.
const maxConvergeAttempts = 5

// Create makes the sandbox of s exist, whole, and returns it. It is idempotent
// and safe under concurrency: every caller creating the same id, from any
// replica, converges on one Pod and one Service. A half-present sandbox is
// repaired. With wait > 0 it also waits (by watch) until the Pod is Ready.
// The sandbox records the caller's principal; an existing one is handed
// only to that principal (or an administrator).
func (m *Manager) Create(ctx context.Context, s api.Spec, wait time.Duration) (api.Sandbox, error) {
	c, err := api.RequireCaller(ctx)
	if err != nil {
		return api.Sandbox{}, err
	}
	s.Caller = c
	sb, err := m.create(ctx, s, wait)
	m.audit.Record(ctx, "create", s.ID, api.Outcome(err), err)
	return sb, err
}

func (m *Manager) create(ctx context.Context, s api.Spec, wait time.Duration) (sb api.Sandbox, err error) {
	release, err := m.admitWait(s.Caller.Principal, wait)
	if err != nil {
		return api.Sandbox{}, err
	}
	defer release()
	if s, err = m.resolveTemplate(ctx, s); err != nil {
		return api.Sandbox{}, err
	}
	// Before anything of the sandbox is written, so a refusal leaves
	// nothing: a quota the Service cache already shows full (issue 45: a
	// principal at its limit writes nothing, not even a slot), and ids that
	// are another principal's or past the principal's bound. Neither
	// decides alone: the slot's count does for the quota (fill,
	// pooled.Create), and the claim of the ids after it (ensurePod,
	// ensureReplicaSet, pooled.Create) for ownership, so that a create the
	// quota refuses records no id.
	if err := m.quota.Full(ctx, s); err != nil {
		var qe *quota.Error
		if errors.As(err, &qe) {
			m.observer.QuotaRefused(qe.Scope)
		}
		return api.Sandbox{}, err
	}
	if err := m.owners.Check(ctx, s.Caller, s.UserID, s.ThreadID); err != nil {
		return api.Sandbox{}, err
	}
	s.Token = token.New()
	// A create that does not answer 200 leaves nothing it wrote, whatever
	// ended it: the client gone (even after the last write: its answer has
	// nowhere to go), the deadline, the API server's 5xx. A success past
	// the request's own deadline is still answered, so it stands. wrote is
	// what this request made (a workload and its Service, new or claimed);
	// undoMade removes it under a deadline of its own, unless another
	// request has answered for it.
	var wrote made
	defer func() {
		if err == nil && errors.Is(ctx.Err(), context.Canceled) {
			err = api.Classify(ctx.Err(), "answer the create of sandbox "+s.ID)
		}
		if err != nil {
			m.undoMade(ctx, wrote)
		}
	}()
	if t := s.Resolved; m.pool != nil && t != nil && t.PoolSize > 0 {
		if sb, handled, err := m.createFromPool(ctx, s, wait, &wrote); handled {
			return sb, err
		}
	}
	// Racing creates can refuse each other at the limit: the rounds retry
	// them (quota.Counter.Rounds).
	var a made
	err = m.quota.Rounds(ctx, s, func() error {
		var err error
		if a, err = m.createOnce(ctx, s); err == nil && !a.existed {
			wrote = a
		}
		return err
	})
	var qe *quota.Error
	if errors.As(err, &qe) {
		m.observer.QuotaRefused(qe.Scope) // once per refused request, not per round
	}
	if err != nil {
		return api.Sandbox{}, err
	}
	obj := a.workload().(runtime.Object)
	switch {
	case !a.existed:
		m.recorder.Eventf(obj, corev1.EventTypeNormal, "SandboxCreated", "Created sandbox %s for user %s", s.ID, s.UserID)
	case a.repaired:
		m.recorder.Eventf(obj, corev1.EventTypeNormal, "SandboxRepaired", "Recreated the missing Service of sandbox %s", s.ID)
	}
	sb, _, err = m.answer(ctx, s.ID, a.found, wait)
	return sb, err
}

// undoMade removes what a create that ends without its answer wrote (a
// new or claimed workload, and its Service), under a deadline of its own
// since the request's may be what ended it. What cannot be removed now (the
// API server down) is a leftover: it counts for the quota while it exists,
// and the next create, destroy or reap of its id removes it (leftover).
func (m *Manager) undoMade(ctx context.Context, a made) {
	w := a.workload()
	if w == nil || a.existed {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.RequestTimeout)
	defer cancel()
	if err := m.undoCreate(uctx, w, a.svc, a.env); err != nil {
		m.audit.Leftover(ctx, w.GetLabels()[keys.LabelID], err)
	}
}

// made is what one create attempt made of the sandbox: what exists of it,
// whether its workload was there before the attempt (existed), and whether
// its Service had to be made again (repaired).
type made struct {
	found
	// env is the request's env Secret this create wrote (nil: none).
	env               *corev1.Secret
	existed, repaired bool
}

// createOnce makes one attempt with the workload kind of the template. An
// id already taken by a sandbox of the other kind (a paused ReplicaSet
// sandbox that DeerFlow, sending no template, creates again; a bare Pod
// sandbox from before templates) is answered with that sandbox.
func (m *Manager) createOnce(ctx context.Context, s api.Spec) (made, error) {
	proxy, err := m.isolation.Require(ctx, s.Caller.Principal, s.Egress.Mode)
	if err != nil {
		return made{}, err
	}
	s.Egress.Proxy = proxy
	var a made
	if s.Resolved != nil && s.Resolved.Kind == template.KindReplicaSet {
		a, err = m.createKindOnce(ctx, s, m.replicaSetKind())
	} else {
		a, err = m.createKindOnce(ctx, s, m.podKind())
	}
	if !errors.Is(err, errOtherKind) {
		return a, err
	}
	return m.reuseOtherKind(ctx, s)
}

// errOtherKind says that the sandbox's Service belongs to a live workload of
// the other kind, or of another name (a Pod claimed from a warm pool keeps
// its pool's name): the id is taken by a sandbox the create did not expect.
var errOtherKind = errors.New("the sandbox exists as the other workload kind")

// reuseOtherKind answers a create with the sandbox that holds the id, as
// DeerFlow's create reuses whatever exists (resuming it if paused).
func (m *Manager) reuseOtherKind(ctx context.Context, s api.Spec) (made, error) {
	f, err := m.fetch(ctx, s.ID)
	if err != nil {
		return made{}, err
	}
	if f.pod == nil && f.rs == nil && f.pending(s.ID) {
		// A pooled create wrote the Service and has yet to claim its Pod
		// (pooled.Create), or a cold create its slot and has yet to make its
		// workload (fill): wait for that write, or for it to give up.
		perr := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, claimLands, false, func(ctx context.Context) (bool, error) {
			if f, err = m.fetch(ctx, s.ID); err != nil {
				return false, err
			}
			return f.pod != nil || f.rs != nil || !f.pending(s.ID), nil
		})
		if err != nil {
			return made{}, err
		}
		if perr != nil && ctx.Err() != nil {
			return made{}, api.Classify(ctx.Err(), "wait for a racing create of the sandbox")
		}
	}
	// Marked as any create marks what it finds (reuse), so its writer's undo spares it.
	switch {
	case f.rs != nil:
		if f.rs, err = m.reuseReplicaSet(ctx, f.rs, s); err != nil {
			return made{}, err
		}
		f.rs = reuse(ctx, m, f.rs, m.client.AppsV1().ReplicaSets(m.cfg.Namespace).Patch)
		if resources.Paused(f.rs) {
			f.pod = nil
		}
	case f.pod != nil:
		if err := resources.CheckOwner(f.pod, "Pod", s); err != nil {
			return made{}, err
		}
		if err := resources.CheckCapacity(f.pod, s); err != nil {
			return made{}, err
		}
		f.pod = reuse(ctx, m, f.pod, m.client.CoreV1().Pods(m.cfg.Namespace).Patch)
	default:
		return made{}, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " is being created and deleted concurrently; retry"}
	}
	return made{found: f, existed: true}, nil
}

// ensurePod creates the Pod or adopts the existing one. A Pod that is being
// deleted is not "already there": we wait for it to go, then create anew.
//
// Its caller (fill) has claimed the sandbox's ids first
// (ownership.Registry.Claim): the slot exists and the quota has counted
// it, so a Lease is only ever written by a create the quota admitted, and
// before any workload.
//
// A new Pod is owned by svc when own (this create's slot). One owned by
// another Service (gone) goes now, as the GC would after the answer.
func (m *Manager) ensurePod(ctx context.Context, s api.Spec, svc *corev1.Service, own bool) (*corev1.Pod, bool, error) {
	want := resources.BuildPodFor(m.cfg.Objects(), s)
	if own {
		want.OwnerReferences = []metav1.OwnerReference{resources.ServiceOwnerRef(svc)}
	}
	pods := m.client.CoreV1().Pods(m.cfg.Namespace)
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		created, err := pods.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return created, false, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, false, m.undoUncertain(ctx, err, want, m.createFailed(err, "Pod", s))
		}
		existing, err := pods.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // deleted between our create and get: try again
		}
		if err != nil {
			return nil, false, api.Classify(err, "read the existing sandbox Pod")
		}
		if err := resources.CheckOwner(existing, "Pod", s); err != nil {
			// Another's, unless a failed create left it: then it goes, and
			// this create makes the id anew.
			if removed, lerr := m.removeLeftover(ctx, existing); lerr != nil || !removed {
				return nil, false, errors.Join(err, lerr)
			}
			continue
		}
		if u := resources.OwningService(existing); existing.DeletionTimestamp == nil && u != "" && u != svc.UID {
			if err := m.rm.Workload(ctx, existing, ptr.To(int64(0)), true)(); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return nil, false, api.Classify(err, "remove a sandbox Pod whose Service is gone")
			}
			continue
		}
		if existing.DeletionTimestamp != nil {
			if err := follow.Gone(ctx, m.client.CoreV1().Pods(m.cfg.Namespace), existing, m.cfg.TerminatingWait); err != nil {
				return nil, false, err
			}
			continue
		}
		if err := resources.CheckCapacity(existing, s); err != nil {
			return nil, false, err
		}
		return existing, true, nil
	}
	return nil, false, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " is being created and deleted concurrently; retry"}
}

// removeLeftover removes pod, a sandbox Pod of another user, thread or
// principal, when it is a leftover: older than any create could have
// undone it in, and named by no Service. It acts for the function, not the
// caller: that Pod was never anyone's sandbox. The delete carries the
// UID and resourceVersion read, so a Pod changed since stays.
func (m *Manager) removeLeftover(ctx context.Context, pod *corev1.Pod) (bool, error) {
	if !resources.IsSandbox(pod, resources.PodID(pod)) || pod.DeletionTimestamp != nil || !m.leftover(pod) {
		return false, nil
	}
	svc, err := m.client.CoreV1().Services(m.cfg.Namespace).Get(ctx, resources.ServiceName(resources.PodID(pod)), metav1.GetOptions{})
	switch {
	case err == nil && resources.Names(svc, pod):
		return false, nil // whole
	case err != nil && !apierrors.IsNotFound(err):
		return false, api.Classify(err, "read the Service of a leftover sandbox Pod")
	}
	err = m.rm.Workload(ctx, pod, ptr.To(int64(0)), true)()
	if err != nil && !apierrors.IsNotFound(err) {
		if apierrors.IsConflict(err) {
			return false, nil
		}
		return false, api.Classify(err, "remove a leftover sandbox Pod")
	}
	m.recorder.Eventf(pod, corev1.EventTypeNormal, "LeftoverRemoved", "Removed Pod %s, left by a failed create of sandbox %s", pod.Name, resources.PodID(pod))
	return true, nil
}

// createFailed explains a failed create of the sandbox's kind of object;
// a missing namespace is the operator's to fix, and a refusal by admission
// names what refused it (see admission.Refusal).
func (m *Manager) createFailed(err error, kind string, s api.Spec) error {
	if apierrors.IsNotFound(err) {
		return &api.Error{Kind: api.KindInternal, Err: err,
			Detail: "namespace " + m.cfg.Namespace + " does not exist; create it (or set CREATE_NAMESPACE=true)"}
	}
	if refused := admission.Refusal(m.cfg.Namespace, &m.cfg.DeerFlowConfig, err, s, kind); refused != nil {
		return refused
	}
	return api.Classify(err, "create the sandbox "+kind)
}

// ensureService creates a pooled create's Service, owned by the pooled Pod
// its claim tries (pooled.Create), adopting or replacing an existing one. A
// Service that holds the id for another sandbox (a live workload of either
// kind, a cold create's young slot) is errOtherKind.
func (m *Manager) ensureService(ctx context.Context, s api.Spec, owner metav1.OwnerReference, want *corev1.Service) (*corev1.Service, error) {
	svcs := m.client.CoreV1().Services(m.cfg.Namespace)
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		created, err := svcs.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, api.Classify(err, "create the sandbox Service")
		}
		existing, err := svcs.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, api.Classify(err, "read the existing sandbox Service")
		}
		if !resources.IsSandbox(existing, s.ID) {
			return nil, &api.Error{Kind: api.KindConflict, Detail: "a Service named " + existing.Name + " exists and is not a sandbox's; choose another sandbox_id"}
		}
		current := resources.SandboxOwner(existing.OwnerReferences)
		switch {
		case current != nil && current.UID == owner.UID && existing.DeletionTimestamp == nil:
			svc, err := token.Reselect(ctx, svcs, existing, want)
			return svc, err
		case current != nil && (current.Kind != owner.Kind || current.Name != owner.Name) && existing.DeletionTimestamp == nil:
			live, err := m.ownerLives(ctx, *current, existing, s.ID)
			if err != nil {
				return nil, err
			}
			if live {
				return nil, errOtherKind
			}
			fallthrough // left over from a workload that is gone: replace it
		case current != nil || resources.OwnerlessReference(existing):
			// Left over from an earlier workload of this id (the GC will remove
			// it anyway), or OwnerlessReference: removed so the new one gets its Service.
			err := svcs.Delete(ctx, existing.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(existing.UID))})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return nil, api.Classify(err, "replace a stale sandbox Service")
			}
			if err := sleep.For(ctx, time.Duration(attempt+1)*100*time.Millisecond); err != nil {
				return nil, api.Classify(err, "replace a stale sandbox Service")
			}
		case existing.DeletionTimestamp == nil && resources.SelectedToken(existing) != "":
			// The slot of a cold create of the id: it holds the id, unless
			// left by a create that could not undo.
			if !m.slots.Leftover(existing) {
				return nil, errOtherKind
			}
			answered, err := m.dropLeftoverSlot(ctx, existing)
			switch {
			case answered:
				return nil, errOtherKind
			case !errors.Is(err, errStale):
				return nil, err
			}
		case existing.DeletionTimestamp == nil:
			// Made by DeerFlow's provisioner (no owner, no token): adopted
			// only by default's cold Pod create, with its Pod (judgeLegacy),
			// never by a claim. Another principal's create gets the taken
			// id's 409, default's answers with the Pod that holds the id, and
			// a Service whose Pod is gone goes (errStale: create again).
			if err := m.judgeLegacy(ctx, s, existing, false); !errors.Is(err, errStale) {
				return nil, err
			}
		default:
			// Being deleted without an owner: wait for it to go.
			if err := sleep.For(ctx, time.Duration(attempt+1)*100*time.Millisecond); err != nil {
				return nil, api.Classify(err, "replace a stale sandbox Service")
			}
		}
	}
	return nil, &api.Error{Kind: api.KindConflict, Detail: "the Service of sandbox " + s.ID + " is changing concurrently; retry"}
}

// ownerLives reports whether the workload ref names still exists (same UID,
// not being deleted) and holds svc for id. A Pod that does not carry id is
// a pooled Pod whose claim wrote svc first (pooled.Create) and holds it
// while that claim may yet land: until svc is older than any create could
// be (undoWindow), as a slot is.
func (m *Manager) ownerLives(ctx context.Context, ref metav1.OwnerReference, svc *corev1.Service, id string) (bool, error) {
	var (
		obj metav1.Object
		err error
	)
	if ref.Kind == "ReplicaSet" {
		obj, err = m.client.AppsV1().ReplicaSets(m.cfg.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	} else {
		obj, err = m.client.CoreV1().Pods(m.cfg.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, api.Classify(err, "read the workload of the sandbox Service")
	}
	if obj.GetUID() != ref.UID || obj.GetDeletionTimestamp() != nil {
		return false, nil
	}
	if pod, ok := obj.(*corev1.Pod); ok && resources.PodID(pod) != id {
		return time.Since(svc.CreationTimestamp.Time) < m.undoWindow(), nil
	}
	return true, nil
}

// claimLands bounds how long a create that lost its id to a pooled create
// waits for that claim's Pod to take the id (normally one patch).
const claimLands = 3 * time.Second
