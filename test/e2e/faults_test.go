//go:build e2e

package e2e

import (
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// Answers the ledger counts for requests that got no HTTP answer.
const (
	// answerCut: the request was sent and its connection ended before an
	// answer (the function died under it).
	answerCut = -1
	// answerRefused: no connection at all (no function was listening).
	answerRefused = -2
)

// noAnswer classifies a request that got no HTTP answer.
func noAnswer(err error) int {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return answerRefused
	}
	return answerCut
}

// ledger records what the provisioner promised: ids whose create answered
// 200 and ids whose delete answered 200, in order per id.
type ledger struct {
	mu      sync.Mutex
	last    map[string]string // id -> "created" | "deleted"
	answers map[int]int
}

func newLedger() *ledger { return &ledger{last: map[string]string{}, answers: map[int]int{}} }

func (l *ledger) note(id, what string, code int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers[code]++
	switch {
	case code == http.StatusOK:
		l.last[id] = what
	default:
		// No answer, or a failure: the operation may or may not have taken
		// effect, so nothing was promised about this id any more.
		l.last[id] = "unknown"
	}
}

// load runs workers that create and delete distinct sandboxes until stop is
// closed (bounded by max iterations), through whichever function target holds.
func load(t *testing.T, target *atomic.Pointer[function.Instance], workers, maxIter int, stop <-chan struct{}, l *ledger, prefix string) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < maxIter; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := fmt.Sprintf("%s%d-%d", prefix, w, i)
				f := target.Load()
				r, err := f.Do("POST", "/api/sandboxes", map[string]any{"sandbox_id": id})
				if err != nil {
					l.note(id, "created", noAnswer(err))
					time.Sleep(20 * time.Millisecond)
					continue
				}
				l.note(id, "created", r.Code)
				if i%2 == 1 { // keep every other sandbox, delete the rest
					continue
				}
				r, err = f.Do("DELETE", "/api/sandboxes/"+id, nil)
				if err != nil {
					l.note(id, "deleted", noAnswer(err))
					continue
				}
				l.note(id, "deleted", r.Code)
			}
		}()
	}
	return &wg
}

// checkInvariants asserts the ledger against the cluster: every sandbox whose
// last answer was a successful create is whole, every successful delete is
// gone, and a half-present sandbox is mended by one create or one reap.
func checkInvariants(t *testing.T, f *function.Instance, ns string, l *ledger) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	eventually(t, 60*time.Second, "deleted sandboxes gone", func() (bool, error) {
		podIDs, svcIDs := idSet(pods(t, ns, "app=deer-flow-sandbox")), idSetSvc(services(t, ns, "app=deer-flow-sandbox"))
		for id, what := range l.last {
			if what == "deleted" && (podIDs[id] || svcIDs[id]) {
				return false, fmt.Errorf("%s was deleted (200) but still has pod=%v service=%v", id, podIDs[id], svcIDs[id])
			}
		}
		return true, nil
	})
	podIDs, svcIDs := idSet(pods(t, ns, "app=deer-flow-sandbox")), idSetSvc(services(t, ns, "app=deer-flow-sandbox"))
	created, deleted := 0, 0
	for id, what := range l.last {
		if what == "deleted" {
			deleted++
		}
		if what != "created" {
			continue
		}
		created++
		if !podIDs[id] || !svcIDs[id] {
			t.Errorf("%s: create answered 200 but pod=%v service=%v", id, podIDs[id], svcIDs[id])
		}
	}
	// Without a promise of each kind, the checks above hold of nothing.
	if created == 0 || deleted == 0 {
		t.Errorf("the load proved nothing: %d ids promised created, %d promised deleted (answers %v)", created, deleted, l.answers)
	}
	// Half-sandboxes left by the fault: one create or one reap mends each.
	var half []string
	for id := range podIDs {
		if !svcIDs[id] {
			half = append(half, id)
			expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": id}), 200, "repair "+id)
		}
	}
	// A Service without a Pod is either a slot (a create cut between its
	// slot and its workload, which its retry makes whole; the reap leaves
	// it until no create could still bind it) or the orphan of a workload
	// gone, which the reap removes.
	orphans, slots := 0, 0
	for _, svc := range services(t, ns, "app=deer-flow-sandbox") {
		id := svc.Labels[keys.LabelID]
		switch {
		case podIDs[id]:
		case len(svc.OwnerReferences) == 0 && svc.Spec.Selector[keys.LabelToken] != "":
			slots++
			expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": id}), 200, "the retry of "+id)
		default:
			orphans++
		}
	}
	if orphans > 0 {
		expectCode(t, mustDo(t, f, "POST", "/api/reap", nil), 200, "reap orphans")
	}
	eventually(t, 30*time.Second, "no half-sandbox after one create or reap", func() (bool, error) {
		p, s := idSet(pods(t, ns, "app=deer-flow-sandbox")), idSetSvc(services(t, ns, "app=deer-flow-sandbox"))
		for id := range p {
			if !s[id] {
				return false, fmt.Errorf("%s has a Pod and no Service", id)
			}
		}
		for id := range s {
			if !p[id] {
				return false, fmt.Errorf("%s has a Service and no Pod", id)
			}
		}
		return true, nil
	})
	t.Logf("answers %v; %d sandboxes promised and whole; %d Pod-only repaired by create; %d slots made whole by a retry; %d orphaned Services reaped", l.answers, created, len(half), slots, orphans)
}

