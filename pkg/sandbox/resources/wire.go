package resources

import (
	"maps"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// A pooled Pod's wire is a Service of its own (of SANDBOX_SERVICE_TYPE:
// NodePort or ClusterIP), named as the Pod,
// owned by it and selecting nothing but its token (keys.LabelToken) and its
// pin (keys.LabelPod, the Pod's own name), which the function writes on the
// Pod before it makes the wire. The token alone would not do: the
// function's ServiceAccount lists Pods, so a compromised function could
// write a pooled Pod's token on another and join its wire; the pin is the
// Pod's name, which the API server keeps unique and the admission policy
// lets no other Pod carry (issue 45). kube-proxy
// programs its endpoint while the Pod stands in the pool, so a claim that
// hands out a wired Pod changes no endpoint: the sandbox answers at the
// wire's URL as soon as the claim does, instead of after kube-proxy's next
// sync (at most one a second, minSyncPeriod). The wire stays the sandbox's
// URL for its whole life and goes with its Pod (the garbage collector
// follows the owner reference).
//
// Wires exist in NodePort and ClusterIP modes (Wired). In Headless mode a
// sandbox's URL is its Service's DNS name, which cluster DNS serves from
// its watch as soon as the Service exists, with no proxy between: there is
// no sync to wait for.

// Wired reports whether pooled Pods are wired under cfg.
func Wired(cfg config.Objects) bool { return cfg.ServiceType != config.ServiceHeadless }

// wireLabels are the labels every pooled Pod's wire carries.
func wireLabels() labels.Set {
	return labels.Set{keys.LabelComponent: keys.ComponentWireValue, keys.LabelManagedBy: keys.ManagedByValue}
}

// SelectorWires selects every pooled Pod's wire, claimed or not.
var SelectorWires = wireLabels().String()

// PoolPrefix begins the name of every warm pool's ReplicaSet,
// sandbox-pool-<pool>, hence of its Pods and their wires,
// sandbox-pool-<pool>-<suffix>.
const PoolPrefix = "sandbox-pool-"

// PoolWires selects the wires of the pool whose label value is pool.
func PoolWires(pool string) string {
	return labels.Merge(wireLabels(), labels.Set{keys.LabelPool: pool}).String()
}

// WireName is the name of pod's wire: the Pod's own (a pool's Pod names
// are sandbox-pool-<pool>-<suffix>, at most 59 characters, a valid Service
// name).
func WireName(pod *corev1.Pod) string { return pod.Name }

// BuildWire returns pod's wire, selecting token (the one pod carries) and
// pod's pin (WireSelector), which pod must carry (Pinned). Its pool label is pod's, or for a claimed Pod (which no longer carries
// one) the pool its name was made in: sandbox-pool-<pool>-<suffix>.
func BuildWire(cfg config.Objects, pod *corev1.Pod, token string) *corev1.Service {
	pool := pod.Labels[keys.LabelPool]
	if rest, ok := strings.CutPrefix(pod.Name, PoolPrefix); ok && pool == "" {
		if i := strings.LastIndex(rest, "-"); i > 0 {
			pool = rest[:i]
		}
	}
	return &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      WireName(pod),
			Namespace: cfg.Namespace,
			Labels: map[string]string{
				keys.LabelName: "deer-flow", keys.LabelComponent: keys.ComponentWireValue,
				keys.LabelManagedBy: keys.ManagedByValue, keys.LabelPool: pool,
			},
			OwnerReferences: []metav1.OwnerReference{PodOwnerRef(pod)},
		},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceType(cfg.ServiceType),
			Selector: WireSelector(pod.Name, token),
			Ports: []corev1.ServicePort{{
				Name: portName, Port: cfg.ContainerPort, TargetPort: intstr.FromInt32(cfg.ContainerPort), Protocol: corev1.ProtocolTCP,
			}},
		},
	}
}

// WireSelector is what the wire of the Pod named name selects: its token
// and its pin, so that only that one Pod matches whatever token another
// Pod is given.
func WireSelector(name, token string) map[string]string {
	return map[string]string{keys.LabelToken: token, keys.LabelPod: name}
}

// Pinned reports whether pod carries its pin (keys.LabelPod: its own
// name), which its wire and, once claimed, its sandbox's Service select.
// A pooled Pod gets it with its token (the wiring) or its claim; one made
// by a version before pins has none until then.
func Pinned(pod *corev1.Pod) bool { return pod.Labels[keys.LabelPod] == pod.Name }

