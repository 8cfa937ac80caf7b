//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deerflow-sandbox/provisioner/test/framework/cluster"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/skip"
)

// funcCLI is the func CLI hack/install-func.sh builds (pinned, from the
// module proxy); the test skips, saying so, when it is absent.
func funcCLI(t *testing.T) string {
	t.Helper()
	version := cluster.EnvOr("FUNC_VERSION", "v0.48.4")
	bin := filepath.Join(cluster.CacheDir(), "func-"+version, "func")
	if _, err := os.Stat(bin); err != nil {
		skip.Unavailable(t, "no func CLI at %s: hack/install-func.sh builds it (make test-e2e does so first): %v", bin, err)
	}
	return bin
}

// readmeInvocations returns the `kn func invoke` lines of docs/api.md's
// "kn func invoke" section, in order.
func readmeInvocations(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "docs", "api.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); strings.HasPrefix(l, "kn func invoke ") {
			lines = append(lines, l)
		}
	}
	if len(lines) == 0 {
		t.Fatal("docs/api.md lists no `kn func invoke` lines")
	}
	return lines
}

// funcReply is what `func invoke` printed, decoded: the body in http mode;
// the reply's type and data in cloudevent mode.
type funcReply struct {
	ceType string
	data   map[string]any
}

// parseFuncOutput reads func's output. In cloudevent mode it prints the
// event as "Context Attributes, … type: X … Data, <json>".
func parseFuncOutput(t *testing.T, out string) funcReply {
	t.Helper()
	var r funcReply
	body := out
	if i := strings.Index(out, "Context Attributes,"); i >= 0 {
		for _, l := range strings.Split(out[i:], "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "type: "); ok {
				r.ceType = v
			}
		}
		_, body, _ = strings.Cut(out[i:], "Data,")
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &r.data); err != nil {
		t.Fatalf("func printed no JSON: %v\n%s", err, out)
	}
	return r
}

// TestFuncInvokeReadme runs every `kn func invoke` line of docs/api.md, as
// written, with the real func CLI (the standalone binary is `func`; `kn func`
// is the same CLI as a kn plugin), against the function served by func-go,
// and checks each answer.
func TestFuncInvokeReadme(t *testing.T) {
	fn := funcCLI(t)
	ns := namespace(t)
	f := start(t, ns, nil)
	// func invoke needs a function directory: a copy of our func.yaml, so
	// that func's run data (.func/) does not land in the repository.
	dir := t.TempDir()
	raw, err := os.ReadFile(filepath.Join("..", "..", "func.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "func.yaml"), raw, 0o644); err != nil {
		t.Fatal(err)
	}

	// What each docs/api.md line must answer, by operation and format.
	type want struct {
		ceType string
		check  func(map[string]any) bool
	}
	isSandbox := func(d map[string]any) bool {
		return d["sandbox_id"] == "abcd1234" && d["sandbox_url"] != "" && (d["status"] == "Pending" || d["status"] == "Running")
	}
	listed := func(d map[string]any) bool {
		items, _ := d["sandboxes"].([]any)
		for _, it := range items {
			if m, _ := it.(map[string]any); m["sandbox_id"] == "abcd1234" {
				return d["count"] == float64(len(items))
			}
		}
		return false
	}
	destroyed := func(d map[string]any) bool { return d["ok"] == true && d["sandbox_id"] == "abcd1234" }
	reaped := func(d map[string]any) bool { _, ok := d["removed"]; return ok && d["count"] != nil }
	wants := map[string]want{
		"create":  {"dev.deerflow.sandbox.created", isSandbox},
		"get":     {"dev.deerflow.sandbox.status", isSandbox},
		"list":    {"dev.deerflow.sandbox.listed", listed},
		"destroy": {"dev.deerflow.sandbox.destroyed", destroyed},
		"reap":    {"dev.deerflow.sandbox.reaped", reaped},
	}

	formats := map[string]int{}
	for _, line := range readmeInvocations(t) {
		op := ""
		for o := range wants {
			if strings.Contains(line, `"operation":"`+o+`"`) || strings.Contains(line, "dev.deerflow.sandbox."+o+" ") {
				op = o
			}
		}
		if op == "" {
			t.Errorf("docs/api.md line names no operation: %s", line)
			continue
		}
		format := "http"
		if strings.Contains(line, "--format cloudevent") {
			format = "cloudevent"
		}
		formats[format]++
		t.Run(format+"/"+op, func(t *testing.T) {
			// docs/api.md's line, as written; only the target is this test's
			// function and $K its key.
			script := `kn() { [ "$1" = func ] && shift; "$FUNC" "$@"; }` + "\n" + strings.ReplaceAll(line, "http://127.0.0.1:8080", f.URL)
			cmd := exec.Command("bash", "-c", script)
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "FUNC="+fn, "K="+function.Key)
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("%s: %v\n%s", line, err, out)
			}
			r := parseFuncOutput(t, string(out))
			w := wants[op]
			if format == "cloudevent" && r.ceType != w.ceType {
				t.Errorf("reply type %q, want %q\n%s", r.ceType, w.ceType, out)
			}
			if !w.check(r.data) {
				t.Errorf("unexpected answer to %s %s:\n%s", format, op, out)
			}
		})
	}
	if formats["http"] != 5 || formats["cloudevent"] != 5 {
		t.Errorf("docs/api.md invocations by format: %v, want all five operations in both", formats)
	}

	// What a func user sees for refusals: func prints only the status for
	// a refused http body, and nothing for a refused CloudEvent.
	run := func(args ...string) (string, error) {
		cmd := exec.Command(fn, append([]string{"invoke", "--target", f.URL}, args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("--format", "http", "--data", `{"operation":"list"}`)
	if err == nil || !strings.Contains(out, "HTTP 401") {
		t.Errorf("http invoke without a key: err %v, output %q; want a failure naming HTTP 401", err, out)
	}
	out, err = run("--format", "cloudevent", "--type", "dev.deerflow.sandbox.get", "--data", `{"sandbox_id":"nope1234","api_key":"`+function.Key+`"}`)
	if err != nil || strings.Contains(out, "Context Attributes") {
		t.Errorf("cloudevent invoke of an unknown sandbox: err %v, output %q; want success with no event printed", err, out)
	}
}
