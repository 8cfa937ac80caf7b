// Package pool keeps warm pools of sandboxes: per template that asks for
// one (sandbox.deerflow.dev/pool-size), a ReplicaSet sandbox-pool-<template>
// of Ready Pods that belong to no one. A create claims one with a single
// conditional write that relabels it out of the ReplicaSet's selector and
// makes it the requested sandbox; the ReplicaSet controller then makes
// another. So nothing runs in the function between requests (it scales to
// zero): Kubernetes refills the pool, and the function makes or corrects
// the ReplicaSet when a create reads the template, and at every reap;
// reads of the templates (GET /api/templates) never write.
//
// Rules this package keeps: a pooled Pod is handed out once (the claim
// carries the resourceVersion it judged, so of racing claims one wins, and
// the winner's Pod leaves the selector and loses its owner reference); an
// unready Pod, or one of an older shape, is never handed out; a pool that
// cannot serve a claim answers nil, and the create goes the cold way.
// Unclaimed Pods carry app=deer-flow-sandbox, so the shared NetworkPolicy
// isolates them, but no sandbox-id, so list, get, the reap and the quota do
// not see them. docs/architecture.md shows a pooled create's writes in
// order, and defines pool, claim, wire and reference.
package pool

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/poolapi"
	"github.com/deerflow-sandbox/provisioner/pkg/remove"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// Claim results, as the metrics count them.
const (
	ResultHit   = "hit"   // a pooled Pod not wired was claimed
	ResultWired = "wired" // a wired pooled Pod was claimed: its URL answered at once
	ResultMiss  = "miss"  // the request needs what a pooled Pod lacks
	ResultEmpty = "empty" // no Ready pooled Pod was left to claim
	ResultError = "error" // the pool could not be read or written
)

// componentValue is app.kubernetes.io/component of a pool's ReplicaSet.
const componentValue = "sandbox-pool"

// ensureEvery is how often a replica that serves creates of a pooled
// template checks its pool's ReplicaSet (a deleted or scaled one is put
// back); an edit of the template is seen at once, as its resourceVersion
// or shape changes.
const ensureEvery = 30 * time.Second

// Observer counts claims by template and result.
type Observer func(template, result string)

// Pool implements poolapi.Pool.
type Pool struct {
	cfg     *config.Config
	client  kubernetes.Interface
	observe Observer
	log     *slog.Logger
	now     func() time.Time
	// rm waits for a cut claim's patch to land (remove.Remover.AwaitLanding).
	rm remove.Remover

	mu      sync.Mutex
	ensured map[string]ensured // by template name: what this replica last made sure of
	// held is the Pods this replica is claiming or has just claimed, by
	// UID, each until a moment after. A hint only, never state that
	// matters: racing claims in one replica pass over each other's Pods
	// instead of spending a conditional write on a Pod another is taking
	// (and the watch cache that Ready lists from may still offer a Pod
	// claimed a moment ago). Between replicas the conditional patch alone
	// decides, as before.
	held map[types.UID]time.Time
	// wiring is the templates whose pool this replica is wiring now
	// (wireSoon); true when another wiring was asked for meanwhile.
	wiring map[string]bool
	// wired is the Pods WireOf found wired for a claim of this replica,
	// until ClaimFrom counts the claim (each entry lives holdFor at most).
	wired map[types.UID]time.Time
	// listed is the wires Ready listed beside the Pods, by their Pod's
	// UID, for WireOf to take (each lives listedFor at most).
	listed map[types.UID]listedWire
	// lists shares Ready's lists among the claims that ask at once (shared).
	lists singleflight.Group
}

// listedWire is a wire as Ready listed it, until a moment after.
type listedWire struct {
	svc   *corev1.Service
	until time.Time
}

// holdFor is how long a Pod this replica claimed is passed over: longer
// than the watch cache takes to show the claim.
const holdFor = 10 * time.Second

type ensured struct {
	key string
	at  time.Time
}

var _ poolapi.Pool = (*Pool)(nil)

