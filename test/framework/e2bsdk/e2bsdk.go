// Package e2bsdk runs test/e2b's scripts, which drive our E2B API with
// E2B's own SDK (the unmodified e2b package that `make e2b` installs there):
// the real-node tests, the benchmark and the Knative suite each run them,
// and they must agree on where the scripts are, on skipping (or failing
// under CI) when the SDK or node is missing, on stopping node so that a
// script's own cleanup still kills its sandboxes, and on reading
// bench.mjs's report.
package e2bsdk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
)

// Dir is test/e2b, seen from a suite's directory (test/<suite>, where go
// test runs its tests), once E2B's SDK is installed there and node is on
// PATH; otherwise tb stops by skip.Unavailable (a skip, or a failure under
// CI) saying which is missing.
func Dir(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join("..", "e2b")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err != nil {
		skip.Unavailable(tb, "E2B's SDK is not installed (run make e2b, which hack/install-e2b.sh does): %v", err)
	}
	if _, err := exec.LookPath("node"); err != nil {
		skip.Unavailable(tb, "node is not installed: %v", err)
	}
	return dir
}

// waitDelay is how long node has, once ctx ends, to kill its sandboxes
// before it is killed itself.
const waitDelay = 30 * time.Second

// Command is `node args...` in dir (Dir's) with env added to this
// process's, ready for its caller to choose where its output goes. When
// ctx ends node gets SIGINT, not SIGKILL, so the script's own cleanup
// kills the sandboxes it made; it is killed waitDelay later.
func Command(ctx context.Context, dir string, env map[string]string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = waitDelay
	return cmd
}

// Summary is one of bench.mjs's figures: its samples, in milliseconds (or
// MiB/s for the upload).
type Summary struct {
	N       int       `json:"n"`
	Samples []float64 `json:"samples"`
}

// Durations is the samples as durations (of a figure in milliseconds).
func (s Summary) Durations() []time.Duration {
	out := make([]time.Duration, len(s.Samples))
	for i, ms := range s.Samples {
		out[i] = time.Duration(ms * float64(time.Millisecond))
	}
	return out
}

// BenchReport is bench.mjs's report, the one JSON line it prints on stdout
// (its header comment says each figure).
type BenchReport struct {
	Template    string   `json:"template"`
	Rounds      int      `json:"rounds"`
	Create      Summary  `json:"create_ms"`
	FirstRun    Summary  `json:"first_run_ms"`
	CreateToRun Summary  `json:"create_to_run_ms"`
	HTTPCreate  *Summary `json:"http_create_ready_ms"` // only with E2B_BENCH_HTTP_API
	RunTrue     Summary  `json:"run_true_ms"`
	Exists      Summary  `json:"exists_ms"`
	// Each failed first commands.run, then retried.
	FirstRunFailures []string `json:"first_run_failures"`
	Upload           struct {
		N       int       `json:"n"`
		Median  float64   `json:"median"`
		Samples []float64 `json:"samples"`
	} `json:"upload_mib_per_s"`
}

// ParseBenchReport reads bench.mjs's report from its output: the last
// line, so output with its progress (stderr) mixed in reads as well as
// stdout alone.
func ParseBenchReport(out []byte) (BenchReport, error) {
	out = bytes.TrimSpace(out)
	if len(out) == 0 {
		return BenchReport{}, errors.New("bench.mjs printed nothing")
	}
	last := out[bytes.LastIndexByte(out, '\n')+1:]
	var r BenchReport
	if err := json.Unmarshal(last, &r); err != nil {
		return BenchReport{}, fmt.Errorf("bench.mjs's last line is not its JSON report: %w", err)
	}
	return r, nil
}
