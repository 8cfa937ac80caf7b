package sandbox

import (
	"context"
	"errors"
	"sync"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Destroy removes a sandbox's Service, then its Pod. An id that never
// existed is not an error. Only objects that carry the sandbox's labels are
// touched, each deleted with a UID precondition, so a Pod that merely shares
// the name, or one created since we looked, is left alone. The order is for
// speed: a Pod deleted while its Service still exists makes the EndpointSlice
// controller rewrite the slice, a write that competes with the Service's own
// (slow: it releases the cluster IP and node port) deletion. Were this call
// to die between the two steps, the Pod is left, and a create repairs it or
// a second delete finishes.
func (m *Manager) Destroy(ctx context.Context, id string) error {
	if err := ValidateID(id); err != nil {
		return err
	}
	pod, svc, err := m.fetch(ctx, id)
	if err != nil {
		return err
	}
	if svc != nil {
		err := m.client.CoreV1().Services(m.cfg.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{
			Preconditions: metav1.NewUIDPreconditions(string(svc.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return classify(err, "delete sandbox "+id)
		}
	}
	if pod != nil {
		background := metav1.DeletePropagationBackground
		err := m.client.CoreV1().Pods(m.cfg.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			Preconditions: metav1.NewUIDPreconditions(string(pod.UID)), PropagationPolicy: &background})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return classify(err, "delete sandbox "+id)
		}
	}
	return nil
}

// undoCreate removes what a refused create made, all of it at once rather
// than leaving the Service to the GC, so a retry of the same
// id finds nothing stale. Preconditions on the UIDs keep it from deleting
// objects that another caller created since.
func (m *Manager) undoCreate(ctx context.Context, pod *corev1.Pod, svc *corev1.Service) error {
	deletes := []func() error{func() error {
		// No grace period: the Pod never served anyone, and a retry of this
		// create must not wait for it to terminate.
		zero := int64(0)
		return m.client.CoreV1().Pods(m.cfg.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			Preconditions: metav1.NewUIDPreconditions(string(pod.UID)), GracePeriodSeconds: &zero})
	}}
	if svc != nil && ownerUID(svc.OwnerReferences) == pod.UID {
		deletes = append(deletes, func() error {
			return m.client.CoreV1().Services(m.cfg.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(svc.UID))})
		})
	}
	return classify(runAll(deletes), "remove the sandbox refused by the quota")
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
