package pool

import (
	"encoding/json"
	"errors"
	"regexp"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	clienttesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

var tokenRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// TestWiredClaim drives wiring and a claim of a wired Pod over a fake
// clientset (a stand-in for the API server: no admission, no node ports,
// no garbage collector; test/e2e runs it against a real one): the wiring
// gives each pooled Pod a token of its own and then its wire, once; a
// create claims a wired Pod keeping its token, makes a headless Service
// that names the wire, and answers, gets and lists with the wire's URL. A
// wire edited by hand is not trusted: a claim that meets it removes it and
// passes over its Pod (left in the pool for the next wiring).
func TestWiredClaim(t *testing.T) {
	cfg, tmpl, cs := claimCluster(t, true, true)
	var c counts
	p := newPool(cfg, cs, &c, tmpl)
	ctx := alice

	n, err := p.Wire(ctx, tmpl)
	if err != nil || n != 2 {
		t.Fatalf("Wire: %d, %v; want both pooled Pods wired", n, err)
	}
	tokens := map[string]bool{}
	for _, name := range []string{"sandbox-pool-warm-aaaaa", "sandbox-pool-warm-bbbbb"} {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		tok := pod.Labels[keys.LabelToken]
		if !tokenRE.MatchString(tok) || tokens[tok] {
			t.Errorf("pooled Pod %s token %q; want 32 hex digits of its own", name, tok)
		}
		tokens[tok] = true
		wire, err := cs.CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil || !resources.Wires(cfg.Objects(), wire, pod) {
			t.Errorf("wire of %s: %v %+v; want one that wires it", name, err, wire)
		}
	}
	if n, err := p.Wire(ctx, tmpl); err != nil || n != 0 {
		t.Errorf("Wire again: %d, %v; want nothing left to wire", n, err)
	}

	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(p))
	sb, err := m.Create(ctx, claimSpec(t, cfg, "abc", nil), 0)
	if err != nil || !sb.Pooled {
		t.Fatalf("create: %+v %v; want a pooled sandbox", sb, err)
	}
	svc, err := cs.CoreV1().Services(ns).Get(ctx, "sandbox-abc-svc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podName := resources.SandboxOwner(svc.OwnerReferences).Name
	claimed, err := cs.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	own, err := cs.CoreV1().Services(ns).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := struct {
		ClusterIP, URLService, PodToken, URL string
		Selector                             map[string]string
	}{svc.Spec.ClusterIP, resources.URLService(svc), claimed.Labels[keys.LabelToken], sb.URL, svc.Spec.Selector}
	want := got
	want.ClusterIP, want.URLService, want.URL, want.Selector = corev1.ClusterIPNone, podName, "http://"+podName+"."+ns+".svc.cluster.local:8080", nil
	if !tokens[got.PodToken] || !resources.Wires(cfg.Objects(), own, claimed) {
		t.Errorf("claimed Pod token %q, its wire %+v; want the token it was wired with, selected by its wire", got.PodToken, own)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("a claim of a wired Pod (-want +got):\n%s", diff)
	}
	if g, err := m.Get(ctx, "abc", 0); err != nil || g.URL != sb.URL {
		t.Errorf("get: %+v %v; want the wire's URL %s", g, err, sb.URL)
	}
	if l, err := m.List(ctx); err != nil || len(l) != 1 || l[0].URL != sb.URL {
		t.Errorf("list: %+v %v; want abc at the wire's URL %s", l, err, sb.URL)
	}

	// The other Pod's wire, edited by hand: its claim unwires it.
	other := "sandbox-pool-warm-aaaaa"
	if podName == other {
		other = "sandbox-pool-warm-bbbbb"
	}
	wire, err := cs.CoreV1().Services(ns).Get(ctx, other, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wire.Spec.Selector = map[string]string{keys.LabelApp: keys.LabelAppValue}
	if _, err := cs.CoreV1().Services(ns).Update(ctx, wire, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sb2, err := m.Create(ctx, claimSpec(t, cfg, "def", nil), 0)
	if err != nil || sb2.Pooled {
		t.Fatalf("create of def: %+v %v; want a cold sandbox (the only pooled Pod left has a wire edited by hand)", sb2, err)
	}
	if _, err := cs.CoreV1().Services(ns).Get(ctx, other, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("wire edited by hand after the claim: %v; want it removed", err)
	}
	if pod, err := cs.CoreV1().Pods(ns).Get(ctx, other, metav1.GetOptions{}); err != nil || pod.Labels[keys.LabelID] != "" || pod.Labels[keys.LabelPool] == "" {
		t.Errorf("the Pod whose wire was edited: %v %v; want it left in its pool, unclaimed", err, pod.Labels)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if diff := cmp.Diff(map[string]int{"warm/wired": 1, "warm/empty": 1}, c.m); diff != "" {
		t.Errorf("claims counted (-want +got):\n%s", diff)
	}
}

// TestClaimPassesOverAPodThatLostItsWire: a wired pooled Pod whose wire was
// deleted or edited by hand is not handed out (issue 32's bad input): a
// claim takes the other, wired Pod (Ready orders a Pod whose wire it did
// not list after those whose wire it did), the next create goes cold
// rather than claim it, and it stays in its pool with its token until the
// next wiring makes its wire again; then it is claimed wired. The fake
// clientset stands in for the API server.
func TestClaimPassesOverAPodThatLostItsWire(t *testing.T) {
	tests := []struct {
		name string
		lose func(svcs typedcorev1.ServiceInterface, wire *corev1.Service) error
		// unlisted: Ready lists no wire for the Pod, so orders it last
		unlisted bool
	}{
		{"deleted", func(svcs typedcorev1.ServiceInterface, wire *corev1.Service) error {
			return svcs.Delete(alice, wire.Name, metav1.DeleteOptions{})
		}, true},
		{"edited", func(svcs typedcorev1.ServiceInterface, wire *corev1.Service) error {
			wire.Spec.Selector = map[string]string{keys.LabelApp: keys.LabelAppValue}
			_, err := svcs.Update(alice, wire, metav1.UpdateOptions{})
			return err
		}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, tmpl, cs := claimCluster(t, true, true)
			var c counts
			p := newPool(cfg, cs, &c, tmpl)
			if n, err := p.Wire(alice, tmpl); err != nil || n != 2 {
				t.Fatalf("Wire: %d, %v; want both pooled Pods wired", n, err)
			}
			const lost, kept = "sandbox-pool-warm-aaaaa", "sandbox-pool-warm-bbbbb"
			svcs, pods := cs.CoreV1().Services(ns), cs.CoreV1().Pods(ns)
			wire, err := svcs.Get(alice, lost, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := tc.lose(svcs, wire); err != nil {
				t.Fatal(err)
			}
			before, err := pods.Get(alice, lost, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			urlOf := func(pod string) string { return "http://" + pod + "." + ns + ".svc.cluster.local:8080" }
			// No wiring in the background (wireSoon, a second after a
			// claim) until the test wires: as if one were running.
			p.wiring[tmpl.Name] = false
			if tc.unlisted {
				// Ready shuffles the Pods; twenty looks all put the wired one first.
				for i := 0; i < 20; i++ {
					ready, err := p.Ready(alice, tmpl, hashOf(cfg, tmpl))
					if err != nil || len(ready) != 2 || ready[0].Name != kept {
						t.Fatalf("Ready: %d Pods, %v; want %s (wired) first", len(ready), err, kept)
					}
				}
			}

			m := sandbox.NewManager(cfg, cs, sandbox.WithPool(p))
			got := map[string]string{}
			for _, id := range []string{"abc", "def"} {
				sb, err := m.Create(alice, claimSpec(t, cfg, id, nil), 0)
				if err != nil {
					t.Fatalf("create %s: %v", id, err)
				}
				got[id] = "cold"
				if sb.Pooled {
					got[id] = sb.URL
				}
			}
			if diff := cmp.Diff(map[string]string{"abc": urlOf(kept), "def": "cold"}, got); diff != "" {
				t.Errorf("creates (the wired Pod's URL, or cold) (-want +got):\n%s", diff)
			}
			after, err := pods.Get(alice, lost, metav1.GetOptions{})
			if err != nil || after.Labels[keys.LabelID] != "" || after.Labels[keys.LabelPool] == "" || resources.Token(after) != resources.Token(before) {
				t.Fatalf("the Pod that lost its wire: %v %v; want it left in its pool, unclaimed, with its token", err, after.Labels)
			}
			if _, err := svcs.Get(alice, lost, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("its wire after the claims: %v; want none (an edited one is removed)", err)
			}

			// The next wiring makes its wire again; then it is claimed wired.
			if n, err := p.Wire(alice, tmpl); err != nil || n != 1 {
				t.Fatalf("Wire: %d, %v; want the Pod that lost its wire wired again", n, err)
			}
			if w, err := svcs.Get(alice, lost, metav1.GetOptions{}); err != nil || !resources.Wires(cfg.Objects(), w, after) {
				t.Fatalf("its wire after the next wiring: %+v %v; want one that wires it", w, err)
			}
			sb, err := m.Create(alice, claimSpec(t, cfg, "ghi", nil), 0)
			if err != nil || !sb.Pooled || sb.URL != urlOf(lost) {
				t.Errorf("create of ghi: %+v %v; want it claimed at its wire %s", sb, err, urlOf(lost))
			}
		})
	}
}

// TestClaimMeetsAWiringLandingFirst: a claim of a Pod not yet wired made
// its Service selecting its own token; the wiring's token write lands on
// the Pod first, so the claim's patch meets a conflict, and the Pod read
// again carries another token than the Service selects. The claim passes
// over it (the Service would select nothing) and the create goes on, here
// cold; the Pod stays in its pool, wired.
func TestClaimMeetsAWiringLandingFirst(t *testing.T) {
	cfg, tmpl, cs := claimCluster(t, true)
	const wiringToken = "0123456789abcdef0123456789abcdef"
	var once sync.Once
	cs.PrependReactor("patch", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		handled := false
		once.Do(func() {
			pod, err := cs.Tracker().Get(corev1.SchemeGroupVersion.WithResource("pods"), ns, a.(clienttesting.PatchAction).GetName())
			if err != nil {
				t.Error(err)
				return
			}
			p := pod.(*corev1.Pod).DeepCopy()
			p.Labels[keys.LabelToken] = wiringToken
			p.ResourceVersion = "wired"
			if err := cs.Tracker().Update(corev1.SchemeGroupVersion.WithResource("pods"), p, ns); err != nil {
				t.Error(err)
			}
			handled = true
		})
		if handled {
			return true, nil, apierrors.NewConflict(corev1.Resource("pods"), a.(clienttesting.PatchAction).GetName(), errors.New("the wiring wrote first"))
		}
		return false, nil, nil
	})
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
	sb, err := m.Create(alice, claimSpec(t, cfg, "abc", nil), 0)
	if err != nil || sb.Pooled {
		t.Fatalf("create: %+v %v; want a cold sandbox (the only pooled Pod was wired under the claim)", sb, err)
	}
	pod, err := cs.CoreV1().Pods(ns).Get(alice, "sandbox-pool-warm-aaaaa", metav1.GetOptions{})
	if err != nil || pod.Labels[keys.LabelID] != "" || pod.Labels[keys.LabelToken] != wiringToken {
		t.Errorf("pooled Pod: %v %v; want it unclaimed, with the wiring's token", err, pod.Labels)
	}
	svc, err := cs.CoreV1().Services(ns).Get(alice, "sandbox-abc-svc", metav1.GetOptions{})
	if err != nil || resources.OwnerUID(svc.OwnerReferences) == pod.UID {
		t.Errorf("sandbox Service: %v %+v; want the cold sandbox's, not one left on the pooled Pod", err, svc)
	}
}

// TestClaimTakesTheWireReadyListed: Ready lists the pool's wires beside its
// Pods, so a claim reads no wire of its own (one round trip fewer); a wire
// listed longer ago than listedFor is read again, and one the list missed
// is read. Gets of the wires are counted on the fake clientset.
func TestClaimTakesTheWireReadyListed(t *testing.T) {
	tests := []struct {
		name      string
		later     time.Duration // between Ready and WireOf
		listFails bool
		wantGets  int
	}{
		{name: "a moment after Ready: the listed wire", wantGets: 0},
		{name: "listed too long ago: read again", later: 3 * time.Second, wantGets: 1},
		{name: "the list failed: read", listFails: true, wantGets: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, tmpl, cs := claimCluster(t, true)
			var c counts
			p := newPool(cfg, cs, &c, tmpl)
			if n, err := p.Wire(alice, tmpl); err != nil || n != 1 {
				t.Fatalf("Wire: %d, %v; want the pooled Pod wired", n, err)
			}
			var mu sync.Mutex
			gets := 0
			cs.PrependReactor("get", "services", func(clienttesting.Action) (bool, runtime.Object, error) {
				mu.Lock()
				defer mu.Unlock()
				gets++
				return false, nil, nil
			})
			if tc.listFails {
				cs.PrependReactor("list", "services", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewServiceUnavailable("injected")
				})
			}
			ready, err := p.Ready(alice, tmpl, hashOf(cfg, tmpl))
			if err != nil || len(ready) != 1 {
				t.Fatalf("Ready: %d Pods, %v", len(ready), err)
			}
			now := time.Now().Add(tc.later)
			p.now = func() time.Time { return now }
			wire, err := p.WireOf(alice, tmpl, ready[0])
			if err != nil || !resources.Wires(cfg.Objects(), wire, ready[0]) {
				t.Fatalf("WireOf: %+v, %v; want the Pod's wire", wire, err)
			}
			if diff := cmp.Diff(tc.wantGets, gets); diff != "" {
				t.Errorf("wire reads (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKeepReapsWiresThatSelectNothing: the reap's keep removes a pool's
// Service that selects no Pod (no selector, a token no Pod carries, a
// selector edited by hand that matches nothing) once it is older than
// wireGrace, and keeps every wire that selects a Pod, pooled or claimed,
// one too young to judge, and one not named as the function names wires. The fake clientset stands in for the API
// server (its lists honour label selectors as the API server's do).
func TestKeepReapsWiresThatSelectNothing(t *testing.T) {
	cfg, tmpl, cs := claimCluster(t, true, true)
	ctx := alice
	p := newPool(cfg, cs, &counts{}, tmpl)
	if n, err := p.Wire(ctx, tmpl); err != nil || n != 2 {
		t.Fatalf("Wire: %d, %v; want both pooled Pods wired", n, err)
	}
	// The second pooled Pod, claimed since: its wire is its sandbox's URL.
	claimed, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-pool-warm-bbbbb", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(claimed.Labels, keys.LabelPool)
	claimed.Labels[keys.LabelID], claimed.Labels[keys.LabelPooled] = "abc123", "true"
	if _, err := cs.CoreV1().Pods(ns).Update(ctx, claimed, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	copyOf := func(name string) *corev1.Service {
		pod, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-pool-warm-aaaaa", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		w := resources.BuildWire(cfg.Objects(), pod, pod.Labels[keys.LabelToken])
		// No owner: made by hand, or its owner reference removed (the fake
		// has no garbage collector, and the real one would not follow).
		w.Name, w.OwnerReferences = name, nil
		w.CreationTimestamp = metav1.Now() // the fake sets none
		return w
	}
	odd := map[string]func(*corev1.Service){
		"sandbox-pool-warm-nosel": func(w *corev1.Service) { w.Spec.Selector = nil },
		"sandbox-pool-warm-nopod": func(w *corev1.Service) { w.Spec.Selector[keys.LabelToken] = "0123456789abcdef0123456789abcdef" },
		"sandbox-pool-warm-edit0": func(w *corev1.Service) { w.Spec.Selector = map[string]string{"app": "nothing-here"} },
		"sandbox-pool-warm-edit1": func(w *corev1.Service) { w.Spec.Selector = map[string]string{keys.LabelPool: "warm"} },
		"sandbox-pool-warm-copy0": func(*corev1.Service) {},
		// Its token with another Pod's pin: no Pod carries both.
		"sandbox-pool-warm-pin00": func(w *corev1.Service) { w.Spec.Selector[keys.LabelPod] = "sandbox-pool-warm-bbbbb" },
		// Wires as made before pins (the token alone): kept while a Pod
		// carries the token.
		"sandbox-pool-warm-old00": func(w *corev1.Service) { delete(w.Spec.Selector, keys.LabelPod) },
		"sandbox-pool-warm-old01": func(w *corev1.Service) {
			w.Spec.Selector = map[string]string{keys.LabelToken: "0123456789abcdef0123456789abcdef"}
		},
		// Not named as the function names wires: not its to delete,
		// whatever it selects (the admission policy refuses it too).
		"wire-made-by-hand": func(w *corev1.Service) { w.Spec.Selector = nil },
	}
	for name, edit := range odd {
		w := copyOf(name)
		edit(w)
		if _, err := cs.CoreV1().Services(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Just made, the Services are too young to judge: all stay.
	if err := p.keep(ctx, []*template.Template{tmpl}); err != nil {
		t.Fatal(err)
	}
	wires := func() []string {
		l, err := cs.CoreV1().Services(ns).List(ctx, metav1.ListOptions{LabelSelector: resources.SelectorWires})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, w := range l.Items {
			names = append(names, w.Name)
		}
		sort.Strings(names)
		return names
	}
	all := []string{"sandbox-pool-warm-aaaaa", "sandbox-pool-warm-bbbbb", "sandbox-pool-warm-copy0", "sandbox-pool-warm-edit0", "sandbox-pool-warm-edit1", "sandbox-pool-warm-nopod", "sandbox-pool-warm-nosel",
		"sandbox-pool-warm-old00", "sandbox-pool-warm-old01", "sandbox-pool-warm-pin00", "wire-made-by-hand"}
	if diff := cmp.Diff(all, wires()); diff != "" {
		t.Errorf("wires after a keep while they are young (-want +got):\n%s", diff)
	}
	p.now = func() time.Time { return time.Now().Add(wireGrace + time.Second) }
	if err := p.keep(ctx, []*template.Template{tmpl}); err != nil {
		t.Fatal(err)
	}
	want := []string{"sandbox-pool-warm-aaaaa", "sandbox-pool-warm-bbbbb", "sandbox-pool-warm-copy0", "sandbox-pool-warm-edit1", "sandbox-pool-warm-old00", "wire-made-by-hand"}
	if diff := cmp.Diff(want, wires()); diff != "" {
		t.Errorf("wires after a keep once they are old (-want +got):\n%s", diff)
	}
}

// TestCreateRewiresAClaimedSandbox: a sandbox claimed wired whose wire was
// then deleted, or edited by hand, has no URL (get answers it without
// one and writes nothing); its next create (DeerFlow creates on every
// acquire) makes the wire again, as the wiring made it, and answers with
// its URL. The fake clientset stands in for the API server.
func TestCreateRewiresAClaimedSandbox(t *testing.T) {
	for _, tc := range []struct {
		name   string
		breaks func(t *testing.T, svcs typedcorev1.ServiceInterface, wire *corev1.Service)
	}{
		{"deleted", func(t *testing.T, svcs typedcorev1.ServiceInterface, wire *corev1.Service) {
			if err := svcs.Delete(alice, wire.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{"edited", func(t *testing.T, svcs typedcorev1.ServiceInterface, wire *corev1.Service) {
			wire.Spec.Selector = map[string]string{keys.LabelApp: keys.LabelAppValue}
			if _, err := svcs.Update(alice, wire, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, tmpl, cs := claimCluster(t, true)
			ctx := alice
			p := newPool(cfg, cs, &counts{}, tmpl)
			if n, err := p.Wire(ctx, tmpl); err != nil || n != 1 {
				t.Fatalf("Wire: %d, %v; want the pooled Pod wired", n, err)
			}
			m := sandbox.NewManager(cfg, cs, sandbox.WithPool(p))
			sb, err := m.Create(ctx, claimSpec(t, cfg, "abc", nil), 0)
			if err != nil || !sb.Pooled || sb.URL == "" {
				t.Fatalf("create: %+v %v; want a pooled sandbox with a URL", sb, err)
			}
			svcs := cs.CoreV1().Services(ns)
			wire, err := svcs.Get(ctx, "sandbox-pool-warm-aaaaa", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			tc.breaks(t, svcs, wire)
			writes := len(cs.Actions())
			if g, err := m.Get(ctx, "abc", 0); err != nil || g.URL != "" {
				t.Errorf("get with its wire %s: %+v %v; want no URL", tc.name, g, err)
			}
			for _, a := range cs.Actions()[writes:] {
				if v := a.GetVerb(); v != "get" && v != "list" && v != "watch" {
					t.Errorf("get wrote: %s %s", v, a.GetResource().Resource)
				}
			}
			again, err := m.Create(ctx, claimSpec(t, cfg, "abc", nil), 0)
			if err != nil || again.URL != sb.URL {
				t.Fatalf("create again: %+v %v; want the sandbox at %s", again, err, sb.URL)
			}
			pod, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-pool-warm-aaaaa", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if w, err := svcs.Get(ctx, "sandbox-pool-warm-aaaaa", metav1.GetOptions{}); err != nil || !resources.Wires(cfg.Objects(), w, pod) || w.Labels[keys.LabelPool] != "warm" {
				t.Errorf("the wire after the create: %+v %v; want one that wires the claimed Pod, in pool warm", w, err)
			}
			if g, err := m.Get(ctx, "abc", 0); err != nil || g.URL != sb.URL {
				t.Errorf("get after the create: %+v %v; want the sandbox at %s", g, err, sb.URL)
			}
		})
	}
}

// TestCreateAfterAClaimedPodWasOrphaned: a sandbox claimed wired whose Pod
// was deleted with --cascade=orphan leaves its Service without an owner
// (the garbage collector removes the reference) and naming a wire that
// went the same way. That Service selects nothing and no workload is its:
// the next create of the id removes it and makes a whole sandbox, rather
// than adopting it as a Service of DeerFlow's provisioner (the API
// server's admission policy would refuse that update: a Service naming a
// wire selects nothing). Whether the create's first read sees it (the cold
// way removes it) or misses it (the claim's own Service create meets it).
// The fake clientset stands in for the API server and its garbage
// collector (the test removes the references itself).
func TestCreateAfterAClaimedPodWasOrphaned(t *testing.T) {
	for _, tc := range []struct {
		name       string
		readMisses bool // the create's first read of the id's Service answers 404 (a stale watch cache)
		pooled     bool
	}{
		{"the create's read finds it", false, false},
		{"the claim meets it", true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, tmpl, cs := claimCluster(t, true, true)
			ctx := alice
			p := newPool(cfg, cs, &counts{}, tmpl)
			if n, err := p.Wire(ctx, tmpl); err != nil || n != 2 {
				t.Fatalf("Wire: %d, %v; want both pooled Pods wired", n, err)
			}
			m := sandbox.NewManager(cfg, cs, sandbox.WithPool(p))
			if sb, err := m.Create(ctx, claimSpec(t, cfg, "abc", nil), 0); err != nil || !sb.Pooled {
				t.Fatalf("create: %+v %v; want a pooled sandbox", sb, err)
			}
			svcs, pods := cs.CoreV1().Services(ns), cs.CoreV1().Pods(ns)
			first, err := svcs.Get(ctx, "sandbox-abc-svc", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			claimed := resources.URLService(first)
			for _, name := range []string{first.Name, claimed} {
				svc, err := svcs.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				svc.OwnerReferences = nil
				if _, err := svcs.Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := pods.Delete(ctx, claimed, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			if tc.readMisses {
				var once sync.Once
				cs.PrependReactor("get", "services", func(a clienttesting.Action) (bool, runtime.Object, error) {
					handled := false
					if a.(clienttesting.GetAction).GetName() == first.Name {
						once.Do(func() { handled = true })
					}
					return handled, nil, apierrors.NewNotFound(corev1.Resource("services"), first.Name)
				})
			}

			sb, err := m.Create(ctx, claimSpec(t, cfg, "abc", nil), 0)
			if err != nil || sb.URL == "" || sb.Pooled != tc.pooled {
				t.Fatalf("create again: %+v %v; want a sandbox with a URL, pooled %v", sb, err, tc.pooled)
			}
			svc, err := svcs.Get(ctx, first.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			owner := resources.SandboxOwner(svc.OwnerReferences)
			if owner == nil || owner.Name == claimed || (resources.URLService(svc) != "" && resources.URLService(svc) != owner.Name) {
				t.Fatalf("the id's Service after the create: %+v; want one owned by a new workload, naming that workload's wire if any", svc)
			}
			pod, err := pods.Get(ctx, owner.Name, metav1.GetOptions{})
			if err != nil || pod.UID != owner.UID || !resources.Names(svc, pod) {
				t.Errorf("the Service's owner %s: %+v %v; want the live Pod it names", owner.Name, pod, err)
			}
			if g, err := m.Get(ctx, "abc", 0); err != nil || g.URL != sb.URL {
				t.Errorf("get: %+v %v; want the sandbox at %s", g, err, sb.URL)
			}
		})
	}
}

// TestWiringPinsEachPod (issue 45): the wiring gives a pooled Pod its
// token and its pin (its own name) in one write conditional on the Pod's
// UID and version, and its wire selects both, so a Pod given that token
// (the function's ServiceAccount can read it from a Pod list) does not
// join the wire. A Pod wired before pins keeps its wire (the token alone)
// while it has one: no write; one that lost it gains its pin alone (its
// token stays) before its wire is made again, pinned. The fake clientset
// stands in for the API server.
func TestWiringPinsEachPod(t *testing.T) {
	cfg, tmpl, cs := claimCluster(t, true, true)
	const fresh, old, oldToken = "sandbox-pool-warm-aaaaa", "sandbox-pool-warm-bbbbb", "0123456789abcdef0123456789abcdef"
	pods, svcs := cs.CoreV1().Pods(ns), cs.CoreV1().Services(ns)
	// old, as the version before pins wired it: a token, no pin, a wire
	// selecting the token alone.
	before, err := pods.Get(alice, old, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	before.Labels[keys.LabelToken] = oldToken
	if before, err = pods.Update(alice, before, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	legacy := resources.BuildWire(cfg.Objects(), before, oldToken)
	legacy.Spec.Selector = map[string]string{keys.LabelToken: oldToken}
	if _, err := svcs.Create(alice, legacy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		patches = map[string][]map[string]any{}
	)
	cs.PrependReactor("patch", "pods", func(a clienttesting.Action) (bool, runtime.Object, error) {
		var p struct {
			Metadata map[string]any `json:"metadata"`
		}
		if err := json.Unmarshal(a.(clienttesting.PatchAction).GetPatch(), &p); err != nil {
			t.Error(err)
		}
		mu.Lock()
		defer mu.Unlock()
		patches[a.(clienttesting.PatchAction).GetName()] = append(patches[a.(clienttesting.PatchAction).GetName()], p.Metadata)
		return false, nil, nil
	})
	p := newPool(cfg, cs, &counts{}, tmpl)
	if n, err := p.Wire(alice, tmpl); err != nil || n != 1 {
		t.Fatalf("Wire: %d, %v; want the one Pod without a wire wired", n, err)
	}
	pod, err := pods.Get(alice, fresh, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok := pod.Labels[keys.LabelToken]
	if !tokenRE.MatchString(tok) || pod.Labels[keys.LabelPod] != fresh {
		t.Errorf("wired Pod %s labels %v; want a token of 32 hex digits and %s=%s", fresh, pod.Labels, keys.LabelPod, fresh)
	}
	wantPatch := []map[string]any{{"uid": "uid-" + fresh, "resourceVersion": "10", "labels": map[string]any{keys.LabelToken: tok, keys.LabelPod: fresh}}}
	if diff := cmp.Diff(wantPatch, patches[fresh]); diff != "" {
		t.Errorf("the wiring's writes of %s (-want +got):\n%s", fresh, diff)
	}
	wire, err := svcs.Get(alice, fresh, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{keys.LabelToken: tok, keys.LabelPod: fresh}, wire.Spec.Selector); diff != "" {
		t.Errorf("the wire's selector (-want +got):\n%s", diff)
	}
	sel := labels.SelectorFromSet(wire.Spec.Selector)
	stray := labels.Set{keys.LabelToken: tok, keys.LabelPod: resources.PodName("stray"), keys.LabelID: "stray"}
	if !sel.Matches(labels.Set(pod.Labels)) || sel.Matches(stray) {
		t.Errorf("wire %v: matches its Pod %v, a Pod given its token %v: want true, false", wire.Spec.Selector, sel.Matches(labels.Set(pod.Labels)), sel.Matches(stray))
	}
	if got := patches[old]; len(got) != 0 {
		t.Errorf("the Pod wired before pins, its wire standing, was written: %v; want no write", got)
	}

	// It loses its wire: the next wiring pins it, then makes its wire.
	if err := svcs.Delete(alice, old, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if n, err := p.Wire(alice, tmpl); err != nil || n != 1 {
		t.Fatalf("Wire: %d, %v; want the Pod from before pins wired again", n, err)
	}
	wantPatch = []map[string]any{{"uid": "uid-" + old, "resourceVersion": before.ResourceVersion, "labels": map[string]any{keys.LabelPod: old}}}
	if diff := cmp.Diff(wantPatch, patches[old]); diff != "" {
		t.Errorf("the wiring's writes of %s, wired before pins (-want +got):\n%s", old, diff)
	}
	after, err := pods.Get(alice, old, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := svcs.Get(alice, old, metav1.GetOptions{})
	if err != nil || after.Labels[keys.LabelToken] != oldToken || !resources.Wires(cfg.Objects(), w, after) || resources.UnpinnedWire(w) {
		t.Errorf("Pod %s (labels %v) and its wire %+v, %v; want its token kept and a pinned wire", old, after.Labels, w, err)
	}
}

// TestUnwiredClaimPinsItsService (issue 45): a claim of a Pod not wired
// writes the Pod's pin (its own name) with the id and token, and the
// sandbox's Service, made before the claim, selects id, token and that
// name: a Pod given the id and token (read from a Pod list) does not
// join it. The fake clientset stands in for the API server.
func TestUnwiredClaimPinsItsService(t *testing.T) {
	cfg, tmpl, cs := claimCluster(t, true)
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &counts{}, tmpl)))
	sb, err := m.Create(alice, claimSpec(t, cfg, "abc", nil), 0)
	if err != nil || !sb.Pooled {
		t.Fatalf("create: %+v %v; want a pooled sandbox", sb, err)
	}
	const claimed = "sandbox-pool-warm-aaaaa"
	pod, err := cs.CoreV1().Pods(ns).Get(alice, claimed, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := cs.CoreV1().Services(ns).Get(alice, "sandbox-abc-svc", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok := pod.Labels[keys.LabelToken]
	want := map[string]string{keys.LabelID: "abc", keys.LabelToken: tok, keys.LabelPod: claimed}
	if diff := cmp.Diff(want, svc.Spec.Selector); diff != "" || !tokenRE.MatchString(tok) {
		t.Errorf("the claimed sandbox's Service selects (-want +got):\n%s", diff)
	}
	sel := labels.SelectorFromSet(svc.Spec.Selector)
	stray := labels.Set{keys.LabelID: "abc", keys.LabelToken: tok, keys.LabelPod: resources.PodName("abc")}
	if !sel.Matches(labels.Set(pod.Labels)) || sel.Matches(stray) {
		t.Errorf("Service %v: matches its Pod %v (labels %v), a Pod given its id and token %v: want true, false",
			svc.Spec.Selector, sel.Matches(labels.Set(pod.Labels)), pod.Labels, sel.Matches(stray))
	}
}

// TestCreatePinsAPodClaimedBeforePins (issue 45): a sandbox claimed wired
// by the version before pins (its Pod has no pin, its wire selects the
// token alone) answers at its wire as before; once that wire is deleted,
// its next create pins the Pod first (the admission policy refuses a wire
// of the token alone), makes the wire pinned, and answers with its URL at
// once. The fake clientset stands in for the API server.
func TestCreatePinsAPodClaimedBeforePins(t *testing.T) {
	cfg, tmpl, cs := claimCluster(t, true)
	p := newPool(cfg, cs, &counts{}, tmpl)
	if n, err := p.Wire(alice, tmpl); err != nil || n != 1 {
		t.Fatalf("Wire: %d, %v; want the pooled Pod wired", n, err)
	}
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(p))
	sb, err := m.Create(alice, claimSpec(t, cfg, "abc", nil), 0)
	if err != nil || !sb.Pooled || sb.URL == "" {
		t.Fatalf("create: %+v %v; want a pooled sandbox with a URL", sb, err)
	}
	const name = "sandbox-pool-warm-aaaaa"
	pods, svcs := cs.CoreV1().Pods(ns), cs.CoreV1().Services(ns)
	// As the version before pins left it.
	pod, err := pods.Get(alice, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(pod.Labels, keys.LabelPod)
	if _, err := pods.Update(alice, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wire, err := svcs.Get(alice, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wire.Spec.Selector = map[string]string{keys.LabelToken: pod.Labels[keys.LabelToken]}
	if _, err := svcs.Update(alice, wire, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if g, err := m.Get(alice, "abc", 0); err != nil || g.URL != sb.URL {
		t.Errorf("get with its wire from before pins: %+v %v; want the sandbox at %s", g, err, sb.URL)
	}
	if err := svcs.Delete(alice, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	again, err := m.Create(alice, claimSpec(t, cfg, "abc", nil), 0)
	if err != nil || again.URL != sb.URL {
		t.Fatalf("create again: %+v %v; want the sandbox at %s", again, err, sb.URL)
	}
	pinned, err := pods.Get(alice, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := svcs.Get(alice, name, metav1.GetOptions{})
	if err != nil || pinned.Labels[keys.LabelPod] != name || resources.UnpinnedWire(w) || !resources.Wires(cfg.Objects(), w, pinned) {
		t.Errorf("the Pod (labels %v) and its wire %+v, %v after the create; want the Pod pinned and a pinned wire that wires it", pinned.Labels, w, err)
	}
}
