package main

import (
	"os"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// kernelProbe is what hostile code tries against the kernel it runs on: each
// returns ok when the kernel let it through. Under runc that kernel is the
// node's; under gVisor it is gVisor's own (the Sentry), and only what the
// Sentry asks of the node's kernel reaches it.
func kernelProbe(name string) result {
	switch name {
	case "uname":
		var u unix.Utsname
		if err := unix.Uname(&u); err != nil {
			return result{Error: err.Error()}
		}
		version, _ := os.ReadFile("/proc/version")
		return result{OK: true, Output: unix.ByteSliceToString(u.Release[:]), Items: []string{strings.TrimSpace(string(version))}}
	case "raw-socket":
		return fdResult(unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP))
	case "packet-socket":
		return fdResult(unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0x0300)) // ETH_P_ALL, network order
	case "init_module":
		// An empty image: the kernel refuses it for want of the right
		// (CAP_SYS_MODULE, seccomp) before it looks at what it is.
		return errResult(unix.InitModule(nil, ""))
	case "finit_module":
		f, err := os.Open("/proc/self/exe")
		if err != nil {
			return result{Error: err.Error()}
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
		// first step to root inside, and a much larger kernel surface.
		return errResult(unix.Unshare(unix.CLONE_NEWUSER | unix.CLONE_NEWNS))
	case "mount":
		return errResult(unix.Mount("none", "/tmp", "tmpfs", 0, ""))
	case "ptrace":
		// pid 1 of the sandbox's own pid namespace (its init): the node's
		// processes and other containers' are in no namespace it can name,
		// so this is the one other target it has; tracing it needs a right
		// the sandbox lacks.
		return errResult(unix.PtraceAttach(1))
	}
	return result{Error: "unknown kernel probe " + name}
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

func errResult(err error) result {
	if err != nil {
		return result{Error: err.Error()}
	}
	return result{OK: true}
}

// fdResult closes what a probe opened: it only has to show it could.
func fdResult(fd int, err error) result {
	if err != nil {
		return result{Error: err.Error()}
	}
	if fd >= 0 {
		_ = unix.Close(fd)
	}
	return result{OK: true}
}
