package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Reaped says what one reap removed.
type Reaped struct {
	Removed []ReapedSandbox `json:"removed"`
	Count   int             `json:"count"`
}

// ReapedSandbox is one removed sandbox and why.
type ReapedSandbox struct {
	ID     string `json:"sandbox_id"`
	Reason string `json:"reason"` // idle, lifetime, ended, orphaned-service
}

// Reap deletes every expired sandbox and every ended Pod (Succeeded/Failed,
// e.g. after activeDeadlineSeconds), with their Services. It runs on demand
// (PingSource event, reap event, HTTP) instead of in a loop, because this
// process scales to zero. Each delete carries the UID and resourceVersion it
// judged, so a sandbox touched since, or reaped by a concurrent reaper, is
// left alone and counted once.
func (m *Manager) Reap(ctx context.Context) (Reaped, error) {
	pods, svcs, err := m.listAll(ctx)
	if err != nil {
		return Reaped{}, err
	}
	now := time.Now()
	type victim struct {
		id, reason string
		obj        runtime.Object
		del        func() error
	}
	var victims []victim
	live := map[string]bool{}
	svcByID := map[string]*corev1.Service{}
	for i := range svcs {
		if id := serviceID(&svcs[i]); id != "" {
			svcByID[id] = &svcs[i]
		}
	}
	for i := range pods {
		p := &pods[i]
		id := p.Labels[LabelID]
		live[id] = true
		if p.Labels[LabelManagedBy] != ManagedByValue || p.DeletionTimestamp != nil || podID(p) == "" {
			continue
		}
		reason := expiryReason(p, now)
		if reason == "" {
			continue
		}
		uid, rv := p.UID, p.ResourceVersion
		svc := svcByID[id]
		victims = append(victims, victim{id: id, reason: reason, obj: p, del: func() error {
			err := m.client.CoreV1().Pods(m.cfg.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
				Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv},
			})
			if err != nil || svc == nil || ownerUID(svc.OwnerReferences) != uid {
				return err
			}
			// The GC would remove the Service too, but only eventually: a
			// later reap must not find it and report this sandbox again.
			err = m.client.CoreV1().Services(m.cfg.Namespace).Delete(ctx, svc.Name, metav1.DeleteOptions{
				Preconditions: metav1.NewUIDPreconditions(string(svc.UID)),
			})
			if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
				return nil
			}
			return err
		}})
	}
	for i := range svcs {
		s := &svcs[i]
		id := s.Labels[LabelID]
		if live[id] || s.Labels[LabelManagedBy] != ManagedByValue || s.DeletionTimestamp != nil || serviceID(s) == "" {
			continue
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
		out  = Reaped{Removed: []ReapedSandbox{}}
		errs []error
		wg   sync.WaitGroup
		sem  = make(chan struct{}, 16)
	)
	for _, v := range victims {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			err := v.del()
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				out.Removed = append(out.Removed, ReapedSandbox{ID: v.id, Reason: v.reason})
				m.observer.Reaped(v.reason)
				m.recorder.Eventf(v.obj, corev1.EventTypeNormal, "SandboxReaped", "Reaped sandbox %s: %s", v.id, v.reason)
			case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
				// Reaped by another replica, or touched since we looked: not ours to remove.
			default:
				errs = append(errs, err)
			}
		}()
	}
	wg.Wait()
	out.Count = len(out.Removed)
	if err := errors.Join(errs...); err != nil {
		return out, classify(err, "reap expired sandboxes")
	}
	return out, nil
}

// expiryReason says why a Pod should go now, or "" if it should stay.
func expiryReason(p *corev1.Pod, now time.Time) string {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return "ended"
	}
	lt, ok := lifetimeOf(p)
	if !ok {
		return ""
	}
	if !now.Before(lt.created.Add(lt.max)) {
		return "lifetime"
	}
	if !now.Before(lt.lastActivity.Add(lt.idle)) {
		return "idle"
	}
	return ""
}
