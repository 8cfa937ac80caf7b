package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/poolapi"
	"github.com/deerflow-sandbox/provisioner/pkg/remove"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	"github.com/deerflow-sandbox/provisioner/pkg/token"
)

// Wiring: every unclaimed pooled Pod gets a token of its own and then its
// wire (resources.BuildWire), so that its claim changes no endpoint. The
// function runs no loop, so creates of a pooled template (after their
// answer), and the reap, wire what is not wired yet; a Pod not yet wired is
// still claimed, as before wires.
//
// The token comes first, with the Pod's pin (its own name, which the wire
// selects beside the token: resources.BuildWire) in the same write,
// conditional on the Pod's UID and version (a claim racing it wins or
// loses whole), and the wire after it: a wiring cut between the two leaves
// a Pod with a token and no wire, which a claim passes over (WireOf) and
// the next wiring completes. The wire is owned by the Pod, so it goes with
// it. A Pod wired before pins carries a token and a wire selecting it
// alone: that wire still counts (resources.Wires), and a wire made for
// such a Pod anew (its own lost) is made after the Pod gains its pin.

// wireTries bounds the token's conditional writes on one Pod whose status
// the kubelet keeps changing (just after it starts).
const wireTries = 3

// Wire wires t's unclaimed pooled Pods that are not yet: one list of the
// pool's Pods and one of its wires, then for each Pod without its wire a
// token (if it has none) and the wire. Pods not yet Ready are wired too:
// kube-proxy then programs the endpoint as the Pod turns Ready, long
// before a claim may take it. A wire that no longer wires its Pod (edited
// by hand) is removed, and made again by the next wiring. Returns how many
// Pods it wired.
func (p *Pool) Wire(ctx context.Context, t *template.Template) (int, error) {
	n, _, err := p.wireAll(ctx, t)
	return n, err
}

// wireAll is Wire; short says the pool had fewer unclaimed Pods than its
// size (a claimed Pod's replacement not made yet), to be wired later.
func (p *Pool) wireAll(ctx context.Context, t *template.Template) (wired int, short bool, err error) {
	if !resources.Wired(p.cfg.Objects()) || t.PoolSize == 0 {
		return 0, false, nil
	}
	lv := poolValue(t.Name)
	pods := p.client.CoreV1().Pods(p.cfg.Namespace)
	svcs := p.client.CoreV1().Services(p.cfg.Namespace)
	podList, err := pods.List(ctx, metav1.ListOptions{LabelSelector: labels.Set(selector(lv)).String(), ResourceVersion: "0"})
	if err != nil {
		return 0, false, fmt.Errorf("list the pool's Pods: %w", err)
	}
	wireList, err := svcs.List(ctx, metav1.ListOptions{LabelSelector: resources.PoolWires(lv), ResourceVersion: "0"})
	if err != nil {
		return 0, false, fmt.Errorf("list the pool's wires: %w", err)
	}
	wires := map[string]*corev1.Service{}
	for i := range wireList.Items {
		wires[wireList.Items[i].Name] = &wireList.Items[i]
	}
	var (
		errs      []error
		unclaimed int
	)
	for i := range podList.Items {
		pod := &podList.Items[i]
		if pod.DeletionTimestamp != nil || pod.Labels[keys.LabelID] != "" || pod.Labels[keys.LabelPool] != lv {
			continue
		}
		unclaimed++
		have := wires[resources.WireName(pod)]
		if have != nil && resources.Wires(p.cfg.Objects(), have, pod) {
			continue
		}
		ok, err := p.wire(ctx, pod, have)
		if err != nil {
			errs = append(errs, fmt.Errorf("wire pooled Pod %s: %w", pod.Name, err))
		}
		if ok {
			wired++
		}
	}
	return wired, unclaimed < t.PoolSize, errors.Join(errs...)
}

