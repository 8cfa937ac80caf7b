//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
)

// The soak's share of the real node: a warm pool whose Pods (and the
// sandboxes claimed or created from its template) run there, and one
// backend per principal that the prober connects from. The first id of
// each principal's first soakNetWorkers workers (sk-a0-0, sk-a1-0, and
// bob's) is made from soak-net whichever create picks it, and no other:
// at most soakNetWorkers sandboxes of each principal run on the node at
// once, beside the pool, so that the node keeps up on two cores beside
// the soak's load (their creates are a third of those workers').
const (
	soakNetTemplate = "soak-net"
	soakNetPool     = 2
	soakNetWorkers  = 2
	// soakNetWait bounds a probe's connection: a Pod on the same node
	// answers within milliseconds, a connection the policy drops never.
	soakNetWait = time.Second
	// soakNetRounds bounds each principal's probe rounds (one every 1.5
	// to 4 seconds, a blocked probe waiting soakNetWait: about 45 in the
	// 2-minute soak, this many in make soak's 10).
	soakNetRounds = 200
	// The owner of a probed Pod that has none: an unclaimed pooled Pod,
	// and one that did not stay the same live Pod across the probe.
	ownerUnclaimed = "(unclaimed)"
	ownerGone      = "(gone)"
)

// soakSources are the soak's principals' sources
// (PROVISIONER_PRINCIPAL_INGRESS): each principal's backend Pods alone.
const soakSources = "alice=pods:tenant=alice;bob=pods:tenant=bob"

// soakNet is the soak's view of the network: its backends and the
// prober's records. A nil *soakNet (no real node) probes nothing and never
// sends a create to the real node.
type soakNet struct {
	ns       string
	backends map[string]string // principal → its backend Pod's IP
	byLabel  map[string]string // principal label value → principal

	mu      sync.Mutex
	probes  []soakProbe
	failed  int      // probes whose backend did not answer
	listErr []string // rounds skipped because the Pods could not be listed
}

// soakProbe is one connection a principal's backend tried to a Pod's IP.
type soakProbe struct {
	from, pod string
	// before and after are the Pod's owner by its labels, read before and
	// after the connection: a principal, ownerUnclaimed or (after only)
	// ownerGone.
	before, after string
	reached       bool
	at            time.Time
	// ip is the Pod's address, and age how long before the probe the Pod
	// was made: a policy agent that learns of new Pods late leaves a young
	// Pod open. networked is how long before the probe its network came up
	// (PodReadyToStartContainers; its age when that is not known).
	ip             string
	age, networked time.Duration
}

// agentWindow is how long after a Pod's network comes up the real node's
// policy agent (kube-network-policies v0.7.0) may still let connections to
// it through: it queues for judgement only packets to the addresses it
// knows are selected by a policy, and learns a new Pod's address from a
// rate-limited work queue. A connection in that window that reaches an
// unclaimed pooled Pod, or another principal's new sandbox, is the agent's
// gap, not this provisioner's policy:
// it is counted and printed apart ("in the agent's window"), never hidden,
// and docs/security.md says what it means for a deployment. Past the
// window, every such connection is a violation.
const agentWindow = 5 * time.Second

// networkedFor is how long pod's network has been up at now.
func networkedFor(pod *corev1.Pod, now time.Time) time.Duration {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers && c.Status == corev1.ConditionTrue {
			return now.Sub(c.LastTransitionTime.Time)
		}
	}
	return now.Sub(pod.CreationTimestamp.Time)
}

// newSoakNet, when the real node is up, sets the soak's function to put
// soak-net's sandboxes there, applies soak-net and starts each principal's
// backend on the node. Without a real node it says so and returns nil
// (the soak runs on kwok alone), but under CI, where the node is always
// up, it fails (skip.Unavailable).
//
// soak-net's Pods run under runc, not gVisor: what the prober judges is
// the policy agent's work on the node, in front of the Pod's network
// namespace, whatever runs behind it (TestTenantNetwork proves the same
// rules under gVisor); runc starts a Pod in a fraction of gVisor's time
// and memory, which the node needs beside the soak's load on two cores.
func newSoakNet(t *testing.T, ns string, env map[string]string) *soakNet {
	t.Helper()
	if realNode == nil {
		if skip.Truthy(os.Getenv("CI")) {
			skip.Unavailable(t, "no real node, so the soak's network prober cannot run: %v", realNodeErr)
		}
		t.Logf("soak: no real node (%v): the network prober does not run", realNodeErr)
		return nil
	}
	// The node's runc cannot make a user namespace (realnode.FunctionEnv);
	// a template may add the node's toleration.
	env["SANDBOX_USER_NAMESPACE"] = "false"
	env["SANDBOX_TEMPLATE_TOLERATIONS"] = realnode.TaintKey + "=true:NoSchedule"
	putTemplate(t, ns, pooledTemplate(soakNetTemplate, soakNetPool, corev1.PodSpec{
		NodeSelector: map[string]string{realnode.NodeLabel: "true"},
		Tolerations:  []corev1.Toleration{realnode.Toleration},
		Containers:   []corev1.Container{{Name: "sandbox", Image: realnode.SandboxImage, ImagePullPolicy: corev1.PullNever}},
	}))
	ips := standInPods(t, ns, map[string]map[string]string{
		"alice-backend": {"tenant": "alice"},
		"bob-backend":   {"tenant": "bob"},
	})
	n := &soakNet{ns: ns, backends: map[string]string{}, byLabel: map[string]string{}}
	for _, p := range []string{"alice", "bob"} {
		n.backends[p] = ips[p+"-backend"]
		n.byLabel[resources.PrincipalLabelValue(p)] = p
	}
	return n
}

