package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// childArg makes the stand-in its own child (kernelChild) instead of a
// server: the process the ptrace and namespace probes need besides
// themselves. After it, nondumpableArg makes the child refuse tracing.
const (
	childArg       = "kernel-probe-child"
	nondumpableArg = "nondumpable"
)

// kernelChild is the stand-in as its own child: it makes itself
// non-dumpable if asked (args), says "ready" on its stdout, and waits for
// its parent to kill it (a minute at most, should the parent die first).
func kernelChild(args []string) {
	if len(args) > 0 && args[0] == nondumpableArg {
		// As a process that ran a setuid binary, or protects its
		// secrets, is: only a tracer with CAP_SYS_PTRACE may attach.
		if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
			fmt.Printf("PR_SET_DUMPABLE: %v\n", err)
			os.Exit(1)
		}
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
}

// kernelProbe is what hostile code tries against the kernel it runs on: each
// returns ok when the kernel let it through. Under runc that kernel is the
// node's; under gVisor it is gVisor's own (the Sentry), and only what the
// Sentry asks of the node's kernel reaches it. A refusal's error starts with
// the errno's name ("EPERM: …"), which the kernel test asserts row by row: a
// refusal for another reason (or no errno at all, as for an unknown probe)
// is not the refusal a row expects.
func kernelProbe(name string) result {
	switch name {
	case "uname":
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			return errResult(err)
		}
		version, _ := os.ReadFile("/proc/version")
		return result{OK: true, Output: unix.ByteSliceToString(u.Release[:]), Items: []string{strings.TrimSpace(string(version))}}
	case "raw-socket":
		return fdResult(unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP))
	case "packet-socket":
		return fdResult(unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0x0300)) // ETH_P_ALL, network order
	case "init_module":
		// An empty image: the kernel refuses it for want of the right
		// (CAP_SYS_MODULE, seccomp) before it looks at what it is; past
		// that check it is no module (ENOEXEC), and a kernel built without
		// modules has no such call (ENOSYS).
		return errResult(unix.InitModule(nil, ""))
	case "finit_module":
		f, err := os.Open("/proc/self/exe")
		if err != nil {
			return errResult(err)
		}
		defer f.Close()
		return errResult(unix.FinitModule(int(f.Fd()), "", 0))
	case "keyctl":
		_, err := unix.KeyctlJoinSessionKeyring("sandbox-probe")
		return errResult(err)
	case "bpf":
		// BPF_MAP_CREATE of a one-entry array: the least a loader needs.
		attr := struct{ mapType, keySize, valueSize, maxEntries uint32 }{2, 4, 4, 1}
		fd, _, errno := unix.Syscall(unix.SYS_BPF, 0, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
		return fdResult(int(fd), errnoErr(errno))
	case "perf_event_open":
		attr := unix.PerfEventAttr{Type: unix.PERF_TYPE_SOFTWARE, Config: unix.PERF_COUNT_SW_CPU_CLOCK}
		attr.Size = uint32(unsafe.Sizeof(attr))
		return fdResult(unix.PerfEventOpen(&attr, 0, -1, -1, 0))
	case "userfaultfd":
		fd, _, errno := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
		return fdResult(int(fd), errnoErr(errno))
	case "io_uring_setup":
		var params [120]byte // struct io_uring_params, zeroed
		fd, _, errno := unix.Syscall(unix.SYS_IO_URING_SETUP, 1, uintptr(unsafe.Pointer(&params[0])), 0)
		return fdResult(int(fd), errnoErr(errno))
	case "unshare":
		// A new user namespace, then a mount namespace in it: the usual
		// first step to root inside, and a much larger kernel surface. A
		// Go process has many threads, and the kernel refuses unshare of a
		// user namespace to any such process (EINVAL, whatever its rights),
		// so the new namespaces are made where they can be: in the clone
		// that starts a child.
		cmd, err := startChild(&syscall.SysProcAttr{Cloneflags: unix.CLONE_NEWUSER | unix.CLONE_NEWNS}, nil)
		if err != nil {
			return errResult(err)
		}
		stopChild(cmd)
		return result{OK: true, Output: fmt.Sprintf("pid %d in a new user and mount namespace", cmd.Process.Pid)}
	case "mount":
		if err := unix.Mount("none", "/tmp", "tmpfs", 0, ""); err != nil {
			return errResult(err)
		}
		// Leave /tmp as it was: a control that may mount keeps serving.
		return errResult(unix.Unmount("/tmp", 0))
	case "ptrace":
		// A process of its own, which any process may trace: the same call
		// as ptrace-nondumpable's on a target it may, so that row's
		// refusal is for the right it lacks, not a probe that cannot work.
		return ptraceChild()
	case "ptrace-nondumpable":
		return ptraceChild(nondumpableArg)
	}
	return result{Error: "unknown kernel probe " + name}
}

// startChild starts the stand-in as its own child (childArg, then args),
// with attr's clone flags if any, and waits until it says it is ready.
func startChild(attr *syscall.SysProcAttr, args []string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("the stand-in's own binary: %w", err)
	}
	cmd := exec.Command(self, append([]string{childArg}, args...)...)
	cmd.SysProcAttr = attr
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("the child's stdout: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a child: %w", err)
	}
	// The child's first line: what it did before it waits. (If it dies
	// first, the read ends at once.)
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "ready\n" {
		stopChild(cmd)
		return nil, fmt.Errorf("the child %d did not get ready: %q", cmd.Process.Pid, line)
	}
	return cmd, nil
}

// stopChild kills and reaps a child startChild started.
func stopChild(cmd *exec.Cmd) {
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
}

// ptraceChild attaches to a child the stand-in starts (with args): a
// process of its own that it can name. (Its pid 1 is the stand-in itself,
// which no process may attach to, so a probe of pid 1 is refused
// everywhere and shows nothing.)
func ptraceChild(args ...string) result {
	cmd, err := startChild(nil, args)
	if err != nil {
		return errResult(err)
	}
	defer stopChild(cmd)
	pid := cmd.Process.Pid
	done := make(chan result)
	go func() {
		// A tracee answers only the thread that attached. This goroutine
		// keeps its thread to itself and never gives it back: the thread
		// ends with it, tracing nothing, whatever the detach did.
		runtime.LockOSThread()
		if err := unix.PtraceAttach(pid); err != nil {
			done <- errResult(fmt.Errorf("PTRACE_ATTACH to its child %d: %w", pid, err))
			return
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != nil || !ws.Stopped() {
			done <- result{Error: fmt.Sprintf("attached to its child %d, which never stopped: %v (status %#x)", pid, err, ws)}
			return
		}
		if err := unix.PtraceDetach(pid); err != nil {
			done <- errResult(fmt.Errorf("attached to its child %d, then PTRACE_DETACH: %w", pid, err))
			return
		}
		done <- result{OK: true, Output: fmt.Sprintf("attached to its child %d, which stopped (%v), and detached", pid, ws.StopSignal())}
	}()
	return <-done
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// errResult is ok for no error; otherwise the error, led by its errno's name
// when it has one.
func errResult(err error) result {
	if err == nil {
		return result{OK: true}
	}
	var errno unix.Errno
	if errors.As(err, &errno) {
		return result{Error: unix.ErrnoName(errno) + ": " + err.Error()}
	}
	return result{Error: err.Error()}
}

// fdResult closes what a probe opened: it only has to show it could.
func fdResult(fd int, err error) result {
	if err != nil {
		return errResult(err)
	}
	if fd >= 0 {
		_ = unix.Close(fd)
	}
	return result{OK: true}
}
