package sandbox

import (
	"context"
	"errors"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/audit"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/remove"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

// Destroy removes a sandbox's ReplicaSet and Pod, then its Service. An id
// that never existed is not an error. Only objects that carry the
// sandbox's labels are touched, each deleted with a UID precondition, so a
// Pod that merely shares the name, or one created since we looked, is left
// alone. The workload goes first because the Service is the sandbox's
// place in the quota (quota.Counter.Check): deleted first, it would admit
// another create while this workload still stood, one over the limit for a
// moment. Were this call to die between the two steps, the Service is
// left (still counted), and the next create, destroy or reap of the id
// removes it.
//
// A claim of the id in flight (its Service made, its pooled Pod not yet
// patched) is waited for, then taken from the pool (remove.Remover.Pooled);
// a round whose reads went stale before its deletes (remove.ErrChanged) is
// run again, and a 409 answered when they keep going stale.
//
// Another principal's sandbox is answered as one that never existed (nil)
// and left alone: the caller's postcondition, "no sandbox of mine has this
// id", holds, and the answer tells it nothing about the other's. The audit
// line says which it was.
func (m *Manager) Destroy(ctx context.Context, id string) (err error) {
	result := audit.OK
	defer func() {
		if err != nil {
			result = api.Outcome(err)
		}
		m.audit.Record(ctx, "destroy", id, result, err)
	}()
	if err := api.ValidateID(id); err != nil {
		return err
	}
	// A pending claim's Service or pooled Pod changed between the read and
	// its delete (the claim landed, or handed its Service to another
	// pooled Pod): read again and judged anew.
	err = remove.OnError(retry.DefaultRetry, func(err error) bool { return errors.Is(err, remove.ErrChanged) }, func() (err error) {
		result, err = m.destroy(ctx, id)
		return err
	})
	if errors.Is(err, remove.ErrChanged) {
		return &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " kept changing while it was being destroyed (a create of it is in flight); retry the destroy"}
	}
	return err
}

// destroy is one round of Destroy, and its audit result. It returns
// remove.ErrChanged when what it judged changed before its delete.
func (m *Manager) destroy(ctx context.Context, id string) (string, error) {
	f, hidden, err := m.fetchVisible(ctx, id)
	switch {
	case err != nil:
		return audit.OK, err
	case hidden:
		if f.stray != nil {
			return audit.Hidden, api.Classify(remove.All([]func() error{m.rm.Workload(ctx, f.stray, nil, false)}), "delete sandbox "+id)
		}
		return audit.Hidden, nil
	case f.svc == nil && f.workload() == nil && f.stray == nil:
		return audit.Absent, nil
	}
	// pending: the Service holds the id for a workload still to come when
	// the deletes start, and is removed only as read (remove.ServiceAsRead).
	pending := false
	if f.workload() == nil && f.svc != nil {
		// A create or claim of the id in flight (its slot, or a Service
		// owned by the pooled Pod it claims) is waited for, as a racing
		// create waits: its Service goes only once no workload it admitted
		// can still appear, or the quota would not count that workload. A
		// slot still pending when the deadline nears is a conflict to
		// retry (only its create removes it: package slot). A workload the
		// read missed (made meanwhile) goes by the Service's owner reference.
		if f.pending(id) && !m.slots.Leftover(f.svc) {
			slot := resources.SandboxOwner(f.svc.OwnerReferences) == nil
			within := claimLands
			if slot {
				within = m.slots.Settles(ctx)
			}
			settled := func() bool {
				return f.workload() != nil || !f.pending(id) || m.slots.Leftover(f.svc)
			}
			_ = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, within, true, func(ctx context.Context) (bool, error) {
				g, _, err := m.fetchVisible(ctx, id)
				if err == nil {
					f = g
				}
				return err == nil && settled(), nil
			})
			if slot && !settled() {
				return audit.OK, &api.Error{Kind: api.KindConflict, Detail: "sandbox " + id + " is being created by another request; retry the destroy once it has answered"}
			}
		}
		// (A Service gone meanwhile was given up by its create.)
		if ref := resources.ServiceOwner(f.svc); ref != nil && f.workload() == nil {
			var err error
			if pending = resources.ClaimedOwner(f.svc, id); pending {
				err = m.rm.Pooled(ctx, id, *ref) // a claim that never landed
			} else {
				err = remove.All([]func() error{m.rm.Owner(ctx, *ref)})
			}
			if err := remove.Classify(err, "delete sandbox "+id); err != nil {
				return audit.OK, err
			}
		}
	}
	// The ReplicaSet first, so that it does not replace the Pods deleted next.
	pods := []*corev1.Pod{f.pod, f.stray}
	if f.rs != nil {
		if err := remove.All([]func() error{m.rm.Workload(ctx, f.rs, nil, false)}); err != nil {
			return audit.OK, api.Classify(err, "delete sandbox "+id)
		}
		// Its Pods, read after it went: the read before may have missed one
		// its controller made since (after a create or resume answered
		// without waiting), which would run on after the 200 until the
		// garbage collector came.
		mine, err := m.replicaSetPods(ctx, f.rs)
		if err != nil {
			return audit.OK, err
		}
		pods = append(mine, f.stray)
	}
	// Deleted now rather than left to the garbage collector, so the
	// sandbox stops at once.
	var deletes []func() error
	for _, p := range pods {
		if p != nil {
			deletes = append(deletes, m.rm.Workload(ctx, p, nil, false))
		}
	}
	if err := remove.All(deletes); err != nil {
		return audit.OK, api.Classify(err, "delete sandbox "+id)
	}
	switch {
	case f.svc == nil:
		return audit.OK, nil
	case pending:
		return audit.OK, remove.Classify(m.rm.ServiceAsRead(ctx, f.svc), "delete sandbox "+id)
	}
	return audit.OK, api.Classify(m.rm.Service(ctx, f.svc, false), "delete sandbox "+id)
}

