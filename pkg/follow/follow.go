// Package follow follows API objects by watch until what a caller waits
// for holds: a Pod, the current Pod of a ReplicaSet, a Service's
// EndpointSlices. Watches the server closes are resumed from where they
// stood; nothing here polls. It holds no state: each call is one wait.
package follow

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	typeddiscoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/status"
)

// Pod follows one Pod by watch, from the version we already hold, until
// done says stop, the Pod is deleted (nil is passed to done), or ctx ends.
// client-go's RetryWatcher resumes the watches the server closes from the
// last version seen, with backoff, and retries those it cannot open, until
// ctx ends. It gives up on a version the server no longer holds ("too
// old", 410): then one read, and a new watch from it. A watch refused
// (403, 401) ends the wait with that error. No list: a list of Pods by name
// scans the namespace's Pods in the API server.
func Pod(ctx context.Context, pods typedcorev1.PodInterface, pod *corev1.Pod, done func(*corev1.Pod) bool) (*corev1.Pod, error) {
	byName := fields.OneTermEqualSelector("metadata.name", pod.Name).String()
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		o.FieldSelector = byName
		return pods.Watch(ctx, o)
	}}
	current := pod
	for {
		w, err := watchFrom(ctx, lw, current.ResourceVersion)
		if err != nil {
			return current, api.Classify(err, "watch the sandbox Pod")
		}
		next, finished, err := podEvents(ctx, w, pod.UID, current, done)
		w.Stop()
		if finished || err != nil {
			return next, err
		}
		current = next
		// The version is too old: start over from a fresh read.
		fresh, err := pods.Get(ctx, pod.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err) || (err == nil && fresh.UID != pod.UID):
			if done(nil) {
				return nil, nil
			}
			// Nothing left to follow: wait for ctx, as a watch of a Pod
			// that never changes would.
			<-ctx.Done()
			return current, ctx.Err()
		case err != nil:
			return current, api.Classify(err, "read the sandbox Pod")
		}
		current = fresh
		if done(current) {
			return current, nil
		}
	}
}

// watchFrom watches from rv with a RetryWatcher. An object without a
// version (one a fake clientset made; an API server always sets it) has
// no version to resume from: it gets one plain watch, which starts with
// the object as it is now.
func watchFrom(ctx context.Context, lw *cache.ListWatch, rv string) (watch.Interface, error) {
	if rv == "" {
		return lw.WatchWithContext(ctx, metav1.ListOptions{})
	}
	return watchtools.NewRetryWatcherWithContext(ctx, rv, lw)
}

// podEvents hands w's events for the Pod uid to done until it says stop
// (finished), ctx ends or the watch fails. It returns unfinished, without
// an error, when the watch's version is too old.
func podEvents(ctx context.Context, w watch.Interface, uid types.UID, current *corev1.Pod, done func(*corev1.Pod) bool) (*corev1.Pod, bool, error) {
	for {
		select {
		case <-ctx.Done():
			return current, false, ctx.Err()
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The RetryWatcher closes only when ctx ends or after
				// the error it sent; a plain watch (watchFrom) that
				// closes is read afresh, as a version too old is.
				return current, false, ctx.Err()
			}
			switch ev.Type {
			case watch.Error:
				err := apierrors.FromObject(ev.Object)
				if apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
					return current, false, nil
				}
				return current, false, api.Classify(err, "watch the sandbox Pod")
			case watch.Deleted:
				if done(nil) {
					return nil, true, nil
				}
			case watch.Added, watch.Modified:
				p, ok := ev.Object.(*corev1.Pod)
				if !ok || p.UID != uid {
					continue
				}
				current = p
				if done(current) {
					return current, true, nil
				}
			}
		}
	}
}

// Gone waits, up to bound (SANDBOX_TERMINATING_WAIT), for a terminating Pod
// to disappear, so that a create right after a delete makes the sandbox
// anew instead of answering with the dying one. Still there at the bound,
// it is a conflict to retry.
func Gone(ctx context.Context, pods typedcorev1.PodInterface, pod *corev1.Pod, bound time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	_, err := Pod(wctx, pods, pod, func(p *corev1.Pod) bool { return p == nil })
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return api.Classify(ctx.Err(), "wait for the old sandbox Pod to terminate")
	case wctx.Err() != nil:
		return &api.Error{Kind: api.KindConflict, Detail: fmt.Sprintf(
			"sandbox %s is still terminating after %s; retry when it is gone", pod.Labels[keys.LabelID], bound)}
	}
	return err
}

