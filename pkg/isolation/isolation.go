// Package isolation checks, before any sandbox is created, that what isolates
// it is in force: the shared NetworkPolicy, meaning what the settings make of
// it (resources.BuildNetworkPolicy), and the RuntimeClass that
// SANDBOX_RUNTIME_CLASS names (gVisor's kernel between the sandbox and the
// node's). It fails closed: while either is missing or altered, creates are
// refused, never made with less isolation.
package isolation

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
)

// Checker keeps the last verdict of each check. Nothing runs between
// requests (the function scales to zero): a create that finds a verdict
// older than SANDBOX_NETWORK_POLICY_CHECK_TTL makes that check again (one
// GET, shared by the creates that arrive meanwhile), so a policy or class
// that is deleted or altered stops creates within the TTL, and creates
// resume as soon after it is restored.
type Checker struct {
	cfg          *config.IsolationConfig
	namespace    string
	runtimeClass string         // SANDBOX_RUNTIME_CLASS; "" checks none
	userNS       bool           // SANDBOX_USER_NAMESPACE: sandboxes ask for hostUsers: false
	timeout      time.Duration  // a check's own bound: REQUEST_TIMEOUT
	policies     []*policyCheck // the shared policy first, then the egress modes'
	client       kubernetes.Interface
	report       func(check string, err error)
	runtime      verdict
	proxy        proxyCheck
	ingressOf    func(principal string) []*networkingv1.NetworkPolicy // nil: none to ensure
	ingress      ingress
}

// The checks, as Report names them.
const (
	CheckNetworkPolicy = "network_policy"
	CheckRuntimeClass  = "runtime_class"
)

// Option customises a Checker.
type Option func(*Checker)

// WithReport has every verdict reported (nil: in force), for the log,
// metrics and Events the caller keeps.
func WithReport(f func(check string, err error)) Option { return func(c *Checker) { c.report = f } }

// policyCheck is one of the policies every sandbox depends on.
type policyCheck struct {
	want *networkingv1.NetworkPolicy
	v    verdict
}