// New returns the pools of cfg.Namespace.
func New(cfg *config.Config, client kubernetes.Interface, observe Observer, log *slog.Logger) *Pool {
	if observe == nil {
		observe = func(string, string) {}
	}
	if log == nil {
		log = slog.Default()
	}
	return &Pool{cfg: cfg, client: client, observe: observe, log: log, now: time.Now, rm: remove.Remover{Client: client, Namespace: cfg.Namespace}, ensured: map[string]ensured{}, held: map[types.UID]time.Time{}, wiring: map[string]bool{}, wired: map[types.UID]time.Time{}, listed: map[types.UID]listedWire{}}
}

// Name is the name of template's pool ReplicaSet: sandbox-pool- and the
// pool label its selector holds (poolValue), so that the admission policy
// (config/800-admission-policy.yaml) can tell that a pool's ReplicaSet
// selects its own pool and no other. Pods get it plus a random suffix.
func Name(tmpl string) string {
	return resources.PoolPrefix + poolValue(tmpl)
}

// poolValue is the pool label of template's pooled Pods: the template's
// name, or for a name too long to leave room for a Pod's suffix in Name, a
// stable hash of it.
func poolValue(tmpl string) string {
	if len(tmpl) > 40 {
		return resources.LabelValue("pool/" + tmpl)
	}
	return resources.LabelValue(tmpl)
}

// Build returns the pool ReplicaSet of t under cfg: t.PoolSize Pods shaped
// as a create of t with nothing else would shape them, labelled as
// sandboxes (for the NetworkPolicy) without an id, and owned by the
// PodTemplate, so deleting the template deletes its pool.
func Build(cfg config.Objects, t *template.Template) *appsv1.ReplicaSet {
	tpl := resources.PoolPodTemplate(cfg, resources.PoolSpec(cfg, t))
	lv := poolValue(t.Name)
	tpl.Labels[keys.LabelPool] = lv
	rs := &appsv1.ReplicaSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name: Name(t.Name), Namespace: cfg.Namespace,
			Labels: map[string]string{keys.LabelName: "deer-flow", keys.LabelComponent: componentValue,
				keys.LabelManagedBy: keys.ManagedByValue, keys.LabelPool: lv},
			Annotations: map[string]string{keys.AnnotationTemplate: t.Name},
		},
		Spec: appsv1.ReplicaSetSpec{
			Replicas: ptr.To(int32(t.PoolSize)),
			Selector: &metav1.LabelSelector{MatchLabels: selector(lv)},
			Template: tpl,
		},
	}
	if t.UID != "" {
		rs.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "PodTemplate", Name: t.Name, UID: t.UID, BlockOwnerDeletion: ptr.To(false)}}
	}
	return rs
}

func selector(lv string) map[string]string {
	return map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelPool: lv}
}

// Claim lists the pool's Ready Pods of the wanted shape and claims one
// (Ready, then ClaimFrom).
func (p *Pool) Claim(ctx context.Context, t *template.Template, hash string, c poolapi.Claim) *corev1.Pod {
	ready, err := p.Ready(ctx, t, hash)
	if err != nil {
		return nil
	}
	return p.ClaimFrom(ctx, t, hash, ready, c)
}

