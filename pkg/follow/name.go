package follow

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	typeddiscoveryv1 "k8s.io/client-go/kubernetes/typed/discovery/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/reqid"
)

// DefaultNameWait bounds how long a create that does not wait for Ready
// holds its answer for the sandbox's name (Headless mode): the Pod gets its
// address when the kubelet starts its sandbox, about a third of a second on
// the real node; a Pod still unscheduled after this is answered without.
const DefaultNameWait = 5 * time.Second

// AwaitName, for a Service of Headless mode, holds the answer until cluster DNS can
// answer the sandbox's name: until an EndpointSlice of its Service lists
// the address of pod (of any Pod when pod is nil: a ReplicaSet's Pod not
// yet seen). Cluster DNS answers a headless name that lists no address
// with NXDOMAIN and caches the denial (CoreDNS with kubeadm's Corefile: 30
// s), so a client that looked the name up as soon as it had the URL (as
// DeerFlow's backend does: it creates without waiting and polls at once)
// would not reach the sandbox for that long. In the other modes the name
// or node port exists from the Service's create. Nothing is refused here:
// when bound runs out, or the slices cannot be read, the answer goes as
// it is and the log says so (at Warn: a client may be denied the name
// for the negative TTL).
func AwaitName(ctx context.Context, slices typeddiscoveryv1.EndpointSliceInterface, svc *corev1.Service, pod *corev1.Pod, bound time.Duration) {
	if svc == nil || bound <= 0 {
		return
	}
	start := time.Now()
	var uid types.UID // any Pod's, while the ReplicaSet's is not known
	if pod != nil {
		uid = pod.UID
	}
	err := Slices(ctx, slices, svc, bound, func(s *discoveryv1.EndpointSlice) bool { return ListsAddress(s, svc.Name, uid) })
	if err != nil {
		reqid.Logger(ctx).Warn(LogAnsweredUnnamed,
			"service", svc.Name, "waited", time.Since(start).Round(time.Millisecond), "error", err)
	}
}

// AwaitSlice holds a pooled create's claim until the EndpointSlice
// controller has written the first (empty) slice of the claim's new
// Service, for at most claimSliceWait. The controller, syncing the Service
// again when the claimed Pod matches it, refuses to go on while its own
// cache lacks a slice it wrote ("EndpointSlice informer cache is out of
// date") and retries a second later: a claim that patched at once lost
// that second about once in thirty on the real node (a throwaway probe,
// bare client-go, 30 claims each way, 2026-11-25; README "Warm pools"), so
// its URL answered a second late. Seen here, the slice is all but
// certainly in the controller's cache too: none in thirty.
func AwaitSlice(ctx context.Context, slices typeddiscoveryv1.EndpointSliceInterface, svc *corev1.Service) {
	if err := Slices(ctx, slices, svc, claimSliceWait, func(*discoveryv1.EndpointSlice) bool { return true }); err != nil {
		reqid.Logger(ctx).Debug("claiming before the sandbox Service's first EndpointSlice was seen", "service", svc.Name, "error", err)
	}
}

// claimSliceWait bounds AwaitSlice: the controller writes a new Service's
// slice within milliseconds; a claim does not wait on a slow one for long.
const claimSliceWait = 250 * time.Millisecond

// LogAnsweredUnnamed is what the log says of a Headless answer given before
// its name resolved (tests and the bench count these lines).
const LogAnsweredUnnamed = "answering before cluster DNS lists the sandbox's address (Headless mode): a client that looks its name up now may be denied for the DNS cache's negative TTL"
