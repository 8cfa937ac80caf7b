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

// Destroy removes a sandbox's Service, then its ReplicaSet and Pod. An id that never
// existed is not an error. Only objects that carry the sandbox's labels are
// touched, each deleted with a UID precondition, so a Pod that merely shares
// the name, or one created since we looked, is left alone. The order is for
// speed: a Pod deleted while its Service still exists makes the EndpointSlice
// controller rewrite the slice, a write that competes with the Service's own
// (slow: it releases the cluster IP and node port) deletion. Were this call
// to die between the two steps, the Pod is left, and a create repairs it or
// a second delete finishes.
//
// Another principal's sandbox is answered as one that never existed (nil)
// and left alone: the caller's postcondition, "no sandbox of mine has this
// id", holds, and the answer tells it nothing about the other's. The audit
// line says which it was.
func (m *Manager) Destroy(ctx context.Context, id string) (err error) {
	result := outcomeOK
	defer func() {
		if err != nil {
			result = outcome(err)
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
		return nil
	case f.svc == nil && f.workload() == nil && f.stray == nil:
		result = outcomeAbsent
		return nil
	}
	if f.svc != nil {
		err := m.client.CoreV1().Services(m.cfg.Namespace).Delete(ctx, f.svc.Name, metav1.DeleteOptions{
			Preconditions: metav1.NewUIDPreconditions(string(f.svc.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return api.Classify(err, "delete sandbox "+id)
		}
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
	return api.Classify(runAll(deletes), "delete sandbox "+id)
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

// undoCreate removes what a refused or failed create made, all of it at
// once rather than leaving the Service to the GC, so a retry of the same
// id finds nothing stale. Its Service goes first, with a UID precondition;
// then the workload (undoWorkload). ctx must not be the request's: a
// create that failed because its client went away must still undo.
func (m *Manager) undoCreate(ctx context.Context, workload workloadObject, svc *corev1.Service) error {
	if svc != nil && resources.OwnerUID(svc.OwnerReferences) == workload.GetUID() {
		err := m.client.CoreV1().Services(m.cfg.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(svc.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return api.Classify(err, "remove what a refused or failed create made")
		}
	}
	return api.Classify(m.undoWorkload(ctx, workload), "remove what a refused or failed create made")
}

// undoWorkload deletes the workload a failed create wrote, with the UID
// and resourceVersion it was written with, so that nothing else is removed
// in its stead. Changed since (by the scheduler, the kubelet or its
// controller, or by another create of the id that found it), it is read
// again: a Service owned by it means another create made it whole and may
// have answered 200 for it, so it stays; otherwise it goes at the version
// read. No grace period: it never served anyone, and a retry of the create
// must not wait for it to terminate.
func (m *Manager) undoWorkload(ctx context.Context, w workloadObject) error {
	obj := w
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		err := m.deleteWorkload(ctx, obj, ptr.To(int64(0)), true)()
		if err == nil || apierrors.IsNotFound(err) {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return err
		}
		cur, err := m.readWorkload(ctx, w)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		if cur.GetUID() != w.GetUID() || cur.GetDeletionTimestamp() != nil {
			return nil // gone, and another object took the name
		}
		svc, err := m.client.CoreV1().Services(m.cfg.Namespace).Get(ctx, resources.ServiceName(w.GetLabels()[keys.LabelID]), metav1.GetOptions{})
		switch {
		case err == nil && resources.OwnerUID(svc.OwnerReferences) == w.GetUID():
			return nil // made whole by another create: its sandbox now
		case err != nil && !apierrors.IsNotFound(err):
			return err
		}
		obj = cur
	}
	return fmt.Errorf("%s %s kept changing while a failed create removed it", w.GetObjectKind().GroupVersionKind().Kind, w.GetName())
}

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