// Ready implements poolapi.Pool: one list of the pool's Pods of the wanted
// shape, the claimable ones best first (order), each rank in random order
// (so racing claims mostly pick different Pods). A failure is counted and
// logged here; the caller goes the cold way.
func (p *Pool) Ready(ctx context.Context, t *template.Template, hash string) ([]*corev1.Pod, error) {
	p.ensureSoon(t)
	// ResourceVersion "0": the API server answers from its watch cache at
	// once, instead of first confirming with etcd that the cache is current
	// (a consistent list waits for etcd's progress report, tens of
	// milliseconds: most of a claim). A stale answer is safe: the claim
	// patch carries the resourceVersion listed here, so a Pod claimed since
	// fails with a conflict and the next is tried; a Pod Ready since is
	// offered by ClaimFrom's second look.
	// The pool's wires are listed beside its Pods, as fresh (both from
	// the watch cache), so that the claim need not read its Pod's wire
	// after choosing it: one round trip fewer (listWires).
	// Claims of one pool that ask while its lists are under way share them
	// (shared): a burst of eight claims costs the API server two lists, not
	// sixteen. A list shared is no staler than the watch cache's own answer.
	var ready []*corev1.Pod
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		v, err := p.shared(gctx, "pods/"+t.Name+"/"+hash, func(ctx context.Context) (any, error) { return p.list(ctx, t, hash, "0") })
		if err != nil {
			return err
		}
		// Each claim its own order of the Pods, as with a list of its own.
		ready = slices.Clone(v.([]*corev1.Pod))
		rand.Shuffle(len(ready), func(i, j int) { ready[i], ready[j] = ready[j], ready[i] })
		return nil
	})
	if resources.Wired(p.cfg.Objects()) {
		g.Go(func() error {
			_, _ = p.shared(gctx, "wires/"+t.Name, func(ctx context.Context) (any, error) {
				p.listWires(ctx, t)
				return nil, nil
			})
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		p.log.Warn("cannot read the warm pool; creating cold", "template", t.Name, "error", err)
		p.observe(t.Name, ResultError)
		return nil, err
	}
	if p.order(ready) {
		p.wireSoon(t) // a Pod not wired (ordered last): wire it for the next claim
	}
	return ready, nil
}

// shared runs read once for the claims that ask for key while it runs,
// and gives each its answer. It runs under a deadline of its own: a claim
// that gives up does not end the read the others wait for.
func (p *Pool) shared(ctx context.Context, key string, read func(context.Context) (any, error)) (any, error) {
	ch := p.lists.DoChan(key, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.RequestTimeout)
		defer cancel()
		return read(rctx)
	})
	select {
	case r := <-ch:
		return r.Val, r.Err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// list is the pool's claimable Pods of the wanted shape as of resource
// version rv ("0": the watch cache; "": current), in random order (so
// racing claims mostly pick different Pods; order ranks them).
func (p *Pool) list(ctx context.Context, t *template.Template, hash, rv string) ([]*corev1.Pod, error) {
	sel := labels.Set(selector(poolValue(t.Name)))
	sel[keys.LabelPoolHash] = hash
	list, err := p.client.CoreV1().Pods(p.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String(), ResourceVersion: rv})
	if err != nil {
		return nil, err
	}
	var ready []*corev1.Pod
	for i := range list.Items {
		if pod := &list.Items[i]; claimable(pod, hash) {
			ready = append(ready, pod)
		}
	}
	rand.Shuffle(len(ready), func(i, j int) { ready[i], ready[j] = ready[j], ready[i] })
	return ready, nil
}

// programmed is how long a wired Pod must have been Ready for kube-proxy
// to have programmed its wire's endpoint: its minSyncPeriod (1 s by
// default) and the sync itself.
const programmed = 2 * time.Second

// order sorts claimable Pods best first, those of one rank left in their
// random order: (0) wired, its wire listed beside it (Ready), and Ready
// for long enough that the wire's endpoint is programmed; (1) the same,
// Ready a moment ago; (2) with a token and no wire listed: it lost its
// wire (WireOf passes over it), or its wire was made since the list;
// (3) no token: not wired yet, claimed as before wires. It reports whether
// any Pod ranks 2 or 3, for its pool to be wired.
func (p *Pool) order(ready []*corev1.Pod) (unwired bool) {
	now := p.now()
	rank := make(map[types.UID]int, len(ready))
	p.mu.Lock()
	for _, pod := range ready {
		_, listed := p.listed[pod.UID]
		r := 0
		switch {
		case pod.Labels[keys.LabelToken] == "":
			r = 3
		case !listed:
			r = 2
		case now.Sub(readySince(pod)) < programmed:
			r = 1
		}
		rank[pod.UID] = r
		unwired = unwired || r >= 2
	}
	p.mu.Unlock()
	slices.SortStableFunc(ready, func(a, b *corev1.Pod) int { return cmp.Compare(rank[a.UID], rank[b.UID]) })
	return unwired
}

func readySince(pod *corev1.Pod) time.Time {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.LastTransitionTime.Time
		}
	}
	return time.Time{}
}

