//go:build e2e

package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/follow"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// poolRowName is the row item 7 of issue 20 names.
const poolRowName = "create from pool → Ready (real node)"

// poolViewRowName is a pooled create as DeerFlow's backend sees it: the
// create, then its own polling of the URL until the first 200.
const poolViewRowName = "create from pool → first 200 from {sandbox_url}/v1/sandbox (DeerFlow's view, real node)"

// BenchmarkRealNodePool measures a create served from a warm pool on the
// real node: POST /api/sandboxes?wait=20s of a pooled template, answered
// when the sandbox is Ready (its Pod already is: the kubelet's probe passed
// while it stood in the pool), against the floor: the bare client-go calls
// a claim needs (list the pool's Pods, one conditional patch, create the
// Service). Rounds of c claims alternate floor and ours; each round starts
// with the pool full: between rounds the pool refills (the ReplicaSet
// controller, Pods started by the real kubelet), which is not timed, and
// the sandboxes are deleted. The refill that a round's own claims set off
// does run beside them, on the same two cores as the API server.
//
// It runs in the shipped default Service mode (NodePort, the row issue 20
// names) and in Headless mode, where the claim's Service create allocates
// neither a ClusterIP nor a node port and kube-proxy on the node programs
// nothing for it.
//
// Both modes run under gVisor (config/'s runtime class); NodePort also runs
// under runc, for the comparison of the two in the same run.
func BenchmarkRealNodePool(b *testing.B) {
	for _, c := range []struct {
		mode string
		rt   benchRuntime
	}{{"NodePort", benchRuntimes[0]}, {config.ServiceHeadless, benchRuntimes[0]}, {"NodePort", benchRuntimes[1]}} {
		mode := c.mode
		b.Run(mode+"/"+c.rt.name, func(b *testing.B) {
			kc := benchCluster(b, "benchpool-"+strings.ToLower(mode)+"-"+strings.ToLower(c.rt.name), 0)
			defer kc.Down()
			env, down := realNodeEnv(b, kc, poolRowName)
			defer down()
			env["SANDBOX_SERVICE_TYPE"] = mode
			env["SANDBOX_RUNTIME_CLASS"] = c.rt.class
			row := poolRowName
			if mode != "NodePort" {
				row = strings.TrimSuffix(poolRowName, ")") + ", " + mode + ")"
			}
			if !c.rt.shipped {
				row = strings.TrimSuffix(row, ")") + ", " + c.rt.name + ")"
			}
			// DeerFlow's view needs a URL this machine reaches: a node
			// port. A Headless sandbox's URL is a cluster DNS name (the
			// Knative suite reaches one by name through CoreDNS).
			view := ""
			if mode == "NodePort" {
				view = poolViewRowName
			}
			benchPool(b, kc, env, realnode.SandboxImage, row, view)
		})
	}
}

// BenchmarkKwokPool is BenchmarkRealNodePool on kwok's simulated nodes:
// the API cost of a claim without a kubelet (kwok reports pooled Pods
// Ready at once, so the refill between rounds is quick).
func BenchmarkKwokPool(b *testing.B) {
	kc := benchCluster(b, "benchpoolkwok", 2)
	defer kc.Down()
	useNamespace(b, kc)
	benchPool(b, kc, benchEnv(kc), "sandbox:test", "create from pool → Ready (kwok)", "")
}

