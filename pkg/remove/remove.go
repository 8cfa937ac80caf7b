// Package remove deletes sandbox objects so that nothing else goes in
// their stead: every delete carries the UID read (and, for a judgement,
// the resourceVersion judged), and a failed create's undo stops once
// another request has answered for what it wrote. docs/architecture.md
// lists what the undo does on each failure.
package remove

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
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

// Service deletes svc with its UID as precondition and, judged, the
// resourceVersion read too, so a Service made since, or changed since it
// was judged, stays; the API server's 5xx is retried (Retry). Gone, or
// changed since, counts as done.
func (r Remover) Service(ctx context.Context, svc *corev1.Service, judged bool) error {
	if err := r.service(ctx, svc, judged); !errors.Is(err, ErrChanged) {
		return err
	}
	return nil
}

// ErrChanged says an object was changed (or replaced) between the read a
// delete was judged on and the delete: its caller reads it again.
var ErrChanged = errors.New("changed since it was read")

// Classify classifies err for an answer (api.Classify), but keeps
// ErrChanged as it is: its caller reads again.
func Classify(err error, doing string) error {
	if errors.Is(err, ErrChanged) {
		return err
	}
	return api.Classify(err, doing)
}

// ServiceAsRead deletes svc only as it was read (its UID and
// resourceVersion as preconditions), retrying the API server's 5xx, and
// returns ErrChanged when it was changed or replaced since. Gone counts as
// done. For a Service whose workload may still be written (a pooled claim
// hands its Service to another Pod): removed at a newer version, it would
// leave that workload uncounted.
func (r Remover) ServiceAsRead(ctx context.Context, svc *corev1.Service) error {
	return r.service(ctx, svc, true)
}

// service deletes svc with its UID (and, judged, its resourceVersion) as
// precondition, retrying the API server's 5xx: gone is done, a failed
// precondition ErrChanged.
func (r Remover) service(ctx context.Context, svc *corev1.Service, judged bool) error {
	pre := metav1.Preconditions{UID: &svc.UID}
	if judged {
		pre.ResourceVersion = &svc.ResourceVersion
	}
	return asRead(Retry(ctx, func() error {
		return r.Client.CoreV1().Services(r.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{Preconditions: &pre})
	}), "Service "+svc.Name)
}

// EnvSecret deletes a sandbox's env Secret (resources.EnvSecret) that a
// failed create wrote, with its UID as precondition, so the Secret of a
// create that took the id since stays; the API server's 5xx is retried.
// Gone, or replaced, counts as done. Its owner, the create's Service,
// would take it too through the garbage collector, but only once that
// Service is gone and the collector gets to it: the values are removed
// with what the undo removes, not after.
func (r Remover) EnvSecret(ctx context.Context, secret *corev1.Secret) error {
	err := asRead(Retry(ctx, func() error {
		return r.Client.CoreV1().Secrets(r.Namespace).Delete(ctx, secret.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(secret.UID))})
	}), "Secret "+secret.Name)
	if errors.Is(err, ErrChanged) {
		return nil
	}
	return err
}

// PodAsRead deletes pod only as it was read (UID and resourceVersion), and
// returns ErrChanged when it was changed or replaced since. Gone counts as
// done.
func (r Remover) PodAsRead(ctx context.Context, pod *corev1.Pod) error {
	return asRead(Retry(ctx, r.Workload(ctx, pod, nil, true)), "Pod "+pod.Name)
}

// asRead is the outcome of a delete of what (as read): gone counts as
// done, a failed precondition is ErrChanged.
func asRead(err error, what string) error {
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		return fmt.Errorf("%s: %w", what, ErrChanged)
	}
	return err
}

// Pooled removes, as read, the pooled Pod that ref names, the owner of a
// pending claim's Service of sandbox id: the claim's own patch is
// conditional on the version it read, so of the claim and this delete
// exactly one lands, and once the Pod is going no claim can make it this
// id's sandbox after its Service is gone (a Pod the quota would not
// count). A Pod claimed for id since is ErrChanged (judged again); one
// another create claimed for its own id is that sandbox, and stays.
func (r Remover) Pooled(ctx context.Context, id string, ref metav1.OwnerReference) error {
	pod, err := r.Client.CoreV1().Pods(r.Namespace).Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("read pooled Pod %s: %w", ref.Name, err)
	case pod.UID != ref.UID || pod.DeletionTimestamp != nil:
		return nil
	case resources.PodID(pod) == id:
		return fmt.Errorf("pooled Pod %s claimed since it was read: %w", pod.Name, ErrChanged)
	case resources.PodID(pod) != "" || pod.Labels[keys.LabelPool] == "":
		return nil
	}
	return r.PodAsRead(ctx, pod)
}