// ClaimFrom implements poolapi.Pool: it tries the Pods Ready listed, each
// with one patch that carries the resourceVersion it saw (after the
// claim's Prepare for that Pod): a Pod someone claimed since fails with a
// conflict, and the next is tried. When none of them could be had, it
// looks once more with a current list (the watch cache's answer may have
// missed Pods that turned Ready a moment ago), before the create goes the
// cold way.
func (p *Pool) ClaimFrom(ctx context.Context, t *template.Template, hash string, ready []*corev1.Pod, c poolapi.Claim) *corev1.Pod {
	// done is the Pods this claim is through with: taken by someone else,
	// gone, or no longer claimable. A Pod it could not write only because
	// its status kept changing (the kubelet's writes just after it turned
	// Ready) is not done: the second look tries it again.
	done := map[types.UID]bool{}
	listed, skipped := len(ready), 0
	for look := 0; look < 2; look++ {
		if look == 1 {
			var err error
			if ready, err = p.list(ctx, t, hash, ""); err != nil {
				break // the stale look found nothing either: cold, as with an empty pool
			}
			p.order(ready)
			listed, skipped = len(ready), 0
		}
		for _, pod := range ready {
			if done[pod.UID] {
				continue
			}
			if !p.hold(pod.UID) {
				skipped++ // another claim of this replica is taking it
				continue
			}
			if c.Prepare != nil {
				if err := c.Prepare(ctx, pod); errors.Is(err, poolapi.ErrSkip) {
					p.release(pod.UID)
					done[pod.UID] = true
					continue
				} else if err != nil {
					p.release(pod.UID)
					return nil // the caller's to answer: it knows why
				}
			}
			claimed, taken, err := p.claim(ctx, pod, hash, c)
			if claimed == nil {
				p.release(pod.UID)
			}
			switch {
			case err != nil:
				p.log.Warn("cannot claim a pooled sandbox; creating cold", "template", t.Name, "pod", pod.Name, "error", err)
				p.observe(t.Name, ResultError)
				return nil
			case claimed != nil:
				result := ResultHit
				if p.wasWired(claimed.UID) {
					result = ResultWired
				}
				p.observe(t.Name, result)
				p.wireSoon(t)
				return claimed
			case taken:
				done[pod.UID] = true
			}
		}
	}
	// Said at Info: an operator sizing a pool wants to see it run dry.
	p.log.Info("the warm pool had no Pod left to claim; creating cold", "template", t.Name,
		"claimable", listed, "taken_by_this_replica", skipped)
	p.observe(t.Name, ResultEmpty)
	return nil
}

// hold marks uid as being claimed by this replica; false when it already
// is (or was claimed here within holdFor).
func (p *Pool) hold(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	expire(p.held, now, at)
	if _, taken := p.held[uid]; taken {
		return false
	}
	p.held[uid] = now.Add(holdFor)
	return true
}

// expire forgets the entries of m (Pods by UID, each until the time
// until tells) whose time is past. The caller holds p.mu.
func expire[V any](m map[types.UID]V, now time.Time, until func(V) time.Time) {
	for u, v := range m {
		if now.After(until(v)) {
			delete(m, u)
		}
	}
}

// at is the time of an entry that is one.
func at(t time.Time) time.Time { return t }

// release lets other claims of this replica try uid again: its claim did
// not take it.
func (p *Pool) release(uid types.UID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.held, uid)
}

// maxClaimTries bounds the writes a claim spends on one Pod that other
// writers (the kubelet's status, say) change under it.
const maxClaimTries = 3

// claim tries to claim pod and returns it claimed. When it could not, the
// bool (taken) says whether pod is out of reach for good (someone else
// claimed it first, it is gone, or it is no longer claimable); not taken
// means every try met a change to the Pod that left it claimable (a
// status write), and a later try may win. Such a
// conflict is retried on the fresh Pod, so that only a claim by someone
// else sends a create on to another Pod or the cold way.
func (p *Pool) claim(ctx context.Context, pod *corev1.Pod, hash string, c poolapi.Claim) (*corev1.Pod, bool, error) {
	pods := p.client.CoreV1().Pods(p.cfg.Namespace)
	token := tokenOf(pod, c) // what the claim's Prepare saw, and its Service selects
	for try := 0; try < maxClaimTries; try++ {
		patch, err := claimPatch(pod, c, p.now())
		if err != nil {
			return nil, false, err
		}
		claimed, err := pods.Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			return claimed, false, nil
		case apierrors.IsNotFound(err):
			return nil, true, nil
		case !apierrors.IsConflict(err):
			return p.readBack(ctx, pod, c, err)
		}
		if pod, err = pods.Get(ctx, pod.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil, true, nil
		} else if err != nil {
			return nil, false, err
		}
		if !claimable(pod, hash) {
			return nil, true, nil // claimed by someone else first
		}
		if tokenOf(pod, c) != token {
			// Wired meanwhile: its token is not the one this claim's Service
			// selects. Passed over: the next Pod gets a Service of its own.
			return nil, true, nil
		}
	}
	return nil, false, nil
}

