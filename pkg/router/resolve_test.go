package router

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	listersappsv1 "k8s.io/client-go/listers/apps/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

const ns = "sandboxes"

var created = metav1.NewTime(time.Date(2026, 11, 28, 11, 0, 0, 0, time.UTC))

// sandboxPod is bare sandbox abc's Pod, as the function makes it.
func sandboxPod(mod func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox-abc", Namespace: ns, UID: "uid-abc", CreationTimestamp: created,
			Labels: map[string]string{
				keys.LabelApp: keys.LabelAppValue, keys.LabelID: "abc", keys.LabelToken: "tok",
				keys.LabelPod: "sandbox-abc", LabelEnvd: "true",
			},
			Annotations: map[string]string{keys.AnnotationPrincipal: "alice", keys.AnnotationCreatedAt: "2026-11-28T11:00:00Z"},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "sandbox", Ports: []corev1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 3000, Protocol: corev1.ProtocolTCP}}},
			{Name: "side", Ports: []corev1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 53, Protocol: corev1.ProtocolUDP}}},
		}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.244.0.7", PodIPs: []corev1.PodIP{{IP: "10.244.0.7"}}},
	}
	if mod != nil {
		mod(p)
	}
	return p
}

// sandboxService is sandbox abc's Service, selecting its id, token and pin.
func sandboxService(mod func(*corev1.Service)) *corev1.Service {
	s := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: resources.ServiceName("abc"), Namespace: ns,
			Labels: map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: "abc"}},
		Spec: corev1.ServiceSpec{Selector: map[string]string{keys.LabelID: "abc", keys.LabelToken: "tok", keys.LabelPod: "sandbox-abc"}},
	}
	if mod != nil {
		mod(s)
	}
	return s
}

// claimed turns sandboxPod into one claimed from a wired pool, and returns
// its wire and its sandbox's reference Service (resources.Reference).
func claimed() (*corev1.Pod, *corev1.Service, *corev1.Service) {
	const name = "sandbox-pool-py-x7k2p"
	pod := sandboxPod(func(p *corev1.Pod) {
		p.Name, p.UID = name, "uid-pooled"
		p.Labels[keys.LabelPod] = name
		p.Labels[keys.LabelPooled] = "true"
	})
	owner := []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: name, UID: pod.UID}}
	wire := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, OwnerReferences: owner,
			Labels: map[string]string{keys.LabelComponent: keys.ComponentWireValue, keys.LabelManagedBy: keys.ManagedByValue}},
		Spec: corev1.ServiceSpec{Selector: resources.WireSelector(name, "tok")},
	}
	svc := sandboxService(func(s *corev1.Service) { s.OwnerReferences = owner })
	resources.Reference(svc, wire)
	return pod, wire, svc
}

