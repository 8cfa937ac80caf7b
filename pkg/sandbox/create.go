package sandbox

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// maxConvergeAttempts bounds the create-or-adopt loops. Each round trip that
// loses a race learns the winner's state, so a handful is plenty.
const maxConvergeAttempts = 5

// Create makes the sandbox of s exist, whole, and returns it. It is idempotent
// and safe under concurrency: every caller creating the same id, from any
// replica, converges on one Pod and one Service. A half-present sandbox is
// repaired. With wait > 0 it also waits (by watch) until the Pod is Ready.
func (m *Manager) Create(ctx context.Context, s Spec, wait time.Duration) (Sandbox, error) {
	release, err := m.admitWait(wait)
	if err != nil {
		return Sandbox{}, err
	}
	defer release()
	for attempt := 0; ; attempt++ {
		var (
			pod               *corev1.Pod
			svc               *corev1.Service
			existed, repaired bool
			err               error
		)
		if attempt > 0 {
			// Racing creates refused each other: back off for a random moment
			// so that the next round admits some of them, and create again only
			// if a count shows room, so that a quota full of young sandboxes
			// does not cost a Pod created and deleted per round.
			if err := sleepCtx(ctx, time.Duration(attempt)*time.Duration(50+rand.IntN(150))*time.Millisecond); err != nil {
				return Sandbox{}, classify(err, "create the sandbox")
			}
			err = m.checkQuota(ctx, s, nil)
		}
		if err == nil {
			pod, svc, existed, repaired, err = m.createOnce(ctx, s)
		}
		var qe *quotaError
		if errors.As(err, &qe) && qe.contended && attempt < maxQuotaRetries {
			continue
		}
		if qe != nil {
			m.observer.QuotaRefused(qe.scope) // once per refused request, not per round
		}
		if err != nil {
			return Sandbox{}, err
		}
		switch {
		case !existed:
			m.recorder.Eventf(pod, corev1.EventTypeNormal, "SandboxCreated", "Created sandbox %s for user %s", s.ID, s.UserID)
		case repaired:
			m.recorder.Eventf(pod, corev1.EventTypeNormal, "SandboxRepaired", "Recreated the missing Service of sandbox %s", s.ID)
		}
		if wait > 0 {
			return m.waitReady(ctx, s.ID, pod, svc, wait)
		}
		return m.view(s.ID, pod, svc), nil
	}
}

// maxQuotaRetries bounds the rounds a create spends on a contended quota.
const maxQuotaRetries = 4

// createOnce makes one attempt: Pod first, then the Service and the quota
// count concurrently. Isolation needs no write: the shared NetworkPolicy
// selects the Pod by label from its first moment.
func (m *Manager) createOnce(ctx context.Context, s Spec) (pod *corev1.Pod, svc *corev1.Service, existed, repaired bool, err error) {
	if err := m.requireIsolation(ctx); err != nil {
		return nil, nil, false, false, err
	}
	pod, existed, err = m.ensurePod(ctx, s)
	if err != nil {
		return nil, nil, false, false, err
	}
	if existed {
		pod = m.touch(ctx, pod)
	}

	// The Service needs the Pod's UID for its owner reference; the quota
	// count needs the Pod to exist. The two then overlap, so a create costs
	// two API round trips, like the bare floor.
	var (
		wg               sync.WaitGroup
		svcErr, quotaErr error
	)
	wg.Add(1)
	go func() { defer wg.Done(); svc, repaired, svcErr = m.ensureService(ctx, s, pod, existed) }()
	if !existed && (m.cfg.MaxSandboxes > 0 || m.cfg.MaxSandboxesPerUser > 0) {
		wg.Add(1)
		go func() { defer wg.Done(); quotaErr = m.checkQuota(ctx, s, pod) }()
	}
	wg.Wait()

	if quotaErr != nil {
		if KindOf(quotaErr) == KindQuota {
			// Undo what this call created; a refused create leaves nothing behind.
			if err := m.undoCreate(context.WithoutCancel(ctx), pod, svc); err != nil {
				return nil, nil, false, false, err
			}
		}
		return nil, nil, false, false, quotaErr
	}
	if svcErr != nil {
		return nil, nil, false, false, svcErr
	}
	return pod, svc, existed, repaired, nil
}

// ensurePod creates the Pod or adopts the existing one. A Pod that is being
// deleted is not "already there": we wait for it to go, then create anew.
func (m *Manager) ensurePod(ctx context.Context, s Spec) (*corev1.Pod, bool, error) {
	want := BuildPod(m.cfg, s)
	pods := m.client.CoreV1().Pods(m.cfg.Namespace)
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		created, err := pods.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return created, false, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			if apierrors.IsNotFound(err) {
				return nil, false, &Error{Kind: KindInternal, Err: err,
					Detail: "namespace " + m.cfg.Namespace + " does not exist; create it (or set CREATE_NAMESPACE=true)"}
			}
			return nil, false, classify(err, "create the sandbox Pod")
		}
		existing, err := pods.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue // deleted between our create and get: try again
		}
		if err != nil {
			return nil, false, classify(err, "read the existing sandbox Pod")
		}
		if err := checkOwner(existing, s); err != nil {
			return nil, false, err
		}
		if existing.DeletionTimestamp != nil {
			if err := m.waitGone(ctx, existing); err != nil {
				return nil, false, err
			}
			continue
		}
		if err := checkCapacity(existing, s); err != nil {
			return nil, false, err
		}
		return existing, true, nil
	}
	return nil, false, &Error{Kind: KindConflict, Detail: "sandbox " + s.ID + " is being created and deleted concurrently; retry"}
}

