package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
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
// Another principal's sandbox is answered as one that never existed (nil)
// and left alone: the caller's postcondition, "no sandbox of mine has this
// id", holds, and the answer tells it nothing about the other's. The audit
// line says which it was.
func (m *Manager) Destroy(ctx context.Context, id string) (err error) {
	result := outcomeOK
	defer func() {
		if err != nil {
			result = api.Outcome(err)
		}
		m.audit(ctx, "destroy", id, result, err)
	}()
	if err := api.ValidateID(id); err != nil {
		return err
	}
	f, hidden, err := m.fetchVisible(ctx, id)
	switch {
	case err != nil:
		return err
	case hidden:
		result = outcomeHidden
		if f.stray != nil {
			return api.Classify(runAll([]func() error{m.deleteWorkload(ctx, f.stray, nil, false)}), "delete sandbox "+id)
		}
		return nil
	case f.svc == nil && f.workload() == nil && f.stray == nil:
		result = outcomeAbsent
		return nil
	}
	// The ReplicaSet first, so that it does not replace the Pod deleted next.
	if f.rs != nil {
		if err := runAll([]func() error{m.deleteWorkload(ctx, f.rs, nil, false)}); err != nil {
			return api.Classify(err, "delete sandbox "+id)
		}
	}
	// A bare Pod, or the ReplicaSet's current one: deleted now rather than
	// left to the garbage collector, so the sandbox stops at once.
	var deletes []func() error
	for _, p := range []*corev1.Pod{f.pod, f.stray} {
		if p != nil {
			deletes = append(deletes, m.deleteWorkload(ctx, p, nil, false))
		}
	}
	if err := runAll(deletes); err != nil {
		return api.Classify(err, "delete sandbox "+id)
	}
	if f.svc != nil {
		err := m.client.CoreV1().Services(m.cfg.Namespace).Delete(ctx, f.svc.Name, metav1.DeleteOptions{
			Preconditions: metav1.NewUIDPreconditions(string(f.svc.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return api.Classify(err, "delete sandbox "+id)
		}
	}
	return nil
}

// workloadObject is a sandbox's Pod or ReplicaSet.
type workloadObject interface {
	metav1.Object
	runtime.Object
}

// deleteWorkload deletes a Pod or ReplicaSet with a UID precondition (so an
// object created since is left alone); the dependents go in the background.
// Judged, it also carries the resourceVersion the caller judged, so an
// object changed since (a sandbox used since the reap looked) is left alone.
func (m *Manager) deleteWorkload(ctx context.Context, obj workloadObject, grace *int64, judged bool) func() error {
	background := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(obj.GetUID())), PropagationPolicy: &background, GracePeriodSeconds: grace}
	if judged {
		opts.Preconditions.ResourceVersion = ptr.To(obj.GetResourceVersion())
	}
	return func() error {
		if _, ok := obj.(*appsv1.ReplicaSet); ok {
			return m.client.AppsV1().ReplicaSets(m.cfg.Namespace).Delete(ctx, obj.GetName(), opts)
		}
		return m.client.CoreV1().Pods(m.cfg.Namespace).Delete(ctx, obj.GetName(), opts)
	}
}

// undoCreate removes what a refused or failed create made: the workload
// (undoWorkload), then, once it is gone, its Service (or slot), rather than leaving
// that to the GC, so a retry of the same id finds nothing stale. ctx must
// not be the request's: a create that failed because its client went away
// must still undo.
func (m *Manager) undoCreate(ctx context.Context, workload workloadObject, svc *corev1.Service) error {
	removed, err := m.undoWorkload(ctx, workload)
	if err != nil {
		return api.Classify(err, "remove what a refused or failed create made")
	}
	// Its Service: owned by it, or the slot made for it and not bound yet;
	// never one of DeerFlow's provisioner (which names it too, but is not
	// this create's to remove).
	if removed && svc != nil && resources.Names(svc, workload) && (resources.SandboxOwner(svc.OwnerReferences) != nil || resources.SlotToken(svc) != "") {
		err := m.client.CoreV1().Services(m.cfg.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(svc.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return api.Classify(err, "remove what a refused or failed create made")
		}
	}
	return nil
}

// undoWorkload deletes the workload w that a failed create wrote, unless
// another request has answered for it since, and reports whether it did.
// The delete carries w's UID and the resourceVersion last read, so nothing
// else is removed in its stead and nothing changed unseen. A workload
// changed since (the scheduler, the kubelet or its controller write it
// too) is read again: one whose activity mark moved was answered for by
// another request (a create that found it, or a get: see reuse) and stays;
// otherwise it goes at the version read. No grace period: it never served
// anyone, and a retry of the create must not wait for it to terminate.
func (m *Manager) undoWorkload(ctx context.Context, w workloadObject) (bool, error) {
	obj := w
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		err := m.deleteWorkload(ctx, obj, ptr.To(int64(0)), true)()
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsNotFound(err):
			return false, nil
		case !apierrors.IsConflict(err):
			return false, err
		}
		cur, err := m.readWorkload(ctx, w)
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if cur.GetUID() != w.GetUID() || cur.GetDeletionTimestamp() != nil {
			return false, nil // gone, and another object took the name
		}
		if cur.GetAnnotations()[keys.AnnotationLastActivity] != w.GetAnnotations()[keys.AnnotationLastActivity] {
			return false, nil // answered for by another request: its sandbox now
		}
		obj = cur
	}
	return false, fmt.Errorf("%s %s kept changing while a failed create removed it", w.GetObjectKind().GroupVersionKind().Kind, w.GetName())
}