// wire gives pod a token unless it has one, then its wire; have is the
// Service of the wire's name that exists and does not wire pod, if any.
// false, nil: pod was claimed or removed meanwhile (nothing to do).
func (p *Pool) wire(ctx context.Context, pod *corev1.Pod, have *corev1.Service) (bool, error) {
	svcs := p.client.CoreV1().Services(p.cfg.Namespace)
	if have != nil {
		if have.Labels[keys.LabelComponent] != keys.ComponentWireValue || resources.OwnerUID(have.OwnerReferences) != pod.UID {
			return false, fmt.Errorf("a Service named %s exists and is not its wire", have.Name)
		}
		// The Pod's own wire, edited by hand: removed, made again below.
		err := svcs.Delete(ctx, have.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(have.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return false, fmt.Errorf("remove its wire edited by hand: %w", err)
		}
		return false, nil
	}
	pod, err := p.giveToken(ctx, pod)
	if pod == nil || err != nil {
		return false, err
	}
	_, err = svcs.Create(ctx, resources.BuildWire(p.cfg.Objects(), pod, pod.Labels[keys.LabelToken]), metav1.CreateOptions{})
	switch {
	case apierrors.IsAlreadyExists(err):
		return false, nil // another replica's wiring
	case err != nil:
		return false, fmt.Errorf("create its wire: %w", err)
	}
	return true, nil
}

// giveToken gives pooled pod what its wire selects unless it has it: a
// fresh token and its pin (giveWired). nil, nil: pod is claimed, gone or
// leaving.
func (p *Pool) giveToken(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	return p.giveWired(ctx, pod, func(pod *corev1.Pod) bool {
		return pod.DeletionTimestamp == nil && pod.Labels[keys.LabelID] == "" && pod.Labels[keys.LabelPool] != ""
	})
}

// giveWired writes on pod what a wire made now selects and pod lacks: a
// fresh token, and its pin (keys.LabelPod, its own name; a Pod wired or
// claimed before pins has none), in one merge patch conditional on the
// UID and version read (a claim in between wins; a status write is
// retried on the Pod read again). still says whether the Pod (read again
// after a conflict) is still to be given them. nil, nil: it is not, or
// is gone.
func (p *Pool) giveWired(ctx context.Context, pod *corev1.Pod, still func(*corev1.Pod) bool) (*corev1.Pod, error) {
	pods := p.client.CoreV1().Pods(p.cfg.Namespace)
	uid := pod.UID
	for try := 0; try < wireTries; try++ {
		if pod.UID != uid || !still(pod) {
			return nil, nil
		}
		add := map[string]string{}
		if pod.Labels[keys.LabelToken] == "" {
			add[keys.LabelToken] = token.New()
		}
		if !resources.Pinned(pod) {
			add[keys.LabelPod] = pod.Name
		}
		if len(add) == 0 {
			return pod, nil
		}
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid": pod.UID, "resourceVersion": pod.ResourceVersion, "labels": add}})
		got, err := pods.Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		switch {
		case err == nil:
			return got, nil
		case apierrors.IsNotFound(err):
			return nil, nil
		case !apierrors.IsConflict(err):
			return nil, fmt.Errorf("give it its token and pin: %w", err)
		}
		if pod, err = pods.Get(ctx, pod.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("read it again: %w", err)
		}
	}
	return nil, nil // its status kept changing: the next wiring tries again
}

// wireAfter is how long after a claim its pool is wired: long enough for
// the ReplicaSet controller to have made the claimed Pod's replacement,
// which is then wired with the rest.
const wireAfter = time.Second

// wireBound bounds one wiring of a pool.
const wireBound = 10 * time.Second

// maxRewires bounds the wirings one wireSoon runs back to back, when
// claims keep asking for more while it runs.
const maxRewires = 3

// wireSoon wires t's pool in the background, wireAfter from now, once for
// all claims of this replica meanwhile; claims while it runs ask for one
// more, and so does a pool found short of Pods (a replacement the
// ReplicaSet controller has not made yet). The claim's answer does not
// wait for it.
func (p *Pool) wireSoon(t *template.Template) {
	if !resources.Wired(p.cfg.Objects()) {
		return
	}
	p.mu.Lock()
	if _, running := p.wiring[t.Name]; running {
		p.wiring[t.Name] = true
		p.mu.Unlock()
		return
	}
	p.wiring[t.Name] = false
	p.mu.Unlock()
	go func() {
		for round := 0; round < maxRewires; round++ {
			time.Sleep(wireAfter)
			ctx, cancel := context.WithTimeout(context.Background(), wireBound)
			n, short, err := p.wireAll(ctx, t)
			cancel()
			if err != nil {
				p.log.Warn("cannot wire the warm pool; the next claim or reap tries again", "template", t.Name, "error", err)
			} else if n > 0 {
				p.log.Debug("wired pooled sandboxes", "template", t.Name, "wired", n)
			}
			p.mu.Lock()
			again := p.wiring[t.Name] || short
			if !again || round == maxRewires-1 {
				delete(p.wiring, t.Name)
				p.mu.Unlock()
				return
			}
			p.wiring[t.Name] = false
			p.mu.Unlock()
		}
	}()
}

// WireOf implements poolapi.Pool. The wire is the one Ready listed a moment
// ago, or else read from etcd. A wire a moment old is as good as one read
// from etcd (a wire is never updated, and one deleted since leaves the
// sandbox without a URL until its next create, as a deleted Service does).
//
// A Pod that carries a token and has no wire was wired and lost its wire
// (deleted by hand, or a wiring cut between its two writes): it is not
// handed out, since its claim would change an endpoint after all (a URL
// that answers only after kube-proxy's next sync). It is passed over
// (poolapi.ErrSkip) and left in the pool, and its pool is wired again,
// which makes its wire.
func (p *Pool) WireOf(ctx context.Context, t *template.Template, pod *corev1.Pod) (*corev1.Service, error) {
	if !resources.Wired(p.cfg.Objects()) || pod.Labels[keys.LabelToken] == "" {
		return nil, nil
	}
	svcs := p.client.CoreV1().Services(p.cfg.Namespace)
	wire, err := p.takeListed(pod.UID), error(nil)
	if wire == nil {
		// Not listed (or listed too long ago): one read from etcd, which
		// the watch cache might not yet show a wire made a moment ago.
		wire, err = svcs.Get(ctx, resources.WireName(pod), metav1.GetOptions{})
	}
	switch {
	case apierrors.IsNotFound(err):
		p.log.Info("passing over a pooled sandbox whose Service is gone; its pool is wired again", "pod", pod.Name, "service", resources.WireName(pod))
		p.wireSoon(t)
		return nil, poolapi.ErrSkip
	case err != nil:
		return nil, api.Classify(err, "read the pooled Pod's Service")
	case resources.Wires(p.cfg.Objects(), wire, pod):
		p.mu.Lock()
		p.wired[pod.UID] = p.now().Add(holdFor)
		p.mu.Unlock()
		return wire, nil
	case wire.Labels[keys.LabelComponent] != keys.ComponentWireValue || resources.OwnerUID(wire.OwnerReferences) != pod.UID:
		return nil, nil // not a wire of this Pod: not ours to remove
	}
	err = svcs.Delete(ctx, wire.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(wire.UID))})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return nil, api.Classify(err, "remove a pooled Pod's Service edited by hand")
	}
	p.log.Info("unwired a pooled sandbox whose Service was edited by hand; passing over it", "pod", pod.Name, "service", wire.Name)
	p.wireSoon(t)
	return nil, poolapi.ErrSkip
}

