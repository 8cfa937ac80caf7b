//go:build e2e

package bench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
	"github.com/deerflow-sandbox/provisioner/test/cluster"
	"github.com/deerflow-sandbox/provisioner/test/realnode"
)

// BenchmarkRealNodeCreateToReady measures create → Ready on the real node:
// the function (POST /api/sandboxes?wait=20s, which answers when the real
// readiness probe passes) against the floor (client-go creates the same Pod
// and Service, then watches the Pod until Ready), alternating, in one run.
func BenchmarkRealNodeCreateToReady(b *testing.B) {
	ctx := context.Background()
	kc := benchCluster(b, "benchrn", 0)
	defer kc.Down()
	rn, err := realnode.Up(ctx, realnode.DefaultPaths(cluster.CacheDir()), realnode.Cluster{Host: kc.Config.Host, PKIDir: kc.PKIDir(), Client: kc.Client})
	if err != nil {
		b.Skipf("no real node, so no create → Ready figures: %v", err)
	}
	defer rn.Down()
	useNamespace(b, kc)
	dir := b.TempDir()
	bin := binary(b)
	base, err := realnode.HostBase(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	env := benchEnv(kc)
	for k, v := range realnode.FunctionEnv(base) {
		env[k] = v
	}
	fn, fl := startWithFloor(b, kc, bin, env, dir)
	defer fn.Stop()

	floorReady := func(id string) error {
		w, err := kc.Client.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", sandbox.PodName(id)).String()})
		if err != nil {
			return err
		}
		defer w.Stop()
		if err := fl.create(ctx, id); err != nil {
			return err
		}
		timeout := time.After(30 * time.Second)
		for {
			select {
			case ev := <-w.ResultChan():
				if ev.Type == watch.Error {
					return fmt.Errorf("watch error: %v", ev.Object)
				}
				if p, ok := ev.Object.(*corev1.Pod); ok {
					if realnode.Ready(p) {
						return nil
					}
				}
			case <-timeout:
				return fmt.Errorf("%s not Ready within 30s", id)
			}
		}
	}
	oursReady := func(id string) error {
		r, err := fn.Do("POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": id})
		if err != nil {
			return err
		}
		if r.Code != 200 || r.Body["ready"] != true {
			return fmt.Errorf("create %s: %d %s", id, r.Code, r.Raw)
		}
		return nil
	}
	const n = 12
	var fd, od []time.Duration
	progress("real node: %d creates → Ready each, the floor and ours alternating", n)
	for i := 0; i < n; i++ {
		for _, side := range []struct {
			op  func(string) error
			id  string
			out *[]time.Duration
		}{{floorReady, fmt.Sprintf("rf%d", i), &fd}, {oursReady, fmt.Sprintf("ro%d", i), &od}} {
			start := time.Now()
			if err := side.op(side.id); err != nil {
				b.Fatal(err)
			}
			*side.out = append(*side.out, time.Since(start))
			// One sandbox at a time on the node: delete before the next.
			_ = fl.delete(ctx, side.id)
		}
	}
	var md strings.Builder
	fmt.Fprintf(&md, "\n| real node, create → Ready | n | p50 ms | p95 ms |\n|---|---|---|---|\n")
	fmt.Fprintf(&md, "| ours (POST ?wait=20s) | %d | %.0f | %.0f |\n", len(od), pct(od, .5), pct(od, .95))
	fmt.Fprintf(&md, "| floor (client-go create + watch) | %d | %.0f | %.0f |\n", len(fd), pct(fd, .5), pct(fd, .95))
	fmt.Fprintf(&md, "\nratio p50 %.2f×. The readiness probe starts after 5 s (initialDelaySeconds, DeerFlow's value), so both sides wait for it.\n", pct(od, .5)/pct(fd, .5))
	fmt.Println(md.String())
}