// undoUncertain follows a workload create that failed (err) without
// saying whether it was written (the client gone or timed out, the API
// server's 5xx): the workload of want's name is read back, and removed when
// it carries want's token, so it is this create's. A refusal (a 4xx) wrote
// nothing. It returns failed, the create's error, marked as errMayExist
// when the workload may still be there (the read or the delete failed too):
// a leftover, which keeps its slot so that the quota still counts it.
func (m *Manager) undoUncertain(ctx context.Context, err error, want workloadObject, failed error) error {
	var st apierrors.APIStatus
	if errors.As(err, &st) && st.Status().Code >= 400 && st.Status().Code < 500 {
		return failed
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.RequestTimeout)
	defer cancel()
	got, rerr := m.readWorkload(uctx, want)
	switch {
	case apierrors.IsNotFound(rerr):
		return failed
	case rerr != nil:
		return mayExist{failed}
	case got.GetDeletionTimestamp() != nil || resources.Token(got) != resources.Token(want):
		return failed
	}
	if _, uerr := m.undoWorkload(uctx, got); uerr != nil {
		m.warnLeftover(ctx, want.GetLabels()[keys.LabelID], uerr)
		return mayExist{failed}
	}
	return failed
}

// mayExist marks a create's error after which its workload may exist.
type mayExist struct{ error }

func (e mayExist) Unwrap() error { return e.error }

// errMayExist matches a mayExist (errors.Is).
var errMayExist = errors.New("the workload may exist")

func (e mayExist) Is(target error) bool { return target == errMayExist }

// readWorkload reads w again, of its kind.
func (m *Manager) readWorkload(ctx context.Context, w workloadObject) (workloadObject, error) {
	if _, ok := w.(*appsv1.ReplicaSet); ok {
		return m.client.AppsV1().ReplicaSets(m.cfg.Namespace).Get(ctx, w.GetName(), metav1.GetOptions{})
	}
	return m.client.CoreV1().Pods(m.cfg.Namespace).Get(ctx, w.GetName(), metav1.GetOptions{})
}

// runAll runs deletes concurrently. An object already gone, or replaced by a
// newer one (a failed precondition), counts as done.
func runAll(deletes []func() error) error {
	errs := make([]error, len(deletes))
	var wg sync.WaitGroup
	for i, del := range deletes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := del(); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				errs[i] = err
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
