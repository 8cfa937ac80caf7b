//go:build e2e

package bench

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// cpuUse is the CPU time (seconds) the machine's parts have used so far,
// by part: the control plane's processes by name, the function by its
// pid, and "machine" for every core's busy time (/proc/stat), which also
// holds what no named part used (the node's container starts, the bench).
type cpuUse map[string]float64

// ticks is the kernel's USER_HZ, the unit of /proc's CPU times; 100 on
// every Linux this runs on (sysconf(_SC_CLK_TCK)).
const ticks = 100

// cpuParts names the long-lived processes by their comm (at most 15
// characters, so kube-controller-manager reads kube-controller).
var cpuParts = map[string]string{
	"kube-apiserver":  "kube-apiserver",
	"etcd":            "etcd",
	"kube-controller": "kube-controller-manager",
	"kube-scheduler":  "kube-scheduler",
	"kubelet":         "kubelet",
	"containerd":      "containerd",
	"kwok":            "kwok",
	// On the real node: kube-proxy, the policy agent, the egress proxy,
	// the stand-in hosts of the fake internet, and gVisor's processes.
	"kube-proxy":    "kube-proxy",
	"netpol":        "policy agent (kube-network-policies)",
	"proxy":         "egress proxy",
	"standin":       "fake internet hosts (stand-in)",
	"runsc-sandbox": "gVisor (runsc)",
	"runsc-gofer":   "gVisor (runsc)",
	"exe":           "gVisor (runsc)",
}

// sampleCPU reads the CPU time used so far by each part; fnPID is the
// function's process. A process that ended between the two samples of a
// round (a container's runtime) is only in "machine".
func sampleCPU(fnPID int) (cpuUse, error) {
	out := cpuUse{}
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	line, _, _ := bytes.Cut(stat, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return nil, fmt.Errorf("/proc/stat begins %q", line)
	}
	// user nice system idle iowait irq softirq steal: all but idle and iowait.
	for i, v := range f[1:9] {
		if i == 3 || i == 4 {
			continue
		}
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/stat: %w", err)
		}
		out["machine"] += n / ticks
	}
	dirs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, err
	}
	for _, p := range dirs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // ended since the glob
		}
		// pid (comm) state … utime stime: comm may hold spaces, so the
		// fields are counted from its closing parenthesis.
		open, shut := bytes.IndexByte(b, '('), bytes.LastIndexByte(b, ')')
		if open < 0 || shut < open {
			continue
		}
		comm := string(b[open+1 : shut])
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b[:open])))
		part := cpuParts[comm]
		switch pid {
		case fnPID:
			part = "function"
		case os.Getpid():
			part = "bench (the floor's client, ours' HTTP client)"
		}
		if part == "" {
			continue
		}
		rest := strings.Fields(string(b[shut+1:]))
		if len(rest) < 13 {
			continue
		}
		u, _ := strconv.ParseFloat(rest[11], 64)
		s, _ := strconv.ParseFloat(rest[12], 64)
		out[part] += (u + s) / ticks
	}
	return out, nil
}

// add adds after minus before to c: the CPU used in between.
func (c cpuUse) add(before, after cpuUse) {
	for k, a := range after {
		c[k] += a - before[k]
	}
}

// table prints c as markdown rows of CPU milliseconds per claim (of the n
// measured), beside the floor's (fc, over its fn claims), the machine's
// total first.
func (c cpuUse) table(n int, fc cpuUse, fn int) string {
	names := make([]string, 0, len(c)+1)
	for k := range c {
		if k != "machine" {
			names = append(names, k)
		}
	}
	sort.Slice(names, func(i, j int) bool { return c[names[i]] > c[names[j]] })
	names = append([]string{"machine"}, names...)
	per := func(s float64, n int) string { return fmt.Sprintf("%.1f", 1000*s/float64(max(n, 1))) }
	var b strings.Builder
	fmt.Fprintf(&b, "| CPU of | ours ms per claim | floor ms per claim |\n|---|---|---|\n")
	for _, k := range names {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", k, per(c[k], n), per(fc[k], fn))
	}
	return b.String()
}