func newCache(t *testing.T, pods []*corev1.Pod, svcs ...*corev1.Service) Cache {
	t.Helper()
	pi := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{IDIndex: IndexByID})
	si := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	wi := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, p := range pods {
		if err := pi.Add(p); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range svcs {
		// As cmd/router's two informers split them by label.
		into := si
		if s.Labels[keys.LabelComponent] == keys.ComponentWireValue {
			into = wi
		}
		if err := into.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	return Cache{
		Pods:     pi,
		Services: listerscorev1.NewServiceLister(si).Services(ns),
		Wires:    listerscorev1.NewServiceLister(wi).Services(ns),
	}
}

func TestResolve(t *testing.T) {
	want := Target{
		Pod: "sandbox-abc", UID: "uid-abc", IP: "10.244.0.7", Envd: true, Ports: []int32{3000, 8080},
		Sandbox: access.Sandbox{Principal: "alice", ID: "abc", CreatedAt: "2026-11-28T11:00:00Z"},
	}
	gone := metav1.NewTime(created.Add(time.Minute))
	pooled, wire, ref := claimed()
	wantPooled := want
	wantPooled.Pod, wantPooled.UID = pooled.Name, string(pooled.UID)
	rows := []struct {
		name    string
		pods    []*corev1.Pod
		svcs    []*corev1.Service
		want    Target
		wantErr error
	}{{
		name: "a bare sandbox's Pod", pods: []*corev1.Pod{sandboxPod(nil)}, svcs: []*corev1.Service{sandboxService(nil)}, want: want,
	}, {
		name: "no Service", pods: []*corev1.Pod{sandboxPod(nil)}, wantErr: ErrNotFound,
	}, {
		name: "a terminating Service", pods: []*corev1.Pod{sandboxPod(nil)},
		svcs:    []*corev1.Service{sandboxService(func(s *corev1.Service) { s.DeletionTimestamp = &gone })},
		wantErr: ErrNotFound,
	}, {
		name: "a Service labelled for another id", pods: []*corev1.Pod{sandboxPod(nil)},
		svcs:    []*corev1.Service{sandboxService(func(s *corev1.Service) { s.Labels[keys.LabelID] = "xyz" })},
		wantErr: ErrNotFound,
	}, {
		name: "no Pod", svcs: []*corev1.Service{sandboxService(nil)}, wantErr: ErrNotFound,
	}, {
		name: "a Pod whose token is not its Service's",
		pods: []*corev1.Pod{sandboxPod(func(p *corev1.Pod) { p.Labels[keys.LabelToken] = "other" })},
		svcs: []*corev1.Service{sandboxService(nil)}, wantErr: ErrNotFound,
	}, {
		name: "a Service that selects no token (from before tokens)", pods: []*corev1.Pod{sandboxPod(nil)},
		svcs:    []*corev1.Service{sandboxService(func(s *corev1.Service) { delete(s.Spec.Selector, keys.LabelToken) })},
		wantErr: ErrNotFound,
	}, {
		name: "a Pod without the Service's pin", pods: []*corev1.Pod{sandboxPod(func(p *corev1.Pod) { delete(p.Labels, keys.LabelPod) })},
		svcs: []*corev1.Service{sandboxService(nil)}, wantErr: ErrNotFound,
	}, {
		name: "an unclaimed pooled Pod", pods: []*corev1.Pod{sandboxPod(func(p *corev1.Pod) { p.Labels[keys.LabelPool] = "py" })},
		svcs: []*corev1.Service{sandboxService(nil)}, wantErr: ErrNotFound,
	}, {
		name: "a Pod not labelled as a sandbox", pods: []*corev1.Pod{sandboxPod(func(p *corev1.Pod) { delete(p.Labels, keys.LabelApp) })},
		svcs: []*corev1.Service{sandboxService(func(s *corev1.Service) { delete(s.Spec.Selector, keys.LabelPod) })}, wantErr: ErrNotFound,
	}, {
		name: "another create's Pod of the same id beside the sandbox's",
		pods: []*corev1.Pod{
			sandboxPod(func(p *corev1.Pod) {
				p.Name, p.Labels[keys.LabelToken], p.Status.PodIP = "sandbox-abc-other", "theirs", "10.244.0.9"
				p.CreationTimestamp = gone
			}),
			sandboxPod(nil),
		},
		svcs: []*corev1.Service{sandboxService(nil)}, want: want,
	}, {
		name: "a Pod not running", pods: []*corev1.Pod{sandboxPod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending })},
		svcs: []*corev1.Service{sandboxService(nil)}, wantErr: ErrNotRunning,
	}, {
		name: "a Pod without an IP", pods: []*corev1.Pod{sandboxPod(func(p *corev1.Pod) { p.Status.PodIP, p.Status.PodIPs = "", nil })},
		svcs: []*corev1.Service{sandboxService(nil)}, wantErr: ErrNotRunning,
	}, {
		name: "a Pod on the host network", pods: []*corev1.Pod{sandboxPod(func(p *corev1.Pod) { p.Spec.HostNetwork = true })},
		svcs: []*corev1.Service{sandboxService(nil)}, wantErr: ErrNotRunning,
	}, {
		name: "a terminating Pod", pods: []*corev1.Pod{sandboxPod(func(p *corev1.Pod) { p.DeletionTimestamp = &gone })},
		svcs: []*corev1.Service{sandboxService(nil)}, wantErr: ErrNotRunning,
	}, {
		name: "a ReplicaSet sandbox's live Pod beside its terminating one",
		pods: []*corev1.Pod{
			sandboxPod(func(p *corev1.Pod) {
				p.Name, p.DeletionTimestamp, p.CreationTimestamp = "sandbox-abc-old", &gone, gone
				p.Labels[keys.LabelWorkload] = keys.WorkloadReplicaSetValue
				delete(p.Labels, keys.LabelPod)
			}),
			sandboxPod(func(p *corev1.Pod) {
				p.Name = "sandbox-abc"
				p.Labels[keys.LabelWorkload] = keys.WorkloadReplicaSetValue
				delete(p.Labels, keys.LabelPod)
			}),
		},
		svcs: []*corev1.Service{sandboxService(func(s *corev1.Service) {
			delete(s.Spec.Selector, keys.LabelPod)
			s.Spec.Selector[keys.LabelWorkload] = keys.WorkloadReplicaSetValue
		})},
		want: want,
	}, {
		name: "a Pod claimed from a wired pool", pods: []*corev1.Pod{pooled}, svcs: []*corev1.Service{ref, wire}, want: wantPooled,
	}, {
		name: "a Pod claimed from a wired pool whose wire is gone", pods: []*corev1.Pod{pooled}, svcs: []*corev1.Service{ref},
		wantErr: ErrNotFound,
	}, {
		name: "a wire owned by another Pod", pods: []*corev1.Pod{pooled},
		svcs: []*corev1.Service{ref, func() *corev1.Service {
			w := wire.DeepCopy()
			w.OwnerReferences[0].UID = types.UID("uid-other")
			return w
		}()},
		wantErr: ErrNotFound,
	}, {
		name: "a wire selecting another token", pods: []*corev1.Pod{pooled},
		svcs: []*corev1.Service{ref, func() *corev1.Service {
			w := wire.DeepCopy()
			w.Spec.Selector = resources.WireSelector(pooled.Name, "other")
			return w
		}()},
		wantErr: ErrNotFound,
	}, {
		name: "a reference Service owned by another Pod", pods: []*corev1.Pod{pooled},
		svcs: []*corev1.Service{func() *corev1.Service {
			s := ref.DeepCopy()
			s.OwnerReferences[0].UID = types.UID("uid-other")
			return s
		}(), wire},
		wantErr: ErrNotFound,
	}, {
		name: "a reference Service naming another Pod's wire",
		pods: []*corev1.Pod{sandboxPod(nil)},
		svcs: []*corev1.Service{func() *corev1.Service {
			s := ref.DeepCopy()
			s.OwnerReferences[0].UID = "uid-abc"
			return s
		}(), wire},
		wantErr: ErrNotFound,
	}}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			got, err := newCache(t, r.pods, r.svcs...).Resolve("abc")
			if r.wantErr != nil {
				if !errors.Is(err, r.wantErr) {
					t.Fatalf("Resolve = %+v, %v; want an error wrapping %q", got, err, r.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if d := cmp.Diff(r.want, got); d != "" {
				t.Errorf("Resolve (-want +got):\n%s", d)
			}
		})
	}
}

