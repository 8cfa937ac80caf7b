//go:build e2e

package e2e

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/test/framework/apiproxy"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// TestQuotaHoldsUnderFaults: creates and destroys of a few ids race
// through two replicas against MAX_SANDBOXES, while the API proxy fails one
// request of the namespace in five (before the API server sees it, or after
// it did its work, so the function cannot know), and clients give up at
// random moments. A watch of the namespace's Pods and ReplicaSets recounts
// the sandbox workloads on every event: the count never exceeds the limit,
// not even for a moment (what the slot written before the workload buys:
// quota.Counter.Check). Once the faults stop, destroying every id leaves
// nothing: no failed create left an object the next destroy cannot find.
//
// The API server is real; the nodes are kwok's (a workload's count does
// not depend on a node), and the faults are the proxy's stand-in for an
// API server that answers 5xx.
func TestQuotaHoldsUnderFaults(t *testing.T) {
	ns := namespace(t)
	const (
		limit   = 3
		ids     = 8
		workers = 8
		ops     = 160
	)
	env := map[string]string{"MAX_SANDBOXES": fmt.Sprint(limit), "EMIT_KUBERNETES_EVENTS": "false"}
	replicas := []*function.Instance{start(t, ns, env), start(t, ns, env)}

	w := watchWorkloads(t, ns)

	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	faults := injectFaults(t, ns, seed, 10, 10, 0)

	var codes sync.Map // status code -> count
	var wg sync.WaitGroup
	deadline := time.Now().Add(3 * time.Minute)
	// Rounds of ops until the count has reached the limit (the witness
	// below), within the deadline: under these faults most creates fail,
	// and in about one round in three the workloads never stood at the
	// limit at once, which proved nothing either way.
	for round := 0; round < 10 && time.Now().Before(deadline) && (round == 0 || w.peaks().max < limit); round++ {
		for g := 0; g < workers; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(seed+uint64(round), uint64(g)+2))
				for i := 0; i < ops/workers && time.Now().Before(deadline); i++ {
					f := replicas[r.IntN(len(replicas))]
					id := fmt.Sprintf("qf%d", r.IntN(ids))
					giveUp := 30 * time.Second
					if r.IntN(3) > 0 {
						giveUp = time.Duration(2+r.IntN(200)) * time.Millisecond
					}
					method, path, body := "POST", "/api/sandboxes", any(map[string]any{"sandbox_id": id})
					if r.IntN(10) < 3 {
						method, path, body = "DELETE", "/api/sandboxes/"+id, nil
					}
					code := doWithin(f, method, path, body, giveUp)
					v, _ := codes.LoadOrStore(fmt.Sprintf("%s %d", method, code), new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
				}
			}()
		}
		wg.Wait()
	}
	proxy.SetFaults(nil)
	injected := faults.total()
	summary := map[string]int64{}
	codes.Range(func(k, v any) bool { summary[k.(string)] = v.(*atomic.Int64).Load(); return true })
	pk := w.peaks()
	t.Logf("answers %v; %d faults injected; %d watch events; at most %d sandbox workloads at once (limit %d)", summary, injected, pk.events, pk.max, limit)
	if pk.max > limit {
		t.Errorf("the quota overshot: %d sandbox workloads existed at once, limit %d; at that moment: %v", pk.max, limit, pk.at)
		w.tell(pk)
		for _, f := range replicas {
			tellLog(t, f.LogPath, pk.at)
		}
	}
	if injected == 0 || summary["POST 200"] == 0 {
		t.Errorf("the load proved nothing: %d faults injected, %d creates admitted", injected, summary["POST 200"])
	}
	// The count must have reached the limit, or that it never passed it
	// proves nothing. (A refusal for the quota, 429, is no better witness:
	// under these faults most creates at the limit fail on a 5xx first.)
	if pk.max < limit {
		t.Errorf("the load never reached the limit: at most %d sandbox workloads at once, limit %d", pk.max, limit)
	}

	// Settled: every id destroyed leaves no sandbox object behind.
	for i := 0; i < ids; i++ {
		expectCode(t, mustDo(t, replicas[i%2], "DELETE", fmt.Sprintf("/api/sandboxes/qf%d", i), nil), 200, "destroy after the faults")
	}
	eventually(t, 30*time.Second, "no sandbox object left", func() (bool, error) {
		left := len(pods(t, ns, "app=deer-flow-sandbox")) + len(services(t, ns, "app=deer-flow-sandbox"))
		rss, err := client().AppsV1().ReplicaSets(ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app=deer-flow-sandbox"})
		if err != nil {
			return false, err
		}
		return left+len(rss.Items) == 0, nil
	})
}