// New returns the checker of namespace's shared NetworkPolicies, each of
// which must mean what want (resources.BuildNetworkPolicy and
// resources.BuildEgressPolicies of the settings) means, and
// of the sandboxes' runtime class (pod's; none when ""); it has no verdict
// yet. Each check is bounded by timeout.
func New(cfg *config.IsolationConfig, pod *config.PodSecurityConfig, namespace string, timeout time.Duration, want []*networkingv1.NetworkPolicy, client kubernetes.Interface, opts ...Option) *Checker {
	c := &Checker{cfg: cfg, namespace: namespace, runtimeClass: pod.RuntimeClassName, userNS: pod.UserNamespace, timeout: timeout, client: client,
		report: func(string, error) {}}
	for _, w := range want {
		c.policies = append(c.policies, &policyCheck{want: w})
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// check is one of the checks in force: its verdict, and how to make it.
type check struct {
	v      *verdict
	action string
	make   func(context.Context) error
}

// checks are those the settings turn on: the policy unless
// SANDBOX_NETWORK_POLICY is off, the runtime class when one is named.
func (c *Checker) checks() []check {
	var cs []check
	if c.cfg.NetworkPolicy {
		for _, p := range c.policies {
			cs = append(cs, check{&p.v, "check the sandbox NetworkPolicy " + p.want.Name, func(ctx context.Context) error { return c.checkPolicy(ctx, p) }})
		}
	}
	if c.runtimeClass != "" {
		cs = append(cs, check{&c.runtime, "check the sandboxes' RuntimeClass", c.checkRuntimeClass})
	}
	return cs
}

// Ensure checks now that the shared NetworkPolicy exists and is
// what BuildNetworkPolicy makes of the settings (when
// SANDBOX_NETWORK_POLICY_ENSURE is on, for local clusters, it creates a
// missing one and updates one that differs), and that the RuntimeClass exists. It runs at start-up;
// creates run each check again when its last verdict is older than the
// TTL, and are refused (503 naming the policy or the setting) while one fails.
//
// The checks run side by side, as a create's do: the shared policies are
// several now (the shared one and each egress mode's), and a cold replica
// should wait for one round trip before it serves, not one per policy.
func (c *Checker) Ensure(ctx context.Context) error {
	return c.run(ctx, c.checks(), true)
}

// Require is the check a create for principal of a sandbox in mode makes;
// it fails closed: no sandbox runs unconfined, nor on the node's own kernel
// when a sandboxed one is asked for, nor unreachable by its principal's
// backends (the policies RequireIngress ensures), nor in allowlist mode
// without the proxy's address, which it returns. The stale checks are made
// at once, side by side: a create that finds every verdict older than the
// TTL (the first after a quiet moment) waits for one round trip, not
// several. Of several refusals the first check's is answered.
func (c *Checker) Require(ctx context.Context, principal string, mode egress.Mode) (proxy string, err error) {
	cs := append(c.checks(), c.ingressChecks(principal)...)
	if mode == egress.Allowlist {
		cs = append(cs, c.proxyChecks()...)
	}
	if err := c.run(ctx, cs, false); err != nil {
		return "", err
	}
	if mode == egress.Allowlist {
		return c.proxy.address(), nil
	}
	return "", nil
}

// run makes the checks whose verdicts are stale (all of them when every is
// set) side by side, and answers the first check's refusal of several.
func (c *Checker) run(ctx context.Context, cs []check, every bool) error {
	errs := make([]error, len(cs))
	var g errgroup.Group
	for i, k := range cs {
		if err, ok := k.v.fresh(c.cfg.NetworkPolicyCheckTTL); ok && !every {
			errs[i] = err
			continue
		}
		g.Go(func() error {
			errs[i] = k.v.run(ctx, c.timeout, k.action, k.make)
			return nil
		})
	}
	_ = g.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// checkPolicy reads the policy and records the verdict. A failure to
// read it is transient and not recorded: the next create reads again.
func (c *Checker) checkPolicy(ctx context.Context, p *policyCheck) error {
	name := c.namespace + "/" + p.want.Name
	nps := c.client.NetworkingV1().NetworkPolicies(c.namespace)
	want := p.want.DeepCopy()
	live, err := nps.Get(ctx, want.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) && c.cfg.EnsureNetworkPolicy {
		live, err = nps.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			live, err = nps.Get(ctx, want.Name, metav1.GetOptions{})
		}
	}
	if apierrors.IsNotFound(err) {
		verdict := &api.Error{Kind: api.KindUnavailable, Err: err, Detail: "the shared NetworkPolicy " + name +
			" that isolates sandboxes does not exist, so no sandbox is created; apply config/701-networkpolicy-sandboxes.yaml (or set SANDBOX_NETWORK_POLICY_ENSURE=true)"}
		p.v.store(verdict, "")
		c.report(CheckNetworkPolicy, verdict)
		return verdict
	}
	if err != nil {
		return api.Classify(err, "check the sandbox NetworkPolicy "+name)
	}
	if _, rv, verdict := p.v.last(); rv != "" && rv == live.ResourceVersion {
		p.v.store(verdict, rv) // unchanged since it was judged
		return verdict
	}
	parts := specDiff(want.Spec, live.Spec)
	if len(parts) > 0 && c.cfg.EnsureNetworkPolicy {
		// A local cluster's function owns its shared policies: a run with
		// other settings (make run with SANDBOX_EGRESS_MODE=isolated, then
		// without) brings them in line rather than refusing every create.
		// In place, so the sandboxes it selects are never unconfined.
		live.Spec = want.Spec
		if live, err = nps.Update(ctx, live, metav1.UpdateOptions{}); err != nil {
			return api.Classify(err, "bring the sandbox NetworkPolicy "+name+" in line with this function's settings")
		}
		parts = nil
	}
	var verdict error
	if len(parts) > 0 {
		verdict = &api.Error{Kind: api.KindUnavailable, Detail: fmt.Sprintf("the shared NetworkPolicy %s that isolates sandboxes is not what this function's settings make of it (its %s differ), so no sandbox is created; "+
			"restore it (kubectl apply -f config/701-networkpolicy-sandboxes.yaml), or align the SANDBOX_* network settings with it", name, strings.Join(parts, ", "))}
	}
	p.v.store(verdict, live.ResourceVersion)
	c.report(CheckNetworkPolicy, verdict)
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