// undoCreate removes what a refused or failed create made: the workload
// (undoWorkload), then, once it is gone, its Service (or slot) and the env
// Secret it wrote (nil: none), rather than leaving those to the GC, so a
// retry of the same id finds nothing stale and no value outlives the undo.
// ctx must not be the request's: a create that failed because its client
// went away must still undo.
func (m *Manager) undoCreate(ctx context.Context, workload workloadObject, svc *corev1.Service, env *corev1.Secret) error {
	removed, err := m.rm.Undo(ctx, workload)
	if err != nil {
		return api.Classify(err, "remove what a refused or failed create made")
	}
	// Its Service: owned by it, or the slot made for it and not bound yet;
	// never one of DeerFlow's provisioner (which names it too, but is not
	// this create's to remove).
	if removed && svc != nil && resources.Names(svc, workload) && (resources.SandboxOwner(svc.OwnerReferences) != nil || resources.SelectedToken(svc) != "") {
		if err := m.rm.Service(ctx, svc, false); err != nil {
			return api.Classify(err, "remove what a refused or failed create made")
		}
	}
	// The env Secret it wrote (by its UID), last, as its owner the Service
	// would take it; a workload answered for since keeps it.
	if removed && env != nil {
		if err := m.rm.EnvSecret(ctx, env); err != nil {
			return api.Classify(err, "remove what a refused or failed create made")
		}
	}
	return nil
}

// undoUncertain follows a workload create that failed (err) without
// saying whether it was written: a refusal (a 4xx) wrote nothing; any other
// failure is undone (remove.Remover.UndoCut). It returns failed, the
// create's error, marked as remove.ErrMayExist when the workload may still be
// there: a leftover, which keeps its slot so that the quota still counts it.
func (m *Manager) undoUncertain(ctx context.Context, err error, want workloadObject, failed error) error {
	if api.Refused(err) {
		return failed
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.RequestTimeout)
	defer cancel()
	if mayExist, uerr := m.rm.UndoCut(uctx, want); mayExist {
		if uerr != nil { // nil: another request answered with it, no leftover
			m.audit.Leftover(ctx, want.GetLabels()[keys.LabelID], uerr)
		}
		return remove.MayExist(failed)
	}
	return failed
}

// workloadObject is a sandbox's Pod or ReplicaSet.
type workloadObject = remove.Object