// faultCounts counts the faults injected, by kind.
type faultCounts struct{ m sync.Map }

func (c *faultCounts) add(kind string) {
	v, _ := c.m.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func (c *faultCounts) byKind() map[string]int64 {
	out := map[string]int64{}
	c.m.Range(func(k, v any) bool { out[k.(string)] = v.(*atomic.Int64).Load(); return true })
	return out
}

func (c *faultCounts) total() (n int64) {
	for _, v := range c.byKind() {
		n += v
	}
	return n
}

// injectFaults makes the API proxy fail or slow the requests of namespace
// ns until the test ends: of every 100, before fail before the API server
// sees them, after fail after it did their work, and slow are slowed.
func injectFaults(t *testing.T, ns string, seed uint64, before, after, slow int) *faultCounts {
	c := &faultCounts{}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 0))
	proxy.SetFaults(func(r *http.Request) apiproxy.Fault {
		if !strings.Contains(r.URL.Path, "/namespaces/"+ns+"/") {
			return apiproxy.Forward
		}
		mu.Lock()
		n := rng.IntN(100)
		mu.Unlock()
		switch {
		case n < before:
			c.add("5xx before the API server")
			return apiproxy.FailBefore
		case n < before+after:
			c.add("5xx after the API server's work")
			return apiproxy.FailAfter
		case n < before+after+slow:
			c.add("latency")
			return apiproxy.Slow
		}
		return apiproxy.Forward
	})
	t.Cleanup(func() { proxy.SetFaults(nil) })
	return c
}

// doWithin sends a request with the test API key whose client gives up
// after giveUp (0 when it got no answer).
func doWithin(f *function.Instance, method, path string, body any, giveUp time.Duration) int {
	code, _ := doWithinHeaders(f, map[string]string{"X-API-Key": function.Key}, method, path, body, giveUp)
	return code
}

// doWithinHeaders is doWithin with the given headers; it returns the
// answer's body too.
func doWithinHeaders(f *function.Instance, headers map[string]string, method, path string, body any, giveUp time.Duration) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), giveUp)
	defer cancel()
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, f.URL+path, bytes.NewReader(raw))
	if err != nil {
		return 0, ""
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := f.Client.Do(req)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(out)
}

// workloadWatch counts a namespace's sandbox workloads at every moment of
// the API server's history: bare and claimed Pods that have not ended, and
// ReplicaSets (whose Pods they stand for), until their deletion starts.
//
// Pods and ReplicaSets come on two watches, and neither waits for the
// other: a Pod's deletion can arrive after a ReplicaSet created later
// (after an API server restart, one watch may be seconds behind the
// other). So the events are kept with their resourceVersion (etcd's
// revision, one order for every kind) and replayed in that order. A
// deletion a watch missed (an API server restart: the informer's relist
// reports it without its revision) is placed at the newest revision seen
// when it was reported: the latest it can have happened, so the count
// never misses a moment over the limit (it may count one too many).
type workloadWatch struct {
	t    *testing.T
	ns   string
	stop func() // ends the current watch

	mu     sync.Mutex
	log    []workloadEvent
	trace  []traced // every event of the sandbox objects, for the story of an overshoot
	newest uint64   // the newest resourceVersion seen on either watch
	missed int      // deletions reported without their revision
}

type workloadEvent struct {
	rv        uint64
	key       string // "Pod <name>" or "ReplicaSet <name>"
	principal string
	counts    bool // the workload counts from this revision on
}

func watchWorkloads(t *testing.T, ns string) *workloadWatch {
	t.Helper()
	w := &workloadWatch{t: t, ns: ns}
	w.stop, _ = w.start()
	t.Cleanup(func() { w.stop() })
	return w
}