// benchPool runs the rounds against a function started with env and
// prints the rows named rowName; with viewRow, also what DeerFlow's backend
// sees of a pooled create, one claim at a time.
func benchPool(b *testing.B, kc *cluster.Cluster, env map[string]string, image, rowName, viewRow string) {
	ctx := context.Background()
	fn, fl := startWithFloor(b, kc, binary(b), env, b.TempDir())
	defer fn.Stop()

	const size, rounds = 8, 20
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "warm", Namespace: ns, Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplatePoolSize: fmt.Sprint(size), keys.TemplateDeerFlowMounts: "false"}},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: image}}}},
	}
	if _, err := kc.Client.CoreV1().PodTemplates(ns).Create(ctx, pt, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	// A reap makes the pool (reading the templates writes nothing).
	if err := ours(fn, "POST", "/api/reap", nil); err != nil {
		b.Fatal(err)
	}
	pods := kc.Client.CoreV1().Pods(ns)
	// The floor's claims have a client of their own, timed as the
	// function's calls are, so their calls can be set beside the function's.
	fc, floorCalls, err := timedClient(kc.Config)
	if err != nil {
		b.Fatal(err)
	}
	fpods := fc.CoreV1().Pods(ns)
	poolSel := keys.LabelPool + "=warm"
	// rv "0" lists from the API server's watch cache, as a claim does
	// (pool.Ready); "" is a consistent list, for waiting on the pool.
	listReady := func(ctx context.Context, pods typedcorev1.PodInterface, rv string) ([]corev1.Pod, error) {
		l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: poolSel, ResourceVersion: rv})
		if err != nil {
			return nil, err
		}
		var out []corev1.Pod
		for _, p := range l.Items {
			if p.DeletionTimestamp == nil && p.Labels[keys.LabelID] == "" && realnode.Ready(&p) {
				out = append(out, p)
			}
		}
		return out, nil
	}
	readyPooled := func(ctx context.Context, rv string) ([]corev1.Pod, error) { return listReady(ctx, pods, rv) }
	// With wires (NodePort and ClusterIP modes), a pool stands full when
	// each of its Ready Pods is wired too and, on the real node (viewRow),
	// its wire answers from it at its node port: kube-proxy has programmed
	// it, as for a Pod that has stood in the pool a while.
	wired := resources.Wired(fl.cfg.Objects())
	answered := map[types.UID]bool{}
	standing := func(ctx context.Context, p *corev1.Pod) bool {
		if !wired || answered[p.UID] {
			return true
		}
		if p.Labels[keys.LabelToken] == "" {
			return false
		}
		w, err := kc.Client.CoreV1().Services(ns).Get(ctx, resources.WireName(p), metav1.GetOptions{})
		if err != nil || !resources.Wires(fl.cfg.Objects(), w, p) {
			return false
		}
		if viewRow != "" {
			resp, err := direct.Get(nodePortURL(fl.cfg.NodeHost, w) + "/v1/sandbox")
			if err != nil {
				return false
			}
			var body strings.Builder
			_, _ = io.Copy(&body, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !strings.Contains(body.String(), p.Name) {
				return false
			}
		}
		answered[p.UID] = true
		return true
	}
	// Claims wire their pools (a second after); the floor's, made with
	// client-go, do not: a pool Ready but not all wired 3 s on gets a reap,
	// which wires it, as the PingSource's reap would.
	waitPool := func(n int) {
		var unwiredSince time.Time
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
			r, err := readyPooled(ctx, "")
			if err != nil || len(r) < n {
				return false, nil
			}
			k := 0
			for i := range r {
				if standing(ctx, &r[i]) {
					k++
				}
			}
			switch {
			case k >= n:
				return true, nil
			case unwiredSince.IsZero():
				unwiredSince = time.Now()
			case time.Since(unwiredSince) > 3*time.Second:
				if err := ours(fn, "POST", "/api/reap", nil); err != nil {
					return false, err
				}
				unwiredSince = time.Now()
			}
			return false, nil
		})
		if err != nil {
			var state strings.Builder
			if rs, err := kc.Client.AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-pool-warm", metav1.GetOptions{}); err != nil {
				fmt.Fprintf(&state, "ReplicaSet: %v", err)
			} else {
				fmt.Fprintf(&state, "ReplicaSet: %d replicas, %d ready, %v", *rs.Spec.Replicas, rs.Status.ReadyReplicas, rs.Status.Conditions)
			}
			if l, err := pods.List(ctx, metav1.ListOptions{LabelSelector: poolSel}); err == nil {
				for _, p := range l.Items {
					fmt.Fprintf(&state, "; %s %s on %q (token %q, answered at its wire %v)", p.Name, p.Status.Phase, p.Spec.NodeName,
						p.Labels[keys.LabelToken], answered[p.UID])
				}
			}
			b.Fatalf("the pool did not stand %d Ready: %v (%s)", n, err, state.String())
		}
	}
	// floorClaim is what a claim needs, with bare client-go, in a claim's
	// order (pooled.Create): the Service first, owned by the Pod
	// about to be claimed, then (once the Service's first EndpointSlice is
	// there, as follow.AwaitSlice waits) the claim's conditional patch.
	// A claim of a wired Pod (NodePort and ClusterIP modes) takes the
	// Pod's wire from a list of the pool's wires made beside the list of
	// its Pods (both from the watch cache), makes the Service headless and
	// naming the wire (resources.Reference), waits for no slice, and keeps
	// the Pod's token in its patch; its URL is the wire's.
	// At c > 1 claim i of a round starts at the i-th Pod by name, so that
	// the floor's racing claims never lose a write to each other: the
	// floor is the cost of claims that are perfectly spread.
	floorClaimService := func(id string, i int) (url *corev1.Service, err error) {
		spec, err := api.CreateRequest{SandboxID: id, Template: "warm"}.Validate(fl.cfg.Objects(), time.Now())
		if err != nil {
			return nil, err
		}
		spec.Caller = api.Caller{Principal: "default"} // ours is called with the API key
		svcs := fc.CoreV1().Services(ns)
		var svc *corev1.Service
		// As a claim does (pool.ClaimFrom): from the watch cache, then
		// once more from a current list when the cache offered too few;
		// a Pod is passed over for good once someone else took it.
		taken := map[types.UID]bool{}
		for _, rv := range []string{"0", ""} {
			// The pool's wires are listed beside its Pods, as a claim
			// lists them (pool.Ready).
			var (
				cands []corev1.Pod
				wires = map[types.UID]*corev1.Service{}
			)
			g, gctx := errgroup.WithContext(ctx)
			g.Go(func() (err error) {
				cands, err = listReady(gctx, fpods, rv)
				return err
			})
			if wired {
				g.Go(func() error {
					l, err := svcs.List(gctx, metav1.ListOptions{LabelSelector: keys.LabelComponent + "=" + keys.ComponentWireValue + "," + poolSel, ResourceVersion: rv})
					if err != nil {
						return err
					}
					for i := range l.Items {
						wires[resources.OwnerUID(l.Items[i].OwnerReferences)] = &l.Items[i]
					}
					return nil
				})
			}
			if err := g.Wait(); err != nil {
				return nil, err
			}
			sort.Slice(cands, func(a, b int) bool { return cands[a].Name < cands[b].Name })
			if len(cands) > 0 {
				k := i % len(cands)
				cands = append(cands[k:], cands[:k]...)
			}
			for idx := range cands {
				p := &cands[idx]
				if taken[p.UID] {
					continue
				}
				owner := resources.PodOwnerRef(p)
				var wire *corev1.Service
				if wired {
					if wire = wires[p.UID]; !resources.Wires(fl.cfg.Objects(), wire, p) {
						return nil, fmt.Errorf("floor: pooled Pod %s is not wired", p.Name)
					}
					spec.Token = p.Labels[keys.LabelToken]
					if svc != nil { // the Pod before was taken: its Service selected its token
						_ = svcs.Delete(ctx, svc.Name, metav1.DeleteOptions{})
						svc = nil
					}
				}
				switch {
				case svc == nil && wire != nil:
					svc, err = svcs.Create(ctx, resources.Reference(resources.BuildService(fl.cfg.Objects(), spec, owner), wire), metav1.CreateOptions{})
				case svc == nil:
					if svc, err = svcs.Create(ctx, resources.BuildService(fl.cfg.Objects(), spec, owner), metav1.CreateOptions{}); err == nil {
						fl.waitSlice(ctx, svc)
					}
				case svc.OwnerReferences[0].UID != p.UID:
					svc.OwnerReferences = []metav1.OwnerReference{owner}
					svc, err = svcs.Update(ctx, svc, metav1.UpdateOptions{})
				}
				if err != nil {
					return nil, err
				}
				url = svc
				if wire != nil {
					url = wire
				}
				// Up to three writes on one Pod, as a claim makes
				// (pool.claim): a conflict from a status write (the
				// kubelet's, just after the Pod turned Ready) is retried on
				// the current Pod; one from another claim moves on.
				// The claim's patch writes what pool.claimPatch writes: the
				// pool's labels and owner gone, the sandbox's labels and
				// annotations (its identity, principal and lifetimes) and
				// its lifetime cap. Their size is what a claim's patch costs
				// beyond a bare relabel (kwok, c=8: 21.3 ms mean for the
				// relabel alone, 27.6 for this patch; ours 26.8–28.9).
				meta := &metav1.ObjectMeta{Labels: resources.Labels(spec), Annotations: resources.Annotations(spec)}
				resources.RecordPrincipal(meta, spec)
				lbls := map[string]any{keys.LabelPool: nil, keys.LabelPoolHash: nil, keys.LabelPooled: "true"}
				for k, v := range meta.Labels {
					lbls[k] = v
				}
				uid := p.UID
				for try := 0; try < 3 && p != nil; try++ {
					patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"resourceVersion": p.ResourceVersion, "ownerReferences": nil,
						"labels": lbls, "annotations": meta.Annotations},
						"spec": map[string]any{"activeDeadlineSeconds": int64(time.Since(p.CreationTimestamp.Time)/time.Second) + 1 + int64(spec.MaxLifetime/time.Second)}})
					_, err := fpods.Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
					if apierrors.IsConflict(err) {
						if p, err = fpods.Get(ctx, p.Name, metav1.GetOptions{}); err != nil || p.Labels[keys.LabelID] != "" {
							p, taken[uid] = nil, true
						}
						continue
					}
					if err != nil {
						return nil, err
					}
					return url, nil
				}
			}
		}
		if svc != nil {
			_ = svcs.Delete(ctx, svc.Name, metav1.DeleteOptions{})
		}
		return nil, fmt.Errorf("floor: no pooled Pod left for %s", id)
	}
	// In Headless mode a claim is answered once the name resolves (see
	// createNamed), and so is the floor's.
	floorClaim := func(id string, i int) error {
		svc, err := floorClaimService(id, i)
		if err != nil || fl.cfg.ServiceType != config.ServiceHeadless {
			return err
		}
		return fl.waitName(ctx, svc, svc.OwnerReferences[0].UID)
	}
	oursClaim := func(id string, _ int) error {
		r, err := fn.Do("POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": id, "template": "warm"})
		if err != nil {
			return err
		}
		if r.Code != 200 || r.Body["pooled"] != true || r.Body["ready"] != true {
			return fmt.Errorf("create %s from the pool: %d %s; the function said:\n%s", id, r.Code, r.Raw, logLines(fn, id, "warm pool"))
		}
		return nil
	}
	// remove deletes claimed sandboxes at once (no grace: they served no
	// one), so the node has room for the refill.
	remove := func(ids []string) {
		for _, id := range ids {
			_ = kc.Client.CoreV1().Services(ns).Delete(ctx, resources.ServiceName(id), metav1.DeleteOptions{})
			_ = pods.DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(int64(0))}, metav1.ListOptions{LabelSelector: keys.LabelID + "=" + id})
		}
	}
	type result struct{ ours, floor []time.Duration }
	results := map[int]*result{}
	errs := 0
	// What ours asked the API server during its c=8 rounds (from the round's
	// start to its last answer; the wiring a claim asks for comes after).
	calls8, floorCalls8 := kubeCalls{}, kubeCalls{}
	// And the CPU the machine's parts used in those rounds, ours and the
	// floor's: where the two cores went.
	cpu8, floorCPU8 := cpuUse{}, cpuUse{}
	// And ours' slowest c=8 claims, whose log is printed: a tail is read
	// from what the function did, not guessed.
	type claimTime struct {
		id string
		d  time.Duration
	}
	var slowest []claimTime
	for _, c := range []int{1, 8} {
		res := &result{}
		results[c] = res
		progress("%s: %d rounds of %d claims from a warm pool of %d, the floor and ours alternating", rowName, rounds, c, size)
		for r := 0; r < rounds; r++ {
			for _, side := range []struct {
				name string
				op   func(string, int) error
				out  *[]time.Duration
			}{{"f", floorClaim, &res.floor}, {"o", oursClaim, &res.ours}} {
				// A warm pool stands full: the refill of the round before
				// (the kubelet starting Pods on the same two cores as the
				// API server) is not charged to this round's claims.
				waitPool(size)
				var (
					before    kubeCalls
					cpuBefore cpuUse
				)
				calls, into, cpuInto := floorCalls, floorCalls8, floorCPU8
				if side.name == "o" {
					calls, into, cpuInto = func() (kubeCalls, error) { return scrapeKubeCalls(fn) }, calls8, cpu8
				}
				if c == 8 {
					var err error
					if before, err = calls(); err != nil {
						b.Fatal(err)
					}
					if cpuBefore, err = sampleCPU(fn.PID()); err != nil {
						b.Fatal(err)
					}
				}
				ids := make([]string, c)
				var wg sync.WaitGroup
				var mu sync.Mutex
				for i := range ids {
					ids[i] = fmt.Sprintf("p%s%d-%d-%d", side.name, c, r, i)
					wg.Add(1)
					go func() {
						defer wg.Done()
						start := time.Now()
						err := side.op(ids[i], i)
						d := time.Since(start)
						mu.Lock()
						defer mu.Unlock()
						if err != nil {
							errs++
							b.Log(err)
							return
						}
						*side.out = append(*side.out, d)
						if c == 8 && side.name == "o" {
							slowest = append(slowest, claimTime{ids[i], d})
						}
					}()
				}
				wg.Wait()
				if cpuBefore != nil {
					after, err := sampleCPU(fn.PID())
					if err != nil {
						b.Fatal(err)
					}
					cpuInto.add(cpuBefore, after)
				}
				if before != nil {
					after, err := calls()
					if err != nil {
						b.Fatal(err)
					}
					into.add(before, after)
				}
				remove(ids)
			}
		}
	}
	// DeerFlow's backend creates without waiting and polls the URL: a
	// claimed Pod is Ready already, but its Service is new, and the URL
	// answers once kube-proxy on the node has written the Service's rules
	// with its endpoint. The floor polls its own claim's node port.
	view := &result{}
	if viewRow != "" {
		progress("%s: %d claims one at a time, the floor and ours alternating", viewRow, rounds)
		floorView := func(id string) error {
			svc, err := floorClaimService(id, 0)
			if err != nil {
				return err
			}
			return firstOK(nodePortURL(fl.cfg.NodeHost, svc)) // the wire's, when wired
		}
		oursView := func(id string) error {
			r, err := fn.Do("POST", "/api/sandboxes", map[string]any{"sandbox_id": id, "template": "warm"})
			if err != nil {
				return err
			}
			url, _ := r.Body["sandbox_url"].(string)
			if r.Code != 200 || r.Body["pooled"] != true || url == "" {
				return fmt.Errorf("create %s from the pool: %d %s", id, r.Code, r.Raw)
			}
			return firstOK(url)
		}
		for r := 0; r < rounds; r++ {
			for _, side := range []struct {
				id  string
				op  func(string) error
				out *[]time.Duration
			}{{fmt.Sprintf("vf%d", r), floorView, &view.floor}, {fmt.Sprintf("vo%d", r), oursView, &view.ours}} {
				waitPool(size)
				start := time.Now()
				if err := side.op(side.id); err != nil {
					errs++
					b.Log(err)
				} else {
					*side.out = append(*side.out, time.Since(start))
				}
				remove([]string{side.id})
			}
		}
	}
	var md strings.Builder
	// The floor's tail is printed beside ours: on a shared machine it says
	// how much of a p99 the refill and the API server charge any claim.
	fmt.Fprintf(&md, "\n| measure | c | n | p50 ms | p95 ms | p99 ms | floor p50 ms | floor p95 ms | floor p99 ms | ratio |\n|---|---|---|---|---|---|---|---|---|---|\n")
	line := func(name string, c int, r *result) {
		fmt.Fprintf(&md, "| %s | %d | %d | %.1f | %s | %s | %.1f | %s | %s | %.2f× |\n", name, c, len(r.ours),
			pct(r.ours, .5), pctText(r.ours, .95, "%.1f"), pctText(r.ours, .99, "%.1f"),
			pct(r.floor, .5), pctText(r.floor, .95, "%.1f"), pctText(r.floor, .99, "%.1f"), pct(r.ours, .5)/pct(r.floor, .5))
	}
	for _, c := range []int{1, 8} {
		line(rowName, c, results[c])
	}
	if rowName == poolRowName {
		ownRows[ownPool] = pct(results[1].ours, .5)
	}
	if viewRow != "" {
		line(viewRow, 1, view)
	}
	if wired {
		fmt.Fprintf(&md, "\nPooled Pods are wired (issue 32): each stands behind a Service of its own, programmed before the claim. floor: client-go lists the pool's Pods and, beside them, its wires, creates the sandbox's headless Service naming one's wire, owned by the Pod, and claims the Pod with a conditional patch (what a claim writes: the sandbox's labels and annotations and its lifetime cap). Targets (issue 32): p50 ≤ 30 ms at c=1; p50 ≤ 100 ms, p99 ≤ 250 ms at c=8. Errors: %d.\n", errs)
	} else {
		fmt.Fprintf(&md, "\nfloor: client-go lists the pool's Pods, creates the Service owned by one, waits for its first EndpointSlice and claims the Pod with a conditional patch (in Headless mode, then waits until its EndpointSlice lists the Pod, as a claim does). Targets: p50 ≤ 50 ms, p99 ≤ 250 ms at c=1 and c=8. Errors: %d.\n", errs)
	}
	fmt.Fprintf(&md, "\nWhat the c=8 claims asked the API server (ours: the function's kube_request_duration_seconds, from each round's start to its last answer; the floor: its own client timed the same way):\n\n%s",
		calls8.table(len(results[8].ours), floorCalls8, len(results[8].floor)))
	fmt.Fprintf(&md, "\nThe CPU the c=8 rounds used (/proc, from each round's start to its last answer), by part:\n\n%s",
		cpu8.table(len(results[8].ours), floorCPU8, len(results[8].floor)))
	sort.Slice(slowest, func(i, j int) bool { return slowest[i].d > slowest[j].d })
	for _, c := range slowest[:min(2, len(slowest))] {
		fmt.Fprintf(&md, "\nOurs' slow c=8 claim %s, %.1f ms; what the function logged of its request (LOG_LEVEL=debug adds each API call):\n\n```\n%s\n```\n",
			c.id, float64(c.d.Microseconds())/1000, requestLog(fn, c.id))
	}
	if fl.cfg.ServiceType == config.ServiceHeadless {
		fmt.Fprintf(&md, "Claims answered before their name resolved (5 s bound): ours %d, the floor's %d.\n", unnamed(fn), fl.unnamed.Load())
	}
	if viewRow != "" {
		fmt.Fprintf(&md, "DeerFlow's view: the create without ?wait, then GET {sandbox_url}/v1/sandbox every 20 ms until a 200 (the floor: its claim, then the same polling of its URL: the wire's node port). "+
			"The URL is the claimed Pod's wire, whose endpoint kube-proxy programmed before the claim. Target (issue 32): p50 ≤ 100 ms.\n")
	}
	fmt.Println(md.String())
	if errs > 0 {
		b.Errorf("%d claims failed", errs)
	}
}

// unnamed counts the function's Headless creates answered before their
// name resolved (its log says so for each).
func unnamed(fn *function.Instance) int {
	lines := logLines(fn, follow.LogAnsweredUnnamed)
	if lines == "" {
		return 0
	}
	return strings.Count(lines, "\n") + 1
}

// logLines is the function's log lines that mention any of subs: why a
// claim went the cold way.
func logLines(fn *function.Instance, subs ...string) string {
	data, err := os.ReadFile(fn.LogPath)
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		for _, s := range subs {
			if strings.Contains(line, s) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// requestLog is the function's log lines of the requests that named
// sandbox id (its audit record names it; the request id ties the rest).
func requestLog(fn *function.Instance, id string) string {
	data, err := os.ReadFile(fn.LogPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(string(data), "\n")
	reqs := map[string]bool{}
	for _, line := range lines {
		var rec struct {
			SandboxID string `json:"sandbox_id"`
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.SandboxID == id && rec.RequestID != "" {
			reqs[rec.RequestID] = true
		}
	}
	var out []string
	for _, line := range lines {
		var rec struct {
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && reqs[rec.RequestID] {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
