// Package function starts the function for tests and benchmarks the way it is
// deployed: cmd/provisioner, the main `func build` scaffolds, serving the
// function through the func Go runtime (knative.dev/func-go/http) in its own
// process. It talks to it over real HTTP.
package function

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Key is the API key tests configure (at least 16 bytes, or the function
// refuses it).
const Key = "e2e-test-key-0123456789"

// Instance is a running function instance.
type Instance struct {
	URL    string
	Client *http.Client
	cmd    *exec.Cmd
	// Started is when the process was started (binary functions only).
	Started time.Time
	// LogPath is the file its stdout and stderr (the JSON logs) go to.
	LogPath string
}

// BaseEnv is the configuration every test starts from.
func BaseEnv(kubeconfig, namespace string) map[string]string {
	return map[string]string{
		"KUBECONFIG_PATH":        kubeconfig,
		"K8S_NAMESPACE":          namespace,
		"PROVISIONER_API_KEY":    Key,
		"NODE_HOST":              "127.0.0.1",
		"SANDBOX_IMAGE":          "sandbox:test",
		"LOG_LEVEL":              "warn",
		"EMIT_KUBERNETES_EVENTS": "true",
		// Test namespaces have no config/ applied: the function creates the
		// shared sandbox NetworkPolicy, as on a local cluster.
		"SANDBOX_NETWORK_POLICY_ENSURE": "true",
	}
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// Binary builds cmd/provisioner once per test process and returns its path.
func Binary() (string, error) {
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "provisioner-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin, buildErr = build(dir)
	})
	return builtBin, buildErr
}

// Cleanup removes what Binary built (44 MB a test process, which would
// otherwise pile up under the temporary directory run after run). A
// TestMain defers it.
func Cleanup() {
	if builtBin != "" {
		_ = os.RemoveAll(filepath.Dir(builtBin))
	}
}

// Start runs the function binary with env and waits until it is ready; it is
// stopped (SIGTERM, as the kubelet does) when the test ends.
func Start(t testing.TB, env map[string]string) *Instance {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		t.Fatal(err)
	}
	f, err := StartBinary(bin, env, filepath.Join(t.TempDir(), "function.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Stop)
	return f
}

// Stop ends the function as the kubelet does: SIGTERM, so the runtime
// drains, then SIGKILL after 15 s.
func (f *Instance) Stop() {
	if f.cmd == nil || f.cmd.Process == nil {
		return
	}
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = f.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = f.cmd.Process.Kill()
		<-done
	}
	f.cmd = nil
}

// WaitReady polls /health/readiness (bounded) until it answers 200.
func (f *Instance) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := f.Client.Get(f.URL + "/health/readiness")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("function at %s not ready after %s (last: %v)", f.URL, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Response is a decoded answer.
type Response struct {
	Code   int
	Body   map[string]any
	Raw    []byte
	Header http.Header
}

// Detail returns the error detail of the answer.
func (r Response) Detail() string { s, _ := r.Body["detail"].(string); return s }

// Do sends a request with the test API key. body may be nil, a string
// (sent as is) or any value (sent as JSON).
func (f *Instance) Do(method, path string, body any) (Response, error) {
	return f.DoWithHeaders(method, path, body, map[string]string{"X-API-Key": Key})
}

// DoWithHeaders sends a request with exactly the given headers.
func (f *Instance) DoWithHeaders(method, path string, body any, headers map[string]string) (Response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = bytes.NewBufferString(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return Response{}, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, f.URL+path, rd)
	if err != nil {
		return Response{}, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := f.Client.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return Response{}, err
	}
	out := Response{Code: resp.StatusCode, Raw: raw, Header: resp.Header}
	_ = json.Unmarshal(raw, &out.Body)
	return out, nil
}

// build compiles the provisioner binary into dir and returns its path.
func build(dir string) (string, error) {
	bin := filepath.Join(dir, "provisioner")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/deerflow-sandbox/provisioner/cmd/provisioner")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
}

// FreeAddr returns a loopback address with a free port.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// StartBinary runs the built binary as a separate process with env and
// waits until it is ready. Logs go to logPath.
func StartBinary(bin string, env map[string]string, logPath string) (*Instance, error) {
	addr, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	f, err := StartProcess(bin, env, addr, logPath)
	if err != nil {
		return nil, err
	}
	if err := f.WaitReady(20 * time.Second); err != nil {
		f.Stop()
		return nil, err
	}
	return f, nil
}

// StartProcess starts the binary listening on addr and returns at once.
func StartProcess(bin string, env map[string]string, addr, logPath string) (*Instance, error) {
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "LISTEN_ADDRESS="+addr)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	started := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &Instance{URL: "http://" + addr, Client: &http.Client{Timeout: 60 * time.Second}, cmd: cmd, Started: started, LogPath: logPath}, nil
}

// Kill ends a binary function with SIGKILL: no drain, no cleanup.
func (f *Instance) Kill() {
	if f.cmd != nil && f.cmd.Process != nil {
		_ = f.cmd.Process.Kill()
		_ = f.cmd.Wait()
		f.cmd = nil
	}
}

// PID returns the process id of a binary function.
func (f *Instance) PID() int {
	if f.cmd == nil || f.cmd.Process == nil {
		return 0
	}
	return f.cmd.Process.Pid
}
