// Package isolation checks, before any sandbox is created, that the shared
// NetworkPolicy which isolates every sandbox is in force and means what the
// settings make of it (resources.BuildNetworkPolicy). It fails closed: while
// the policy is missing or altered, creates are refused.
package isolation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"golang.org/x/sync/singleflight"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Checker keeps the last verdict on the shared NetworkPolicy. Nothing runs
// between requests (the function scales to zero): a create that finds the
// verdict older than SANDBOX_NETWORK_POLICY_CHECK_TTL reads the policy again
// (one GET, shared by the creates that arrive meanwhile), so a policy that
// is deleted or altered stops creates within the TTL, and creates resume as
// soon after it is restored.
type Checker struct {
	cfg       *config.IsolationConfig
	namespace string
	timeout   time.Duration // a check's own bound: REQUEST_TIMEOUT
	want      *networkingv1.NetworkPolicy
	client    kubernetes.Interface
	group     singleflight.Group
	mu        sync.Mutex
	checked   time.Time // zero: never checked
	verdict   error     // nil: the policy is in force
	rv        string    // the resourceVersion the verdict is about
}

func (c *Checker) last() (checked time.Time, rv string, verdict error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.checked, c.rv, c.verdict
}

func (c *Checker) store(verdict error, rv string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.checked, c.verdict, c.rv = time.Now(), verdict, rv
}

// New returns the checker of namespace's shared NetworkPolicy, which must
// mean what want (resources.BuildNetworkPolicy of the settings) means; it
// has no verdict yet. Each check is bounded by timeout.
func New(cfg *config.IsolationConfig, namespace string, timeout time.Duration, want *networkingv1.NetworkPolicy, client kubernetes.Interface) *Checker {
	return &Checker{cfg: cfg, namespace: namespace, timeout: timeout, want: want, client: client}
}

// Ensure checks now that the shared NetworkPolicy exists and is
// what BuildNetworkPolicy makes of the settings; when
// SANDBOX_NETWORK_POLICY_ENSURE is on (local clusters) it creates a missing
// one. It runs at start-up; creates run it again when the last verdict is
// older than the TTL, and are refused (503 naming the policy) while it fails.
func (c *Checker) Ensure(ctx context.Context) error {
	if !c.cfg.NetworkPolicy {
		return nil
	}
	// One check at a time per replica; a caller that gives up does not
	// cancel the check the others wait for.
	ch := c.group.DoChan("check", func() (any, error) {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.timeout)
		defer cancel()
		return nil, c.check(cctx)
	})
	select {
	case r := <-ch:
		return r.Err
	case <-ctx.Done():
		return api.Classify(ctx.Err(), "check the shared sandbox NetworkPolicy")
	}
}

// Require is the check a create makes; it fails closed: no sandbox runs unconfined.
func (c *Checker) Require(ctx context.Context) error {
	if !c.cfg.NetworkPolicy {
		return nil
	}
	if checked, _, verdict := c.last(); !checked.IsZero() && time.Since(checked) < c.cfg.NetworkPolicyCheckTTL {
		return verdict
	}
	return c.Ensure(ctx)
}

// check reads the policy and records the verdict. A failure to
// read it is transient and not recorded: the next create reads again.
func (c *Checker) check(ctx context.Context) error {
	name := c.namespace + "/" + c.cfg.NetworkPolicyName
	nps := c.client.NetworkingV1().NetworkPolicies(c.namespace)
	want := c.want.DeepCopy()
	live, err := nps.Get(ctx, c.cfg.NetworkPolicyName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && c.cfg.EnsureNetworkPolicy {
		live, err = nps.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			live, err = nps.Get(ctx, c.cfg.NetworkPolicyName, metav1.GetOptions{})
		}
	}
	if apierrors.IsNotFound(err) {
		verdict := &api.Error{Kind: api.KindUnavailable, Err: err, Detail: "the shared NetworkPolicy " + name +
			" that isolates sandboxes does not exist, so no sandbox is created; apply config/701-networkpolicy-sandboxes.yaml (or set SANDBOX_NETWORK_POLICY_ENSURE=true)"}
		c.store(verdict, "")
		return verdict
	}
	if err != nil {
		return api.Classify(err, "check the shared sandbox NetworkPolicy")
	}
	if _, rv, verdict := c.last(); rv != "" && rv == live.ResourceVersion {
		c.store(verdict, rv) // unchanged since it was judged
		return verdict
	}
	var verdict error
	if parts := specDiff(want.Spec, live.Spec); len(parts) > 0 {
		verdict = &api.Error{Kind: api.KindUnavailable, Detail: fmt.Sprintf("the shared NetworkPolicy %s that isolates sandboxes is not what this function's settings make of it (its %s differ), so no sandbox is created; "+
			"restore it (kubectl apply -f config/701-networkpolicy-sandboxes.yaml), or align the SANDBOX_* network settings with it", name, strings.Join(parts, ", "))}
	}
	c.store(verdict, live.ResourceVersion)
	return verdict
}

// specDiff names the parts of the live spec that do not mean what want
// means: the same rules, peers, ports and ranges in any order, with the
// API server's default protocol (TCP) filled in.
func specDiff(want, live networkingv1.NetworkPolicySpec) []string {
	w, l := normalized(want), normalized(live)
	var parts []string
	for _, p := range []struct {
		name string
		a, b any
	}{
		{"podSelector", w.PodSelector, l.PodSelector},
		{"policyTypes", w.PolicyTypes, l.PolicyTypes},
		{"ingress rules", w.Ingress, l.Ingress},
		{"egress rules", w.Egress, l.Egress},
	} {
		if !equality.Semantic.DeepEqual(p.a, p.b) {
			parts = append(parts, p.name)
		}
	}
	return parts
}

func normalized(in networkingv1.NetworkPolicySpec) networkingv1.NetworkPolicySpec {
	s := *in.DeepCopy()
	slices.Sort(s.PolicyTypes)
	peers := func(ps []networkingv1.NetworkPolicyPeer) {
		for i := range ps {
			if ps[i].IPBlock != nil {
				slices.Sort(ps[i].IPBlock.Except)
			}
		}
		sortByJSON(ps)
	}
	ports := func(ps []networkingv1.NetworkPolicyPort) {
		for i := range ps {
			if ps[i].Protocol == nil {
				tcp := corev1.ProtocolTCP
				ps[i].Protocol = &tcp
			}
		}
		sortByJSON(ps)
	}
	for i := range s.Ingress {
		peers(s.Ingress[i].From)
		ports(s.Ingress[i].Ports)
	}
	for i := range s.Egress {
		peers(s.Egress[i].To)
		ports(s.Egress[i].Ports)
	}
	sortByJSON(s.Ingress)
	sortByJSON(s.Egress)
	return s
}

// sortByJSON orders items by their JSON form: an order-free comparison of
// lists whose order means nothing.
func sortByJSON[T any](items []T) {
	key := func(v T) string {
		b, _ := json.Marshal(v)
		return string(b)
	}
	slices.SortFunc(items, func(a, b T) int { return strings.Compare(key(a), key(b)) })
}
