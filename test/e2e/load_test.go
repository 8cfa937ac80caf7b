//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// TestLoad creates and destroys sandboxes through the HTTP API, each id
// created and then destroyed: every call answers 200, every create and
// destroy completes before the deadline, and the namespace is left with
// nothing but the NetworkPolicies that outlive sandboxes (the shared one
// and the principal's ingress policies).
// `make load` (LOAD=1) runs 1,000 at concurrency 32; without LOAD, a short
// run of 200 at concurrency 8, so that `make test` runs it on every change
// and it cannot rot unseen. LOAD_SANDBOXES changes the count.
func TestLoad(t *testing.T) {
	total, concurrency, within := 200, 8, 2*time.Minute
	if os.Getenv("LOAD") != "" {
		total, concurrency, within = 1000, 32, 5*time.Minute
	}
	if v := os.Getenv("LOAD_SANDBOXES"); v != "" {
		if _, err := fmt.Sscan(v, &total); err != nil {
			t.Fatalf("LOAD_SANDBOXES=%q: %v", v, err)
		}
	}
	ns := namespace(t)
	f := start(t, ns, nil)
	// next hands out ids; created and destroyed count the calls that
	// completed (answered 200), which is what the run must show.
	var next, created, destroyed, failures atomic.Int64
	var wg sync.WaitGroup
	began := time.Now()
	deadline := began.Add(within)
	for w := 0; w < concurrency; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(total) || time.Now().After(deadline) {
					return
				}
				id := fmt.Sprintf("load-%04d", i)
				for _, step := range []struct {
					method, path string
					done         *atomic.Int64
				}{{"POST", "/api/sandboxes", &created}, {"DELETE", "/api/sandboxes/" + id, &destroyed}} {
					var body any
					if step.method == "POST" {
						body = map[string]any{"sandbox_id": id}
					}
					r, err := f.Do(step.method, step.path, body)
					if err != nil || r.Code != 200 {
						failures.Add(1)
						t.Errorf("%s %s: %v %d %s", step.method, step.path, err, r.Code, r.Raw)
						continue
					}
					step.done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	t.Logf("%d creates and %d destroys of %d completed at concurrency %d in %s (%.0f requests/s), %d errors",
		created.Load(), destroyed.Load(), total, concurrency, elapsed.Round(time.Millisecond), float64(created.Load()+destroyed.Load())/elapsed.Seconds(), failures.Load())
	if created.Load() != int64(total) || destroyed.Load() != int64(total) {
		t.Fatalf("%d of %d creates and %d of %d destroys completed within %s", created.Load(), total, destroyed.Load(), total, within)
	}

	// What the function leaves: no Pod, Service or ReplicaSet (a sandbox's
	// objects), and of NetworkPolicies only those that outlive sandboxes:
	// the shared one it ensured at start (SANDBOX_NETWORK_POLICY_ENSURE in
	// the harness's settings), as the shipped manifest names and labels it,
	// and the two its key's principal ("default", the only one) had written
	// by its first create: its ingress policy and the legacy one.
	for k, v := range function.BaseEnv(kubeconfig, ns) {
		t.Setenv(k, v) // the function's settings, for the policies' names
	}
	cfg, err := config.Load()
	if err != nil {
		t.Fatalf("the harness's settings: %v", err)
	}
	want := map[string]map[string]string{}
	for _, shared := range shippedNetworkPolicies(t, ns) {
		want[shared.Name] = shared.Labels
	}
	for _, np := range []*networkingv1.NetworkPolicy{resources.BuildIngressPolicy(cfg.Objects(), config.DefaultPrincipal, nil), resources.BuildLegacyIngressPolicy(cfg.Objects(), nil)} {
		want[np.Name] = np.Labels
	}
	ctx := context.Background()
	eventually(t, 120*time.Second, "namespace empty of Pods, Services and ReplicaSets, and of NetworkPolicies but those that outlive sandboxes", func() (bool, error) {
		p, err := client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		s, err := client().CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		rs, err := client().AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		if len(p.Items)+len(s.Items)+len(rs.Items) > 0 {
			return false, fmt.Errorf("%d Pods, %d Services, %d ReplicaSets left", len(p.Items), len(s.Items), len(rs.Items))
		}
		n, err := client().NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		got := map[string]map[string]string{}
		for _, np := range n.Items {
			got[np.Name] = np.Labels
		}
		if diff := cmp.Diff(want, got); diff != "" {
			return false, fmt.Errorf("NetworkPolicies left, by name and labels (-want +got):\n%s", diff)
		}
		return true, nil
	})
}