// start watches both kinds from a list, into w's log, until stop; stores
// are what the lists and the events since hold.
func (w *workloadWatch) start() (stop func(), stores []cache.Store) {
	factory := informers.NewSharedInformerFactoryWithOptions(client(), 0, informers.WithNamespace(w.ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = "app=deer-flow-sandbox" }))
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj, false, false) },
		UpdateFunc: func(_, obj any) { w.observe(obj, false, false) },
		DeleteFunc: func(obj any) {
			d, missed := obj.(cache.DeletedFinalStateUnknown)
			if missed {
				obj = d.Obj
			}
			w.observe(obj, true, missed)
		},
	}
	for _, inf := range []cache.SharedIndexInformer{factory.Core().V1().Pods().Informer(), factory.Apps().V1().ReplicaSets().Informer(), factory.Core().V1().Services().Informer()} {
		if _, err := inf.AddEventHandler(handler); err != nil {
			w.t.Fatal(err)
		}
		stores = append(stores, inf.GetStore())
	}
	ch := make(chan struct{})
	factory.Start(ch)
	for typ, ok := range factory.WaitForCacheSync(ch) {
		if !ok {
			w.t.Fatalf("the watch of %v did not sync", typ)
		}
	}
	var once sync.Once
	return func() { once.Do(func() { close(ch); factory.Shutdown() }) }, stores
}

// rebase replaces the watch with a new one, from a new list, once the API
// server is back after a restart: the old watch's own relist would report
// what was deleted meanwhile without its revision, and a slow reconnect
// leaves the two kinds' watches apart. A workload the log holds live and
// the new list lacks was deleted at a revision the watch never saw: it is
// placed at the newest revision the new list shows, the latest it can have
// happened (counted as missed). The caller keeps writes from starting
// until rebase returns, so that nothing created meanwhile counts beside a
// deletion placed late.
func (w *workloadWatch) rebase() {
	time.Sleep(time.Second) // what the old watch received before the restart, delivered
	w.stop()
	stop, stores := w.start()
	w.stop = stop
	present := map[string]bool{}
	for _, st := range stores {
		for _, obj := range st.List() {
			switch o := obj.(type) {
			case *corev1.Pod:
				present["Pod "+o.Name] = true
			case *appsv1.ReplicaSet:
				present["ReplicaSet "+o.Name] = true
			}
		}
	}
	pk := w.peaks()
	w.mu.Lock()
	defer w.mu.Unlock()
	for key, principal := range pk.live {
		if !present[key] {
			w.log = append(w.log, workloadEvent{rv: w.newest, key: key, principal: principal})
			w.missed++
		}
	}
}

func (w *workloadWatch) observe(obj any, deleted, missed bool) {
	w.record(obj, deleted)
	e := workloadEvent{counts: !deleted}
	switch o := obj.(type) {
	case *corev1.Pod:
		if o.Labels[keys.LabelWorkload] == keys.WorkloadReplicaSetValue || o.Labels[keys.LabelID] == "" {
			return // a ReplicaSet's Pod (its ReplicaSet counts), or an unclaimed pooled one (the pool's)
		}
		e.key = "Pod " + o.Name
		e.counts = e.counts && o.DeletionTimestamp == nil && o.Status.Phase != corev1.PodSucceeded && o.Status.Phase != corev1.PodFailed
	case *appsv1.ReplicaSet:
		e.key = "ReplicaSet " + o.Name
		e.counts = e.counts && o.DeletionTimestamp == nil
	default:
		return
	}
	m := obj.(metav1.Object)
	e.principal = m.GetAnnotations()[keys.AnnotationPrincipal]
	rv, err := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.newest = max(w.newest, rv)
	e.rv = rv
	if missed {
		e.rv = w.newest
		w.missed++
	}
	w.log = append(w.log, e)
}

// traced is one event of a sandbox object, as the story of an overshoot
// tells it.
type traced struct {
	rv   uint64
	id   string
	what string
}

