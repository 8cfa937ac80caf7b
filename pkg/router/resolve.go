package router

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	listersappsv1 "k8s.io/client-go/listers/apps/v1"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/status"
)

// LabelEnvd ("true") marks a sandbox Pod whose sandbox container carries the
// agent (cmd/envd): the router opens EnvdPort on those Pods alone.
// TODO(lead): move to pkg/keys.
const (
	LabelEnvd      = keys.Prefix + "envd"
	LabelEnvdValue = "true"
)

// EnvdPort is the agent's port, as E2B's SDK knows it.
const EnvdPort = 49983

// Target is where a sandbox's traffic goes, and what its tokens are made of.
type Target struct {
	Pod string // the Pod's name, for logs
	UID string // the Pod's, which the router's record of the agents it initialised keys
	IP  string
	// Sandbox is what the sandbox's tokens are bound to (its Pod's principal
	// and created-at annotations and its id).
	Sandbox access.Sandbox
	// Envd says the Pod carries the agent (LabelEnvd).
	Envd bool
	// Ports are the TCP containerPorts of the Pod's containers, sorted,
	// without repeats.
	Ports []int32
	// Ready: the Pod's Ready condition is true (its agent answers).
	Ready bool
	// Paused: with ErrPaused, the sandbox's ReplicaSet has no replica yet
	// (false: it is resuming).
	Paused bool
	// Failure: with ErrPaused while resuming, why the ReplicaSet's
	// controller could not make the next Pod, as it reported after it saw
	// the resume (its ReplicaFailure condition: a quota, an admission
	// policy, a deleted ServiceAccount): the held requests need not wait
	// for their hold to end to be told.
	Failure string
}

// Resolver finds a sandbox's Pod.
type Resolver interface {
	// Resolve returns the sandbox's Target, or an error wrapping ErrNotFound
	// or ErrNotRunning.
	Resolve(id string) (Target, error)
}

var (
	// ErrNotFound: no sandbox of that id, as far as the router can tell (no
	// Service, or no Pod that its Service selects).
	ErrNotFound = errors.New("not found")
	// ErrNotRunning: the sandbox's Pod exists but cannot take traffic (not
	// Running, no IP yet, or terminating).
	ErrNotRunning = errors.New("not running")
	// ErrGone: the sandbox's Service is gone (or going): the sandbox is
	// (ErrNotFound), whatever becomes of its Pod.
	ErrGone = fmt.Errorf("%w: it has no live Service", ErrNotFound)
	// ErrPaused: the sandbox is paused and resumes on traffic
	// (keys.AnnotationAutoResume). Resolve's Target then says what its Pod
	// will be (its tokens' sandbox, agent and ports), without an IP.
	ErrPaused = errors.New("paused, resumes on traffic")
)

// IDIndex is the name of the Pod index by sandbox id (IndexByID).
const IDIndex = "sandboxID"

// IndexByID indexes a Pod under its sandbox id label, if it has one.
func IndexByID(obj any) ([]string, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	if id := p.Labels[keys.LabelID]; id != "" {
		return []string{id}, nil
	}
	return nil, nil
}

// Cache resolves sandboxes from informer caches: sandbox Pods indexed by
// IndexByID, sandbox Services (app=deer-flow-sandbox) and pooled Pods' wires
// (resources.SelectorWires), all of one namespace.
type Cache struct {
	Pods     cache.Indexer
	Services listerscorev1.ServiceNamespaceLister
	Wires    listerscorev1.ServiceNamespaceLister
	// ReplicaSets are the sandbox ReplicaSets, to tell a paused sandbox
	// that resumes on traffic (nil: none does).
	ReplicaSets listersappsv1.ReplicaSetNamespaceLister
	// Now is the clock a sandbox's end is read against (nil: time.Now).
	Now func() time.Time
}

