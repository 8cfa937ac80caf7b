//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// The soak's settings: two principals, two replicas, small limits so that
// the quota is met often, and short deadlines so that what a failed request
// leaves is judged leftover within seconds.
const (
	soakBobKey     = "bob-key-0123456789abcdef"
	soakLimit      = 6
	soakPerPrinc   = 4
	soakReqTimeout = 5 * time.Second
	soakReadyWait  = 5 * time.Second
	soakWorkers    = 3 // per principal
	// soakRestartFrom is the shortest soak that restarts the API server:
	// make soak's, not the 2-minute one inside make test. A restart under
	// this load has been seen to end the kwok test cluster's scheduler,
	// controller manager and kwok controller, which leaves every later
	// test of the suite unscheduled (not understood yet: see the closing
	// note); make soak runs the soak alone.
	soakRestartFrom = 5 * time.Minute
	soakIDs         = 3 // per worker
)

// TestSoak is the fault soak (issue: tenants under faults). For
// SOAK_DURATION (2 minutes in make test, 10 in make soak), two principals
// drive two replicas with random creates (cold, ReplicaSet, pooled: of wired Pods and not),
// gets, destroys, pauses, resumes, reaps and attacks on each other's
// sandboxes, while clients give up at random, the API proxy answers 5xx
// (before and after the API server's work) and slows requests, one replica
// is killed and started again, and (soaks of soakRestartFrom or more:
// make soak) the API server is stopped and started once under the requests
// in flight (new ones wait until the checker's watch sees again).
// SOAK_SEED replays a run's choices (the faults' timing is the machine's).
//
// The checker holds the history against the cluster, read straight from
// the API server (never through the faults):
//   - every create answered 200 was whole at its answer (its Service
//     selects a live workload of its principal);
//   - every destroy answered 200 left nothing of its sandbox;
//   - no principal's get of another's id answered 200, no attack's
//     create answered 200, and a sandbox certain to exist still existed
//     after another principal's destroy of its id;
//   - a sandbox certain to exist never answered its owner's get with 404;
//   - a watch recounts the sandbox workloads on every event: never more
//     than MAX_SANDBOXES, nor more than MAX_SANDBOXES_PER_PRINCIPAL of one
//     principal;
//   - after the settle (faults off, past every undo's window, one reap),
//     no Pod without its Service and no Service without its workload;
//   - on the network (soaknet_test.go), each principal's backend, at
//     random moments, connected to every sandbox and pooled Pod on the
//     real node: none reached another principal's sandbox or an unclaimed
//     pooled Pod, and each reached its own.
//
// An id's checks pause for a while after a request on it was cut (the
// client gave up, or a replica died): the function may still be working on
// it.
//
// The API server and the faults are real (the proxy stands in for an API
// server answering 5xx); the nodes are kwok's, where what is checked does
// not depend on a node, but for a small share on the real node (the
// sandboxes of two ids of each principal, from the pooled template
// soak-net), which the network checks need: there a connection is made or
// refused by the policy agent. Without a real node (REAL_NODE=0) the soak
// runs on kwok alone and says so; under CI that fails.
func TestSoak(t *testing.T) {
	dur := 2 * time.Minute
	if v := os.Getenv("SOAK_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("SOAK_DURATION=%q: want a positive duration such as 10m", v)
		}
		dur = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("SOAK_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: want the number a run printed", v)
		}
		seed = s
	}
	t.Logf("SOAK_SEED=%d SOAK_DURATION=%s", seed, dur)

	ns := namespace(t)
	putTemplate(t, ns, rsTemplate("soak-rs", "sandbox:test", nil))
	env := function.BaseEnv(kubeconfig, ns)
	for k, v := range map[string]string{
		"PROVISIONER_API_KEYS":        "alice=" + aliceKey + ",bob=" + soakBobKey,
		"MAX_SANDBOXES":               fmt.Sprint(soakLimit),
		"MAX_SANDBOXES_PER_PRINCIPAL": fmt.Sprint(soakPerPrinc),
		"REQUEST_TIMEOUT":             soakReqTimeout.String(),
		"SANDBOX_MAX_READY_WAIT":      soakReadyWait.String(),
		"EMIT_KUBERNETES_EVENTS":      "false",
		// Each principal's sandboxes admit its own backends alone.
		"PROVISIONER_PRINCIPAL_INGRESS": soakSources,
		// Every principal may run everything, the reap too (the setup's
		// and the settle's, and the load's): with several principals the
		// reap is granted only so.
		"PROVISIONER_PRINCIPAL_OPERATIONS": "*=" + strings.Join(config.Operations, ","),
	} {
		env[k] = v
	}
	network := newSoakNet(t, ns, env)
	bin, err := function.Binary()
	if err != nil {
		t.Fatal(err)
	}
	var replicas [2]atomic.Pointer[function.Instance]
	for i := range replicas {
		f, err := function.StartBinary(bin, env, filepath.Join(t.TempDir(), fmt.Sprintf("replica%d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		replicas[i].Store(f)
	}
	t.Cleanup(func() {
		for i := range replicas {
			replicas[i].Load().Stop()
		}
	})
	warmUp(t, replicas[0].Load(), ns, "soak-pool", 3) // its reap makes soak-net's pool too, if any
	keepPools(t, replicas[0].Load())                  // wires the pool's Pods: claims of wired Pods are in the load from the start
	network.awaitPool(t, replicas[0].Load())
	w := watchWorkloads(t, ns)
	s := &soak{t: t, ns: ns, seed: seed, replicas: &replicas, ids: map[string]*soakID{}, net: network}
	for _, p := range []soakPrincipal{{"alice", aliceKey}, {"bob", soakBobKey}} {
		for wk := 0; wk < soakWorkers; wk++ {
			for i := 0; i < soakIDs; i++ {
				id := fmt.Sprintf("sk-%s%d-%d", p.name[:1], wk, i)
				s.ids[id] = &soakID{id: id, owner: p, user: fmt.Sprintf("%s-u%d", p.name, wk), thread: id, template: network.template(wk, i)}
			}
		}
	}
	// Every user and thread id is first used by its own principal, before
	// any attack names it (ownership is first come: an attack must meet
	// an owner): each id is created and destroyed once.
	for _, x := range s.sortedIDs() {
		if r := s.send(replicas[0].Load(), x.owner, "POST", "/api/sandboxes", x.createBody(x.template), 30*time.Second); r != 200 {
			t.Fatalf("first create of %s: %d", x.id, r)
		}
		if r := s.send(replicas[0].Load(), x.owner, "DELETE", "/api/sandboxes/"+x.id, nil, 30*time.Second); r != 200 {
			t.Fatalf("first destroy of %s: %d", x.id, r)
		}
		x.state = stateAbsent
	}

	faults := injectFaults(t, ns, seed, 4, 4, 6)

	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	g := 0
	for _, p := range []soakPrincipal{{"alice", aliceKey}, {"bob", soakBobKey}} {
		for wk := 0; wk < soakWorkers; wk++ {
			g++
			wg.Add(1)
			go func(r *rand.Rand) {
				defer wg.Done()
				for time.Now().Before(end) {
					s.enter()
					s.step(r, p, wk)
					s.inflight.Add(-1)
				}
			}(rand.New(rand.NewPCG(seed, uint64(g))))
		}
	}
	network.probe(seed, end, &wg)
	go func() { // progress, for a long make soak
		for tick := time.NewTicker(30 * time.Second); time.Now().Before(end); <-tick.C {
			s.mu.Lock()
			t.Logf("soak: %d operations so far, %s left", s.ops, time.Until(end).Round(time.Second))
			s.mu.Unlock()
		}
	}()
	// One replica killed mid-load and started again; the API server
	// stopped and started once.
	time.Sleep(dur / 3)
	victim := replicas[1].Load()
	victim.Kill()
	faults.add("replica killed")
	time.Sleep(2 * time.Second)
	restarted, err := function.StartBinary(bin, env, filepath.Join(t.TempDir(), "replica1-again.log"))
	if err != nil {
		t.Fatal(err)
	}
	replicas[1].Store(restarted)
	time.Sleep(time.Until(end.Add(-dur / 3)))
	if dur >= soakRestartFrom {
		// Requests in flight meet the restart; new ones wait until the
		// workload watch sees again (workloadWatch.rebase says why).
		held := s.hold()
		restore := outage(t)
		faults.add("API server restarted")
		time.Sleep(3 * time.Second)
		restore()
		s.drain(30 * time.Second)
		w.rebase()
		close(held)
		s.gate.Store(nil)
	}
	wg.Wait()
	proxy.SetFaults(nil)

	// The settle: past every cut request's work and every undo's window,
	// then one reap, which removes what an undo could not.
	time.Sleep(2*soakReqTimeout + soakReadyWait + 2*time.Second)
	if code := s.send(replicas[0].Load(), soakPrincipal{"alice", aliceKey}, "POST", "/api/reap", nil, 30*time.Second); code != 200 {
		s.violate("the settle's reap answered %d", code)
	}
	s.checkSettled()

	pk := w.peaks()
	if pk.max > soakLimit {
		s.violate("%d sandbox workloads at once, over MAX_SANDBOXES=%d (%d deletions the watch missed counted until it saw them): %v", pk.max, soakLimit, pk.missed, pk.at)
		w.tell(pk)
	}
	for p, n := range pk.byPrincipal {
		if n > soakPerPrinc {
			s.violate("%d sandbox workloads of %s at once, over MAX_SANDBOXES_PER_PRINCIPAL=%d", n, p, soakPerPrinc)
		}
	}
	// Claims of wired pooled Pods were part of the load (counted by the
	// replicas now running: a killed one's counts went with it).
	claims := map[string]float64{}
	for i := range replicas {
		for k, v := range scrape(t, replicas[i].Load(), "sandbox_provisioner_pool_claims_total") {
			claims[k[strings.Index(k, "{"):]] += v
		}
	}
	if claims[`{result="wired",template="soak-pool"}`] == 0 {
		s.violate("no claim of a wired pooled Pod in the load: %v", claims)
	}
	netSummary, netLittle := network.check(s)
	injected := faults.byKind()
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("soak: seed %d; %d operations %v; faults injected %v; %d watch events (%d deletions missed), at most %d workloads at once (per principal %v); pool claims (running replicas) %v; %s; violations: %d",
		seed, s.ops, s.answers, injected, pk.events, pk.missed, pk.max, pk.byPrincipal, claims, netSummary, len(s.violations))
	for _, v := range s.violations {
		t.Error(v)
	}
	if s.answers["POST 200"] == 0 || injected["5xx after the API server's work"] == 0 {
		t.Errorf("the soak proved little: %v answers, %v faults", s.answers, injected)
	}
	if netLittle != "" {
		t.Errorf("the soak's network prober proved little: %s", netLittle)
	}
}

type soakPrincipal struct{ name, key string }

// An id's state, as the history makes certain of it.
const (
	stateUnknown = iota
	stateExists
	stateAbsent
)

type soakID struct {
	mu               sync.Mutex // one request on the id at a time, the owner's or an attack's
	id, user, thread string
	owner            soakPrincipal
	template         string // every create's, when set (soak-net); else the op's
	state            int
	taintedUntil     time.Time // a request on it was cut: the function may still work on it
}

func (x *soakID) createBody(tmpl string) map[string]any {
	b := map[string]any{"sandbox_id": x.id, "user_id": x.user, "thread_id": x.thread}
	if tmpl != "" {
		b["template"] = tmpl
	}
	return b
}

func (x *soakID) settled() bool { return time.Now().After(x.taintedUntil) }

type soak struct {
	t        *testing.T
	ns       string
	seed     uint64
	replicas *[2]atomic.Pointer[function.Instance]
	ids      map[string]*soakID
	net      *soakNet // nil without a real node

	// gate, when set, holds new steps until it is closed; inflight counts
	// the steps under way.
	gate     atomic.Pointer[chan struct{}]
	inflight atomic.Int64

	mu         sync.Mutex
	ops        int
	answers    map[string]int
	violations []string
}

// enter waits at the gate, if one is set, and counts a step under way.
func (s *soak) enter() {
	if g := s.gate.Load(); g != nil {
		<-*g
	}
	s.inflight.Add(1)
}

// hold sets the gate; closing what it returns opens it.
func (s *soak) hold() chan struct{} {
	g := make(chan struct{})
	s.gate.Store(&g)
	return g
}

// drain waits, at most within, until no step is under way.
func (s *soak) drain(within time.Duration) {
	_ = wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, within, true, func(context.Context) (bool, error) {
		return s.inflight.Load() == 0, nil
	})
}

func (s *soak) sortedIDs() []*soakID {
	var out []*soakID
	for _, x := range s.ids {
		out = append(out, x)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].id < out[j].id })
	return out
}

