// Package makerun runs `make run` as a user does: make in its own process
// group (a terminal's foreground job), the function reached over HTTP with
// its API key, stopped with Ctrl-C or killed. The test of
// `make run NODE=real` (test/runreal) and the bench's row measured through it
// (test/bench) use it.
package makerun

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Options are one `make run`'s settings. Cluster, State and Addr keep a
// test's run apart from a user's own (sandbox-dev, ~/.cache/…/run-real-node,
// 127.0.0.1:8080).
type Options struct {
	Repo    string   // the repository's root
	Real    bool     // NODE=real
	Cluster string   // CLUSTER_NAME (NODE=real uses <Cluster>-real)
	Addr    string   // LISTEN_ADDRESS
	Key     string   // PROVISIONER_API_KEY
	State   string   // RUN_REAL_STATE
	Log     string   // make's output
	Env     []string // more settings (K=V), for the function too
}

// Run is one running `make run`.
type Run struct {
	URL string
	// Kubeconfig is the local cluster's, as run.sh prints it.
	Kubeconfig string
	// Serving is how long make took until the function was ready
	// (/health/readiness: connected to its cluster).
	Serving time.Duration
	o       Options
	cmd     *exec.Cmd
	done    chan struct{}
	client  *http.Client
}

// Start runs make and waits, up to bound, until the function serves.
func Start(o Options, bound time.Duration) (*Run, error) {
	args := []string{"-C", o.Repo, "run"}
	if o.Real {
		args = append(args, "NODE=real")
	}
	out, err := os.Create(o.Log)
	if err != nil {
		return nil, err
	}
	r := &Run{URL: "http://" + o.Addr, o: o, done: make(chan struct{}), client: &http.Client{Timeout: 60 * time.Second}}
	r.cmd = exec.Command("make", args...)
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k != "KUBECONFIG" && k != "KUBECONFIG_PATH" && k != "NODE" {
			env = append(env, kv)
		}
	}
	r.cmd.Env = append(append(env, "CLUSTER_NAME="+o.Cluster, "LISTEN_ADDRESS="+o.Addr, "PROVISIONER_API_KEY="+o.Key,
		"RUN_REAL_STATE="+o.State), o.Env...)
	r.cmd.Stdout, r.cmd.Stderr = out, out
	// Its own process group, as a terminal's foreground job: Ctrl-C
	// signals the group.
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	start := time.Now()
	if err := r.cmd.Start(); err != nil {
		out.Close()
		return nil, err
	}
	go func() { _ = r.cmd.Wait(); out.Close(); close(r.done) }()
	for {
		select {
		case <-r.done:
			return nil, fmt.Errorf("make run ended before it served:\n%s", r.Tail(40))
		case <-time.After(200 * time.Millisecond):
		}
		if r.serving() {
			r.Serving = time.Since(start)
			if m := regexp.MustCompile(`export KUBECONFIG=(\S+)`).FindStringSubmatch(r.Tail(200)); m != nil {
				r.Kubeconfig = m[1]
			}
			return r, nil
		}
		if time.Since(start) > bound {
			r.Kill()
			return nil, fmt.Errorf("make run did not serve within %s:\n%s", bound, r.Tail(40))
		}
	}
}