func TestTargetPorts(t *testing.T) {
	rows := []struct {
		name    string
		t       Target
		open    []int
		closed  []int
		listing string
	}{
		{"agent and app", Target{Envd: true, Ports: []int32{3000, 8080}}, []int{EnvdPort, 3000, 8080}, []int{80, 49982}, "3000, 8080, 49983"},
		{"no agent, though a container declares its port", Target{Ports: []int32{8080, EnvdPort}}, []int{8080}, []int{EnvdPort}, "8080"},
		{"nothing", Target{}, nil, []int{EnvdPort, 8080}, "none"},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			for _, p := range r.open {
				if !r.t.Exposes(p) {
					t.Errorf("Exposes(%d) = false; want true", p)
				}
			}
			for _, p := range r.closed {
				if r.t.Exposes(p) {
					t.Errorf("Exposes(%d) = true; want false", p)
				}
			}
			if got := r.t.PortList(); got != r.listing {
				t.Errorf("PortList = %q; want %q", got, r.listing)
			}
		})
	}
}

// TestResolveEndsAtTheSandboxEnd: from the second a sandbox's end (last
// activity plus idle timeout, capped by its lifetime) passes, it takes no
// traffic (E2B's setTimeout: isRunning is false then), though the reap
// removes it later; one that resumes on traffic still takes it, and one
// that records no lifetime never ends here.
func TestResolveEndsAtTheSandboxEnd(t *testing.T) {
	at := created.Add(time.Minute) // abc's activity, idle timeout 60 s: its end is created + 2m
	withLifetime := func(a map[string]string) {
		a[keys.AnnotationLastActivity], a[keys.AnnotationIdleTimeout], a[keys.AnnotationMaxLifetime] = at.Format(time.RFC3339), "60", "3600"
	}
	rsPod := func(p *corev1.Pod) { p.Labels[keys.LabelWorkload] = keys.WorkloadReplicaSetValue }
	rsOf := func(autoResume bool) *appsv1.ReplicaSet {
		a := map[string]string{keys.AnnotationCreatedAt: "2026-11-28T11:00:00Z"}
		withLifetime(a)
		if autoResume {
			a[keys.AnnotationAutoResume] = "true"
		}
		return &appsv1.ReplicaSet{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-abc", Namespace: ns, Annotations: a}}
	}
	cases := []struct {
		name  string
		pod   func(*corev1.Pod)
		rs    *appsv1.ReplicaSet
		now   time.Duration // after the end
		ended bool
	}{
		{name: "a bare Pod a second before its end", pod: func(p *corev1.Pod) { withLifetime(p.Annotations) }, now: -time.Second},
		{name: "a bare Pod at its end", pod: func(p *corev1.Pod) { withLifetime(p.Annotations) }, ended: true},
		{name: "a bare Pod with no lifetime", now: time.Hour},
		{name: "a bare Pod Ready 30 s after its activity, 20 s past the end its activity gives", now: 20 * time.Second, pod: func(p *corev1.Pod) {
			withLifetime(p.Annotations)
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(at.Add(30 * time.Second))}}
		}},
		{name: "the same, 30 s past it", now: 30 * time.Second, ended: true, pod: func(p *corev1.Pod) {
			withLifetime(p.Annotations)
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.NewTime(at.Add(30 * time.Second))}}
		}},
		{name: "a ReplicaSet's Pod past its ReplicaSet's end", pod: rsPod, rs: rsOf(false), now: time.Second, ended: true},
		{name: "one that resumes on traffic", pod: rsPod, rs: rsOf(true), now: time.Second},
		{name: "a ReplicaSet's Pod, its ReplicaSet not cached", pod: rsPod, now: time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cc := newCache(t, []*corev1.Pod{sandboxPod(c.pod)}, sandboxService(nil))
			if c.rs != nil {
				cc.ReplicaSets = listersappsv1.NewReplicaSetLister(indexOf(t, c.rs)).ReplicaSets(ns)
			}
			cc.Now = func() time.Time { return at.Add(time.Minute + c.now) }
			_, err := cc.Resolve("abc")
			if ended := errors.Is(err, ErrNotFound); ended != c.ended || !ended && err != nil {
				t.Errorf("Resolve = %v; want ended %v", err, c.ended)
			}
		})
	}
}
