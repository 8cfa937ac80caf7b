// Package remove deletes sandbox objects so that nothing else goes in
// their stead: every delete carries the UID read (and, for a judgement,
// the resourceVersion judged), and a failed create's undo stops once
// another request has answered for what it wrote.
package remove

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sleep"
)

// Remover deletes in one namespace.
type Remover struct {
	Client    kubernetes.Interface
	Namespace string
	// Lands is how long after its request was cut a write may still land
	// (0: WriteLands).
	Lands time.Duration
}

// WriteLands bounds how long a write may still land after its request was
// cut (the client gone or timed out, a 5xx from the API server). The API
// server does not stop a write that etcd has already been sent: a read
// made at once may come before it commits, and find nothing. On a single
// etcd a write commits within one fsync (milliseconds; seconds when the
// disk stalls); two seconds leave room for that. Only a failed write
// waits, under its undo's own deadline, with its slot kept (and counted)
// meanwhile. A write landing later still is a leftover that counts for
// nothing until the next create, destroy or reap of its id removes it.
const WriteLands = 2 * time.Second

// maxAttempts bounds Undo's rounds: each one that loses learns the newer
// version.
const maxAttempts = 5

// Object is a sandbox's Pod or ReplicaSet.
type Object interface {
	metav1.Object
	runtime.Object
}

// Workload deletes a Pod or ReplicaSet with a UID precondition (so an
// object created since is left alone); the dependents go in the background.
// Judged, it also carries the resourceVersion the caller judged, so an
// object changed since (a sandbox used since the reap looked) is left alone.
func (r Remover) Workload(ctx context.Context, obj Object, grace *int64, judged bool) func() error {
	background := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(obj.GetUID())), PropagationPolicy: &background, GracePeriodSeconds: grace}
	if judged {
		opts.Preconditions.ResourceVersion = ptr.To(obj.GetResourceVersion())
	}
	return func() error {
		if _, ok := obj.(*appsv1.ReplicaSet); ok {
			return r.Client.AppsV1().ReplicaSets(r.Namespace).Delete(ctx, obj.GetName(), opts)
		}
		return r.Client.CoreV1().Pods(r.Namespace).Delete(ctx, obj.GetName(), opts)
	}
}

// Owner deletes the workload ref names, with its UID as precondition.
func (r Remover) Owner(ctx context.Context, ref metav1.OwnerReference) func() error {
	opts := metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(ref.UID))}
	return func() error {
		if ref.Kind == "ReplicaSet" {
			return r.Client.AppsV1().ReplicaSets(r.Namespace).Delete(ctx, ref.Name, opts)
		}
		return r.Client.CoreV1().Pods(r.Namespace).Delete(ctx, ref.Name, opts)
	}
}

// Undo deletes the workload w that a failed create wrote, unless
// another request has answered for it since, and reports whether it did.
// The delete carries w's UID and the resourceVersion last read, so nothing
// else is removed in its stead and nothing changed unseen. A workload
// changed since (the scheduler, the kubelet or its controller write it
// too) is read again: one whose activity mark moved was answered for by
// another request (a create that found it, or a get: see reuse) and stays;
// otherwise it goes at the version read. No grace period: it never served
// anyone, and a retry of the create must not wait for it to terminate.
func (r Remover) Undo(ctx context.Context, w Object) (bool, error) {
	obj := w
	for attempt := 0; attempt < maxAttempts; attempt++ {
		err := r.Workload(ctx, obj, ptr.To(int64(0)), true)()
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsNotFound(err):
			return false, nil
		case !apierrors.IsConflict(err):
			return false, err
		}
		cur, err := r.Read(ctx, w)
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

// UndoCut follows a create of want that failed without saying whether it
// was written (its request cut: the client gone or timed out, the API
// server's 5xx). The workload of want's name is read back and, when it
// carries want's token (so it is that create's), removed (Undo). A read
// that finds none reads again once a cut write must have landed (Lands):
// only then is "not written" certain enough to give up the create's slot,
// since a workload landing after its slot is gone is one the quota does
// not count. mayExist says the workload may still be there (a read or the
// delete failed): the caller keeps its slot, so the quota counts it until
// the next create, destroy or reap of the id removes both.
func (r Remover) UndoCut(ctx context.Context, want Object) (mayExist bool, err error) {
	got, err := r.readCreated(ctx, want)
	if err == nil && got == nil {
		if err = r.AwaitLanding(ctx); err == nil {
			got, err = r.readCreated(ctx, want)
		}
	}
	switch {
	case err != nil:
		return true, err
	case got == nil:
		return false, nil
	}
	if _, err := r.Undo(ctx, got); err != nil {
		return true, err
	}
	return false, nil
}

// readCreated reads the workload of want's name: nil when there is none
// that carries want's token and is not being deleted (a workload of
// another create holds the name: want's may yet land once it is gone).
func (r Remover) readCreated(ctx context.Context, want Object) (Object, error) {
	got, err := r.Read(ctx, want)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, err
	case got.GetDeletionTimestamp() != nil || resources.Token(got) != resources.Token(want):
		return nil, nil
	}
	return got, nil
}

// AwaitLanding waits until a write whose request was cut must have landed
// (Lands), or answers ctx's error when it ends first.
func (r Remover) AwaitLanding(ctx context.Context) error {
	if r.Lands > 0 {
		return sleep.For(ctx, r.Lands)
	}
	return sleep.For(ctx, WriteLands)
}

// Read reads w again, of its kind.
func (r Remover) Read(ctx context.Context, w Object) (Object, error) {
	if _, ok := w.(*appsv1.ReplicaSet); ok {
		return r.Client.AppsV1().ReplicaSets(r.Namespace).Get(ctx, w.GetName(), metav1.GetOptions{})
	}
	return r.Client.CoreV1().Pods(r.Namespace).Get(ctx, w.GetName(), metav1.GetOptions{})
}

// All runs deletes concurrently. An object already gone, or replaced by a
// newer one (a failed precondition), counts as done.
func All(deletes []func() error) error {
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
