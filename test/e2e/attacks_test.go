//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// TestAttacksFromInsideASandbox runs, from inside a sandbox, what hostile
// code would try, with the isolation defaults, in each Service mode. Each
// attack is also made from a backend Pod (labelled as the policy's allowed
// peer, not a sandbox), which shows the target is up and reachable from the
// Pod network, so a block is the policy's (or the node guard's) doing.
//
// The targets: another sandbox (Pod IP, ClusterIP unless headless, and in
// NodePort mode its NodePort on the node's address), the backend Pod
// itself, the cluster's DNS (reached: names must resolve) and every other
// resolver (public, private off the node, on the node), a public host
// (reached: the internet is allowed), hosts off the node in each private
// range and on two metadata addresses (network namespaces on this machine,
// routed from the node), the control plane, the kubelet, etcd, the
// provisioner and a metadata server on the node, and the node over IPv6.
func TestAttacksFromInsideASandbox(t *testing.T) {
	needRealNode(t)
	for _, mode := range []string{"ClusterIP", "NodePort", config.ServiceHeadless} {
		t.Run(mode, func(t *testing.T) { attackFromInside(t, mode) })
	}
}

// attack is one row of the attack table.
type attack struct {
	name   string
	action map[string]any
	// node is true for what NetworkPolicy does not cover and
	// config/node/sandbox-node-guard.nft does: targets on the sandbox's own
	// node (traffic to them ends in the node's INPUT path), and IPv6
	// link-local traffic (addresses the policy agent knows no Pod by).
	node    bool
	blocked bool // expected from the sandbox (with the guard for node targets)
}

func connect(addr string) map[string]any {
	return map[string]any{"op": "connect", "addr": addr, "timeout_ms": 2000}
}

func dnsVia(server string) map[string]any {
	return map[string]any{"op": "dns", "server": server, "name": "exfil.example.com", "timeout_ms": 2000}
}

func web(ip string) map[string]any {
	return map[string]any{"op": "http", "url": "http://" + ip + "/v1/sandbox", "timeout_ms": 3000}
}

func word(ok bool) string {
	if ok {
		return "reached"
	}
	return "blocked"
}

