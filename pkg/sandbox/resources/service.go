package resources

import (
	"maps"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// BuildService returns the Service that exposes the sandbox. It is owned by
// the sandbox's workload (its Pod, or its ReplicaSet), so the cluster's
// garbage collector removes it with the workload whatever happens to this
// process mid-request. A ReplicaSet's Service outlives its Pods: a
// recreated or resumed Pod is at the same URL.
//
// A ReplicaSet's Service carries keys.LabelWorkload too: the quota counts
// ReplicaSet sandboxes through their Services on the hot path (see
// quota.Counter.Check).
func BuildService(cfg config.Objects, s api.Spec, owner metav1.OwnerReference) *corev1.Service {
	l := Labels(s)
	if owner.Kind == "ReplicaSet" {
		l[keys.LabelWorkload] = keys.WorkloadReplicaSetValue
	}
	svc := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            ServiceName(s.ID),
			Namespace:       cfg.Namespace,
			Labels:          l,
			OwnerReferences: []metav1.OwnerReference{owner},
		},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceType(cfg.ServiceType),
			Selector: ServiceSelector(s.ID, s.Token),
			Ports: []corev1.ServicePort{{
				Name: portName, Port: cfg.ContainerPort, TargetPort: intstr.FromInt32(cfg.ContainerPort), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
	if s.Token != "" {
		maps.Copy(svc.Spec.Selector, ServicePin(s.ID, owner))
	}
	if cfg.ServiceType == config.ServiceHeadless {
		// No virtual IP: nothing for the API server to allocate (at 5,000
		// Services a ClusterIP costs it about 35 ms a create, against 4 ms
		// without; BenchmarkScale) and no rules for kube-proxy. The URL is
		// the same DNS name, which cluster DNS answers with the Pod's
		// address. The port is the container's, so the URL's port is too.
		//
		// Its not-ready address too: cluster DNS answers a headless name
		// that lists no address with NXDOMAIN, and caches that denial
		// (CoreDNS: up to 30 s with kubeadm's Corefile), so a client that
		// looked the name up before Ready, or while a readiness probe
		// failed once, would not reach the sandbox for that long after.
		// A connection to a sandbox not yet serving is refused at once
		// and retried. There is one Pod behind the name: nothing to
		// balance away from.
		svc.Spec.Type, svc.Spec.ClusterIP = corev1.ServiceTypeClusterIP, corev1.ClusterIPNone
		svc.Spec.PublishNotReadyAddresses = true
	}
	if s.Egress.Mode == egress.Allowlist {
		// The list the egress proxy judges by, on the object that lives as
		// long as the sandbox, whatever its kind (grants are added here).
		svc.Annotations = map[string]string{keys.AnnotationEgressAllow: strings.Join(s.Egress.Allow, ",")}
	}
	RecordPrincipal(svc, s)
	return svc
}

// ServiceSelector selects the one workload of sandbox id: the id and its
// token (keys.LabelToken), which only the function knows. Without a token
// (a sandbox from before tokens) it is the id alone, as DeerFlow selects.
func ServiceSelector(id, token string) map[string]string {
	if token == "" {
		return map[string]string{keys.LabelID: id}
	}
	return map[string]string{keys.LabelID: id, keys.LabelToken: token}
}

// ServicePin is what a sandbox Service selects beside the id and token so
// that no Pod but its own workload's can join it, whatever token that Pod
// carries (a compromised function could read a victim's token from a Pod
// list): something the API server keeps unique and the admission policy
// lets no other Pod carry. For a bare Pod, its name (keys.LabelPod, which
// the policy ties to the Pod's metadata.name): only the one Pod
// sandbox-<id> matches. For a ReplicaSet, its workload label, which only
// the template of the ReplicaSet sandbox-<id> (one per id) may carry. For
// a warm pool's Pod being claimed (sandbox-pool-<pool>-<suffix>), its own
// name too: the claim writes it on the Pod (Pinned) with the id and token,
// in the one write that makes the Pod the sandbox, so the Service, made
// just before, selects the Pod once the claim lands. Any other Pod name:
// nil.
//
// owner is the workload's reference; a slot's names only the kind (its
// workload, of the slot's kind, is to be sandbox-<id>).
func ServicePin(id string, owner metav1.OwnerReference) map[string]string {
	switch {
	case owner.Kind == "ReplicaSet":
		return map[string]string{keys.LabelWorkload: keys.WorkloadReplicaSetValue}
	case owner.Kind == "Pod" && (owner.Name == "" || owner.Name == PodName(id)):
		return map[string]string{keys.LabelPod: PodName(id)}
	case owner.Kind == "Pod" && strings.HasPrefix(owner.Name, PoolPrefix):
		return map[string]string{keys.LabelPod: owner.Name}
	}
	return nil
}

// pinKeys are the keys ServicePin may select.
var pinKeys = []string{keys.LabelPod, keys.LabelWorkload}

// Token is the selector token a sandbox workload carries: a Pod's, or the
// one a ReplicaSet's Pod template gives its Pods ("" for one from before
// tokens).
func Token(obj metav1.Object) string {
	if rs, ok := obj.(*appsv1.ReplicaSet); ok {
		return rs.Spec.Template.Labels[keys.LabelToken]
	}
	return obj.GetLabels()[keys.LabelToken]
}

// Names reports whether svc is the Service of the workload w: owned by
// it; or owned by no workload and selecting w's token (a create's slot,
// made before its workload, which may own it: see Slot); or owned by none
// and selecting no token (a sandbox of DeerFlow's provisioner, which sets
// no owners, until a create adopts its Service). An OwnerlessReference
// Service names none.
func Names(svc *corev1.Service, w metav1.Object) bool {
	if owner := SandboxOwner(svc.OwnerReferences); owner != nil {
		return owner.UID == w.GetUID()
	}
	if OwnerlessReference(svc) {
		return false
	}
	t := SelectedToken(svc)
	return t == "" || t == Token(w)
}

// Slot is the Service a create makes before the sandbox's workload of kind
// ("Pod" or "ReplicaSet"): its place in the quota (quota.Counter.Check),
// owned by nothing. A bare Pod names it as its owner from its create
// (ServiceOwnerRef); a ReplicaSet is made its owner once it exists (Bind).
// It selects the token the workload will carry, so no other Pod joins it.
func Slot(cfg config.Objects, s api.Spec, kind string) *corev1.Service {
	svc := BuildService(cfg, s, metav1.OwnerReference{Kind: kind})
	svc.OwnerReferences = nil
	return svc
}

// SlotKind is the workload kind a slot was made for.
func SlotKind(svc *corev1.Service) string {
	if svc.Labels[keys.LabelWorkload] == keys.WorkloadReplicaSetValue {
		return "ReplicaSet"
	}
	return "Pod"
}

// SelectedToken is the token svc selects ("" for a Service from before tokens).
func SelectedToken(svc *corev1.Service) string { return svc.Spec.Selector[keys.LabelToken] }

// Bind makes svc the Service of the workload ref names (as BuildService
// would have made it): owned by it, selecting token (the workload's) and
// the pin svc selects, if any,
// recording s's principal; other owners stay. The node port and cluster
// IP stay: it is updated in place.
func Bind(svc *corev1.Service, ref metav1.OwnerReference, token string, s api.Spec) *corev1.Service {
	c := svc.DeepCopy()
	refs := []metav1.OwnerReference{ref}
	for _, r := range c.OwnerReferences {
		if SandboxOwner([]metav1.OwnerReference{r}) == nil {
			refs = append(refs, r)
		}
	}
	c.OwnerReferences = refs
	// The pin a slot was made with stays (the admission policy lets an
	// update only add to a selector). A Service made without one (by
	// DeerFlow's provisioner, or before pins) gains none: its workload
	// may be as old and not carry it.
	sel := ServiceSelector(s.ID, token)
	for _, k := range pinKeys {
		if v, ok := svc.Spec.Selector[k]; ok && token != "" {
			sel[k] = v
		}
	}
	c.Spec.Selector = sel
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	// The kind bound, whatever the slot was made for (a leftover slot of
	// the other kind is never bound: see fill, but a label must not lie).
	if ref.Kind == "ReplicaSet" {
		c.Labels[keys.LabelWorkload] = keys.WorkloadReplicaSetValue
	} else {
		delete(c.Labels, keys.LabelWorkload)
	}
	RecordPrincipal(c, s)
	return c
}

// PodOwnerRef makes pod the controller-less owner of a dependent object. Not
// a controller reference: nothing reconciles these objects but the GC.
func PodOwnerRef(pod *corev1.Pod) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID,
		BlockOwnerDeletion: ptr.To(false),
	}
}

