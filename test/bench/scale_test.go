//go:build e2e

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
)

// BenchmarkScale measures whether a create costs the same with 5,000
// sandboxes present as with 50 (issue 20: create p50 at 5,000 ≤ 1.10× at
// 50), and a get and a destroy likewise: the quota once listed every
// sandbox on every create, and a get that found its sandbox by a list (by
// labels) would grow with them. Our function runs with the shipped defaults but a quota
// large enough for the run (MAX_SANDBOXES=10000); the sandboxes that fill
// the namespace are made by the floor's bare calls (whole sandboxes, Pod
// and Service, labelled as ours), which is faster than through the
// function and counts the same. At each size the floor and ours alternate
// single creates, then single gets and deletes of what they made, at
// concurrency 1.
// In Headless mode a create is answered once the Service's EndpointSlice
// lists the Pod (the name resolves), and the floor's measured creates wait
// for that too (floor.createNamed); the fill does not.
//
// It runs once per Service mode that can hold 5,000 sandboxes, each on a
// cluster of its own filled in that mode. NodePort, the default, cannot: a
// cluster's NodePort range holds fewer ports (this one's 2,000, the
// default 2,768); an operator at that scale runs ClusterIP, as the README
// says for any backend inside the cluster, or Headless. ClusterIP pays the
// API server's ClusterIP allocator, whose cost per Service grows with the
// number of Services (the floor's creates grow as ours do); Headless
// allocates nothing.
func BenchmarkScale(b *testing.B) {
	for _, mode := range []string{"ClusterIP", config.ServiceHeadless} {
		b.Run(mode, func(b *testing.B) { scale(b, mode) })
	}
}