// readBack follows a claim's patch of pod that failed (err) without saying
// whether it landed (the API server's 5xx, a timeout, the client gone): the
// Pod is read again, under a deadline of its own, and is this claim's when
// it carries the claim's id and token. A Pod still at the version the
// patch was conditional on may yet take it (a cut write can land after a
// read made at once: remove.WriteLands), so it is read once more when such
// a write must have landed; a Pod at any other version never will. A
// refusal (a 4xx) wrote nothing. When a read fails, c.Uncertain is told:
// the Pod may be claimed.
func (p *Pool) readBack(ctx context.Context, pod *corev1.Pod, c poolapi.Claim, err error) (*corev1.Pod, bool, error) {
	if api.Refused(err) {
		return nil, false, err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.RequestTimeout)
	defer cancel()
	pods := p.client.CoreV1().Pods(p.cfg.Namespace)
	got, rerr := pods.Get(rctx, pod.Name, metav1.GetOptions{})
	if rerr == nil && !claimedBy(got, c, tokenOf(pod, c)) && got.ResourceVersion == pod.ResourceVersion {
		if rerr = p.rm.AwaitLanding(rctx); rerr == nil {
			got, rerr = pods.Get(rctx, pod.Name, metav1.GetOptions{})
		}
	}
	switch {
	case rerr == nil && claimedBy(got, c, tokenOf(pod, c)):
		return got, false, nil
	case rerr != nil && !apierrors.IsNotFound(rerr) && c.Uncertain != nil:
		c.Uncertain()
	}
	return nil, false, err
}

// claimedBy reports whether pod carries c's claim: its id and token, and
// is not on its way out.
func claimedBy(pod *corev1.Pod, c poolapi.Claim, token string) bool {
	return pod.DeletionTimestamp == nil && pod.Labels[keys.LabelID] == c.Labels[keys.LabelID] &&
		token != "" && pod.Labels[keys.LabelToken] == token
}

// tokenOf is the token a claim of pod writes: the one pod carries (a wired
// Pod's, which never changes), or else the claim's own.
func tokenOf(pod *corev1.Pod, c poolapi.Claim) string {
	if t := pod.Labels[keys.LabelToken]; t != "" {
		return t
	}
	return c.Labels[keys.LabelToken]
}

// Missed implements poolapi.Pool.
func (p *Pool) Missed(t *template.Template) {
	p.ensureSoon(t)
	p.observe(t.Name, ResultMiss)
}

