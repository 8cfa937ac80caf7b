package knative

import (
	"context"
	"fmt"
	"time"

	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// Env is a running Knative cluster: a kwok control plane whose kwok nodes
// are tainted, the real node every workload runs on, CoreDNS, Traefik and
// Knative.
type Env struct {
	Cluster *cluster.Cluster
	Node    *realnode.Node
	Timings map[string]time.Duration
}

// Up brings up a Knative cluster named name. On error everything started
// is undone.
func Up(ctx context.Context, name, repoRoot string, s Settings, logf func(string, ...any)) (e *Env, err error) {
	images, err := ImageArchives(cluster.CacheDir())
	if err != nil {
		return nil, err
	}
	if err := realnode.Preflight(realnode.DefaultPaths(cluster.CacheDir())); err != nil {
		return nil, err
	}
	e = &Env{Timings: map[string]time.Duration{}}
	defer func() {
		if err != nil {
			e.Down()
			e = nil
		}
	}()
	start := time.Now()
	e.Cluster, err = cluster.UpWith(ctx, name, cluster.Options{Nodes: 1, APIServerSANs: APIServerSANs, NodeTaint: &NodeTaint})
	if err != nil {
		return e, fmt.Errorf("control plane: %w", err)
	}
	e.Timings["control plane"] = time.Since(start)
	logf("control plane up in %s", e.Timings["control plane"].Round(time.Millisecond))

	start = time.Now()
	e.Node, err = realnode.UpWith(ctx, realnode.DefaultPaths(cluster.CacheDir()),
		realnode.Cluster{Host: e.Cluster.Config.Host, PKIDir: e.Cluster.PKIDir(), Client: e.Cluster.Client},
		realnode.Options{Untainted: true, Images: images, NoDNSStandIn: true, NoSurroundings: true})
	if err != nil {
		return e, err
	}
	e.Timings["real node"] = time.Since(start)
	logf("real node Ready in %s (%d Knative images imported)", e.Timings["real node"].Round(time.Millisecond), len(images))

	start = time.Now()
	if err := Install(ctx, e.Cluster.Config, repoRoot, s, logf); err != nil {
		return e, fmt.Errorf("installing Knative: %w", err)
	}
	e.Timings["Knative"] = time.Since(start)
	return e, nil
}

// Down takes the node and the control plane down.
func (e *Env) Down() {
	if e.Node != nil {
		e.Node.Down()
	}
	if e.Cluster != nil {
		e.Cluster.Down()
	}
}
