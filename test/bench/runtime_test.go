//go:build e2e

package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
)

// benchRuntime is a runtime class the real-node rows run under.
type benchRuntime struct {
	name, class string
	shipped     bool // config/'s default: the rows make run NODE=real is held to
}

// benchRuntimes: gVisor (config/'s SANDBOX_RUNTIME_CLASS) and runc (the
// node's default runtime, no class), measured in the same run.
var benchRuntimes = []benchRuntime{{"gVisor", "gvisor", true}, {"runc", "", false}}

// runtimeRows holds, per row and runtime, what each measured; runtimeMemory
// the idle sandbox Pod's memory per runtime, in bytes.
var (
	runtimeRows   = map[string]map[string][]time.Duration{}
	runtimeOrder  []string
	runtimeMemory = map[string]int64{}
)

func record(rt benchRuntime, row string, d []time.Duration) {
	if runtimeRows[row] == nil {
		runtimeRows[row] = map[string][]time.Duration{}
		runtimeOrder = append(runtimeOrder, row)
	}
	runtimeRows[row][rt.name] = d
}

// printRuntimeTable prints gVisor against runc, row by row.
func printRuntimeTable() {
	if len(runtimeOrder) == 0 {
		return
	}
	var md strings.Builder
	md.WriteString("\n| real node, gVisor against runc | n | runc p50 / p95 ms | gVisor p50 / p95 ms | gVisor / runc (p50) |\n|---|---|---|---|---|\n")
	for _, row := range runtimeOrder {
		r, g := runtimeRows[row]["runc"], runtimeRows[row]["gVisor"]
		if len(r) == 0 || len(g) == 0 {
			continue
		}
		fmt.Fprintf(&md, "| %s | %d | %.0f / %s | %.0f / %s | %.2f× |\n", row, len(g), pct(r, .5), pctText(r, .95, "%.0f"), pct(g, .5), pctText(g, .95, "%.0f"), pct(g, .5)/pct(r, .5))
	}
	if r, g := runtimeMemory["runc"], runtimeMemory["gVisor"]; r > 0 && g > 0 {
		fmt.Fprintf(&md, "| memory of an idle sandbox's Pod (its cgroup's usage) | 1 | %.1f MiB | %.1f MiB | %.2f× |\n", float64(r)/(1<<20), float64(g)/(1<<20), float64(g)/float64(r))
	}
	md.WriteString("\nTarget: create → Ready under gVisor ≤ 1.2× runc's p50. gVisor runs on the systrap platform here (no usable KVM).\n")
	fmt.Println(md.String())
}

// idleMemory creates one sandbox, lets it idle, and reads its Pod's memory
// from the Pod's cgroup on the node (cgroup v1's memory.usage_in_bytes, or
// v2's memory.current): what a sandbox costs the node, whichever runtime
// holds it (runsc's sandbox process and gofer, or runc's container).
func idleMemory(b *testing.B, kc *cluster.Cluster, fn *function.Instance) int64 {
	b.Helper()
	const id = "idle-memory"
	r, err := fn.Do("POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": id})
	if err != nil || r.Code != 200 || r.Body["ready"] != true {
		b.Fatalf("create %s: %v %d %s", id, err, r.Code, r.Raw)
	}
	defer func() { _, _ = fn.Do("DELETE", "/api/sandboxes/"+id, nil) }()
	pod, err := kc.Client.CoreV1().Pods(ns).Get(context.Background(), resources.PodName(id), metav1.GetOptions{})
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(5 * time.Second) // idle: past start-up's allocations
	mem, err := podMemory(string(pod.UID))
	if err != nil {
		b.Fatal(err)
	}
	return mem
}

// podMemory reads the memory of the Pod whose UID is uid from its cgroup.
func podMemory(uid string) (int64, error) {
	for _, pattern := range []string{
		"/sys/fs/cgroup/memory/kubepods*/pod" + uid + "/memory.usage_in_bytes",
		"/sys/fs/cgroup/memory/kubepods*/*/pod" + uid + "/memory.usage_in_bytes",
		"/sys/fs/cgroup/kubepods*/pod" + uid + "/memory.current",
		"/sys/fs/cgroup/kubepods*/*/pod" + uid + "/memory.current",
	} {
		files, _ := filepath.Glob(pattern)
		if len(files) == 1 {
			raw, err := os.ReadFile(files[0])
			if err != nil {
				return 0, err
			}
			return strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
		}
	}
	return 0, fmt.Errorf("no cgroup of Pod %s", uid)
}
