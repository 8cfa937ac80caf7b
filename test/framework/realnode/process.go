package realnode

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// start runs a part in the background, its output in <state>/<name>.log.
func (n *Node) start(name string, env []string, bin string, args ...string) error {
	logf, err := os.Create(filepath.Join(n.State, name+".log"))
	if err != nil {
		return err
	}
	n.logFiles = append(n.logFiles, logf)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: Down signals the part, not the test.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", name, err)
	}
	n.procs = append(n.procs, cmd)
	return nil
}

// Log returns the tail of a part's log, for failure messages.
func (n *Node) Log(name string, lines int) string {
	b, err := os.ReadFile(filepath.Join(n.State, name+".log"))
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

func poll(ctx context.Context, timeout time.Duration, what string, cond func(context.Context) (bool, error)) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		ok, err := cond(ctx)
		// The poll's own deadline ending the last call says nothing of
		// what was awaited: keep what the call before it saw.
		if err != nil && ctx.Err() == nil || last == nil {
			last = err
		}
		return ok, nil
	})
	if err != nil {
		return fmt.Errorf("%s not within %s (last: %v)", what, timeout, last)
	}
	return nil
}

func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// stopGroup ends p's process group: SIGTERM, then SIGKILL if it has not
// exited within 10 s. It returns once p has.
func stopGroup(p *exec.Cmd) {
	_ = syscall.Kill(-p.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.Process.Pid, syscall.SIGKILL)
		<-done
	}
}