// UnpinnedWire reports whether svc selects exactly {token}, as a wire made
// before pins does. Such a wire is still pod's (Wires), found and removed
// with its Pod, but any Pod given that token joins it until its Pod goes.
func UnpinnedWire(svc *corev1.Service) bool {
	_, ok := svc.Spec.Selector[keys.LabelToken]
	return ok && len(svc.Spec.Selector) == 1
}

// Wires reports whether svc is pod's wire as BuildWire makes it, in use:
// owned by pod (by UID), selecting exactly the token pod carries and pod's
// pin, which pod carries, and reaching pod's port (on a node port in
// NodePort mode). A wire made before pins, selecting the token alone
// (UnpinnedWire), still counts: it reaches pod, and remaking it would move
// a claimed sandbox's URL. A wire deleted, or edited by hand, is not
// trusted with a sandbox's URL: the claim unwires the Pod instead.
func Wires(cfg config.Objects, svc *corev1.Service, pod *corev1.Pod) bool {
	token := pod.Labels[keys.LabelToken]
	if svc == nil || svc.DeletionTimestamp != nil || token == "" || svc.Name != WireName(pod) ||
		svc.Labels[keys.LabelComponent] != keys.ComponentWireValue || OwnerUID(svc.OwnerReferences) != pod.UID ||
		svc.Spec.Type != corev1.ServiceType(cfg.ServiceType) || len(svc.Spec.Ports) != 1 {
		return false
	}
	pinned := Pinned(pod) && maps.Equal(svc.Spec.Selector, WireSelector(pod.Name, token))
	if !pinned && !maps.Equal(svc.Spec.Selector, map[string]string{keys.LabelToken: token}) {
		return false
	}
	p := svc.Spec.Ports[0]
	return (p.NodePort != 0 || svc.Spec.Type != corev1.ServiceTypeNodePort) && p.Port == cfg.ContainerPort && p.TargetPort == intstr.FromInt32(cfg.ContainerPort) && p.Protocol == corev1.ProtocolTCP
}

// Reference makes svc, a sandbox Service as BuildService made it, the one
// of a sandbox claimed from wired: headless and selecting nothing, so no
// controller computes an endpoint for it (no EndpointSlice, no Endpoints:
// two writes a claim no longer sets off on the node's cores, two objects
// fewer per sandbox in etcd) and kube-proxy has nothing to program. It
// names the wire, whose URL the sandbox answers with and which alone
// selects the Pod (by its token). Its owner reference (by UID) is what ties
// it to its workload (Names), and it holds the id and the quota's place.
// Nothing answers at its own DNS name: the sandbox's URL is the wire's.
func Reference(svc *corev1.Service, wire *corev1.Service) *corev1.Service {
	svc.Spec.Type, svc.Spec.ClusterIP = corev1.ServiceTypeClusterIP, corev1.ClusterIPNone
	svc.Spec.Selector = nil
	if svc.Annotations == nil {
		svc.Annotations = map[string]string{}
	}
	svc.Annotations[keys.AnnotationURLService] = wire.Name
	return svc
}

// URLService is the name of the Service whose URL svc's sandbox answers
// with, when it is not svc itself ("").
func URLService(svc *corev1.Service) string {
	if svc == nil {
		return ""
	}
	return svc.Annotations[keys.AnnotationURLService]
}

// OwnerlessReference reports whether svc is the Service of a sandbox claimed wired
// that lost its owner reference: the garbage collector removes it from
// the Service when its Pod is deleted with --cascade=orphan. No workload
// is its (it selects nothing, and a headless Service cannot be given a
// virtual IP in place), so it is not adopted as DeerFlow's provisioner's
// Services are: a create removes it and starts over.
func OwnerlessReference(svc *corev1.Service) bool {
	return URLService(svc) != "" && SandboxOwner(svc.OwnerReferences) == nil
}

// Exposing is the Service a sandbox whose own Service is svc is reached
// through: svc, or the wire svc names when it was claimed wired, if that
// wire still wires pod (nil otherwise: the sandbox has no URL, as without
// a Service, so DeerFlow's next create repairs it).
func Exposing(cfg config.Objects, svc, wire *corev1.Service, pod *corev1.Pod) *corev1.Service {
	if URLService(svc) == "" {
		return svc
	}
	if pod == nil || wire == nil || wire.Name != URLService(svc) || !Wires(cfg, wire, pod) {
		return nil
	}
	return wire
}
