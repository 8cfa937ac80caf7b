//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

const (
	poolLabel   = "sandbox.deerflow.dev/pool"
	pooledLabel = "sandbox.deerflow.dev/pooled"
)

// pooledTemplate is a template with a warm pool of size and no DeerFlow
// mounts (which would make its Pods per-request).
func pooledTemplate(name string, size int, spec corev1.PodSpec) *corev1.PodTemplate {
	if len(spec.Containers) == 0 {
		spec.Containers = []corev1.Container{{Name: "sandbox", Image: "sandbox:test"}}
	}
	return podTemplate(name, map[string]string{keys.TemplatePoolSize: fmt.Sprint(size), keys.TemplateDeerFlowMounts: "false"}, spec)
}

// poolReady counts the unclaimed Ready Pods of template's pool.
func poolReady(t *testing.T, ns, tmpl string) int {
	t.Helper()
	n := 0
	for _, p := range pods(t, ns, poolLabel+"="+tmpl) {
		if p.DeletionTimestamp == nil && p.Labels["sandbox-id"] == "" && ready(&p) {
			n++
		}
	}
	return n
}

// cordon marks every node unschedulable and returns the function that
// undoes it (also run when the test ends).
func cordon(t *testing.T) (undo func()) {
	t.Helper()
	ctx := context.Background()
	set := func(v bool) {
		nodes, err := client().CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		patch := []byte(fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, v))
		for _, n := range nodes.Items {
			if _, err := client().CoreV1().Nodes().Patch(ctx, n.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	set(true)
	done := false
	undo = func() {
		if !done {
			done = true
			set(false)
		}
	}
	t.Cleanup(undo)
	return undo
}

// poolState says what the pool's Pods are doing, for a failure message.
func poolState(t *testing.T, ns, tmpl string) error {
	var b strings.Builder
	rs, err := client().AppsV1().ReplicaSets(ns).Get(context.Background(), "sandbox-pool-"+tmpl, metav1.GetOptions{})
	if err != nil {
		fmt.Fprintf(&b, "ReplicaSet: %v; ", err)
	} else {
		fmt.Fprintf(&b, "ReplicaSet replicas %d ready %d conditions %v; ", *rs.Spec.Replicas, rs.Status.ReadyReplicas, rs.Status.Conditions)
	}
	for _, p := range pods(t, ns, poolLabel+"="+tmpl) {
		fmt.Fprintf(&b, "%s node=%q phase=%s ready=%v; ", p.Name, p.Spec.NodeName, p.Status.Phase, ready(&p))
	}
	return fmt.Errorf("%s", b.String())
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// templatePool is the pool entry of one template in GET /api/templates.
func templatePool(t *testing.T, f *function.Instance, name string) map[string]any {
	t.Helper()
	l := mustDo(t, f, "GET", "/api/templates", nil)
	expectCode(t, l, 200, "list templates")
	for _, x := range l.Body["templates"].([]any) {
		if e := x.(map[string]any); e["name"] == name {
			p, _ := e["pool"].(map[string]any)
			return p
		}
	}
	t.Fatalf("template %s not listed: %s", name, l.Raw)
	return nil
}

// keepPools asks a reap, which makes the pools the templates ask for
// (reading the templates writes nothing).
func keepPools(t *testing.T, f *function.Instance) {
	t.Helper()
	expectCode(t, mustDo(t, f, "POST", "/api/reap", nil), 200, "reap, which keeps the pools")
}

// warmUp applies a pooled template, asks a reap to make its pool and waits
// until all of it stands Ready.
func warmUp(t *testing.T, f *function.Instance, ns, name string, size int) {
	t.Helper()
	putTemplate(t, ns, pooledTemplate(name, size, corev1.PodSpec{}))
	keepPools(t, f)
	if p := templatePool(t, f, name); p == nil || p["size"] != float64(size) || p["error"] != nil {
		t.Fatalf("template %s pool: %v, want size %d and no error", name, p, size)
	}
	eventually(t, 60*time.Second, fmt.Sprintf("%d Ready Pods in the pool of %s", size, name), func() (bool, error) {
		return poolReady(t, ns, name) == size, poolState(t, ns, name)
	})
}

// TestPoolClaims: 20 concurrent creates on a Ready pool of 5 give 5
// sandboxes claimed from it, each a distinct Pod, and 15 cold ones; the
// ReplicaSet controller refills the pool; a claimed sandbox is listed, got,
// created again and destroyed like any other, and unclaimed pooled Pods
// are no sandboxes to list.
func TestPoolClaims(t *testing.T) {
	ns := namespace(t)
	f := start(t, ns, nil)
	warmUp(t, f, ns, "warm", 5)
	// No node takes new Pods during the burst: on kwok a replacement is
	// Ready within a second, and one claimed mid-burst would make the count
	// of hits depend on timing. Scheduling resumes for the refill below.
	schedule := cordon(t)

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		answers = map[string]map[string]any{}
	)
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := fmt.Sprintf("pool-%02d", i)
			r, err := f.Do("POST", "/api/sandboxes", map[string]any{"sandbox_id": id, "template": "warm", "user_id": "u1"})
			mu.Lock()
			defer mu.Unlock()
			if err != nil || r.Code != 200 {
				t.Errorf("create %s: %v %d %s", id, err, r.Code, r.Raw)
				return
			}
			answers[id] = r.Body
		}()
	}
	wg.Wait()
	var hits []string
	for id, b := range answers {
		if b["pooled"] == true {
			hits = append(hits, id)
		}
	}
	if len(hits) != 5 {
		t.Fatalf("%d creates hit the pool (%v), want 5 of 20", len(hits), hits)
	}
	// Every sandbox is exactly one Pod: 5 claimed (distinct, keeping their
	// pool names, no owner), 15 made cold as sandbox-<id>.
	claimed := map[string]string{}
	cold := 0
	for _, p := range pods(t, ns, "app=deer-flow-sandbox,sandbox-id") {
		id := p.Labels["sandbox-id"]
		switch {
		case p.Labels[pooledLabel] == "true":
			if prev, dup := claimed[id]; dup {
				t.Errorf("sandbox %s has two claimed Pods: %s and %s", id, prev, p.Name)
			}
			claimed[id] = p.Name
			if len(p.OwnerReferences) != 0 || p.Labels[poolLabel] != "" || p.Spec.ActiveDeadlineSeconds == nil {
				t.Errorf("claimed Pod %s: owners %v, pool label %q, deadline %v; want out of the pool with a deadline", p.Name, p.OwnerReferences, p.Labels[poolLabel], p.Spec.ActiveDeadlineSeconds)
			}
		case p.Name == "sandbox-"+id:
			cold++
		default:
			t.Errorf("unexpected sandbox Pod %s of %s", p.Name, id)
		}
	}
	if len(claimed) != 5 || cold != 15 {
		t.Fatalf("%d claimed and %d cold Pods, want 5 and 15", len(claimed), cold)
	}
	for _, id := range hits {
		if _, ok := claimed[id]; !ok {
			t.Errorf("create %s answered pooled but its Pod is not a claimed one", id)
		}
	}

	// Kubernetes refills the pool; GET /api/templates shows it.
	schedule()
	eventually(t, 60*time.Second, "the pool refilled to 5 Ready Pods", func() (bool, error) {
		return poolReady(t, ns, "warm") == 5, nil
	})
	// The function reads the pool's ready count from the ReplicaSet's
	// status, which its controller writes a moment after the Pods turn
	// Ready: wait for it, bounded.
	var last map[string]any
	eventually(t, 20*time.Second, "GET /api/templates shows the pool ready 5", func() (bool, error) {
		last = templatePool(t, f, "warm")
		return last["ready"] == float64(5), fmt.Errorf("pool %v", last)
	})

	// List: the 20 sandboxes, not the 5 pooled Pods standing by.
	l := mustDo(t, f, "GET", "/api/sandboxes", nil)
	expectCode(t, l, 200, "list")
	if l.Body["count"] != float64(20) {
		t.Errorf("list count %v, want 20 (pooled Pods are no sandboxes): %s", l.Body["count"], l.Raw)
	}

	id := hits[0]
	url := answers[id]["sandbox_url"]
	g := mustDo(t, f, "GET", "/api/sandboxes/"+id, nil)
	expectCode(t, g, 200, "get a claimed sandbox")
	if g.Body["sandbox_url"] != url || g.Body["pooled"] != true || g.Body["status"] != "Running" {
		t.Errorf("get %s: %s; want pooled, Running, at %v", id, g.Raw, url)
	}
	svc, err := client().CoreV1().Services(ns).Get(context.Background(), "sandbox-"+id+"-svc", metav1.GetOptions{})
	if err != nil || len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].Name != claimed[id] {
		t.Errorf("Service of %s: %v, owners %v; want owned by its claimed Pod %s", id, err, svc.OwnerReferences, claimed[id])
	}
	// DeerFlow creates again on every reuse: the same sandbox, no new Pod,
	// no pooled Pod spent.
	again := create(t, f, map[string]any{"sandbox_id": id, "template": "warm", "user_id": "u1"})
	if again.Body["sandbox_url"] != url || again.Body["pooled"] != true {
		t.Errorf("create %s again: %s; want the same pooled sandbox at %v", id, again.Raw, url)
	}
	// A cold create of the same id (it asks for more than the pool has)
	// gets it too, not a second Pod.
	coldAgain := create(t, f, map[string]any{"sandbox_id": id, "template": "warm", "user_id": "u1", "cpu": "2"})
	if coldAgain.Body["sandbox_url"] != url {
		t.Errorf("cold create of claimed %s: %s; want the same sandbox", id, coldAgain.Raw)
	}
	if _, err := client().CoreV1().Pods(ns).Get(context.Background(), "sandbox-"+id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a create of claimed %s left a second Pod sandbox-%s (%v)", id, id, err)
	}
	// Another user cannot take it over.
	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": id, "template": "warm", "user_id": "mallory"})
	expectCode(t, r, 409, "create of a claimed sandbox by another user")

	// Destroy removes the claimed Pod; the id is gone.
	d := mustDo(t, f, "DELETE", "/api/sandboxes/"+id, nil)
	expectCode(t, d, 200, "destroy a claimed sandbox")
	eventually(t, 30*time.Second, "claimed Pod gone", func() (bool, error) {
		_, err := client().CoreV1().Pods(ns).Get(context.Background(), claimed[id], metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	expectCode(t, mustDo(t, f, "GET", "/api/sandboxes/"+id, nil), 404, "get a destroyed claimed sandbox")

	// A request that needs what a pooled Pod lacks starts cold.
	ms := create(t, f, map[string]any{"sandbox_id": "pool-shells", "template": "warm", "max_shell_sessions": 3})
	if ms.Body["pooled"] == true {
		t.Errorf("create with max_shell_sessions hit the pool: %s", ms.Raw)
	}
	if _, err := client().CoreV1().Pods(ns).Get(context.Background(), "sandbox-pool-shells", metav1.GetOptions{}); err != nil {
		t.Errorf("cold create of pool-shells: %v", err)
	}

	// The metric says which creates hit. A claim counts as wired or hit by
	// whether its Pod was wired when claimed, which the pool's background
	// wiring (asked for by the reap and by the burst's first claims)
	// decides by timing: the five claims are counted under one of the two,
	// each once.
	got := scrape(t, f, "sandbox_provisioner_pool_claims_total")
	claims := func(result string) float64 {
		return got[`sandbox_provisioner_pool_claims_total{result="`+result+`",template="warm"}`]
	}
	if claims("hit")+claims("wired") != 5 || claims("miss") != 2 {
		t.Errorf("pool_claims_total of template warm %v, want hit and wired 5 together and miss 2", got)
	}
}

// TestPoolUnreadyPodsAreNotHandedOut: a pool whose Pods cannot become Ready
// (no node fits them) serves no claim; creates start cold at once.
func TestPoolUnreadyPodsAreNotHandedOut(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, nil)
	putTemplate(t, ns, pooledTemplate("stuck", 2, corev1.PodSpec{NodeSelector: map[string]string{"no-such-node": "true"}}))
	keepPools(t, f)
	eventually(t, 30*time.Second, "2 pooled Pods exist", func() (bool, error) {
		return len(pods(t, ns, poolLabel+"=stuck")) == 2, nil
	})
	for i := range 3 {
		r := create(t, f, map[string]any{"sandbox_id": fmt.Sprintf("stuck-%d", i), "template": "stuck"})
		if r.Body["pooled"] == true {
			t.Errorf("create hit a pool of unready Pods: %s", r.Raw)
		}
	}
	for _, p := range pods(t, ns, poolLabel+"=stuck") {
		if p.Labels["sandbox-id"] != "" {
			t.Errorf("unready pooled Pod %s was claimed", p.Name)
		}
	}
	if p := templatePool(t, f, "stuck"); p["ready"] != float64(0) {
		t.Errorf("pool %v, want ready 0", p)
	}
}

// TestPoolBadSettings: a pool size above the cap, a negative one, or a pool
// on a template whose Pods need per-request data are listed with their
// error, keep no pool, and the template still serves creates, cold.
func TestPoolBadSettings(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, map[string]string{"SANDBOX_MAX_POOL_SIZE": "3"})
	putTemplate(t, ns, pooledTemplate("over", 4, corev1.PodSpec{}))
	putTemplate(t, ns, pooledTemplate("negative", -1, corev1.PodSpec{}))
	putTemplate(t, ns, podTemplate("mounts", map[string]string{keys.TemplatePoolSize: "2"},
		corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "sandbox:test"}}}))
	want := map[string]string{
		"over":     "4 is above the operator's cap SANDBOX_MAX_POOL_SIZE=3",
		"negative": `"-1": want a whole number from 0 to 3`,
		"mounts":   "a pool on a template whose Pods need per-request data",
	}
	for name, msg := range want {
		p := templatePool(t, f, name)
		errText, _ := p["error"].(string)
		if p["size"] != float64(0) || !strings.Contains(errText, msg) {
			t.Errorf("template %s pool %v, want size 0 and an error containing %q", name, p, msg)
		}
		r := create(t, f, map[string]any{"sandbox_id": "bad-" + name, "template": name})
		if r.Body["pooled"] == true || r.Body["sandbox_url"] == "" {
			t.Errorf("create with %s: %s; want a cold sandbox", name, r.Raw)
		}
	}
	rss, err := client().AppsV1().ReplicaSets(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rs := range rss.Items {
		t.Errorf("ReplicaSet %s exists; a refused pool keeps none", rs.Name)
	}
	// Capabilities still offer the templates.
	c := mustDo(t, f, "GET", "/api/capabilities", nil)
	if diff := cmp.Diff("[default mounts negative over]", fmt.Sprint(c.Body["templates"])); diff != "" {
		t.Errorf("capabilities templates (-want +got):\n%s", diff)
	}
}