// ReplicaSetPod follows the Pods of a ReplicaSet sandbox (list, then
// watch, by label) until its current Pod (resources.CurrentPod of the live
// ones rs controls, nil when there is none) satisfies done or ctx ends. A
// deleted Pod is not the end unless done says so: the ReplicaSet makes
// another.
func ReplicaSetPod(ctx context.Context, pods typedcorev1.PodInterface, rs *appsv1.ReplicaSet, done func(*corev1.Pod) bool) (*corev1.Pod, error) {
	selector := metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: resources.ReplicaSetSelector(rs.Labels[keys.LabelID])})
	lw := &cache.ListWatch{
		ListFunc: func(o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return pods.List(ctx, o)
		},
		WatchFunc: func(o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return pods.Watch(ctx, o)
		},
	}
	// The informer's store is the Pods as of each event: the current one is
	// picked from it afresh.
	var (
		store   cache.Store
		current *corev1.Pod
	)
	check := func(watch.Event) (bool, error) {
		var all []corev1.Pod
		for _, o := range store.List() {
			all = append(all, *o.(*corev1.Pod))
		}
		current = resources.CurrentPod(resources.ControlledPods(rs, all))
		return done(current), nil
	}
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.Pod{}, func(s cache.Store) (bool, error) {
		store = s
		return check(watch.Event{})
	}, check)
	if err != nil && ctx.Err() == nil {
		return current, api.Classify(err, "watch the sandbox's Pods")
	}
	return current, err
}

// Drained waits, up to bound, until rs controls no live Pod: its
// controller has marked them for deletion, as it does once rs is scaled to
// zero. It returns the live Pod still there when bound passed, or nil.
func Drained(ctx context.Context, pods typedcorev1.PodInterface, rs *appsv1.ReplicaSet, bound time.Duration) (*corev1.Pod, error) {
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	return ReplicaSetPod(wctx, pods, rs, func(p *corev1.Pod) bool { return p == nil })
}

// WarningReason is what the kubelet last warned about pod, "" when it said
// nothing or its Events cannot be read (the answer keeps the Pod's own).
func WarningReason(ctx context.Context, events typedcorev1.EventInterface, pod *corev1.Pod) string {
	l, err := events.List(ctx, metav1.ListOptions{
		FieldSelector: fields.Set{"involvedObject.uid": string(pod.UID), "type": corev1.EventTypeWarning}.String()})
	if err != nil {
		return ""
	}
	return status.EventReason(l.Items)
}

// Slices waits, up to bound, until an EndpointSlice of svc satisfies
// done, and says why not otherwise.
func Slices(ctx context.Context, eps typeddiscoveryv1.EndpointSliceInterface, svc *corev1.Service, bound time.Duration, done func(*discoveryv1.EndpointSlice) bool) error {
	wctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	sel := labels.Set{discoveryv1.LabelServiceName: svc.Name}.String() // a Service name is a valid label value
	watchFrom := func(rv string) error {
		w, err := eps.Watch(wctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: rv})
		if err != nil {
			return err
		}
		defer w.Stop()
		for {
			select {
			case <-wctx.Done():
				return wctx.Err()
			case ev, ok := <-w.ResultChan():
				if !ok || ev.Type == watch.Error {
					return errWatchEnded
				}
				if s, ok := ev.Object.(*discoveryv1.EndpointSlice); ok && ev.Type != watch.Deleted && s.Labels[discoveryv1.LabelServiceName] == svc.Name && done(s) {
					return nil
				}
			}
		}
	}
	// From the Service's own version: the slice the EndpointSlice
	// controller writes for it comes after, so the API server replays it
	// from its watch cache without a list (a list scans every slice of the
	// namespace). An older version (an existing sandbox's Service) may be
	// gone from that cache: then one list, and a watch from it. A read
	// the API server refuses (a Role without endpointslices) ends the wait
	// at once.
	err := watchFrom(svc.ResourceVersion)
	if errors.Is(err, errWatchEnded) || apierrors.IsResourceExpired(err) || apierrors.IsGone(err) {
		var l *discoveryv1.EndpointSliceList
		if l, err = eps.List(wctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: "0"}); err == nil {
			if slices.ContainsFunc(l.Items, func(s discoveryv1.EndpointSlice) bool { return done(&s) }) {
				return nil
			}
			err = watchFrom(l.ResourceVersion)
		}
	}
	return err
}

// errWatchEnded: the watch closed, or sent an error (its starting version
// is too old); the wait goes on from a list.
var errWatchEnded = errors.New("the EndpointSlice watch ended")

// ListsAddress reports whether s is a slice of the Service named svc that
// lists an address of the Pod uid (of any Pod when uid is ""): whether
// cluster DNS can answer a headless Service's name with that Pod.
func ListsAddress(s *discoveryv1.EndpointSlice, svc string, uid types.UID) bool {
	if s.Labels[discoveryv1.LabelServiceName] != svc {
		return false
	}
	for _, e := range s.Endpoints {
		if len(e.Addresses) == 0 {
			continue
		}
		if uid == "" || e.TargetRef != nil && e.TargetRef.Kind == "Pod" && e.TargetRef.UID == uid {
			return true
		}
	}
	return false
}