// Rewire implements poolapi.Pool. A sandbox claimed wired answers with its
// wire's URL; with the wire deleted or edited by hand it has none (get
// answers it without one). Its next create (DeerFlow creates on every
// acquire) makes the wire again, as the wiring made it: named as the Pod,
// owned by it, selecting its token, which never changes, and its pin. A
// Pod claimed before pins gains its pin first (the admission policy
// refuses a wire of the token alone), and pod is then the Pod as written,
// which the new wire selects. A new wire has a
// new node port, so the URL changes, and kube-proxy programs it within its
// next sync (about a second). A Service of the wire's name that is not the
// Pod's wire (made by hand) is not the function's to remove: the sandbox
// stays without a URL.
func (p *Pool) Rewire(ctx context.Context, svc, wire *corev1.Service, pod *corev1.Pod) (*corev1.Service, error) {
	cfg := p.cfg.Objects()
	if !resources.Wired(cfg) || pod == nil || resources.URLService(svc) != resources.WireName(pod) ||
		resources.Token(pod) == "" || resources.Wires(cfg, wire, pod) {
		return wire, nil
	}
	svcs := p.client.CoreV1().Services(p.cfg.Namespace)
	if wire != nil && (wire.Labels[keys.LabelComponent] != keys.ComponentWireValue || resources.OwnerUID(wire.OwnerReferences) != pod.UID) {
		return nil, nil
	}
	tok := resources.Token(pod)
	pinned, err := p.giveWired(ctx, pod, func(pod *corev1.Pod) bool { return pod.DeletionTimestamp == nil && resources.Token(pod) == tok })
	if err != nil {
		return nil, api.Classify(err, "pin a sandbox's Pod before its Service is made again")
	}
	if pinned == nil {
		return nil, nil // gone, leaving, or its status kept changing: the next create tries again
	}
	*pod = *pinned
	if wire != nil {
		// Gone or changed since (a racing create's repair) counts as
		// removed: the create below finds what stands and judges it.
		if err := p.rm.Service(ctx, wire, true); err != nil {
			return nil, api.Classify(err, "remove a sandbox's Service edited by hand")
		}
	}
	made, err := svcs.Create(ctx, resources.BuildWire(cfg, pod, resources.Token(pod)), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		made, err = svcs.Get(ctx, resources.WireName(pod), metav1.GetOptions{})
	}
	if err != nil {
		return nil, api.Classify(err, "make a sandbox's Service again")
	}
	if !resources.Wires(cfg, made, pod) {
		return nil, nil
	}
	p.log.Info("made again the Service of a sandbox claimed wired, deleted or edited by hand", "pod", pod.Name, "service", made.Name)
	return made, nil
}

