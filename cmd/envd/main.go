// Command envd is the agent E2B's SDK talks to inside a sandbox (package
// envd): a static binary that is put into any template's container without
// changing its image.
//
//	envd install DEST   copy this binary to DEST (mode 0755, atomically):
//	                    what the sandbox Pod's init container runs, DEST
//	                    being on an emptyDir the sandbox container mounts
//	envd start          start `envd serve` detached (its own session, stdio
//	                    to ENVD_LOG_FILE) and return once it answers /health,
//	                    or fail with the reason within 10 s; nothing to do if
//	                    one already answers: the sandbox container's
//	                    postStart hook, so the image's entrypoint stays PID 1
//	envd serve          serve the agent until SIGTERM or SIGINT
//	envd version        print the envd version the agent speaks
//
// Environment:
//
//	ENVD_ADDR                 listen address (default :49983)
//	ENVD_ACCESS_TOKEN_SHA256  hex SHA-256 of the sandbox's envd access
//	                          token; unset, every call but /health is refused
//	ENVD_LOG_FILE             where `start` sends serve's output (default
//	                          /tmp/envd.log, else /dev/null if that cannot be
//	                          opened)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/envd"
)

const (
	// startTimeout bounds how long start waits for serve's /health.
	startTimeout = 10 * time.Second
	// shutdownGrace lets requests finish after SIGTERM; streams (process
	// output, watches) are cut at once, their contexts cancelled.
	shutdownGrace = 5 * time.Second
	// defaultLogFile is where a started serve writes its logs.
	defaultLogFile = "/tmp/envd.log"
)

func main() {
	if err := run(os.Args[1:], os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "envd:", err)
		os.Exit(1)
	}
}

const usage = "usage: envd install DEST | envd start | envd serve | envd version"

func run(args []string, getenv func(string) string, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New(usage)
	}
	addr := getenv(envd.EnvAddr)
	if addr == "" {
		addr = envd.DefaultAddr
	}
	switch args[0] {
	case "install":
		if len(args) != 2 {
			return errors.New("usage: envd install DEST")
		}
		if err := install(args[1]); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "envd %s installed at %s\n", envd.Version, args[1])
		return nil
	case "start":
		if len(args) != 1 {
			return errors.New("usage: envd start")
		}
		logFile := getenv("ENVD_LOG_FILE")
		if logFile == "" {
			logFile = defaultLogFile
		}
		return start(addr, logFile, stdout)
	case "serve":
		if len(args) != 1 {
			return errors.New("usage: envd serve")
		}
		return serve(addr, getenv(envd.EnvTokenHash))
	case "version":
		fmt.Fprintln(stdout, envd.Version)
		return nil
	}
	return fmt.Errorf("unknown subcommand %q\n%s", args[0], usage)
}

// install copies this executable to dest: into a temporary file beside it,
// then renamed over it, so dest is never a partial binary.
func install(dest string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this executable: %w", err)
	}
	src, err := os.Open(self)
	if err != nil {
		return fmt.Errorf("opening this executable: %w", err)
	}
	defer src.Close()
	dir := filepath.Dir(dest)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("making %s: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(dest)+".tmp-*")
	if err != nil {
		return fmt.Errorf("creating a temporary file in %s: %w", dir, err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := io.Copy(tmp, src); err != nil {
		tmp.Close()
		return fmt.Errorf("copying to %s: %w", tmp.Name(), err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return fmt.Errorf("making %s executable: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("syncing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dest); err != nil {
		return fmt.Errorf("installing %s: %w", dest, err)
	}
	return nil
}

// healthURL is where addr's /health answers: a listen address without a
// host (":49983") listens on every interface, loopback among them.
func healthURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("%s=%q: %w", envd.EnvAddr, addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/health", nil
}

func healthy(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusNoContent
}

// start spawns `serve` in a session of its own, detached from this
// process's stdio (a postStart hook's exec waits for its output to close),
// and waits for its /health.
func start(addr, logFile string, stdout io.Writer) error {
	url, err := healthURL(addr)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if healthy(ctx, url) {
		fmt.Fprintf(stdout, "envd already serving on %s\n", addr)
		return nil
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this executable: %w", err)
	}
	out, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		// Logs are worth less than the agent: a read-only /tmp must not
		// keep it from starting.
		logFile = os.DevNull
		if out, err = os.OpenFile(os.DevNull, os.O_WRONLY, 0); err != nil {
			return fmt.Errorf("opening %s: %w", os.DevNull, err)
		}
	}
	defer out.Close()
	cmd := exec.Command(self, "serve")
	cmd.Stdout, cmd.Stderr = out, out // stdin: /dev/null
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting envd serve: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(startTimeout)
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("envd serve exited before it answered %s: %v%s", url, err, logTail(logFile))
		case <-time.After(50 * time.Millisecond):
		}
		if healthy(ctx, url) {
			fmt.Fprintf(stdout, "envd %s serving on %s (pid %d, logs in %s)\n", envd.Version, addr, cmd.Process.Pid, logFile)
			return nil
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			return fmt.Errorf("envd serve (pid %d) did not answer %s within %v%s", cmd.Process.Pid, url, startTimeout, logTail(logFile))
		}
	}
}

// logTail is the end of the log file, for an error message.
func logTail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return "; its log (" + path + ") ends:\n" + strings.TrimSpace(string(b))
}

// serve runs the agent until SIGTERM or SIGINT.
func serve(addr, tokenHash string) error {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if p := envd.TokenHashProblem(tokenHash); p != "" {
		log.Error(p)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	agent := envd.New(envd.Config{TokenHash: tokenHash, Log: log})
	defer agent.Close()
	srv := envd.NewHTTPServer(addr, agent, log)
	// Requests' contexts end with the signal: Shutdown alone would wait for
	// streams that may never end.
	reqs, cancelReqs := context.WithCancel(context.Background())
	defer cancelReqs()
	srv.BaseContext = func(net.Listener) context.Context { return reqs }
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", addr, err)
	}
	log.Info("envd serving", "addr", ln.Addr().String(), "version", envd.Version, "uid", os.Getuid(), "pid", os.Getpid())
	errs := make(chan error, 1)
	go func() { errs <- srv.Serve(ln) }()
	select {
	case err := <-errs:
		return fmt.Errorf("serving on %s: %w", addr, err)
	case <-ctx.Done():
	}
	log.Info("envd stopping")
	cancelReqs()
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("stopping: %w", err)
	}
	return nil
}
