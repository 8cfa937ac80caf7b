//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestFuzzCorpusAcceptedByAPIServer replays the create-request fuzz corpus:
// every input our validation accepts must build a Pod and a Service that the
// real API server accepts too, acting as the provisioner's ServiceAccount
// with config/'s Role and admission policy in force (server-side dry run, so
// nothing is stored).
func TestFuzzCorpusAcceptedByAPIServer(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	t.Setenv("K8S_NAMESPACE", ns)
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	cfg.LarkCLIInitImage, cfg.LarkCLIBrokerImage = "lark-init:1", "lark-broker:1"
	cfg.RuntimeClassName = "gvisor" // as config/400-service.yaml sets it, which the policy's parameter matches
	files, err := filepath.Glob(filepath.Join("..", "..", "pkg", "sandbox", "resources", "testdata", "fuzz", "FuzzCreateRequest", "*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no corpus: %v", err)
	}
	ctx := context.Background()
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	accepted := 0
	for _, file := range files {
		body, ok := readCorpusBytes(t, file)
		if !ok {
			continue
		}
		req, err := api.DecodeCreateRequest(body)
		if err != nil {
			continue
		}
		spec, err := req.Validate(cfg.Objects(), time.Now())
		if err != nil {
			continue
		}
		accepted++
		spec.Token = strings.Repeat("0c", 16) // as the function gives every sandbox a token
		pod, err := sa.CoreV1().Pods(ns).Create(ctx, resources.BuildPod(cfg.Objects(), spec), dry)
		if err != nil {
			t.Errorf("%s: the API server refuses the Pod built from an accepted request: %v", filepath.Base(file), err)
			continue
		}
		pod.UID = "00000000-0000-0000-0000-000000000001" // dry run assigns none; the owner reference needs one
		if _, err := sa.CoreV1().Services(ns).Create(ctx, resources.BuildService(cfg.Objects(), spec, resources.PodOwnerRef(pod)), dry); err != nil {
			t.Errorf("%s: the API server refuses the Service: %v", filepath.Base(file), err)
		}
	}
	t.Logf("%d corpus entries, %d accepted and admitted as the provisioner's ServiceAccount", len(files), accepted)
	if accepted == 0 {
		t.Fatal("no corpus entry was accepted")
	}
}

// readCorpusBytes reads a `go test fuzz v1` file holding one []byte value.
func readCorpusBytes(t *testing.T, file string) ([]byte, bool) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	if !sc.Scan() || sc.Text() != "go test fuzz v1" || !sc.Scan() {
		return nil, false
	}
	line := sc.Text()
	if !strings.HasPrefix(line, "[]byte(") || !strings.HasSuffix(line, ")") {
		return nil, false
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(line, "[]byte("), ")"))
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return []byte(s), true
}