// awaitPool waits until soak-net's pool stands Ready on the real node and
// wired (a reap wires the Pods the last one made), so that claims on the
// real node are in the load from the start.
func (n *soakNet) awaitPool(t *testing.T, f *function.Instance) {
	t.Helper()
	if n == nil {
		return
	}
	eventually(t, 90*time.Second, fmt.Sprintf("%d Ready, wired Pods in the pool of %s on the real node", soakNetPool, soakNetTemplate), func() (bool, error) {
		keepPools(t, f)
		wired := 0
		for _, p := range pods(t, n.ns, poolLabel+"="+soakNetTemplate) {
			if p.Spec.NodeName == realnode.Name && p.Labels[keys.LabelToken] != "" && realnode.Ready(&p) {
				wired++
			}
		}
		return wired == soakNetPool, poolState(t, n.ns, soakNetTemplate)
	})
}

// template is the template every create of worker wk's id i uses ("" for
// what the create picks): soak-net for the first id of each principal's
// first soakNetWorkers workers.
func (n *soakNet) template(wk, i int) string {
	if n == nil || wk >= soakNetWorkers || i != 0 {
		return ""
	}
	return soakNetTemplate
}

// probe starts, for each principal, the prober: until end (and at most
// soakNetRounds times), at a random moment (0.5 to 3 seconds after its
// last round; seed: SOAK_SEED), its backend
// connects to the Pod IP of every sandbox and pooled Pod on the real node.
func (n *soakNet) probe(seed uint64, end time.Time, wg *sync.WaitGroup) {
	if n == nil {
		return
	}
	for i, p := range []string{"alice", "bob"} {
		wg.Add(1)
		go func(r *rand.Rand) {
			defer wg.Done()
			for round := 0; round < soakNetRounds; round++ {
				at := time.Now().Add(time.Duration(500+r.IntN(2500)) * time.Millisecond)
				if !at.Before(end) {
					return
				}
				time.Sleep(time.Until(at))
				n.round(p)
			}
		}(rand.New(rand.NewPCG(seed, uint64(100+i)))) // streams apart from the workers'
	}
}

// round is one probe round of principal from: every Pod found, at once.
// The API server is read straight (the admin client, never through the
// faults).
func (n *soakNet) round(from string) {
	ctx := context.Background()
	l, err := client().CoreV1().Pods(n.ns).List(ctx, metav1.ListOptions{
		LabelSelector: resources.SelectorAll, FieldSelector: "spec.nodeName=" + realnode.Name})
	if err != nil {
		n.mu.Lock()
		n.listErr = append(n.listErr, err.Error())
		n.mu.Unlock()
		return
	}
	var wg sync.WaitGroup
	for _, pod := range l.Items {
		if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" {
			continue
		}
		wg.Add(1)
		go func(pod corev1.Pod) {
			defer wg.Done()
			now := time.Now()
			pr := soakProbe{from: from, pod: pod.Name, before: n.owner(&pod), at: now, ip: pod.Status.PodIP, age: now.Sub(pod.CreationTimestamp.Time),
				networked: networkedFor(&pod, now)}
			reached, err := reach(n.backends[from], net.JoinHostPort(pod.Status.PodIP, "8080"))
			if err != nil {
				n.mu.Lock()
				n.failed++
				n.mu.Unlock()
				return
			}
			pr.reached, pr.after = reached, ownerGone
			// The same live Pod, at the same address, throughout: else the
			// address may have been another Pod's by then.
			again, err := client().CoreV1().Pods(n.ns).Get(ctx, pod.Name, metav1.GetOptions{})
			if err == nil && again.UID == pod.UID && again.DeletionTimestamp == nil && again.Status.PodIP == pod.Status.PodIP {
				pr.after = n.owner(again)
			}
			n.mu.Lock()
			n.probes = append(n.probes, pr)
			n.mu.Unlock()
		}(pod)
	}
	wg.Wait()
}

