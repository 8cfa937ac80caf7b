package main

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/access"
	"github.com/deerflow-sandbox/provisioner/pkg/envd"
)

// The test binary is envd too when asked: start spawns its own executable
// with "serve", and here that is this binary.
func TestMain(m *testing.M) {
	if os.Getenv("ENVD_TEST_AS_ENVD") == "1" {
		main()
		return
	}
	os.Exit(m.Run())
}

func TestInstall(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "opt", "envd", "envd")
	var out bytes.Buffer
	for range 2 { // over an existing one too
		if err := run([]string{"install", dest}, os.Getenv, &out); err != nil {
			t.Fatal(err)
		}
	}
	self, _ := os.Executable()
	want, _ := os.ReadFile(self)
	got, err := os.ReadFile(dest)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Error("the installed file is not this executable")
	}
	fi, _ := os.Stat(dest)
	if fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", fi.Mode().Perm())
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(dest), ".*tmp*"))
	if len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if err := run([]string{"install"}, os.Getenv, &out); err == nil {
		t.Error("install without DEST: no error")
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// start runs a real serve child, answers at once when one already serves,
// and the child stops on SIGTERM.
func TestStartAndStop(t *testing.T) {
	addr := freeAddr(t)
	logFile := filepath.Join(t.TempDir(), "envd.log")
	t.Setenv("ENVD_TEST_AS_ENVD", "1") // inherited by the child
	t.Setenv(envd.EnvAddr, addr)
	t.Setenv(envd.EnvTokenHash, access.Hash("tok"))
	t.Setenv("ENVD_LOG_FILE", logFile)
	t.Setenv("HOME", t.TempDir())

	var out bytes.Buffer
	if err := run([]string{"start"}, os.Getenv, &out); err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`\(pid (\d+),`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("start said %q: want the serve child's pid", out.String())
	}
	pid, _ := strconv.Atoi(m[1])
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
		t.Errorf("the serve child's process group %d (%v): want its own session, %d", pgid, err, pid)
	}
	url, _ := healthURL(addr)
	if !healthy(t.Context(), url) {
		t.Fatal("no /health after start returned")
	}

	out.Reset()
	if err := run([]string{"start"}, os.Getenv, &out); err != nil || !strings.Contains(out.String(), "already serving") {
		t.Errorf("a second start: %v, %q: want already serving", err, out.String())
	}

	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	stopped = true
	deadline := time.Now().Add(10 * time.Second)
	for healthy(t.Context(), url) {
		if time.Now().After(deadline) {
			t.Fatal("serve still answers 10 s after SIGTERM")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A zombie until this test's process exits (start let it go), but
	// stopped: its log says so.
	deadline = time.Now().Add(5 * time.Second)
	for {
		b, _ := os.ReadFile(logFile)
		if strings.Contains(string(b), "envd stopping") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the log has no stop: %s", b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A serve that cannot come up fails start with its reason.
func TestStartFails(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	// Something that is not envd holds the port and never answers.
	t.Setenv("ENVD_TEST_AS_ENVD", "1")
	t.Setenv(envd.EnvAddr, busy.Addr().String())
	t.Setenv("ENVD_LOG_FILE", filepath.Join(t.TempDir(), "envd.log"))
	err = run([]string{"start"}, os.Getenv, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "exited before it answered") || !strings.Contains(err.Error(), "address already in use") {
		t.Errorf("start with the port taken: %v: want serve's exit and its reason", err)
	}
}

func TestHealthURL(t *testing.T) {
	for addr, want := range map[string]string{
		":49983":         "http://127.0.0.1:49983/health",
		"0.0.0.0:1":      "http://127.0.0.1:1/health",
		"[::]:2":         "http://127.0.0.1:2/health",
		"10.0.0.1:3":     "http://10.0.0.1:3/health",
		"[fd00::1]:4":    "http://[fd00::1]:4/health",
		"no port at all": "",
	} {
		got, err := healthURL(addr)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("healthURL(%q) = %q, %v: want %q", addr, got, err, want)
		}
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"nope"}, {"serve", "extra"}, {"start", "x"}} {
		if err := run(args, os.Getenv, &bytes.Buffer{}); err == nil {
			t.Errorf("run(%q): no error", args)
		}
	}
	var out bytes.Buffer
	if err := run([]string{"version"}, os.Getenv, &out); err != nil || out.String() != fmt.Sprintln(envd.Version) {
		t.Errorf("version: %q, %v", out.String(), err)
	}
}