// ServiceOwnerRef makes svc, a cold create's slot, the owner of the
// workload written under it (issue 49): the Pod names its Service from its
// own create, so no third write binds the two, and deleting the Service
// takes the Pod with it. Not a controller reference, and it does not block
// the owner's deletion (which would need the finalizers subresource).
func ServiceOwnerRef(svc *corev1.Service) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
		BlockOwnerDeletion: ptr.To(false),
	}
}

// OwnedBy reports whether the workload w names svc as its owner by UID:
// svc is w's Service, bound from w's create (ServiceOwnerRef).
func OwnedBy(w metav1.Object, svc *corev1.Service) bool {
	u := OwningService(w)
	return svc != nil && u != "" && u == svc.UID
}

// OwningService is the UID of the Service that owns the workload w, if
// any ("" for one whose Service it owns, or none).
func OwningService(w metav1.Object) types.UID {
	for _, r := range w.GetOwnerReferences() {
		if r.Kind == "Service" && r.APIVersion == "v1" {
			return r.UID
		}
	}
	return ""
}

// ServiceOwner is the workload svc belongs to, if any (none for nil).
func ServiceOwner(svc *corev1.Service) *metav1.OwnerReference {
	if svc == nil {
		return nil
	}
	return SandboxOwner(svc.OwnerReferences)
}

// SandboxOwner is the workload a sandbox Service belongs to, if any.
func SandboxOwner(refs []metav1.OwnerReference) *metav1.OwnerReference {
	for i, r := range refs {
		if r.Kind == "Pod" && r.APIVersion == "v1" || r.Kind == "ReplicaSet" && r.APIVersion == "apps/v1" {
			return &refs[i]
		}
	}
	return nil
}

// OwnerKind is the kind of the workload that owns svc ("" for none or nil).
func OwnerKind(svc *corev1.Service) string {
	if svc == nil {
		return ""
	}
	if r := SandboxOwner(svc.OwnerReferences); r != nil {
		return r.Kind
	}
	return ""
}

// OwnerUID is the UID of the workload a sandbox Service belongs to ("" for none).
func OwnerUID(refs []metav1.OwnerReference) types.UID {
	if r := SandboxOwner(refs); r != nil {
		return r.UID
	}
	return ""
}
