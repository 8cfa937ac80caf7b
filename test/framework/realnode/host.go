package realnode

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// HostIP is this machine's address (the real node's), on the interface
// holding the default route.
func HostIP() string { return hostIP() }

// hostIP is the address of the interface holding the default route.
func hostIP() string {
	out, err := exec.Command("ip", "-4", "-o", "route", "get", "203.0.113.1").Output()
	if err != nil {
		return "127.0.0.1"
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "src" && i+1 < len(f) {
			return f[i+1]
		}
	}
	return "127.0.0.1"
}

// The kernel settings the parts change (the kubelet, the bridge, kube-proxy)
// or need; Down restores what was there.
var sysctls = map[string]string{
	"net/ipv4/ip_forward":                  "1",
	"net/ipv4/conf/all/route_localnet":     "1",
	"net/bridge/bridge-nf-call-iptables":   "1",
	"net/bridge/bridge-nf-call-ip6tables":  "1",
	"vm/overcommit_memory":                 "",
	"kernel/panic":                         "",
	"kernel/panic_on_oops":                 "",
	"net/ipv4/conf/all/rp_filter":          "",
	"net/netfilter/nf_conntrack_max":       "",
	"net/ipv4/vs/conntrack":                "",
	"net/ipv4/conf/default/route_localnet": "",
}

func (n *Node) saveAndSetSysctls() error {
	for k, v := range sysctls {
		path := filepath.Join("/proc/sys", k)
		old, err := os.ReadFile(path)
		if err != nil {
			continue // not on this kernel
		}
		n.sysctls[path] = strings.TrimSpace(string(old))
		if v != "" {
			if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
				return fmt.Errorf("setting %s: %w", k, err)
			}
		}
	}
	return n.recordSysctls()
}

// PodGatewayLinkLocal is the node's link-local IPv6 address on the Pods'
// bridge, or "" when it has none: where a Pod reaches the node over IPv6
// even in an IPv4-only cluster.
func (n *Node) PodGatewayLinkLocal() (string, error) {
	out, err := exec.Command("ip", "-6", "-o", "addr", "show", "dev", bridgeName, "scope", "link").Output()
	if err != nil {
		return "", fmt.Errorf("ip -6 addr show dev %s: %w", bridgeName, err)
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "inet6" && i+1 < len(f) {
			ip, _, err := net.ParseCIDR(f[i+1])
			if err != nil {
				return "", err
			}
			return ip.String(), nil
		}
	}
	return "", nil
}

// GlobalIPv6 is an IPv6 address of global scope this machine (the node)
// has, or "" when it has none.
func GlobalIPv6() string {
	out, err := exec.Command("ip", "-6", "-o", "addr", "show", "scope", "global").Output()
	if err != nil {
		return ""
	}
	f := strings.Fields(string(out))
	for i := range f {
		if f[i] == "inet6" && i+1 < len(f) {
			if ip, _, err := net.ParseCIDR(f[i+1]); err == nil {
				return ip.String()
			}
		}
	}
	return ""
}