func idSet(items []corev1.Pod) map[string]bool {
	out := map[string]bool{}
	for _, it := range items {
		out[it.Labels[keys.LabelID]] = true
	}
	return out
}

func idSetSvc(items []corev1.Service) map[string]bool {
	out := map[string]bool{}
	for _, it := range items {
		out[it.Labels[keys.LabelID]] = true
	}
	return out
}

func TestFunctionKilledMidLoad(t *testing.T) {
	ns := namespace(t)
	dir := t.TempDir()
	bin, err := function.Binary()
	if err != nil {
		t.Fatal(err)
	}
	env := function.BaseEnv(kubeconfig, ns)
	f, err := function.StartBinary(bin, env, filepath.Join(dir, "fn.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Stop()
	var target atomic.Pointer[function.Instance]
	target.Store(f)
	l := newLedger()
	stop := make(chan struct{})
	wg := load(t, &target, 12, 200, stop, l, "k")
	time.Sleep(1500 * time.Millisecond)
	f.Kill() // SIGKILL: no drain, requests cut mid-flight
	time.Sleep(300 * time.Millisecond)
	g, err := function.StartBinary(bin, env, filepath.Join(dir, "fn2.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Stop()
	target.Store(g)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()
	// The kill must land under load: a request in flight when it did is cut
	// (its connection ends without an answer). Refused connections, while
	// no function listened, do not show that.
	if l.answers[answerCut] == 0 {
		t.Errorf("no request was cut by the kill: the fault did not happen under load (answers %v)", l.answers)
	}
	checkInvariants(t, g, ns, l)
}

func TestAPIServerStoppedMidLoad(t *testing.T) {
	ns := namespace(t)
	f := start(t, ns, map[string]string{"REQUEST_TIMEOUT": "3s"})
	var target atomic.Pointer[function.Instance]
	target.Store(f)
	l := newLedger()
	stop := make(chan struct{})
	wg := load(t, &target, 8, 400, stop, l, "a")

	// Readers that must never see a 404 or NotFound for a live sandbox.
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "witness"}), 200, "witness")
	var bad atomic.Int64
	var outageAnswers sync.Map
	readers := sync.WaitGroup{}
	for i := 0; i < 2; i++ {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for j := 0; j < 2000; j++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := f.Do("GET", "/api/sandboxes/witness", nil)
				if err != nil {
					continue
				}
				if r.Code == 404 || strings.Contains(string(r.Raw), api.StatusNotFound) || (r.Code >= 500 && r.Detail() == "") {
					bad.Add(1)
					t.Errorf("during load/outage: %d %s", r.Code, r.Raw)
				}
				if r.Code >= 500 {
					v, _ := outageAnswers.LoadOrStore(r.Code, new(atomic.Int64))
					v.(*atomic.Int64).Add(1)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	time.Sleep(time.Second)
	restore := outage(t)
	waitReadiness(t, f, http.StatusServiceUnavailable)
	time.Sleep(2 * time.Second)
	restore()
	waitReadiness(t, f, http.StatusOK)
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	readers.Wait()
	codes := map[int]int64{}
	outageAnswers.Range(func(k, v any) bool { codes[k.(int)] = v.(*atomic.Int64).Load(); return true })
	if len(codes) == 0 {
		t.Errorf("the witness never saw the outage")
	}
	for code := range codes {
		if code != 503 && code != 504 {
			t.Errorf("outage answered %d, want 503 or 504", code)
		}
	}
	t.Logf("witness answers during the outage: %v", codes)
	checkInvariants(t, f, ns, l)
}

func TestSlowAPIServerEndsWithinDeadline(t *testing.T) {
	ns := namespace(t)
	f := start(t, ns, map[string]string{"REQUEST_TIMEOUT": "1s"})
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "slow1"}), 200, "create before the slowdown")
	for i := 0; i < 5; i++ {
		mustDo(t, f, "GET", "/api/sandboxes/slow1", nil)
	}
	// The function runs in its own process: its goroutines are what its
	// /metrics reports (the Go collector's go_goroutines), not this test's.
	time.Sleep(200 * time.Millisecond)
	before := goroutines(t, f)

	proxy.SetDelay(3 * time.Second)
	var wg sync.WaitGroup
	const n = 16
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var r function.Response
			var err error
			began := time.Now()
			switch i % 4 {
			case 0:
				r, err = f.Do("POST", "/api/sandboxes", map[string]any{"sandbox_id": fmt.Sprintf("slow-%d", i)})
			case 1:
				r, err = f.Do("GET", "/api/sandboxes/slow1", nil)
			case 2:
				r, err = f.Do("GET", "/api/sandboxes", nil)
			case 3:
				r, err = f.Do("DELETE", fmt.Sprintf("/api/sandboxes/slow-%d", i), nil)
			}
			took := time.Since(began)
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			if r.Code != http.StatusGatewayTimeout || !strings.Contains(r.Detail(), "did not answer in time") {
				t.Errorf("request %d: %d %s, want 504 with a clear detail", i, r.Code, r.Raw)
			}
			if took > 2500*time.Millisecond {
				t.Errorf("request %d took %s, beyond its 1s deadline", i, took)
			}
		}()
	}
	wg.Wait()
	proxy.SetDelay(0)
	expectCode(t, mustDo(t, f, "GET", "/api/sandboxes/slow1", nil), 200, "get after the slowdown")
	// Every goroutine the slow requests started in the function must end
	// (bounded: an API call cut at its deadline may still be waiting out the
	// proxy's delay for a moment). The slack covers the client's idle
	// keep-alive connections, each of which the server holds a goroutine for.
	const slack = 4
	var after float64
	deadline := time.Now().Add(30 * time.Second)
	for {
		after = goroutines(t, f)
		if after <= before+slack || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if after > before+slack {
		t.Errorf("the function's goroutines: %v before, still %v 30s after %d slow requests (slack %d)", before, after, n, slack)
	}
	t.Logf("the function's goroutines: %v before, %v after", before, after)
}

// goroutines is the function's own goroutine count, from its /metrics.
func goroutines(t *testing.T, f *function.Instance) float64 {
	t.Helper()
	v, ok := scrape(t, f, "go_goroutines")["go_goroutines"]
	if !ok {
		t.Fatalf("the function's /metrics has no go_goroutines")
	}
	return v
}