// checkOwner refuses to hand a sandbox to anyone but the user and thread it
// was made for. DeerFlow derives ids from user and thread, so without this
// anyone who can create could pre-create another user's sandbox and receive
// that user's agent traffic, or take over an existing one. The detail names
// neither the owner nor the URL.
func checkOwner(pod *corev1.Pod, s Spec) error {
	if !IsSandbox(pod, s.ID) {
		return &Error{Kind: KindConflict, Detail: "a Pod named " + pod.Name + " exists and is not a sandbox; choose another sandbox_id"}
	}
	if pod.Annotations[AnnotationUserID] != s.UserID || pod.Annotations[AnnotationThreadID] != s.ThreadID {
		return &Error{Kind: KindConflict, Detail: "sandbox " + s.ID + " exists for another user or thread; choose another sandbox_id"}
	}
	return nil
}

// checkCapacity refuses to reuse a Pod that was created for fewer shell
// sessions than now requested, so DeerFlow's backend replaces it.
func checkCapacity(pod *corev1.Pod, s Spec) error {
	if s.MaxShellSessions == 0 {
		return nil
	}
	have, err := strconv.Atoi(pod.Annotations[AnnotationMaxShellSessions])
	if err != nil {
		return &Error{Kind: KindConflict, Detail: "sandbox " + s.ID + " exists but was created without max_shell_sessions; delete it and create it again to get " + strconv.Itoa(s.MaxShellSessions)}
	}
	if have < s.MaxShellSessions {
		return &Error{Kind: KindConflict, Detail: "sandbox " + s.ID + " exists with capacity for " + strconv.Itoa(have) +
			" shell sessions, fewer than the " + strconv.Itoa(s.MaxShellSessions) + " requested; delete it and create it again"}
	}
	return nil
}

// ensureService creates the Service owned by pod, adopting or replacing an
// existing one. It reports whether it had to create one for a Pod that
// already existed (a repair). For a Pod that already existed it reads first,
// since the Service most likely exists too (DeerFlow creates on every reuse).
func (m *Manager) ensureService(ctx context.Context, s Spec, pod *corev1.Pod, readFirst bool) (*corev1.Service, bool, error) {
	want := BuildService(m.cfg, s, pod)
	svcs := m.client.CoreV1().Services(m.cfg.Namespace)
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		if !readFirst {
			created, err := svcs.Create(ctx, want, metav1.CreateOptions{})
			if err == nil {
				return created, true, nil
			}
			if !apierrors.IsAlreadyExists(err) {
				return nil, false, classify(err, "create the sandbox Service")
			}
		}
		readFirst = false
		existing, err := svcs.Get(ctx, want.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, false, classify(err, "read the existing sandbox Service")
		}
		if !IsSandbox(existing, s.ID) {
			return nil, false, &Error{Kind: KindConflict, Detail: "a Service named " + existing.Name + " exists and is not a sandbox's; choose another sandbox_id"}
		}
		switch owner := ownerUID(existing.OwnerReferences); {
		case owner == pod.UID && existing.DeletionTimestamp == nil:
			return existing, false, nil
		case owner == "" && existing.DeletionTimestamp == nil:
			// Made by DeerFlow's provisioner, which sets no owner: adopt it and
			// keep its node port, so a URL the backend holds stays valid.
			adopted, err := m.adopt(ctx, existing, pod)
			if err != nil {
				return nil, false, err
			}
			return adopted, false, nil
		default:
			// Left over from an earlier Pod of this id (the GC will remove it
			// anyway): remove it now so the new Pod gets its Service.
			err := svcs.Delete(ctx, existing.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(existing.UID))})
			if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return nil, false, classify(err, "replace a stale sandbox Service")
			}
			if err := sleepCtx(ctx, time.Duration(attempt+1)*100*time.Millisecond); err != nil {
				return nil, false, classify(err, "replace a stale sandbox Service")
			}
		}
	}
	return nil, false, &Error{Kind: KindConflict, Detail: "the Service of sandbox " + s.ID + " is changing concurrently; retry"}
}

func (m *Manager) adopt(ctx context.Context, svc *corev1.Service, pod *corev1.Pod) (*corev1.Service, error) {
	c := svc.DeepCopy()
	c.OwnerReferences = append(c.OwnerReferences, ownerRef(pod))
	updated, err := m.client.CoreV1().Services(m.cfg.Namespace).Update(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		return nil, classify(err, "adopt the existing sandbox Service")
	}
	return updated, nil
}

func ownerUID(refs []metav1.OwnerReference) types.UID {
	for _, r := range refs {
		if r.Kind == "Pod" && r.APIVersion == "v1" {
			return r.UID
		}
	}
	return ""
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