// record keeps obj's event in the trace: its kind, name, whether it is
// being deleted, and what binds it (a Service's owner and slot token, a
// workload's token).
func (w *workloadWatch) record(obj any, deleted bool) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return
	}
	rv, _ := strconv.ParseUint(m.GetResourceVersion(), 10, 64)
	kind := fmt.Sprintf("%T", obj)
	state := "live"
	switch {
	case deleted:
		state = "DELETED"
	case m.GetDeletionTimestamp() != nil:
		state = "deleting"
	}
	if p, ok := obj.(*corev1.Pod); ok {
		state += " phase=" + string(p.Status.Phase)
	}
	owners := []string{}
	for _, o := range m.GetOwnerReferences() {
		owners = append(owners, o.Kind+"/"+o.Name+"/"+string(o.UID)[:8])
	}
	selects := ""
	if svc, ok := obj.(*corev1.Service); ok {
		selects = svc.Spec.Selector[keys.LabelToken]
	}
	what := fmt.Sprintf("%s %s uid=%s %s owners=%v token=%s selects=%s", kind, m.GetName(), string(m.GetUID())[:8], state, owners,
		m.GetLabels()[keys.LabelToken], selects)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.trace = append(w.trace, traced{rv: rv, id: m.GetLabels()[keys.LabelID], what: what})
}

// tell logs, in revision order, the events of the sandboxes that were
// live at the overshoot, up to a few revisions past it.
func (w *workloadWatch) tell(pk workloadPeaks) {
	ids := map[string]bool{}
	for _, key := range pk.at {
		ids[strings.TrimPrefix(strings.TrimPrefix(key, "Pod sandbox-"), "ReplicaSet sandbox-")] = true
	}
	w.mu.Lock()
	trace := slices.Clone(w.trace)
	w.mu.Unlock()
	slices.SortStableFunc(trace, func(a, b traced) int { return cmp.Compare(a.rv, b.rv) })
	for _, e := range trace {
		if ids[e.id] && e.rv <= pk.atRV+20 {
			w.t.Logf("rv %d %s: %s", e.rv, e.id, e.what)
		}
	}
	w.t.Logf("the overshoot was at rv %d", pk.atRV)
}

// tellLog logs the lines of a function's log that name one of the
// workloads' sandboxes (at most 400).
func tellLog(t *testing.T, path string, at []string) {
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Logf("read %s: %v", path, err)
		return
	}
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		for _, key := range at {
			id := strings.TrimPrefix(strings.TrimPrefix(key, "Pod sandbox-"), "ReplicaSet sandbox-")
			if strings.Contains(line, `"`+id+`"`) || strings.Contains(line, "sandbox-"+id) {
				if n++; n <= 400 {
					t.Logf("%s: %s", filepath.Base(filepath.Dir(path)), line)
				}
				break
			}
		}
	}
}

// workloadPeaks is the watch's history replayed: the most workloads at
// once (and which), the most of each principal, the events, and the
// deletions placed at the latest revision they can have happened at.
type workloadPeaks struct {
	live        map[string]string // at the end: key -> principal
	max         int
	at          []string
	atRV        uint64 // the revision of the moment at
	byPrincipal map[string]int
	events      int
	missed      int
}

func (w *workloadWatch) peaks() workloadPeaks {
	w.mu.Lock()
	log := slices.Clone(w.log)
	out := workloadPeaks{byPrincipal: map[string]int{}, events: len(w.log), missed: w.missed}
	w.mu.Unlock()
	// Stable: one object's events at one revision (a relist repeating an
	// update) keep the order they came in.
	slices.SortStableFunc(log, func(a, b workloadEvent) int { return cmp.Compare(a.rv, b.rv) })
	live := map[string]string{}
	for i, e := range log {
		if e.counts {
			live[e.key] = e.principal
		} else {
			delete(live, e.key)
		}
		if i+1 < len(log) && log[i+1].rv == e.rv {
			continue // the moment is after every event of its revision
		}
		of := map[string]int{}
		for _, p := range live {
			of[p]++
		}
		for p, n := range of {
			out.byPrincipal[p] = max(out.byPrincipal[p], n)
		}
		if len(live) > out.max {
			out.max = len(live)
			out.at = slices.Sorted(maps.Keys(live))
			out.atRV = e.rv
		}
	}
	out.live = live
	return out
}