// listedFor is how long a wire Ready listed stands for a read of it: about
// as long as a claim takes from its list to its Prepare.
const listedFor = 2 * time.Second

// listWires lists the wires of t's pool from the watch cache, for WireOf
// (takeListed). A failed list only means WireOf reads the wire itself.
func (p *Pool) listWires(ctx context.Context, t *template.Template) {
	l, err := p.client.CoreV1().Services(p.cfg.Namespace).List(ctx, metav1.ListOptions{ResourceVersion: "0",
		LabelSelector: resources.PoolWires(poolValue(t.Name))})
	if err != nil {
		return
	}
	now := p.now()
	p.mu.Lock()
	defer p.mu.Unlock()
	expire(p.listed, now, func(w listedWire) time.Time { return w.until })
	for i := range l.Items {
		if uid := resources.OwnerUID(l.Items[i].OwnerReferences); uid != "" {
			p.listed[uid] = listedWire{svc: &l.Items[i], until: now.Add(listedFor)}
		}
	}
}

// takeListed returns (once) the wire Ready listed for the Pod of uid
// within listedFor, or nil.
func (p *Pool) takeListed(uid types.UID) *corev1.Service {
	p.mu.Lock()
	defer p.mu.Unlock()
	w, ok := p.listed[uid]
	delete(p.listed, uid)
	if !ok || p.now().After(w.until) {
		return nil
	}
	return w.svc
}