// TestPoolQuota: claimed sandboxes count toward MAX_SANDBOXES, pooled Pods
// standing by do not.
func TestPoolQuota(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, map[string]string{"MAX_SANDBOXES": "2"})
	warmUp(t, f, ns, "warm", 3)
	for _, id := range []string{"q-1", "q-2"} {
		if r := create(t, f, map[string]any{"sandbox_id": id, "template": "warm"}); r.Body["pooled"] != true {
			t.Errorf("create %s: %s; want it from the pool", id, r.Raw)
		}
	}
	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "q-3", "template": "warm"})
	expectCode(t, r, 429, "a third sandbox over MAX_SANDBOXES=2, with pooled Pods Ready")
	// The refused create claimed no Pod (its Service, counted first, is gone).
	eventually(t, 30*time.Second, "no Pod of q-3", func() (bool, error) {
		return len(pods(t, ns, "sandbox-id=q-3")) == 0, nil
	})
	l := mustDo(t, f, "GET", "/api/sandboxes", nil)
	if l.Body["count"] != float64(2) {
		t.Errorf("list count %v, want 2: %s", l.Body["count"], l.Raw)
	}
}

// TestPoolAndColdCreatesOfOneIDRace: a create served from the pool and a
// cold create of the same id (it asks for what a pooled Pod lacks), sent
// at once, end as one sandbox: both answer with the same URL, and one Pod
// and one Service carry the id. A claim reads whether the id is in use
// from the API server's watch cache, which may not show a racing create
// yet; the Service, which both write, decides, and the loser's Pod goes.
func TestPoolAndColdCreatesOfOneIDRace(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	f := start(t, ns, nil)
	warmUp(t, f, ns, "warm", 5)
	for i := range 5 {
		id := fmt.Sprintf("race-%d", i)
		var (
			wg  sync.WaitGroup
			got [2]function.Response
		)
		for k, body := range []map[string]any{
			{"sandbox_id": id, "template": "warm", "user_id": "u1"},
			{"sandbox_id": id, "template": "warm", "user_id": "u1", "cpu": "2"},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				got[k] = mustDo(t, f, "POST", "/api/sandboxes", body)
			}()
		}
		wg.Wait()
		for k, r := range got {
			expectCode(t, r, 200, fmt.Sprintf("create %s (%s)", id, []string{"pooled", "cold"}[k]))
		}
		if got[0].Body["sandbox_url"] != got[1].Body["sandbox_url"] {
			t.Errorf("%s: the racing creates answered %v and %v; want one sandbox", id, got[0].Body["sandbox_url"], got[1].Body["sandbox_url"])
		}
		if svcs := services(t, ns, "sandbox-id="+id); len(svcs) != 1 {
			t.Errorf("%s: %d Services, want 1", id, len(svcs))
		}
		eventually(t, 30*time.Second, id+": one Pod", func() (bool, error) {
			var live []string
			for _, p := range pods(t, ns, "sandbox-id="+id) {
				if p.DeletionTimestamp == nil {
					live = append(live, p.Name)
				}
			}
			return len(live) == 1, fmt.Errorf("live Pods %v", live)
		})
	}
}