// Resolve finds the one Pod that sandbox id's Service (sandbox-<id>-svc)
// selects. The id is the caller's to choose, so a Pod of another principal's
// failed create of the same id can carry it too; what ties a Pod to the
// sandbox is the Service's selector, which names the token the function
// wrote on the sandbox's own workload (and its pin), as the egress proxy
// decides (cmd/proxy). A sandbox claimed from a wired pooled Pod has a
// Service that selects nothing (resources.Reference): there the wire it
// names, which is the Pod's own and owned by it, must select the Pod.
func (c Cache) Resolve(id string) (Target, error) {
	svc, err := c.Services.Get(resources.ServiceName(id))
	if apierrors.IsNotFound(err) {
		return Target{}, fmt.Errorf("sandbox %s has no Service: %w", id, ErrGone)
	} else if err != nil {
		return Target{}, fmt.Errorf("sandbox %s's Service: %w", id, err)
	}
	if svc.DeletionTimestamp != nil || resources.ServiceID(svc) != id {
		return Target{}, fmt.Errorf("Service %s is no live Service of sandbox %s: %w", svc.Name, id, ErrGone)
	}
	var wire *corev1.Service
	if name := resources.URLService(svc); name != "" {
		if wire, err = c.Wires.Get(name); apierrors.IsNotFound(err) {
			return Target{}, fmt.Errorf("sandbox %s's wire %s is gone: %w", id, name, ErrNotFound)
		} else if err != nil {
			return Target{}, fmt.Errorf("sandbox %s's wire %s: %w", id, name, err)
		}
	}
	objs, err := c.Pods.ByIndex(IDIndex, id)
	if err != nil {
		return Target{}, fmt.Errorf("pod index: %w", err)
	}
	var selected []*corev1.Pod
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && Selects(svc, wire, p) {
			selected = append(selected, p)
		}
	}
	if len(selected) == 0 {
		if t, ok := c.paused(svc, id); ok {
			return t, fmt.Errorf("sandbox %s is paused or resuming: %w", id, ErrPaused)
		}
		return Target{}, fmt.Errorf("no Pod of sandbox %s is the one its Service selects: %w", id, ErrNotFound)
	}
	// A ReplicaSet sandbox may briefly have a terminating Pod beside its
	// next one: take a live one, the newest (the Service would balance
	// over all; any is the sandbox).
	slices.SortFunc(selected, func(a, b *corev1.Pod) int {
		if c := b.CreationTimestamp.Compare(a.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, p := range selected {
		if ip := podIP(p); ip != "" && p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning {
			if t, ok := c.paused(svc, id); ok && t.Paused {
				// Paused a moment ago: its controller has yet to take the
				// Pod away, and would cut what reached it. Wake it instead.
				return t, fmt.Errorf("sandbox %s is paused, its Pod %s going: %w", id, p.Name, ErrPaused)
			}
			if c.ended(p, id) {
				return Target{}, fmt.Errorf("sandbox %s is past its end: %w", id, ErrNotFound)
			}
			return targetOf(p, id, ip), nil
		}
	}
	if t, ok := c.paused(svc, id); ok {
		return t, fmt.Errorf("sandbox %s is resuming: %w", id, ErrPaused)
	}
	p := selected[0]
	return Target{}, fmt.Errorf("sandbox %s's Pod %s is not running (phase %s%s): %w", id, p.Name, p.Status.Phase, why(p), ErrNotRunning)
}

// ended says the sandbox's end (its idle deadline capped by its lifetime,
// on its workload: resources.LifetimeOf, the idle time counted from its
// Pod's readiness when that came later) has passed, so it takes no more
// traffic from that second (E2B's setTimeout), though the reap that
// deletes or pauses it runs later. A sandbox that resumes on traffic still
// takes it, as traffic would wake it once paused; one whose workload
// records no lifetime (or whose ReplicaSet is not in the cache) has none.
func (c Cache) ended(p *corev1.Pod, id string) bool {
	var w metav1.Object = p
	if p.Labels[keys.LabelWorkload] == keys.WorkloadReplicaSetValue {
		if c.ReplicaSets == nil {
			return false
		}
		rs, err := c.ReplicaSets.Get(resources.PodName(id))
		if err != nil || rs.Annotations[keys.AnnotationAutoResume] == "true" {
			return false
		}
		w = rs
	}
	l, ok := resources.LifetimeOf(w)
	if !ok {
		return false
	}
	// The idle timeout runs from the later of the last activity and the
	// Pod's readiness: a create marks its activity before a cold start of
	// seconds, and a sandbox asked to live 5 s should have them running.
	if ready := status.ReadySince(p); status.Ready(p) && ready.After(l.LastActivity) {
		l.LastActivity = ready
	}
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	return !now().Before(l.ExpiresAt())
}

// paused finds the ReplicaSet that owns svc (by UID), when it resumes on
// traffic (keys.AnnotationAutoResume) and is not being deleted, for a
// sandbox with no running Pod: paused, or resuming. It returns the Target
// its next Pod will be: its Pod template's principal, created-at, agent
// and ports, which its tokens are bound to.
func (c Cache) paused(svc *corev1.Service, id string) (Target, bool) {
	if c.ReplicaSets == nil {
		return Target{}, false
	}
	rs, err := c.ReplicaSets.Get(resources.PodName(id))
	if err != nil || rs.DeletionTimestamp != nil || rs.Annotations[keys.AnnotationAutoResume] != "true" ||
		resources.OwnerUID(svc.OwnerReferences) != rs.UID || !resources.IsSandbox(rs, id) {
		return Target{}, false
	}
	p := &corev1.Pod{ObjectMeta: *rs.Spec.Template.ObjectMeta.DeepCopy(), Spec: rs.Spec.Template.Spec}
	p.Name = rs.Name // for logs: its Pods' names are the ReplicaSet controller's
	if p.Annotations[keys.AnnotationPrincipal] == "" {
		p.Annotations = rs.Annotations // the principal and created-at are the ReplicaSet's too
	}
	t := targetOf(p, id, "")
	t.Paused = resources.Paused(rs)
	if !t.Paused && rs.Status.ObservedGeneration >= rs.Generation {
		// The status is of the resume (a scale is a new generation), so a
		// failure in it is this resume's, not one from before.
		for _, c := range rs.Status.Conditions {
			if c.Type == appsv1.ReplicaSetReplicaFailure && c.Status == corev1.ConditionTrue {
				t.Failure = fmt.Sprintf("%s: %s", c.Reason, c.Message)
			}
		}
	}
	return t, true
}

func why(p *corev1.Pod) string {
	switch {
	case p.DeletionTimestamp != nil:
		return ", terminating"
	case podIP(p) == "":
		return ", no IP yet"
	}
	return ""
}

// Selects reports whether pod is the Pod of the sandbox whose Service is
// svc: a sandbox Pod of svc's id, not an unclaimed pooled Pod, carrying a
// token, and matched by what svc selects (its id, that token and its pin),
// or, when svc refers to a wire (resources.URLService), by that wire, which
// must be pod's own (named as pod, owned by its UID, as svc is).
func Selects(svc, wire *corev1.Service, pod *corev1.Pod) bool {
	id := resources.ServiceID(svc)
	token := pod.Labels[keys.LabelToken]
	if id == "" || !resources.IsSandbox(pod, id) || token == "" {
		return false
	}
	if _, pooled := pod.Labels[keys.LabelPool]; pooled {
		return false
	}
	sel := svc.Spec.Selector
	if name := resources.URLService(svc); name != "" {
		if wire == nil || wire.Name != name || name != pod.Name || pod.UID == "" || wire.DeletionTimestamp != nil ||
			resources.OwnerUID(svc.OwnerReferences) != pod.UID || resources.OwnerUID(wire.OwnerReferences) != pod.UID ||
			wire.Labels[keys.LabelComponent] != keys.ComponentWireValue {
			return false
		}
		sel = wire.Spec.Selector
	} else if sel[keys.LabelID] != id {
		return false
	}
	// The token is what a Pod of another create of the id cannot know: a
	// selector without it (a Service from before tokens) ties nothing.
	if sel[keys.LabelToken] != token {
		return false
	}
	return labels.SelectorFromSet(sel).Matches(labels.Set(pod.Labels))
}

func podIP(p *corev1.Pod) string {
	if p.Spec.HostNetwork {
		// Its IP is the node's: no sandbox's address.
		return ""
	}
	if p.Status.PodIP != "" {
		return p.Status.PodIP
	}
	if len(p.Status.PodIPs) > 0 {
		return p.Status.PodIPs[0].IP
	}
	return ""
}

func targetOf(p *corev1.Pod, id, ip string) Target {
	t := Target{
		Pod: p.Name,
		UID: string(p.UID),
		IP:  ip,
		Sandbox: access.Sandbox{
			Principal: p.Annotations[keys.AnnotationPrincipal],
			ID:        id,
			CreatedAt: p.Annotations[keys.AnnotationCreatedAt],
		},
		Envd:  p.Labels[LabelEnvd] == LabelEnvdValue,
		Ready: status.Ready(p),
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) && cp.ContainerPort > 0 && !slices.Contains(t.Ports, cp.ContainerPort) {
				t.Ports = append(t.Ports, cp.ContainerPort)
			}
		}
	}
	slices.Sort(t.Ports)
	return t
}

// Exposes reports whether port is open on t: EnvdPort on a Pod with the
// agent, any other port if a container declares it.
func (t Target) Exposes(port int) bool {
	if port == EnvdPort {
		return t.Envd
	}
	return slices.Contains(t.Ports, int32(port))
}

// PortList names the ports t exposes, for an answer that refuses another.
func (t Target) PortList() string {
	ps := slices.Clone(t.Ports)
	if t.Envd && !slices.Contains(ps, EnvdPort) {
		ps = append(ps, EnvdPort)
	}
	slices.Sort(ps)
	var out []string
	for _, p := range ps {
		if p != EnvdPort || t.Envd {
			out = append(out, strconv.Itoa(int(p)))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, ", ")
}