func scale(b *testing.B, mode string) {
	ctx := context.Background()
	kc := benchCluster(b, "scale-"+strings.ToLower(mode), 2)
	defer kc.Down()
	useNamespace(b, kc)
	dir := b.TempDir()
	env := benchEnv(kc)
	env["MAX_SANDBOXES"] = "10000"
	env["SANDBOX_SERVICE_TYPE"] = mode
	fn, fl := startWithFloor(b, kc, binary(b), env, dir)
	defer fn.Stop()

	// fill creates sandboxes fill<from>..fill<to-1>, in as many rounds as
	// run's 3-minute bound needs (a loaded machine fills slowly).
	fill := func(from, to int) {
		progress("filling the namespace to %d sandboxes", to)
		for next, deadline := from, time.Now().Add(20*time.Minute); next < to; {
			if time.Now().After(deadline) {
				b.Fatalf("filled only to %d of %d sandboxes in 20 minutes", next, to)
			}
			start := next
			s := run(to-start, 32, func(i int) error { return fl.create(ctx, fmt.Sprintf("fill%05d", start+i)) })
			if s.err > 0 {
				b.Fatalf("%d fill creates failed, the first: %v", s.err, s.first)
			}
			next += len(s.d)
		}
	}
	for i := 0; i < 20; i++ { // warm both paths
		_ = fl.create(ctx, fmt.Sprintf("warm-f%d", i))
		_ = ours(fn, "POST", "/api/sandboxes", map[string]any{"sandbox_id": fmt.Sprintf("warm-o%d", i)})
	}
	const n = 100
	var (
		rows []Row
		// p50 ms of getByLabels at each size, by resource version: "0"
		// (the watch cache: what a hit would cost) and "" (quorum: what a
		// miss must cost before a 404)
		byLabels = map[string][]float64{}
	)
	measure := func(present int) {
		progress("%d creates, gets and deletes each at concurrency 1 with %d sandboxes present", n, present)
		fc, oc := alternate(n, 1, n,
			func(i int) error { return fl.createNamed(ctx, fmt.Sprintf("s%d-f%d", present, i)) },
			func(i int) error {
				return ours(fn, "POST", "/api/sandboxes", map[string]any{"sandbox_id": fmt.Sprintf("s%d-o%d", present, i)})
			})
		rows = append(rows, row(fmt.Sprintf("create (%d present)", present), 1, oc, fc))
		// A get finds its sandbox by name (a GET of the id's Service and
		// Pod, each a quorum read), never by a list: it should cost the
		// same at any size, and a miss is never a stale 404.
		fg, og := alternate(n, 1, n,
			func(i int) error { return fl.get(ctx, fmt.Sprintf("s%d-f%d", present, i)) },
			func(i int) error { return ours(fn, "GET", fmt.Sprintf("/api/sandboxes/s%d-o%d", present, i), nil) })
		rows = append(rows, row(fmt.Sprintf("get (%d present)", present), 1, og, fg))
		// What a get by labels would cost instead (not ours: for the
		// comparison): the id's Pods and Services listed by label, from
		// the watch cache (resourceVersion "0", a hit's read) and with
		// resourceVersion "", the quorum read a miss needs before it may
		// answer 404 (DeerFlow deletes its record on a 404).
		for _, rv := range byLabelsRVs {
			bl := run(n, 1, func(i int) error { return getByLabels(ctx, kc, fmt.Sprintf("s%d-f%d", present, i), rv) })
			if bl.err > 0 {
				b.Errorf("get by labels (resourceVersion %q): %d errors, the first: %v", rv, bl.err, bl.first)
			}
			byLabels[rv] = append(byLabels[rv], pct(bl.d, .5))
		}
		fd, od := alternate(n, 1, n,
			func(i int) error { return fl.delete(ctx, fmt.Sprintf("s%d-f%d", present, i)) },
			func(i int) error { return ours(fn, "DELETE", fmt.Sprintf("/api/sandboxes/s%d-o%d", present, i), nil) })
		rows = append(rows, row(fmt.Sprintf("delete (%d present)", present), 1, od, fd))
	}
	// settle waits until the cluster has caught up with the fill (kwok has
	// moved every Pod to Running, so the scheduler and kwok are idle), so
	// that both sizes are measured on a cluster at rest rather than the
	// larger one during the fill's aftermath, which both sides would be
	// charged for.
	settle := func() {
		progress("waiting for the cluster to settle (every sandbox Pod Running)")
		err := wait.PollUntilContextTimeout(ctx, 5*time.Second, 10*time.Minute, true, func(ctx context.Context) (bool, error) {
			l, err := kc.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=deer-flow-sandbox", ResourceVersion: "0"})
			if err != nil {
				return false, nil
			}
			for _, p := range l.Items {
				if p.Status.Phase != corev1.PodRunning {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			b.Fatalf("the cluster did not settle: %v", err)
		}
		time.Sleep(10 * time.Second)
	}
	fill(40, 50) // the 40 warm-up sandboxes and 10 more
	settle()
	measure(countSandboxes(ctx, kc.Client))
	fill(50, 5000)
	settle()
	measure(countSandboxes(ctx, kc.Client))

	var md strings.Builder
	fmt.Fprintf(&md, "# Scale benchmark %s, SANDBOX_SERVICE_TYPE=%s\n\n", time.Now().UTC().Format(time.RFC3339), mode)
	fmt.Fprintf(&md, "| operation | n | ours p50 | p95 | floor p50 | p95 | p50 ratio | errors |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&md, "| %s | %d | %.2f | %s | %.2f | %s | %.2f× | %d |\n", r.Operation, r.N, r.OursP50, pctText(r.ours, .95, "%.2f"), r.FloorP50, pctText(r.floor, .95, "%.2f"), r.OursP50/r.FloorP50, r.Errors)
	}
	if mode == config.ServiceHeadless {
		// Both sides answer after at most 5 s without the name (see
		// floor.createNamed); how often they did is part of the figure.
		fmt.Fprintf(&md, "\nHeadless creates answered before their name resolved (5 s bound): ours %d, the floor's %d.\n",
			unnamed(fn), fl.unnamed.Load())
	}
	qps, burst := shippedClientLimits()
	// rows holds, per size, the create, get and delete rows: 50 present
	// first, then 5,000.
	const ops = 3
	fmt.Fprintf(&md, "\nLatencies in ms, concurrency 1, our function with the shipped client limits (%s/%s) and MAX_SANDBOXES=10000.\n\n", qps, burst)
	fmt.Fprintf(&md, "| target | value | limit | met |\n|---|---|---|---|\n")
	for op := 0; op < ops; op++ {
		small, large := rows[op], rows[ops+op]
		verb, _, _ := strings.Cut(small.Operation, " ")
		growth := large.OursP50 / small.OursP50
		fmt.Fprintf(&md, "| %s p50 with %s vs %s, ours | %.2f | ≤ 1.10 | %v |\n", verb, strings.TrimPrefix(large.Operation, verb+" "), strings.TrimPrefix(small.Operation, verb+" "), growth, growth <= 1.10)
		fmt.Fprintf(&md, "| the floor's %s p50, the same two sizes (the API server's own growth) | %.2f | | |\n", verb, large.FloorP50/small.FloorP50)
	}
	for _, rv := range byLabelsRVs {
		bl := byLabels[rv]
		fmt.Fprintf(&md, "| a get by labels instead (client-go, two lists by the id's label, resourceVersion %q): p50 %.2f ms at %s, %.2f ms at %s | %.2f | | |\n",
			rv, bl[0], strings.TrimPrefix(rows[0].Operation, "create "), bl[1], strings.TrimPrefix(rows[ops].Operation, "create "), bl[1]/bl[0])
	}
	fmt.Println(md.String())
	out := filepath.Join("..", "..", "results")
	if err := os.MkdirAll(out, 0o755); err == nil {
		_ = os.WriteFile(filepath.Join(out, "scale-"+strings.ToLower(mode)+"-"+time.Now().UTC().Format("20060102-150405")+".md"), []byte(md.String()), 0o644)
	}
	for _, r := range rows {
		if r.Errors > 0 {
			b.Errorf("%s: %d errors; ours first: %v; the floor's first: %v", r.Operation, r.Errors, r.oursFirst, r.floorFirst)
		}
	}
}

// byLabelsRVs are the resource versions getByLabels is timed at: "0", the
// watch cache (a hit's read, possibly stale), and "", a consistent list (a
// miss's, before a 404).
var byLabelsRVs = []string{"0", ""}

// getByLabels finds sandbox id by its labels rather than by name: its Pods
// and Services listed by the id's label at resource version rv, which the
// API server answers by filtering every object of the namespace (it keeps
// no index by label). It fails unless it finds one of each.
func getByLabels(ctx context.Context, kc *cluster.Cluster, id, rv string) error {
	sel := metav1.ListOptions{LabelSelector: keys.LabelID + "=" + id, ResourceVersion: rv}
	pods, err := kc.Client.CoreV1().Pods(ns).List(ctx, sel)
	if err != nil {
		return err
	}
	svcs, err := kc.Client.CoreV1().Services(ns).List(ctx, sel)
	if err != nil {
		return err
	}
	if len(pods.Items) != 1 || len(svcs.Items) != 1 {
		return fmt.Errorf("sandbox %s by labels: %d Pods, %d Services; want one of each", id, len(pods.Items), len(svcs.Items))
	}
	return nil
}
