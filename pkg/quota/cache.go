package quota

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// serviceCache is the quota's view of the sandboxes: every sandbox, of either
// workload kind, paused or not, has exactly one Service, so the sandbox
// Services are what the quota counts. A watch (one per replica, by label) keeps
// them in memory, stripped to the few fields the count reads, so that a
// create counts without listing anything: its cost no longer grows with the
// number of sandboxes. Nothing here is state that matters: a cold replica
// fills it with one list, and every answer waits until the cache holds
// the caller's own write (see seen).
type serviceCache struct {
	informer cache.SharedIndexInformer

	mu sync.Mutex
	// rv is the newest resourceVersion the cache has applied, and changed
	// is closed (and replaced) whenever it grows.
	rv      uint64
	changed chan struct{}
}

// indexByUser indexes the cached Services by the sandbox's user label.
const indexByUser = "user"

// newServiceCache makes the cache of namespace's sandbox Services; run starts it.
func newServiceCache(client kubernetes.Interface, namespace string) *serviceCache {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithNamespace(namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = resources.SelectorAll }))
	informer := factory.Core().V1().Services().Informer()
	s := &serviceCache{informer: informer, changed: make(chan struct{})}
	// The count reads names, labels, owners and timestamps: the rest of
	// each Service (spec, status, managed fields) is dropped on arrival, so
	// 5,000 sandboxes cost about a megabyte.
	_ = informer.SetTransform(func(obj any) (any, error) {
		svc, ok := obj.(*corev1.Service)
		if !ok {
			return obj, nil
		}
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{
			Name: svc.Name, Namespace: svc.Namespace, UID: svc.UID, ResourceVersion: svc.ResourceVersion,
			CreationTimestamp: svc.CreationTimestamp, DeletionTimestamp: svc.DeletionTimestamp,
			Labels:          map[string]string{keys.LabelApp: svc.Labels[keys.LabelApp], keys.LabelID: svc.Labels[keys.LabelID], keys.LabelUser: svc.Labels[keys.LabelUser], keys.LabelPrincipal: svc.Labels[keys.LabelPrincipal]},
			OwnerReferences: svc.OwnerReferences,
		}}, nil
	})
	_ = informer.AddIndexers(cache.Indexers{indexByUser: func(obj any) ([]string, error) {
		return []string{obj.(*corev1.Service).Labels[keys.LabelUser]}, nil
	}})
	// A handler runs after the informer's store applied the event it
	// reports, and events arrive in resourceVersion order: so once a
	// handler saw version v, the store holds every Service write up to v.
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { s.saw(obj) },
		UpdateFunc: func(_, obj any) { s.saw(obj) },
		DeleteFunc: func(obj any) { s.saw(obj) },
	})
	return s
}

// run feeds the cache until ctx ends.
func (s *serviceCache) run(ctx context.Context) { s.informer.Run(ctx.Done()) }

func (s *serviceCache) saw(obj any) {
	m, ok := obj.(metav1.Object) // not a DeletedFinalStateUnknown: it has no version
	if !ok {
		return
	}
	v, err := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if v > s.rv {
		s.rv = v
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// seen waits until the cache has applied every Service write up to own
// (so every sandbox whose Service was committed before own's is in it),
// and reports false when that took longer than within or ctx ended. A
// resourceVersion is etcd's revision: the API server exposes it as opaque,
// but the quota's freshness rests on the same reading (listFresh).
func (s *serviceCache) seen(ctx context.Context, own metav1.Object, within time.Duration) bool {
	want, err := strconv.ParseUint(own.GetResourceVersion(), 10, 64)
	if err != nil {
		return false
	}
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		s.mu.Lock()
		done, changed := s.rv >= want && s.informer.HasSynced(), s.changed
		s.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-changed:
		case <-timer.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// boundedBy reports, without waiting for the cache to show own, that a
// count as of own cannot exceed limit. Every write to etcd takes the next
// revision, and a resourceVersion is that revision, so at most own's
// version minus the cache's were written since the cache's state: even if
// each was a sandbox Service, cache and writes together stay within limit.
// (The cache may have applied more than its handlers reported, rv: a
// later state, as seen's own count would be.) It is false while the cache
// has seen no version, so a create then waits (seen) as before.
func (s *serviceCache) boundedBy(own metav1.Object, limit int) bool {
	want, err := strconv.ParseUint(own.GetResourceVersion(), 10, 64)
	if err != nil || limit <= 0 || !s.informer.HasSynced() {
		return false
	}
	s.mu.Lock()
	rv := s.rv
	s.mu.Unlock()
	if rv == 0 {
		return false
	}
	unseen := uint64(0)
	if want > rv {
		unseen = want - rv
	}
	return uint64(s.size())+unseen <= uint64(limit)
}

// synced waits, up to within, for the cache's first list.
func (s *serviceCache) synced(ctx context.Context, within time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	return cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced)
}

// services is every sandbox Service in the cache (user "" means all users).
func (s *serviceCache) services(user string) []metav1.Object {
	var objs []any
	if user == "" {
		objs = s.informer.GetStore().List()
	} else {
		objs, _ = s.informer.GetIndexer().ByIndex(indexByUser, user)
	}
	out := make([]metav1.Object, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*corev1.Service))
	}
	return out
}

// size is how many Services the cache holds, an upper bound of the count.
func (s *serviceCache) size() int { return len(s.informer.GetStore().ListKeys()) }
