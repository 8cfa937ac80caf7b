package sandbox

import (
	"context"
	"slices"
	"sort"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"golang.org/x/sync/errgroup"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// List returns every sandbox of the caller (of everyone for an
// administrator) in the namespace, whole or half-present, in
// three API calls whatever the count: one list per kind (Pods, ReplicaSets,
// Services), by label, issued concurrently; and a fourth after them, for
// the pooled Pods' wires, only when a sandbox listed was claimed wired (it
// answers with its wire's URL). DeerFlow's provisioner made one
// call per sandbox.
func (m *Manager) List(ctx context.Context) ([]api.Sandbox, error) {
	c, err := api.RequireCaller(ctx)
	if err != nil {
		return nil, err
	}
	all, err := m.listAll(ctx, resources.ListSelector(c), false)
	if err != nil {
		return nil, err
	}
	if all.wires, err = m.listWires(ctx, all.svcs); err != nil {
		return nil, err
	}
	byID := all.byID()
	ids := make([]string, 0, len(byID))
	for id, f := range byID {
		if seesSandbox(c, *f) {
			ids = append(ids, id)
		}
	}
	sort.Strings(ids)
	out := make([]api.Sandbox, 0, len(ids))
	for _, id := range ids {
		out = append(out, m.view(id, *byID[id]))
	}
	return out, nil
}

// everything is one list of each kind of sandbox object.
type everything struct {
	pods []corev1.Pod
	rss  []appsv1.ReplicaSet
	svcs []corev1.Service
	// wires are the pooled Pods' own Services, by name: the URL of a
	// sandbox claimed wired (listed only where list answers URLs).
	wires map[string]*corev1.Service
}

// byID groups the lists into sandboxes, as fetch reads one: objects being
// deleted are gone, a ReplicaSet's Pods are found through their controller.
func (e everything) byID() map[string]*found {
	out := map[string]*found{}
	get := func(id string) *found {
		if out[id] == nil {
			out[id] = &found{}
		}
		return out[id]
	}
	for i := range e.svcs {
		if id := resources.ServiceID(&e.svcs[i]); id != "" {
			get(id).svc = &e.svcs[i]
		}
	}
	for i := range e.rss {
		if id := resources.ReplicaSetID(&e.rss[i]); id != "" && e.rss[i].DeletionTimestamp == nil {
			get(id).rs = &e.rss[i]
		}
	}
	for i := range e.pods {
		if id := resources.PodID(&e.pods[i]); id != "" && e.pods[i].DeletionTimestamp == nil {
			if f := get(id); f.rs == nil {
				f.pod = &e.pods[i]
			} else {
				f.stray = &e.pods[i]
			}
		}
	}
	for _, f := range out {
		if name := resources.URLService(f.svc); name != "" {
			f.wire = e.wires[name]
		}
		if f.rs != nil && !resources.Paused(f.rs) {
			f.pod = resources.CurrentPod(resources.ControlledPods(f.rs, e.pods))
		}
	}
	return out
}

// listAll lists every sandbox object selector selects. servicesFirst
// lists the Services before the workloads (the reap): every Service bound
// then has its workload in the later lists, so none is taken for an orphan
// because its workload was created between the lists.
func (m *Manager) listAll(ctx context.Context, selector string, servicesFirst bool) (everything, error) {
	var e everything
	opts := metav1.ListOptions{LabelSelector: selector}
	if servicesFirst {
		l, err := m.client.CoreV1().Services(m.cfg.Namespace).List(ctx, opts)
		if err != nil {
			return e, api.Classify(err, "list sandbox Services")
		}
		e.svcs = l.Items
	}
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		l, err := m.client.CoreV1().Pods(m.cfg.Namespace).List(gctx, opts)
		if err != nil {
			return api.Classify(err, "list sandbox Pods")
		}
		e.pods = l.Items
		return nil
	})
	g.Go(func() error {
		l, err := m.client.AppsV1().ReplicaSets(m.cfg.Namespace).List(gctx, opts)
		if err != nil {
			return api.Classify(err, "list sandbox ReplicaSets")
		}
		e.rss = l.Items
		return nil
	})
	g.Go(func() error {
		if servicesFirst {
			return nil
		}
		l, err := m.client.CoreV1().Services(m.cfg.Namespace).List(gctx, opts)
		if err != nil {
			return api.Classify(err, "list sandbox Services")
		}
		e.svcs = l.Items
		return nil
	})
	return e, g.Wait()
}

// listWires lists the pooled Pods' wires, by name, when one of svcs names
// one for its URL (nil, and no call, otherwise).
func (m *Manager) listWires(ctx context.Context, svcs []corev1.Service) (map[string]*corev1.Service, error) {
	if !slices.ContainsFunc(svcs, func(s corev1.Service) bool { return resources.URLService(&s) != "" }) {
		return nil, nil
	}
	l, err := m.client.CoreV1().Services(m.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: resources.SelectorWires})
	if err != nil {
		return nil, api.Classify(err, "list the pooled Pods' Services")
	}
	wires := make(map[string]*corev1.Service, len(l.Items))
	for i := range l.Items {
		wires[l.Items[i].Name] = &l.Items[i]
	}
	return wires, nil
}
