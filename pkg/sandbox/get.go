package sandbox

import (
	"context"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Get returns one sandbox. Only the absence of both its Pod and its Service
// is "not found"; any failure to ask is a transient error, never a 404,
// because DeerFlow deletes its record of a sandbox on 404. A Get counts as
// activity. With wait > 0 it waits (by watch) until the Pod is Ready.
func (m *Manager) Get(ctx context.Context, id string, wait time.Duration) (Sandbox, error) {
	if err := ValidateID(id); err != nil {
		return Sandbox{}, err
	}
	release, err := m.admitWait(wait)
	if err != nil {
		return Sandbox{}, err
	}
	defer release()
	pod, svc, err := m.fetch(ctx, id)
	if err != nil {
		return Sandbox{}, err
	}
	if pod == nil && svc == nil {
		return Sandbox{}, &Error{Kind: KindNotFound, Detail: "sandbox " + id + " not found"}
	}
	if pod != nil {
		pod = m.touch(ctx, pod)
		if wait > 0 {
			return m.waitReady(ctx, id, pod, svc, wait)
		}
	}
	return m.view(id, pod, svc), nil
}

// fetch reads a sandbox's Pod and Service concurrently; nil means absent.
// An object with the name but not the sandbox labels is absent too.
func (m *Manager) fetch(ctx context.Context, id string) (*corev1.Pod, *corev1.Service, error) {
	var (
		wg             sync.WaitGroup
		pod            *corev1.Pod
		svc            *corev1.Service
		podErr, svcErr error
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		pod, podErr = m.client.CoreV1().Pods(m.cfg.Namespace).Get(ctx, PodName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(podErr) || (podErr == nil && (pod.DeletionTimestamp != nil || !IsSandbox(pod, id))) {
			pod, podErr = nil, nil // a terminating Pod is already gone to our callers
		}
	}()
	go func() {
		defer wg.Done()
		svc, svcErr = m.client.CoreV1().Services(m.cfg.Namespace).Get(ctx, ServiceName(id), metav1.GetOptions{})
		if apierrors.IsNotFound(svcErr) || (svcErr == nil && !IsSandbox(svc, id)) {
			svc, svcErr = nil, nil
		}
	}()
	wg.Wait()
	if podErr != nil {
		return nil, nil, classify(podErr, "read the sandbox Pod")
	}
	if svcErr != nil {
		return nil, nil, classify(svcErr, "read the sandbox Service")
	}
	return pod, svc, nil
}