func (s *soak) violate(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

// send is one request as principal p; 0 when the client got no answer.
func (s *soak) send(f *function.Instance, p soakPrincipal, method, path string, body any, giveUp time.Duration) int {
	code, answer := doWithinKey(f, p.key, method, path, body, giveUp)
	if code == http.StatusInternalServerError {
		// A 500 says the operator must fix something; a fault of the API
		// server is the caller's to retry (503). Never one under faults.
		s.violate("%s %s as %s answered 500: %s", method, path, p.name, answer)
	}
	s.mu.Lock()
	if s.answers == nil {
		s.answers = map[string]int{}
	}
	s.ops++
	s.answers[fmt.Sprintf("%s %d", method, code)]++
	s.mu.Unlock()
	return code
}

// step is one random operation of principal p's worker wk.
func (s *soak) step(r *rand.Rand, p soakPrincipal, wk int) {
	f := s.replicas[r.IntN(2)].Load()
	giveUp := 20 * time.Second
	if r.IntN(4) == 0 {
		giveUp = time.Duration(2+r.IntN(300)) * time.Millisecond
	}
	mine := s.ids[fmt.Sprintf("sk-%s%d-%d", p.name[:1], wk, r.IntN(soakIDs))]
	op := r.IntN(100)
	if op >= 88 { // an attack on the other principal's sandbox
		other := "b"
		if p.name == "bob" {
			other = "a"
		}
		s.attack(f, p, s.ids[fmt.Sprintf("sk-%s%d-%d", other, r.IntN(soakWorkers), r.IntN(soakIDs))], r.IntN(3), giveUp)
		return
	}
	if op >= 84 {
		s.send(f, p, "POST", "/api/reap", nil, giveUp)
		return
	}
	mine.mu.Lock()
	defer mine.mu.Unlock()
	var method, path string
	var body any
	tmpl := ""
	switch {
	case op < 24:
		method, path, body = "POST", "/api/sandboxes", mine.createBody("")
	case op < 34:
		tmpl = "soak-rs"
		method, path, body = "POST", "/api/sandboxes", mine.createBody(tmpl)
	case op < 44:
		tmpl = "soak-pool"
		method, path, body = "POST", "/api/sandboxes", mine.createBody(tmpl)
	case op < 60:
		method, path = "GET", "/api/sandboxes/"+mine.id
	case op < 76:
		method, path = "DELETE", "/api/sandboxes/"+mine.id
	case op < 80:
		method, path = "POST", "/api/sandboxes/"+mine.id+"/pause"
	default:
		method, path = "POST", "/api/sandboxes/"+mine.id+"/resume"
	}
	if body != nil && mine.template != "" {
		tmpl = mine.template // its sandboxes run on the real node
		body = mine.createBody(tmpl)
	}
	settled := mine.settled()
	code := s.send(f, p, method, path, body, giveUp)
	if code == 0 {
		mine.state, mine.taintedUntil = stateUnknown, time.Now().Add(2*soakReqTimeout+time.Second)
		return
	}
	switch {
	case method == "POST" && path == "/api/sandboxes" && code == 200:
		if settled {
			if err := s.whole(mine); err != nil {
				s.violate("create of %s (template %q) answered 200 but the sandbox is not whole: %v", mine.id, tmpl, err)
			}
		}
		mine.state = stateExists
	case method == "DELETE" && code == 200:
		if settled {
			if err := s.gone(mine); err != nil {
				s.violate("destroy of %s answered 200 but %v", mine.id, err)
			}
		}
		mine.state = stateAbsent
	case method == "GET" && code == 404:
		if settled && mine.state == stateExists {
			s.violate("get of %s answered 404 to its owner while it certainly existed", mine.id)
		}
		if settled {
			mine.state = stateAbsent
		}
	case method == "GET" && code == 200:
		if settled && mine.state == stateAbsent {
			s.violate("get of %s answered 200 after its destroy answered 200", mine.id)
		}
	case code >= 500 || code == 429 || code == 409:
		// Failed: what the request did is not certain (an undo may have
		// failed too, or another create of the id was in flight).
		if method != "GET" {
			mine.state = stateUnknown
		}
	}
}

// attack is another principal's get, destroy or create (with the owner's
// user id) of x.
func (s *soak) attack(f *function.Instance, p soakPrincipal, x *soakID, kind int, giveUp time.Duration) {
	x.mu.Lock()
	defer x.mu.Unlock()
	certain := x.settled() && x.state == stateExists
	switch kind {
	case 0:
		if code := s.send(f, p, "GET", "/api/sandboxes/"+x.id, nil, giveUp); code == 200 {
			s.violate("%s's get of %s's sandbox %s answered 200", p.name, x.owner.name, x.id)
		}
	case 1:
		code := s.send(f, p, "DELETE", "/api/sandboxes/"+x.id, nil, giveUp)
		if code == 0 {
			x.taintedUntil = time.Now().Add(2*soakReqTimeout + time.Second)
		}
		if code == 200 && certain {
			if err := s.whole(x); err != nil {
				s.violate("%s's destroy of %s's sandbox %s touched it: %v", p.name, x.owner.name, x.id, err)
			}
		}
	default:
		code := s.send(f, p, "POST", "/api/sandboxes", x.createBody(""), giveUp)
		if code == 0 {
			x.taintedUntil = time.Now().Add(2*soakReqTimeout + time.Second)
		}
		if code == 200 {
			s.violate("%s's create of %s's sandbox %s (with %s's user id) answered 200", p.name, x.owner.name, x.id, x.owner.name)
		}
	}
}

// whole says why x is not a whole sandbox of its owner: its Service
// (recording the owner) selecting a live workload of the owner. A read
// that fails (the API server restarting) proves nothing: nil.
func (s *soak) whole(x *soakID) error {
	ctx := context.Background()
	svc, err := client().CoreV1().Services(s.ns).Get(ctx, "sandbox-"+x.id+"-svc", metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("no Service")
	case err != nil:
		return nil
	case svc.DeletionTimestamp != nil || svc.Annotations[keys.AnnotationPrincipal] != x.owner.name:
		return fmt.Errorf("its Service is being deleted (%v) or records principal %q", svc.DeletionTimestamp, svc.Annotations[keys.AnnotationPrincipal])
	}
	if svc.Annotations[keys.AnnotationURLService] != "" {
		return s.wholeWired(ctx, x, svc)
	}
	tok := svc.Spec.Selector[keys.LabelToken]
	if tok == "" {
		return fmt.Errorf("its Service selects no token: %v", svc.Spec.Selector)
	}
	if svc.Labels[keys.LabelWorkload] == keys.WorkloadReplicaSetValue {
		rs, err := client().AppsV1().ReplicaSets(s.ns).Get(ctx, "sandbox-"+x.id, metav1.GetOptions{})
		switch {
		case err != nil && !apierrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("no ReplicaSet (its Service, owned by %v, selects token %s)", svc.OwnerReferences, tok)
		case rs.DeletionTimestamp != nil || rs.Spec.Template.Labels[keys.LabelToken] != tok || rs.Annotations[keys.AnnotationPrincipal] != x.owner.name:
			return fmt.Errorf("no live ReplicaSet of %s with its Service's token: ReplicaSet %s (deleted %v, token %s, principal %q); Service owned by %v, token %s",
				x.owner.name, rs.UID, rs.DeletionTimestamp, rs.Spec.Template.Labels[keys.LabelToken], rs.Annotations[keys.AnnotationPrincipal], svc.OwnerReferences, tok)
		}
		return nil
	}
	l, err := client().CoreV1().Pods(s.ns).List(ctx, metav1.ListOptions{LabelSelector: keys.LabelID + "=" + x.id + "," + keys.LabelToken + "=" + tok})
	if err != nil {
		return nil
	}
	for _, p := range l.Items {
		if p.DeletionTimestamp == nil && p.Annotations[keys.AnnotationPrincipal] == x.owner.name {
			return nil
		}
	}
	return fmt.Errorf("no live Pod of %s carries its Service's token", x.owner.name)
}

// wholeWired says why x, claimed from a wired pooled Pod, is not a whole
// sandbox of its owner: its Service serving (serves) a live Pod of the
// owner with the id, and that Pod's wire, named by the Service, selecting
// exactly the Pod's token and pin (resources.WireSelector), which the Pod
// carries: no other Pod can join it.
func (s *soak) wholeWired(ctx context.Context, x *soakID, svc *corev1.Service) error {
	name := svc.Annotations[keys.AnnotationURLService]
	pod, err := client().CoreV1().Pods(s.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("no Pod %s (its Service names that wire)", name)
	case err != nil:
		return nil
	case pod.DeletionTimestamp != nil || pod.Labels[keys.LabelID] != x.id || pod.Annotations[keys.AnnotationPrincipal] != x.owner.name || !serves(svc, pod):
		return fmt.Errorf("Pod %s is not a live Pod of %s that its Service serves (deleted %v, id %q, principal %q; Service selects %v, owned by %v)",
			name, x.owner.name, pod.DeletionTimestamp, pod.Labels[keys.LabelID], pod.Annotations[keys.AnnotationPrincipal], svc.Spec.Selector, svc.OwnerReferences)
	}
	wire, err := client().CoreV1().Services(s.ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("no wire %s", name)
	case err != nil:
		return nil
	case wire.DeletionTimestamp != nil || pod.Labels[keys.LabelToken] == "" || !resources.Pinned(pod) ||
		!maps.Equal(wire.Spec.Selector, resources.WireSelector(pod.Name, pod.Labels[keys.LabelToken])):
		return fmt.Errorf("wire %s selects %v, not the token and pin of its Pod (%q, pinned %v)", name, wire.Spec.Selector, pod.Labels[keys.LabelToken], resources.Pinned(pod))
	}
	return nil
}

// gone says what is left of x (nil when a read fails: it proves nothing).
func (s *soak) gone(x *soakID) error {
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: keys.LabelID + "=" + x.id}
	pl, perr := client().CoreV1().Pods(s.ns).List(ctx, sel)
	sl, serr := client().CoreV1().Services(s.ns).List(ctx, sel)
	rl, rerr := client().AppsV1().ReplicaSets(s.ns).List(ctx, sel)
	if perr != nil || serr != nil || rerr != nil {
		return nil
	}
	var left []string
	for _, p := range pl.Items {
		if p.DeletionTimestamp == nil {
			left = append(left, "Pod "+p.Name)
		}
	}
	for _, svc := range sl.Items {
		if svc.DeletionTimestamp == nil {
			left = append(left, "Service "+svc.Name)
		}
	}
	for _, rs := range rl.Items {
		if rs.DeletionTimestamp == nil {
			left = append(left, "ReplicaSet "+rs.Name)
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("left %v", left)
	}
	return nil
}

// serves reports whether svc is Pod p's own Service: one that selects its
// token, or, claimed wired, one that selects nothing and that p owns.
func serves(svc *corev1.Service, p *corev1.Pod) bool {
	if svc.Annotations[keys.AnnotationURLService] != "" {
		return len(svc.Spec.Selector) == 0 && svc.Annotations[keys.AnnotationURLService] == p.Name &&
			slices.ContainsFunc(svc.OwnerReferences, func(r metav1.OwnerReference) bool { return r.UID == p.UID })
	}
	return svc.Spec.Selector[keys.LabelToken] == p.Labels[keys.LabelToken]
}

// checkSettled holds the cluster after the settle: every sandbox object
// is part of a whole sandbox, and ids certain of their state are in it.
func (s *soak) checkSettled() {
	ctx := context.Background()
	svcs := services(s.t, s.ns, "app=deer-flow-sandbox")
	rss, err := client().AppsV1().ReplicaSets(s.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=deer-flow-sandbox"})
	if err != nil {
		s.t.Fatal(err)
	}
	svcOf := map[string]*corev1.Service{}
	for i := range svcs {
		if svcs[i].DeletionTimestamp == nil {
			svcOf[svcs[i].Labels[keys.LabelID]] = &svcs[i]
		}
	}
	workload := map[string]bool{}
	for _, rs := range rss.Items {
		if id := rs.Labels[keys.LabelID]; id != "" && rs.DeletionTimestamp == nil {
			workload[id] = true
			if svcOf[id] == nil {
				s.violate("settled: ReplicaSet %s has no Service", rs.Name)
			}
		}
	}
	for _, p := range pods(s.t, s.ns, "app=deer-flow-sandbox") {
		id := p.Labels[keys.LabelID]
		if id == "" || p.DeletionTimestamp != nil || p.Labels[keys.LabelWorkload] == keys.WorkloadReplicaSetValue {
			continue // an unclaimed pooled Pod, one going, or a ReplicaSet's
		}
		workload[id] = true
		svc := svcOf[id]
		if svc == nil || !serves(svc, &p) {
			s.violate("settled: Pod %s of %s has no Service of its own", p.Name, id)
		}
	}
	for id := range svcOf {
		if !workload[id] {
			s.violate("settled: the Service of %s has no workload", id)
		}
	}
	for _, x := range s.sortedIDs() {
		switch {
		case x.state == stateExists:
			if err := s.whole(x); err != nil {
				s.violate("settled: %s, whose last answer said it exists, is not whole: %v", x.id, err)
			}
		case x.state == stateAbsent:
			if err := s.gone(x); err != nil {
				s.violate("settled: %s, whose last answer said it is gone, %v", x.id, err)
			}
		}
	}
}

// doWithinKey is doWithin with principal key's API key.
func doWithinKey(f *function.Instance, key, method, path string, body any, giveUp time.Duration) (int, string) {
	return doWithinHeaders(f, map[string]string{"X-API-Key": key}, method, path, body, giveUp)
}