// wasWired reports (once) whether WireOf found uid wired for a claim, and
// forgets entries past their time (claims that took another Pod).
func (p *Pool) wasWired(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	expire(p.wired, p.now(), at)
	_, ok := p.wired[uid]
	delete(p.wired, uid)
	return ok
}

// wireGrace is how old a wire must be before the reap may find that it
// selects nothing: the Pods are listed from another watch cache than the
// wires, which may not show yet the token of a Pod wired a moment ago.
const wireGrace = time.Minute

// reapWires removes the wires that select no Pod: one whose selector was
// edited by hand, or whose Pod went while no owner reference let the
// garbage collector follow it. Such a Service serves nothing and holds a
// node port of the cluster's range. Only Services named as the function
// names wires (sandbox-pool-<pool>-...) are judged; any other is not its
// to delete. A wire that still selects its Pod, claimed or not, stays (the
// claim and Wire judge whether it wires the Pod as it should). Each delete
// is conditional on the wire as it was judged.
func (p *Pool) reapWires(ctx context.Context) error {
	if !resources.Wired(p.cfg.Objects()) {
		return nil
	}
	svcs := p.client.CoreV1().Services(p.cfg.Namespace)
	pods := p.client.CoreV1().Pods(p.cfg.Namespace)
	wires, err := svcs.List(ctx, metav1.ListOptions{LabelSelector: resources.SelectorWires, ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("list the wires: %w", err)
	}
	// The Pods that carry a token, by token and by token and pin: what a
	// wire as made selects (one made before pins, the token alone).
	tokened, err := pods.List(ctx, metav1.ListOptions{LabelSelector: keys.LabelToken, ResourceVersion: "0"})
	if err != nil {
		return fmt.Errorf("list the Pods that carry a token: %w", err)
	}
	type pinned struct{ token, pod string }
	byToken := make(map[string]bool, len(tokened.Items))
	byPin := make(map[pinned]bool, len(tokened.Items))
	for i := range tokened.Items {
		l := tokened.Items[i].Labels
		byToken[l[keys.LabelToken]] = true
		if l[keys.LabelPod] != "" {
			byPin[pinned{l[keys.LabelToken], l[keys.LabelPod]}] = true
		}
	}
	var errs []error
	now := p.now()
	for i := range wires.Items {
		w := &wires.Items[i]
		lv := w.Labels[keys.LabelPool]
		if w.DeletionTimestamp != nil || now.Sub(w.CreationTimestamp.Time) < wireGrace ||
			lv == "" || !strings.HasPrefix(w.Name, resources.PoolPrefix+lv+"-") {
			// Too young to judge, or not named as the function names a
			// wire: not its to delete (the admission policy agrees).
			continue
		}
		sel := w.Spec.Selector
		selects := false
		t, ok := sel[keys.LabelToken]
		switch pod, pinnedOK := sel[keys.LabelPod]; {
		case len(sel) == 0:
			// No selector: Kubernetes manages no endpoints for it.
		case ok && pinnedOK && len(sel) == 2:
			selects = byPin[pinned{t, pod}]
		case resources.UnpinnedWire(w):
			selects = byToken[t]
		default:
			// Edited by hand to select something else: asked exactly.
			l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: labels.Set(sel).String(), ResourceVersion: "0", Limit: 1})
			if err != nil {
				errs = append(errs, fmt.Errorf("list the Pods wire %s selects: %w", w.Name, err))
				continue
			}
			selects = len(l.Items) > 0
		}
		if selects {
			continue
		}
		switch err := p.rm.ServiceAsRead(ctx, w); {
		case errors.Is(err, remove.ErrChanged):
			// Changed since it was judged: the next reap judges it again.
		case err != nil:
			errs = append(errs, fmt.Errorf("remove wire %s, which selects no Pod: %w", w.Name, err))
		default:
			p.log.Info("removed a warm pool's Service that selects no Pod", "service", w.Name, "selector", labels.Set(sel).String())
		}
	}
	return errors.Join(errs...)
}