func (r *Run) serving() bool {
	resp, err := http.Get(r.URL + "/health/readiness")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Do sends a request as a user does (X-API-Key, a JSON body) and decodes
// the answer.
func (r *Run) Do(method, path string, body any) (int, map[string]any, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, r.URL+path, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("X-API-Key", r.o.Key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var m map[string]any
	raw, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(raw, &m)
	if m == nil {
		m = map[string]any{"raw": string(raw)}
	}
	return resp.StatusCode, m, nil
}

// Stop is Ctrl-C: SIGINT to make's process group. See end.
func (r *Run) Stop(bound time.Duration) error {
	return r.end(-r.cmd.Process.Pid, syscall.SIGINT, "Ctrl-C", bound)
}

// Terminate is `kill <make's pid>`: SIGTERM to make alone, as timeout(1)
// or a supervisor that signals only its child sends it (make passes it on
// to its own child, hack/run.sh, and to no one else). See end.
func (r *Run) Terminate(bound time.Duration) error {
	return r.end(r.cmd.Process.Pid, syscall.SIGTERM, "SIGTERM to make", bound)
}

// end sends sig to pid (make, or its group when negative) and waits up to
// bound for make to end, then briefly for every process that was under
// make to be gone too, and names any that outlived make: a function left
// serving would keep the address and a cluster whose node is gone.
func (r *Run) end(pid int, sig syscall.Signal, what string, bound time.Duration) error {
	under := map[int]string{}
	for _, p := range Descendants(r.cmd.Process.Pid) {
		if st, ok := startTime(p); ok {
			under[p] = st
		}
	}
	_ = syscall.Kill(pid, sig)
	select {
	case <-r.done:
	case <-time.After(bound):
		r.Kill()
		return fmt.Errorf("make run did not end within %s of %s:\n%s", bound, what, r.Tail(30))
	}
	var left []string
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, outliveGrace, true, func(context.Context) (bool, error) {
		left = left[:0]
		for p, st := range under {
			if now, ok := startTime(p); ok && now == st {
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
				left = append(left, fmt.Sprintf("%d (%s)", p, strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))))
			}
		}
		return len(left) == 0, nil
	})
	if err == nil {
		return nil
	}
	for p := range under {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	return fmt.Errorf("make ended on %s, but %d processes that were under it were still running %s later (killed now): %s",
		what, len(left), outliveGrace, strings.Join(left, ", "))
}

// outliveGrace is how long a process under make may take to end after make
// itself did (a function still finishing its requests).
const outliveGrace = 10 * time.Second

// startTime is a process's start time (field 22 of /proc/<pid>/stat, in
// clock ticks since boot): with the pid, it tells a process from a later
// one that reuses its pid.
func startTime(pid int) (string, bool) {
	f := statFields(pid)
	if len(f) < 20 {
		return "", false
	}
	return f[19], true
}

// statFields are the fields of /proc/<pid>/stat after the command's name
// (which may hold spaces), from field 3 (the state) on; nil when the
// process is gone.
func statFields(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

// Crash is kill -9 of make and every process under it, at once: what a
// killed terminal session or the OOM killer leaves. Containerd's shims and
// the containers under them are not under make (a shim detaches), and
// stay. It returns how many processes were under make.
func (r *Run) Crash() int {
	pids := Descendants(r.cmd.Process.Pid)
	for _, pid := range append([]int{r.cmd.Process.Pid}, pids...) {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-r.done
	return len(pids)
}

// Kill ends a run given up on: SIGTERM to its group, so its node goes down,
// then SIGKILL after 90 s.
func (r *Run) Kill() {
	select {
	case <-r.done:
		return
	default:
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(90 * time.Second):
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
		<-r.done
	}
}

// Printed is the value of the setting name that make's output shows as a
// line to paste ("export NAME=value" or "NAME=value", the last one), and
// whether it shows one.
func (r *Run) Printed(name string) (string, bool) {
	b, err := os.ReadFile(r.o.Log)
	if err != nil {
		return "", false
	}
	return printed(string(b), name)
}

func printed(out, name string) (string, bool) {
	re := regexp.MustCompile(`(?m)^\s*(?:export\s+)?` + regexp.QuoteMeta(name) + `=(\S+)\s*$`)
	m := re.FindAllStringSubmatch(out, -1)
	if m == nil {
		return "", false
	}
	return m[len(m)-1][1], true
}

// Tail is the last n lines of make's output.
func (r *Run) Tail(n int) string {
	b, err := os.ReadFile(r.o.Log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// DownClusters deletes the clusters runs with this CLUSTER_NAME made (plain
// and NODE=real's).
func DownClusters(repo, cluster string) {
	for _, name := range []string{cluster, cluster + "-real"} {
		cmd := exec.Command(filepath.Join(repo, "hack/cluster-down.sh"))
		cmd.Env = append(os.Environ(), "CLUSTER_NAME="+name)
		_ = cmd.Run()
	}
}

// FreeAddr is a free 127.0.0.1 port: not 8080, where a user's own
// `make run` may serve.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// Descendants lists every process under pid, from /proc.
func Descendants(pid int) []int {
	children := map[int][]int{}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		p, _ := strconv.Atoi(filepath.Base(d))
		f := statFields(p)
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], p)
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			out = append(out, c)
			queue = append(queue, c)
		}
	}
	return out
}
