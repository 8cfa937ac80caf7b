package realnode

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"time"
)

// OffNodeHost is a host outside the cluster on an address the sandbox
// policy's egress denies: a network namespace on this machine, routed from
// the node through a veth pair (as the public host is), serving the
// stand-in's web server on 80 and its DNS server on 53. From a sandbox each
// must be blocked; from the backend each is reached, which shows it is up.
type OffNodeHost struct {
	What string // what it stands for
	IP   string // its address, inside the namespace
	gw   string // the node's end of the veth, the other address of the /31
	ns   string // network namespace
	veth string // the node's end of the veth
}

// OffNodeHosts are one host in each private range and on two metadata
// addresses the defaults deny, none overlapping the Pod range (10.88.0.0/16),
// the Service range (10.96.0.0/16), this machine's subnet or its resolver.
//
// Each host and its gateway share a /31 (a point-to-point pair), not a /24:
// the route to a veth's network shadows every real address in it for as
// long as the node is up, and a /24 of the documentation range once took
// this machine's route to the Go module proxy (203.0.113.80), so every
// download failed while a real node ran. A /31 claims the two addresses
// the test needs and no others.
var OffNodeHosts = []OffNodeHost{
	{What: "a private host in 10.0.0.0/8", IP: "10.250.0.10", gw: "10.250.0.11", ns: "rn-p10", veth: "rn-p10"},
	{What: "a private host in 172.16.0.0/12", IP: "172.31.250.10", gw: "172.31.250.11", ns: "rn-p172", veth: "rn-p172"},
	{What: "a private host in 192.168.0.0/16", IP: "192.168.250.10", gw: "192.168.250.11", ns: "rn-p192", veth: "rn-p192"},
	{What: "AWS ECS's task metadata address", IP: "169.254.170.2", gw: "169.254.170.3", ns: "rn-ecs", veth: "rn-ecs"},
	{What: "Alibaba Cloud's metadata address (CGNAT range)", IP: "100.100.100.200", gw: "100.100.100.201", ns: "rn-ali", veth: "rn-ali"},
}

// surroundingsPrefix is the length of each surrounding host's network.
const surroundingsPrefix = "/31"

// startSurroundings builds what the attack tests aim at outside the cluster:
// a "public" host (a network namespace at PublicIP, reached through a veth,
// serving HTTP on 80, HTTPS on 443 and DNS with its zone on 53: zone.go),
// the off-node hosts on denied addresses
// (OffNodeHosts, built the same way), a web server on the metadata address
// and a resolver on the node's own address (port 53, as a node-local cache
// or a dnsmasq would be). All run the sandbox stand-in's binary, taken from
// its image.
func (n *Node) startSurroundings(ctx context.Context) error {
	bin := filepath.Join(n.State, "standin")
	if err := extractEntrypoint(filepath.Join(n.paths.ImagesDir, "sandbox.tar"), bin); err != nil {
		return err
	}
	hosts := append([]OffNodeHost{{What: "the public host", IP: PublicIP, gw: publicGateway, ns: publicNS, veth: publicVeth}}, OffNodeHosts...)
	var cmds [][]string
	for _, h := range hosts {
		cmds = append(cmds,
			[]string{"ip", "netns", "add", h.ns},
			[]string{"ip", "link", "add", h.veth, "type", "veth", "peer", "name", "eth0", "netns", h.ns},
			[]string{"ip", "addr", "add", h.gw + surroundingsPrefix, "dev", h.veth},
			[]string{"ip", "link", "set", h.veth, "up"},
			[]string{"ip", "-n", h.ns, "addr", "add", h.IP + surroundingsPrefix, "dev", "eth0"},
			[]string{"ip", "-n", h.ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", h.ns, "link", "set", "lo", "up"},
			[]string{"ip", "-n", h.ns, "route", "add", "default", "via", h.gw})
	}
	// This kernel has no dummy devices: the metadata address goes on lo.
	cmds = append(cmds, []string{"ip", "addr", "add", MetadataIP + "/32", "dev", "lo"})
	for _, c := range cmds {
		if err := run(ctx, c[0], c[1:]...); err != nil {
			return err
		}
	}
	for _, h := range hosts {
		env := []string{"SANDBOX_ADDR=" + h.IP + ":80", "SANDBOX_DNS_ADDR=" + h.IP + ":53"}
		if h.IP == PublicIP {
			env = append(env, publicHostEnv()...)
		}
		if err := n.start(h.ns, env, "ip", "netns", "exec", h.ns, bin); err != nil {
			return err
		}
	}
	if err := n.start("metadata", []string{"SANDBOX_ADDR=" + MetadataIP + ":80", "SANDBOX_DNS_ADDR=" + n.NodeResolver()}, bin); err != nil {
		return err
	}
	return poll(ctx, 10*time.Second, "public host, off-node hosts and metadata listener", func(ctx context.Context) (bool, error) {
		addrs := []string{MetadataIP + ":80", PublicTLSAddr}
		for _, h := range hosts {
			addrs = append(addrs, net.JoinHostPort(h.IP, "80"))
		}
		for _, addr := range addrs {
			c, err := (&net.Dialer{Timeout: time.Second}).DialContext(ctx, "tcp", addr)
			if err != nil {
				return false, err
			}
			c.Close()
		}
		return true, nil
	})
}

// NodeResolver is the DNS server on the node's own address.
func (n *Node) NodeResolver() string { return net.JoinHostPort(n.HostIP, "53") }

// removeSurroundings deletes the Pods' bridge and what startSurroundings
// made (the processes are stopped by then): deleting a veth's node end deletes its peer, deleting a
// namespace what is left in it.
func removeSurroundings() {
	_ = exec.Command("ip", "link", "del", bridgeName).Run()
	for _, h := range append([]OffNodeHost{{ns: publicNS, veth: publicVeth}}, OffNodeHosts...) {
		_ = exec.Command("ip", "link", "del", h.veth).Run()
		_ = exec.Command("ip", "netns", "del", h.ns).Run()
	}
	_ = exec.Command("ip", "addr", "del", MetadataIP+"/32", "dev", "lo").Run()
}