// claimable: unclaimed, of the wanted shape, Ready, not on its way out.
func claimable(pod *corev1.Pod, hash string) bool {
	if pod.DeletionTimestamp != nil || pod.Labels[keys.LabelID] != "" || pod.Labels[keys.LabelPoolHash] != hash ||
		pod.Labels[keys.LabelPool] == "" || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// claimPatch makes pod the sandbox c describes: its labels and annotations,
// out of the pool's selector (the pool labels removed) and owned by no
// ReplicaSet, and a hard lifetime cap. activeDeadlineSeconds counts from
// the Pod's start, not the claim, and may be set once on a running Pod, so
// it is the time the Pod has stood in the pool plus the sandbox's lifetime.
// The resourceVersion makes the write conditional: of racing claims of one
// Pod, one wins. The Pod gets its pin (keys.LabelPod, its own name) with
// its id and token, which the sandbox's Service selects beside them
// (resources.ServicePin): a Pod not wired before has none yet, and no Pod
// given the token read from a Pod list can carry another's name.
func claimPatch(pod *corev1.Pod, c poolapi.Claim, now time.Time) ([]byte, error) {
	lbls := map[string]any{keys.LabelPool: nil, keys.LabelPoolHash: nil}
	for k, v := range c.Labels {
		lbls[k] = v
	}
	if t := tokenOf(pod, c); t != "" {
		lbls[keys.LabelToken] = t
	}
	lbls[keys.LabelPod] = pod.Name
	started := pod.CreationTimestamp.Time
	if pod.Status.StartTime != nil {
		started = pod.Status.StartTime.Time
	}
	standing := max(int64(now.Sub(started)/time.Second), 0) + 1
	return json.Marshal(map[string]any{
		"metadata": map[string]any{
			"resourceVersion": pod.ResourceVersion,
			"labels":          lbls,
			"annotations":     c.Annotations,
			"ownerReferences": nil,
		},
		"spec": map[string]any{"activeDeadlineSeconds": standing + int64(c.MaxLifetime/time.Second)},
	})
}

// ensureSoon makes sure of t's pool in the background when this replica has
// not lately (or not for this version of t): the claim at hand does not
// wait for it. It is bounded and idempotent; a replica that stops midway
// leaves it to the next.
func (p *Pool) ensureSoon(t *template.Template) {
	key := t.ResourceVersion
	if t.PoolSize > 0 {
		key += "/" + resources.PoolPodTemplate(p.cfg.Objects(), resources.PoolSpec(p.cfg.Objects(), t)).Labels[keys.LabelPoolHash]
	}
	p.mu.Lock()
	e, ok := p.ensured[t.Name]
	fresh := ok && e.key == key && p.now().Sub(e.at) < ensureEvery
	if !fresh {
		p.ensured[t.Name] = ensured{key: key, at: p.now()}
	}
	p.mu.Unlock()
	if fresh {
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := p.ensure(ctx, t, nil, false); err != nil {
			p.forget(t.Name)
			p.log.Warn("cannot keep the warm pool", "template", t.Name, "error", err)
		}
	}()
}

func (p *Pool) forget(name string) {
	p.mu.Lock()
	delete(p.ensured, name)
	p.mu.Unlock()
}

// ensure makes t's pool ReplicaSet what t asks for: created, resized,
// reshaped (its Pods of the old shape deleted, so the controller makes new
// ones), or deleted when t wants no pool. have is the ReplicaSet when the
// caller listed it (known says it did; nil then means absent).
func (p *Pool) ensure(ctx context.Context, t *template.Template, have *appsv1.ReplicaSet, known bool) error {
	rss := p.client.AppsV1().ReplicaSets(p.cfg.Namespace)
	name := Name(t.Name)
	if !known {
		rs, err := rss.Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			have = rs
		}
	}
	if t.PoolSize == 0 {
		return p.remove(ctx, have)
	}
	want := Build(p.cfg.Objects(), t)
	if have == nil {
		_, err := rss.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			return nil // another replica made it
		}
		return err
	}
	oldHash := have.Spec.Template.Labels[keys.LabelPoolHash]
	newHash := want.Spec.Template.Labels[keys.LabelPoolHash]
	if ptr.Deref(have.Spec.Replicas, 0) == *want.Spec.Replicas && oldHash == newHash && equalOwners(have.OwnerReferences, want.OwnerReferences) {
		return nil
	}
	upd := have.DeepCopy()
	upd.Spec.Replicas, upd.Spec.Template = want.Spec.Replicas, want.Spec.Template
	upd.OwnerReferences, upd.Labels, upd.Annotations = want.OwnerReferences, want.Labels, want.Annotations
	if _, err := rss.Update(ctx, upd, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) {
			return nil // changed by another replica since we read it
		}
		return err
	}
	if oldHash != newHash {
		return p.dropShape(ctx, t, newHash)
	}
	return nil
}

// dropShape deletes t's unclaimed pooled Pods of any shape but hash, each
// with the resourceVersion it judged, so a Pod claimed meanwhile stays.
func (p *Pool) dropShape(ctx context.Context, t *template.Template, hash string) error {
	pods := p.client.CoreV1().Pods(p.cfg.Namespace)
	list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: labels.Set(selector(poolValue(t.Name))).String()})
	if err != nil {
		return err
	}
	for i := range list.Items {
		pod := &list.Items[i]
		if pod.Labels[keys.LabelPoolHash] == hash || pod.Labels[keys.LabelID] != "" {
			continue
		}
		err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &pod.UID, ResourceVersion: &pod.ResourceVersion}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}

