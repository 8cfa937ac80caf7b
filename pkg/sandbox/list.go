package sandbox

import (
	"context"
	"sort"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// List returns every sandbox in the namespace, whole or half-present, in two
// API calls whatever the count: one Pod list and one Service list, by label,
// issued concurrently. DeerFlow's provisioner made one call per sandbox.
func (m *Manager) List(ctx context.Context) ([]Sandbox, error) {
	pods, svcs, err := m.listAll(ctx)
	if err != nil {
		return nil, err
	}
	byID := map[string]*corev1.Pod{}
	for i := range pods {
		if id := podID(&pods[i]); id != "" && pods[i].DeletionTimestamp == nil {
			byID[id] = &pods[i]
		}
	}
	svcByID := map[string]*corev1.Service{}
	for i := range svcs {
		if id := serviceID(&svcs[i]); id != "" {
			svcByID[id] = &svcs[i]
		}
	}
	ids := make([]string, 0, len(byID)+len(svcByID))
	for id := range byID {
		ids = append(ids, id)
	}
	for id := range svcByID {
		if byID[id] == nil {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := make([]Sandbox, 0, len(ids))
	for _, id := range ids {
		out = append(out, m.view(id, byID[id], svcByID[id]))
	}
	return out, nil
}

func (m *Manager) listAll(ctx context.Context) ([]corev1.Pod, []corev1.Service, error) {
	var (
		wg             sync.WaitGroup
		pods           *corev1.PodList
		svcs           *corev1.ServiceList
		podErr, svcErr error
	)
	opts := metav1.ListOptions{LabelSelector: selectorAll}
	wg.Add(2)
	go func() {
		defer wg.Done()
		pods, podErr = m.client.CoreV1().Pods(m.cfg.Namespace).List(ctx, opts)
	}()
	go func() {
		defer wg.Done()
		svcs, svcErr = m.client.CoreV1().Services(m.cfg.Namespace).List(ctx, opts)
	}()
	wg.Wait()
	if podErr != nil {
		return nil, nil, classify(podErr, "list sandbox Pods")
	}
	if svcErr != nil {
		return nil, nil, classify(svcErr, "list sandbox Services")
	}
	return pods.Items, svcs.Items, nil
}