// ErrMayExist matches an error after which a create's workload may exist
// (MayExist).
var ErrMayExist = errors.New("the workload may exist")

// MayExist marks err, a create's, as one after which its workload may
// exist: its caller keeps the slot, so the quota counts that workload.
func MayExist(err error) error { return mayExistErr{err} }

type mayExistErr struct{ error }

func (e mayExistErr) Unwrap() error { return e.error }

func (e mayExistErr) Is(target error) bool { return target == ErrMayExist }

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
// The API server's 5xx is retried (undoBackoff): a workload that cannot be
// removed keeps its create's slot, and with it the id, until the slot is a
// leftover.
func (r Remover) Undo(ctx context.Context, w Object) (bool, error) {
	obj := w
	// cut: a delete whose answer was lost (the API server's 5xx) may
	// have removed the workload, so a retry's "not found" is a removal.
	cut := false
	for attempt := 0; attempt < maxAttempts; attempt++ {
		err := Retry(ctx, func() error {
			err := r.Workload(ctx, obj, ptr.To(int64(0)), true)()
			cut = cut || err != nil && transient(ctx)(err)
			return err
		})
		switch {
		case err == nil:
			return true, nil
		case apierrors.IsNotFound(err):
			return cut, nil
		case !apierrors.IsConflict(err):
			return false, err
		}
		var cur Object
		err = Retry(ctx, func() (err error) {
			cur, err = r.Read(ctx, w)
			return err
		})
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
// delete failed), or is there to stay (its activity mark moved: another
// request answered with it): the caller keeps its slot, so the quota counts
// it until the next create, destroy or reap of the id removes both.
//
// Each read and the removal are retried after the API server's 5xx
// (undoBackoff): an undo that gives up keeps its slot, and with it the
// sandbox's id, until the slot is a leftover.
func (r Remover) UndoCut(ctx context.Context, want Object) (mayExist bool, err error) {
	var got Object
	read := func() error {
		got, err = r.readCreated(ctx, want)
		return err
	}
	err = Retry(ctx, read)
	if err == nil && got == nil {
		if err = r.AwaitLanding(ctx); err == nil {
			err = Retry(ctx, read)
		}
	}
	switch {
	case err != nil:
		return true, err
	case got == nil:
		return false, nil
	case got.GetAnnotations()[keys.AnnotationLastActivity] != want.GetAnnotations()[keys.AnnotationLastActivity]:
		// Answered for by another request since it landed (a bare Pod owns
		// its Service from its create, so a racing create of the id may
		// answer with it at once): it stands, and so must what holds it.
		return true, nil
	}
	_, err = r.Undo(ctx, got) // retries the API server's 5xx itself
	return err != nil, err
}

// undoBackoff spaces the retries of an undo's reads and deletes: about
// 1.5 s in all, well within the undo's own deadline.
var undoBackoff = wait.Backoff{Steps: 5, Duration: 100 * time.Millisecond, Factor: 2, Jitter: 0.5}

// Retry calls fn again after the API server's 5xx (or a cut request),
// spaced by undoBackoff, while ctx lasts: the undo of a failed create.
func Retry(ctx context.Context, fn func() error) error {
	return OnError(undoBackoff, transient(ctx), fn)
}

// OnError is client-go's retry.OnError, but returns the last error fn
// returned. retry.OnError takes an error of fn that wraps
// context.DeadlineExceeded or context.Canceled (a request cut by its
// deadline) for the end of its own backoff, and returns the last retriable
// error instead: nil when there was none, so a delete that the deadline
// cut would count as done.
func OnError(backoff wait.Backoff, retriable func(error) bool, fn func() error) error {
	var last error
	_ = retry.OnError(backoff, retriable, func() error {
		last = fn()
		return last
	})
	return last
}

// transient reports whether an undo's failed call is worth another try:
// anything but the API server's refusal (a 4xx), while ctx lasts.
func transient(ctx context.Context) func(error) bool {
	return func(err error) bool {
		return !api.Refused(err) && ctx.Err() == nil
	}
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
// (Landing), or answers ctx's error when it ends first.
func (r Remover) AwaitLanding(ctx context.Context) error {
	return sleep.For(ctx, r.Landing())
}

// Landing is how long after its request was cut a write may still land:
// Lands, or WriteLands.
func (r Remover) Landing() time.Duration {
	if r.Lands > 0 {
		return r.Lands
	}
	return WriteLands
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