// standInPods starts, on the real node, one Pod running the stand-in per
// name (with its labels), and returns their IPs once Ready.
func standInPods(t *testing.T, ns string, labels map[string]map[string]string) map[string]string {
	t.Helper()
	for name, l := range labels {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: l},
			Spec: corev1.PodSpec{
				NodeSelector: map[string]string{realnode.NodeLabel: "true"}, Tolerations: []corev1.Toleration{realnode.Toleration},
				AutomountServiceAccountToken: ptr.To(false), TerminationGracePeriodSeconds: ptr.To[int64](1),
				Containers: []corev1.Container{{Name: name, Image: realnode.SandboxImage, ImagePullPolicy: corev1.PullNever,
					ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/v1/sandbox", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1}}},
			},
		}
		if _, err := client().CoreV1().Pods(ns).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	ips := map[string]string{}
	for name := range labels {
		ips[name] = waitReady(t, "the "+name+" Pod", podNamed(ns, name)).Status.PodIP
	}
	return ips
}

func attackFromInside(t *testing.T, mode string) {
	rn := needRealNode(t)
	ns := namespace(t)
	extra := map[string]string{"SANDBOX_SERVICE_TYPE": mode}
	if mode == "NodePort" {
		// As deployed in NodePort mode (README): traffic through a NodePort
		// reaches the Pod masqueraded to the node's bridge address, which
		// the operator admits.
		extra["SANDBOX_INGRESS_NODE_CIDRS"] = "10.88.0.1/32"
	}
	env := realEnv(t, ns, extra)
	f := start(t, ns, env)

	// The provisioner itself, listening where the Pod network can reach it.
	bin, err := function.Binary()
	if err != nil {
		t.Fatal(err)
	}
	port, err := function.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(port)
	prov, err := function.StartProcess(bin, env, net.JoinHostPort(rn.HostIP, p), filepath.Join(t.TempDir(), "exposed.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer prov.Stop()
	if err := prov.WaitReady(20 * time.Second); err != nil {
		t.Fatal(err)
	}

	for _, id := range []string{"attacker", "victim"} {
		expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": id}), 200, "create "+id)
	}
	attacker, victim := runningPod(t, ns, "attacker"), runningPod(t, ns, "victim")
	victimSvc := services(t, ns, "sandbox-id=victim")[0]
	var svcAddr string // the victim's ClusterIP and port; none in Headless mode
	if headless := victimSvc.Spec.ClusterIP == corev1.ClusterIPNone; headless != (mode == config.ServiceHeadless) {
		t.Fatalf("%s mode made a Service with clusterIP %q", mode, victimSvc.Spec.ClusterIP)
	} else if headless {
		// What cluster DNS answers the Service's name with: the victim's
		// own address, attacked below by its Pod IP.
		endpointsOf(t, ns, victimSvc.Name, &victim)
	} else {
		svcAddr = net.JoinHostPort(victimSvc.Spec.ClusterIP, strconv.Itoa(int(victimSvc.Spec.Ports[0].Port)))
		// Attack the Service only once kube-proxy has programmed it (the
		// host, as root, is always admitted by the policy agent).
		answers(t, "http://"+svcAddr+"/v1/sandbox", victim.Name)
	}
	var nodePortAddr string
	if mode == "NodePort" {
		if victimSvc.Spec.Type != corev1.ServiceTypeNodePort || victimSvc.Spec.Ports[0].NodePort == 0 {
			t.Fatalf("NodePort mode made a %s Service: %+v", victimSvc.Spec.Type, victimSvc.Spec.Ports)
		}
		nodePortAddr = net.JoinHostPort(rn.HostIP, strconv.Itoa(int(victimSvc.Spec.Ports[0].NodePort)))
		answers(t, "http://"+nodePortAddr+"/v1/sandbox", victim.Name)
	}

	// The backend: what the sandbox policy admits, on the same node; and a
	// bystander, a Pod that is neither backend nor sandbox.
	ips := standInPods(t, ns, map[string]map[string]string{
		"backend":   {"app.kubernetes.io/name": "deer-flow-backend"},
		"bystander": {"app": "bystander"},
	})
	backendIP, bystanderIP := ips["backend"], ips["bystander"]

	// The cluster's DNS: the sandbox's resolv.conf names the kube-dns
	// Service, which a stand-in for CoreDNS serves (test/framework/realnode).
	ok, conf := execIn(t, attacker.Status.PodIP, map[string]any{"op": "read", "path": "/etc/resolv.conf"})
	if !ok || !strings.Contains(conf, "nameserver "+realnode.ClusterDNSIP) {
		t.Fatalf("the sandbox's resolv.conf does not name the cluster's DNS %s: %v %q", realnode.ClusterDNSIP, ok, conf)
	}
	dnsPod, err := client().CoreV1().Pods("kube-system").List(context.Background(), metav1.ListOptions{LabelSelector: "k8s-app=kube-dns"})
	if err != nil || len(dnsPod.Items) != 1 || dnsPod.Items[0].Status.PodIP == "" {
		t.Fatalf("the cluster DNS stand-in's Pod: %v %+v", err, dnsPod)
	}

	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(kc.Config.Host, "https://"))
	public := net.JoinHostPort(realnode.PublicIP, "53")
	attacks := []attack{
		{"another sandbox's port 8080 (Pod IP)", connect(net.JoinHostPort(victim.Status.PodIP, "8080")), false, true},
	}
	if svcAddr != "" {
		attacks = append(attacks, attack{"another sandbox's Service (ClusterIP)", connect(svcAddr), false, true})
	}
	if mode == "NodePort" {
		// Forwarded, not delivered to the node: kube-proxy rewrites the
		// destination to the victim's Pod before the policy agent sees it.
		attacks = append(attacks, attack{"another sandbox's NodePort on the node's address", connect(nodePortAddr), false, true})
	}
	attacks = append(attacks,
		attack{"the backend Pod (port 8080)", connect(net.JoinHostPort(backendIP, "8080")), false, true},
		attack{"DNS through the cluster's DNS (kube-dns Service, as resolv.conf names it)", dnsVia(net.JoinHostPort(realnode.ClusterDNSIP, "53")), false, false},
		attack{"DNS to the cluster's DNS Pod by its IP", dnsVia(net.JoinHostPort(dnsPod.Items[0].Status.PodIP, "53")), false, false},
		attack{"DNS to a public resolver (" + public + ")", dnsVia(public), false, true},
		attack{"DNS to a private resolver off the node (" + realnode.OffNodeHosts[0].IP + ":53)", dnsVia(net.JoinHostPort(realnode.OffNodeHosts[0].IP, "53")), false, true},
		// Blocked by the policy alone, though the node is the target:
		// kube-network-policies judges UDP to port 53 in prerouting, before
		// the routing decision, so it covers the node's own resolver. Other
		// agents need not; the node guard closes port 53 on the node anyway.
		attack{"DNS to a resolver on the node (" + rn.NodeResolver() + ")", dnsVia(rn.NodeResolver()), false, true},
		attack{"a public host (HTTP)", web(realnode.PublicIP), false, false},
	)
	for _, h := range realnode.OffNodeHosts {
		attacks = append(attacks, attack{"off the node: " + h.What + " (HTTP to " + h.IP + ")", web(h.IP), false, true})
	}
	attacks = append(attacks,
		attack{"the API server (node address)", connect(net.JoinHostPort(rn.HostIP, apiPort)), true, true},
		attack{"the API server (kubernetes Service 10.96.0.1)", connect("10.96.0.1:443"), true, true},
		attack{"the kubelet's port 10250", connect(net.JoinHostPort(rn.HostIP, "10250")), true, true},
		attack{"etcd (no authentication)", connect(net.JoinHostPort(rn.HostIP, etcdPort(t))), true, true},
		attack{"the provisioner", connect(net.JoinHostPort(rn.HostIP, p)), true, true},
		attack{"the metadata address (served by the node)", connect(realnode.MetadataIP + ":80"), true, true},
	)
	// IPv6: the node is IPv4-only, yet a Pod's interface has a link-local
	// IPv6 address, and so has the node's end, the bridge. A service on the
	// node listening on every address ([::], as many daemons do) is the
	// target.
	ll, llRows := ipv6Exposure(t, rn, attacker.Status.PodIP, victim.Status.PodIP)
	defer ll.Close()
	attacks = append(attacks, llRows...)

	var table strings.Builder
	fmt.Fprintf(&table, "\n%s mode:\n| attack from a sandbox | expected | observed | without the node guard | from the backend (control) |\n|---|---|---|---|---|\n", mode)
	// First without the node guard: the policy alone. Node targets are
	// reached (the finding the guard exists for); everything else is as
	// expected already.
	without := map[string]bool{}
	for i, r := range execEach(t, attacker.Status.PodIP, attacks) {
		a, ok, detail := attacks[i], r.ok, r.detail
		without[a.name] = ok
		if !a.node && ok == a.blocked {
			t.Errorf("%s: from the sandbox %s (%s), want %s", a.name, word(ok), detail, word(!a.blocked))
		}
		if a.node && !ok {
			t.Errorf("%s: blocked without the node guard (%s); the test no longer shows what the guard is for", a.name, detail)
		}
	}
	// The backend, not a sandbox, reaches every target: each is up and
	// reachable from the Pod network, so a block below is the policy's or
	// the guard's doing. (The backend Pod's own row it reaches on its own
	// address: its server is up.)
	control := map[string]bool{}
	for i, r := range execEach(t, backendIP, attacks) {
		a, ok, detail := attacks[i], r.ok, r.detail
		control[a.name] = ok
		if !ok {
			t.Errorf("%s: the backend cannot reach it either (%s): the target is down", a.name, detail)
		}
	}
	guard := filepath.Join("..", "..", "config", "node", "sandbox-node-guard.nft")
	if err := rn.ApplyNodeGuard(context.Background(), guard); err != nil {
		t.Fatal(err)
	}
	defer rn.RemoveNodeGuard()
	for i, r := range execEach(t, attacker.Status.PodIP, attacks) {
		a, ok, detail := attacks[i], r.ok, r.detail
		fmt.Fprintf(&table, "| %s | %s | %s | %s | %s |\n", a.name, word(!a.blocked), word(ok), word(without[a.name]), word(control[a.name]))
		if ok == a.blocked {
			t.Errorf("%s: from the sandbox with the node guard %s (%s), want %s", a.name, word(ok), detail, word(!a.blocked))
		}
	}
	// The backend's selector still reaches the sandbox it serves, and the
	// real probe still passes, with the guard in place.
	ok, detail := execIn(t, backendIP, connect(net.JoinHostPort(attacker.Status.PodIP, "8080")))
	fmt.Fprintf(&table, "| (backend → sandbox port 8080) | reached | %s | | |\n", word(ok))
	if !ok {
		t.Errorf("the backend cannot reach a sandbox: %s", detail)
	}
	r := mustDo(t, f, "GET", "/api/sandboxes/attacker", nil)
	if r.Body["ready"] != true {
		t.Errorf("the sandbox is not ready with the node guard in place (probes blocked?): %s", r.Raw)
	}
	t.Log(table.String())
	exposure(t, mode, victim.Status.PodIP, svcAddr, nodePortAddr, bystanderIP)
}

// exposure shows who else reaches a sandbox, with the node guard in place:
// a bystander Pod (neither backend nor sandbox) and a host outside the
// cluster (the public host), by the sandbox's Pod IP, its ClusterIP and, in
// NodePort mode, its NodePort on the node's address. The NodePort caveat
// (README): kube-proxy masquerades NodePort traffic to the node's address,
// which NodePort mode admits (SANDBOX_INGRESS_NODE_CIDRS, here the bridge's
// 10.88.0.1). Where the policy agent judges after that rewrite, anything
// that reaches a node's port reaches the sandbox. kube-network-policies
// judges before it (postrouting, priority srcnat - 5), on the client's own
// address, so here both are blocked at the NodePort too: what this test
// pins down, so that a change of agent or of its hook shows.
func exposure(t *testing.T, mode, podIP, svcAddr, nodePortAddr, bystanderIP string) {
	t.Helper()
	type probe struct {
		from, to string
		at       string // where the stand-in that connects listens
		addr     string
		reached  bool
	}
	pod := net.JoinHostPort(podIP, "8080")
	public := net.JoinHostPort(realnode.PublicIP, "80")
	probes := []probe{
		{"a bystander Pod", "the sandbox's Pod IP", net.JoinHostPort(bystanderIP, "8080"), pod, false},
		{"a host outside the cluster", "the sandbox's Pod IP", public, pod, false},
	}
	if svcAddr != "" {
		probes = append(probes, probe{"a bystander Pod", "the sandbox's ClusterIP", net.JoinHostPort(bystanderIP, "8080"), svcAddr, false})
	}
	if mode == "NodePort" {
		probes = append(probes,
			probe{"a bystander Pod", "the sandbox's NodePort on the node's address", net.JoinHostPort(bystanderIP, "8080"), nodePortAddr, false},
			probe{"a host outside the cluster", "the sandbox's NodePort on the node's address", public, nodePortAddr, false})
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n%s mode, who else reaches a sandbox (node guard applied):\n| from | to | expected | observed |\n|---|---|---|---|\n", mode)
	for _, p := range probes {
		ok, detail := execAt(t, p.at, connect(p.addr))
		fmt.Fprintf(&table, "| %s | %s | %s | %s |\n", p.from, p.to, word(p.reached), word(ok))
		if ok != p.reached {
			t.Errorf("%s → %s (%s): %s (%s), want %s", p.from, p.to, p.addr, word(ok), detail, word(p.reached))
		}
	}
	t.Log(table.String())
}

// ipv6Exposure checks what IPv6 a sandbox has on this IPv4-only node: no
// address and no route beyond its link (so the node's global IPv6 address,
// and anything beyond, is unreachable by configuration), but a link-local
// address. It starts a listener on the node on [::] (close it) and returns
// the attacks over link-local addresses: the node's on the Pods' bridge (a
// service on [::]), and, as the Pods share the bridge, the victim's (its
// port 8080 listens on [::]). None when the sandbox has no link-local
// address (then there is no IPv6 path at all).
func ipv6Exposure(t *testing.T, rn *realnode.Node, podIP, victimIP string) (net.Listener, []attack) {
	t.Helper()
	lis, err := net.Listen("tcp", "[::]:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(lis.Addr().String())

	own := linkLocalOf(t, podIP)
	ok, routes := execIn(t, podIP, map[string]any{"op": "read", "path": "/proc/net/ipv6_route"})
	if !ok {
		t.Fatalf("reading the sandbox's IPv6 routes: %s", routes)
	}
	for _, l := range strings.Split(routes, "\n") {
		f := strings.Fields(l) // destination, its length, source, its length, next hop, metric, refs, use, flags, device
		if len(f) < 10 || f[9] == "lo" {
			continue // lo holds ::1 and the "unreachable" default route
		}
		if dst := f[0]; !strings.HasPrefix(dst, "fe80") && !strings.HasPrefix(dst, "ff") {
			t.Errorf("the sandbox has an IPv6 route beyond its link: %s", l)
		}
	}
	if global := realnode.GlobalIPv6(); global != "" {
		if ok, detail := execIn(t, podIP, connect(net.JoinHostPort(global, port))); ok {
			t.Errorf("the sandbox reached the node's global IPv6 address %s: IPv6 is configured for Pods", global)
		} else {
			t.Logf("IPv6: the node's global address [%s]:%s from the sandbox: %s (no route: refused by configuration)", global, port, detail)
		}
	}
	if own == "" {
		t.Logf("IPv6: the sandbox has no link-local address either: no IPv6 path at all")
		return lis, nil
	}
	gw, err := rn.PodGatewayLinkLocal()
	if err != nil || gw == "" {
		t.Fatalf("the sandbox has a link-local IPv6 address but the node's bridge has none (%v)", err)
	}
	rows := []attack{{"the node over IPv6 link-local ([" + gw + "%eth0], a service on [::])", connect(net.JoinHostPort(gw+"%eth0", port)), true, true}}
	if victim := linkLocalOf(t, victimIP); victim != "" {
		rows = append(rows, attack{"another sandbox's port 8080 over IPv6 link-local", connect(net.JoinHostPort(victim+"%eth0", "8080")), true, true})
	}
	return lis, rows
}

// linkLocalOf is the link-local IPv6 address of eth0 in the Pod at podIP
// (running the stand-in), or "" when it has none. It fails the test if the
// Pod has an IPv6 address of wider scope: the node is IPv4-only.
func linkLocalOf(t *testing.T, podIP string) string {
	t.Helper()
	ok, addrs := execIn(t, podIP, map[string]any{"op": "read", "path": "/proc/net/if_inet6"})
	if !ok {
		t.Fatalf("reading the IPv6 addresses of %s: %s", podIP, addrs)
	}
	var ll string
	for _, l := range strings.Split(addrs, "\n") {
		f := strings.Fields(l) // address, ifindex, prefix length, scope, flags, name
		if len(f) < 6 || len(f[0]) != 32 {
			continue
		}
		// The scope is judged from the address, not from the scope column:
		// gVisor's kernel writes 00 there for every address.
		var b strings.Builder
		for i := 0; i < 32; i += 4 {
			if i > 0 {
				b.WriteByte(':')
			}
			b.WriteString(f[0][i : i+4])
		}
		ip := net.ParseIP(b.String())
		switch {
		case ip.IsLinkLocalUnicast():
			if f[5] == "eth0" {
				ll = ip.String()
			}
		case ip.IsLoopback(): // ::1 on lo
		default:
			t.Errorf("%s has an IPv6 address beyond its link: %s", podIP, l)
		}
	}
	return ll
}