// owner is who p is, by its labels: an unclaimed pooled Pod, or the
// principal whose label value it carries (the value itself for one that
// is not the soak's).
func (n *soakNet) owner(p *corev1.Pod) string {
	if p.Labels[keys.LabelPool] != "" && p.Labels[keys.LabelID] == "" {
		return ownerUnclaimed
	}
	v := p.Labels[keys.LabelPrincipal]
	if name, ok := n.byLabel[v]; ok {
		return name
	}
	return "principal label " + v
}

// reach asks the stand-in backend at ip to connect to addr, as the
// backend's own code would: whether the connection was made. Unlike
// execAt it returns its error, for it runs off the test's goroutine.
func reach(ip, addr string) (bool, error) {
	body, err := json.Marshal(map[string]any{"op": "connect", "addr": addr, "timeout_ms": soakNetWait.Milliseconds()})
	if err != nil {
		return false, err
	}
	resp, err := freshClient(10*time.Second).Post("http://"+net.JoinHostPort(ip, "8080")+"/v1/exec", "application/json", bytes.NewReader(body))
	if err != nil {
		return false, fmt.Errorf("backend %s: %w", ip, err)
	}
	defer resp.Body.Close()
	var r struct {
		OK bool `json:"ok"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return false, fmt.Errorf("backend %s: %w", ip, err)
	}
	return r.OK, nil
}

// check holds the prober's records: a connection that reached a Pod that
// was another principal's sandbox, or an unclaimed pooled Pod, both before
// and after it, is a violation (a Pod claimed, replaced or gone mid-probe
// is not judged). It returns the figures for the soak's summary and, when
// the records prove nothing (no probe, a principal that never reached its
// own sandbox, no judged probe of another's sandbox or of an unclaimed
// Pod), why.
func (n *soakNet) check(s *soak) (summary, little string) {
	if n == nil {
		return "network: not probed (no real node)", ""
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	var reached, unjudged, violations, foreign, unclaimed, inWindow int
	own, ownProbed := map[string]int{"alice": 0, "bob": 0}, map[string]int{}
	for _, p := range n.probes {
		if p.reached {
			reached++
		}
		if p.before != p.after {
			unjudged++
			continue
		}
		switch {
		case p.before == ownerUnclaimed:
			unclaimed++
		case p.before != p.from:
			foreign++
		default:
			ownProbed[p.from]++
		}
		switch {
		case !p.reached:
		case p.before != p.from && p.networked < agentWindow:
			inWindow++
			s.t.Logf("network: %s's backend reached %s Pod %s (%s) %s after its network came up, within the policy agent's window (%s)",
				p.from, p.before, p.pod, p.ip, p.networked.Round(time.Millisecond), agentWindow)
		case p.before == ownerUnclaimed:
			violations++
			s.violate("network: %s's backend reached the unclaimed pooled Pod %s (%s, made %s before) at %s", p.from, p.pod, p.ip, p.age.Round(time.Millisecond), p.at.Format(time.StampMilli))
		case p.before != p.from:
			violations++
			s.violate("network: %s's backend reached %s's sandbox Pod %s (%s, made %s before) at %s", p.from, p.before, p.pod, p.ip, p.age.Round(time.Millisecond), p.at.Format(time.StampMilli))
		default:
			own[p.from]++
		}
	}
	var never, ownFig []string
	for _, p := range []string{"alice", "bob"} {
		ownFig = append(ownFig, fmt.Sprintf("%s %d of %d", p, own[p], ownProbed[p]))
		if own[p] == 0 {
			never = append(never, p)
		}
	}
	summary = fmt.Sprintf("network: %d probes (%d judged of another's sandbox, %d of an unclaimed pooled Pod; %d claimed, replaced or gone mid-probe), %d reached (own sandboxes: %s), %d reached a Pod not theirs within the policy agent's first %s of it, %d backend failures, %d rounds unlisted, %d violations",
		len(n.probes), foreign, unclaimed, unjudged, reached, strings.Join(ownFig, ", "), inWindow, agentWindow, n.failed, len(n.listErr), violations)
	if len(n.probes) == 0 || len(never) > 0 || foreign == 0 || unclaimed == 0 {
		little = fmt.Sprintf("%s; never reached its own sandbox: %v; list errors %v", summary, never, n.listErr)
	}
	return summary, little
}