// remove deletes a pool nobody asks for any more; its unclaimed Pods go
// with it (claimed ones have no owner reference).
func (p *Pool) remove(ctx context.Context, rs *appsv1.ReplicaSet) error {
	if rs == nil || rs.Labels[keys.LabelManagedBy] != keys.ManagedByValue || rs.DeletionTimestamp != nil {
		return nil
	}
	background := metav1.DeletePropagationBackground
	err := p.client.AppsV1().ReplicaSets(p.cfg.Namespace).Delete(ctx, rs.Name, metav1.DeleteOptions{
		Preconditions: metav1.NewUIDPreconditions(string(rs.UID)), PropagationPolicy: &background})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

func equalOwners(a, b []metav1.OwnerReference) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].UID != b[i].UID || a[i].Kind != b[i].Kind {
			return false
		}
	}
	return true
}

// Describe implements poolapi.Pool: one list of the pool ReplicaSets, and
// each template's ready count filled in. It writes nothing: a read of the
// templates (GET /api/templates, /api/capabilities) is no occasion to make,
// resize or delete a pool, as any principal that may read could then churn
// every pool's Pods. Keep does that, from the reap; creates of a pooled
// template make theirs too (ensureSoon). A listing that fails is said in
// each template's pool error, not as a failed listing: the templates
// themselves are still usable.
func (p *Pool) Describe(ctx context.Context, sums []template.Summary, valid []*template.Template) {
	byName, err := p.pools(ctx)
	if err != nil {
		for i := range sums {
			if sums[i].Pool != nil && sums[i].Pool.Error == "" {
				sums[i].Pool.Error = "cannot read the pool: " + err.Error()
			}
		}
		return
	}
	sumOf := map[string]*template.Summary{}
	for i := range sums {
		sumOf[sums[i].Name] = &sums[i]
	}
	for _, t := range valid {
		have, sum := byName[Name(t.Name)], sumOf[t.Name]
		if sum == nil || sum.Pool == nil || have == nil {
			continue
		}
		if have.Spec.Template.Labels[keys.LabelPoolHash] == Build(p.cfg.Objects(), t).Spec.Template.Labels[keys.LabelPoolHash] {
			sum.Pool.Ready = min(int(have.Status.ReadyReplicas), t.PoolSize)
		}
	}
}

// Keep implements poolapi.Pool. The reap calls it, so pools follow their
// templates within a reap's period even when no create asks for them; a
// failure is logged, and the next reap tries again.
func (p *Pool) Keep(ctx context.Context, templates *template.Store) {
	_, valid, err := templates.ListValid(ctx)
	if err == nil {
		err = p.keep(ctx, valid)
	}
	if err != nil {
		p.log.Warn("cannot keep the warm pools; the next reap tries again", "error", err)
	}
}

// keep is one list of the pool ReplicaSets; each valid template's pool is
// made what it asks for (and wired), pools of templates that ask for none,
// are refused or are gone are deleted, and so are wires that select no Pod.
func (p *Pool) keep(ctx context.Context, valid []*template.Template) error {
	byName, err := p.pools(ctx)
	if err != nil {
		return fmt.Errorf("list the warm pools: %w", err)
	}
	var errs []error
	for _, t := range valid {
		name := Name(t.Name)
		have := byName[name]
		delete(byName, name)
		if t.PoolSize == 0 && have == nil {
			continue
		}
		if err := p.ensure(ctx, t, have, true); err != nil {
			p.forget(t.Name)
			errs = append(errs, fmt.Errorf("keep the warm pool of template %s: %w", t.Name, err))
		}
		if _, err := p.Wire(ctx, t); err != nil {
			errs = append(errs, fmt.Errorf("wire the warm pool of template %s: %w", t.Name, err))
		}
	}
	for _, rs := range byName { // pools of templates refused, gone or unlabelled
		if err := p.remove(ctx, rs); err != nil {
			errs = append(errs, fmt.Errorf("remove the warm pool %s nobody asks for: %w", rs.Name, err))
		}
	}
	if err := p.reapWires(ctx); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// pools lists the pool ReplicaSets by name.
func (p *Pool) pools(ctx context.Context) (map[string]*appsv1.ReplicaSet, error) {
	list, err := p.client.AppsV1().ReplicaSets(p.cfg.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: keys.LabelComponent + "=" + componentValue + "," + keys.LabelPool})
	if err != nil {
		return nil, err
	}
	byName := map[string]*appsv1.ReplicaSet{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	return byName, nil
}
