package isolation

import (
	"context"
	"fmt"
	"sync"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// CheckIngress is the check, as Report names it, of the policies that admit
// a principal's backends to its sandboxes.
const CheckIngress = "ingress_policy"

// WithIngress has RequireIngress ensure, for a principal, the policies build
// makes of it (resources.BuildIngressPolicy, and for "default" also
// resources.BuildLegacyIngressPolicy).
func WithIngress(build func(principal string) []*networkingv1.NetworkPolicy) Option {
	return func(c *Checker) { c.ingressOf = build }
}

// ingress keeps, per policy name, the verdict of the last ensure.
type ingress struct {
	mu       sync.Mutex
	verdicts map[string]*verdict
}

func (in *ingress) of(name string) *verdict {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.verdicts == nil {
		in.verdicts = map[string]*verdict{}
	}
	v, ok := in.verdicts[name]
	if !ok {
		v = &verdict{}
		in.verdicts[name] = v
	}
	return v
}

// ingressChecks are the checks that the policies admitting principal's
// backends to its sandboxes are in force (Require makes them beside the
// others): the first create of a principal writes them, a later one reads
// them (from the watch cache) once the last verdict is older than
// SANDBOX_NETWORK_POLICY_CHECK_TTL, and restores one deleted or altered by
// hand. A sandbox whose policy could not be written would answer no one (the
// shared policy admits nothing), so the create is refused instead: fail
// closed, and said. Without WithIngress, or with SANDBOX_NETWORK_POLICY off,
// there are none.
func (c *Checker) ingressChecks(principal string) []check {
	if c.ingressOf == nil || !c.cfg.NetworkPolicy {
		return nil
	}
	var cs []check
	for _, np := range c.ingressOf(principal) {
		v := c.ingress.of(np.Name)
		cs = append(cs, check{v, "ensure the NetworkPolicy " + np.Name, func(ctx context.Context) error { return c.ensureIngress(ctx, v, principal, np) }})
	}
	return cs
}

// ensureIngress reads np (first from the watch cache: a stale answer is met
// by the create or update it leads to, which the API server judges on the
// current object), creates it when missing and restores it when it differs.
// A racing replica's create (AlreadyExists) or update (Conflict) is met by
// reading again, from etcd, and judging what it wrote: every replica builds
// the same policy, so the race ends in agreement, not in a refusal.
func (c *Checker) ensureIngress(ctx context.Context, v *verdict, principal string, want *networkingv1.NetworkPolicy) error {
	nps := c.client.NetworkingV1().NetworkPolicies(c.namespace)
	what := fmt.Sprintf("ensure the NetworkPolicy %s/%s that admits the backends of principal %q", c.namespace, want.Name, principal)
	var (
		live *networkingv1.NetworkPolicy
		err  error
	)
	read := metav1.GetOptions{ResourceVersion: "0"}
	for attempt := 0; attempt < 3; attempt++ {
		live, err = nps.Get(ctx, want.Name, read)
		read = metav1.GetOptions{}
		switch {
		case apierrors.IsNotFound(err):
			live, err = nps.Create(ctx, want.DeepCopy(), metav1.CreateOptions{})
		case err == nil && (len(specDiff(want.Spec, live.Spec)) > 0 || !labelsHold(live.Labels, want.Labels)):
			restored := want.DeepCopy()
			restored.ResourceVersion = live.ResourceVersion
			live, err = nps.Update(ctx, restored, metav1.UpdateOptions{})
		}
		if !apierrors.IsAlreadyExists(err) && !apierrors.IsConflict(err) {
			break
		}
	}
	if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
		// Not transient: the Role (config/201-role.yaml) or the admission
		// policy (config/801-admission-policy-networkpolicies.yaml) refuses.
		verdict := &api.Error{Kind: api.KindUnavailable, Err: err, Detail: fmt.Sprintf("the NetworkPolicy %s/%s that admits the backends of principal %q could not be written (%s: %v), "+
			"so no sandbox of this principal is created (it would answer no one); apply config/201-role.yaml and config/801-admission-policy-networkpolicies.yaml",
			c.namespace, want.Name, principal, apierrors.ReasonForError(err), err)}
		v.store(verdict, "")
		c.report(CheckIngress, verdict)
		return verdict
	}
	if apierrors.IsAlreadyExists(err) || apierrors.IsConflict(err) {
		return &api.Error{Kind: api.KindUnavailable, Err: err, Detail: "the NetworkPolicy " + c.namespace + "/" + want.Name + " is changing concurrently; retry"}
	}
	if err != nil {
		return api.Classify(err, what) // transient: the next create reads again
	}
	v.store(nil, live.ResourceVersion)
	c.report(CheckIngress, nil)
	return nil
}

// labelsHold says whether live carries every label of want, with its value.
func labelsHold(live, want map[string]string) bool {
	for k, w := range want {
		if l, ok := live[k]; !ok || l != w {
			return false
		}
	}
	return true
}
