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

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestLoad creates and destroys 1,000 sandboxes at concurrency 32 through the
// HTTP API: zero errors, and nothing left behind. `make load` runs it; set
// LOAD_SANDBOXES to change the count.
func TestLoad(t *testing.T) {
	if os.Getenv("LOAD") == "" {
		t.Skip("set LOAD=1 (make load) to run the load test")
	}
	total, concurrency := 1000, 32
	if v := os.Getenv("LOAD_SANDBOXES"); v != "" {
		fmt.Sscan(v, &total)
	}
	ns := namespace(t)
	f := start(t, ns, nil)
	var next, failures atomic.Int64
	var wg sync.WaitGroup
	began := time.Now()
	deadline := began.Add(5 * time.Minute)
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
				for _, step := range []struct{ method, path string }{{"POST", "/api/sandboxes"}, {"DELETE", "/api/sandboxes/" + id}} {
					var body any
					if step.method == "POST" {
						body = map[string]any{"sandbox_id": id}
					}
					r, err := f.Do(step.method, step.path, body)
					if err != nil || r.Code != 200 {
						failures.Add(1)
						t.Errorf("%s %s: %v %d %s", step.method, step.path, err, r.Code, r.Raw)
					}
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(began)
	if n := next.Load(); n < int64(total) {
		t.Fatalf("only %d of %d sandboxes done before the deadline", n, total)
	}
	t.Logf("%d creates and %d deletes at concurrency %d in %s (%.0f requests/s), %d errors",
		total, total, concurrency, elapsed.Round(time.Millisecond), float64(2*total)/elapsed.Seconds(), failures.Load())
	ctx := context.Background()
	eventually(t, 120*time.Second, "namespace empty of Pods, Services and NetworkPolicies", func() (bool, error) {
		p, err := client().CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		s, err := client().CoreV1().Services(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		n, err := client().NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		if len(p.Items)+len(s.Items)+len(n.Items) > 0 {
			return false, fmt.Errorf("%d Pods, %d Services, %d NetworkPolicies left", len(p.Items), len(s.Items), len(n.Items))
		}
		return true, nil
	})
}
