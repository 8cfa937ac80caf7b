//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// agentWindow is how long after a Pod starts the node's policy agent may
// not yet judge its traffic by its labels (docs/security.md): the soak
// exempts it, and so do the rows here, by waiting it out before attacking.
const egressAgentWindow = 6 * time.Second

// TestEgressModes (issue 46): on the real node, under gVisor, each egress
// mode against a fake internet of network namespaces on this machine (the
// public host at realnode.PublicIP serving HTTP, HTTPS and a DNS zone of
// our own, realnode.PublicZone) and the egress proxy config/ ships
// (config/300-egress-proxy.yaml, its image built from cmd/proxy), with
// three stand-ins: the image (localhost/…:e2e), the proxy's resolver (the
// public host's zone server instead of the cluster DNS, which here answers
// every name with one address) and the node (the test's real node).
//
//   - isolated: a public host by IP and by name, DNS to every resolver, and
//     the proxy itself: all blocked;
//   - allowlist: a listed name over HTTP and HTTPS (the certificate the
//     sandbox sees is the host's own: no interception) reached; an
//     unlisted name, an IP literal, a listed name whose answer is private
//     (rebinding) or mixed, a Host or SNI other than the CONNECT target,
//     Encrypted ClientHello, a direct connection and DNS: each refused,
//     the reason visible to the sandbox (a 403 body or a TLS alert) and in
//     the proxy's metrics; a grant opens a name within a second, a revoke
//     closes it for the next connection; another principal's grant is 404;
//     with the proxy down an allowlist sandbox reaches nothing while an
//     open one is unaffected;
//   - open: the public host by IP, the cluster DNS: reached, as before
//     (TestAttacksFromInsideASandbox has the full open table).
//
// Every target is first shown up from the backend Pod (not a sandbox), so
// a block is the policies' or the proxy's doing.
func TestEgressModes(t *testing.T) {
	rn := needRealNode(t)
	ns := namespace(t)
	deployProxy(t, ns)
	f := start(t, ns, realEnv(t, ns, map[string]string{
		"SANDBOX_SERVICE_TYPE": "ClusterIP",
		"PROVISIONER_API_KEYS": "alice=" + aliceKey + ",bob=" + bobKey,
		// Both principals' backends are the one backend Pod here: this test
		// is about egress; TestTenantNetwork about who reaches whom.
		"PROVISIONER_PRINCIPAL_INGRESS": "alice=pods:app.kubernetes.io/name=deer-flow-backend;bob=pods:app.kubernetes.io/name=deer-flow-backend",
	}))
	spec := corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: realnode.SandboxImage}}}
	putTemplate(t, ns, podTemplate("isolated", map[string]string{keys.TemplateEgress: "isolated"}, spec))
	allow := strings.Join([]string{realnode.AllowedName, realnode.WildPattern, realnode.RebindName, realnode.MixedName}, ",")
	putTemplate(t, ns, podTemplate("allowlist", map[string]string{keys.TemplateEgress: "allowlist", keys.TemplateEgressAllow: allow}, spec))

	as := func(key string) map[string]string { return map[string]string{"X-API-Key": key} }
	create := func(id, template string) map[string]any {
		t.Helper()
		body := map[string]any{"sandbox_id": id, "user_id": id, "thread_id": id}
		if template != "" {
			body["template"] = template
		}
		r, err := f.DoWithHeaders("POST", "/api/sandboxes?wait=20s", body, as(aliceKey))
		if err != nil || r.Code != 200 {
			t.Fatalf("create %s: %v %d %s", id, err, r.Code, r.Raw)
		}
		return r.Body
	}
	openBody, isoBody, alBody := create("open1", ""), create("iso1", "isolated"), create("allow1", "allowlist")
	for id, want := range map[string]struct {
		body map[string]any
		mode string
	}{"open1": {openBody, "open"}, "iso1": {isoBody, "isolated"}, "allow1": {alBody, "allowlist"}} {
		eg, _ := want.body["egress"].(map[string]any)
		if eg["mode"] != want.mode {
			t.Errorf("create %s answered egress %v, want mode %s", id, want.body["egress"], want.mode)
		}
	}
	open, iso, al := runningPod(t, ns, "open1"), runningPod(t, ns, "iso1"), runningPod(t, ns, "allow1")
	backendIP := standInPods(t, ns, map[string]map[string]string{"backend": {"app.kubernetes.io/name": "deer-flow-backend"}})["backend"]
	proxySvc, err := client().CoreV1().Services(ns).Get(context.Background(), "sandbox-egress-proxy", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	proxyAddr := net.JoinHostPort(proxySvc.Spec.ClusterIP, "3128")
	env := envOf(al)
	if env["HTTPS_PROXY"] != "http://"+proxyAddr || env["http_proxy"] != "http://"+proxyAddr {
		t.Fatalf("the allowlist sandbox's proxy env %v, want http://%s", env, proxyAddr)
	}
	time.Sleep(egressAgentWindow)

	// The public host's own certificate, fetched directly: what the sandbox
	// must see through the proxy.
	_, hostCert := execAt(t, net.JoinHostPort(realnode.PublicIP, "80"), map[string]any{"op": "http", "url": "http://" + realnode.PublicIP + "/v1/cert"})
	hostCert = strings.TrimSpace(strings.TrimPrefix(hostCert, "200"))
	if len(hostCert) != 64 {
		t.Fatalf("the public host's certificate fingerprint: %q", hostCert)
	}

	type row struct {
		mode, name string
		from       string         // the sandbox's Pod IP
		action     map[string]any // what it tries
		reached    bool
		says       string // in what the sandbox sees (refusals: the reason)
		viaProxy   bool   // the control runs with the proxy env (the backend has none: it goes direct)
	}
	public80, public443 := net.JoinHostPort(realnode.PublicIP, "80"), net.JoinHostPort(realnode.PublicIP, "443")
	clusterDNS, publicDNS := net.JoinHostPort(realnode.ClusterDNSIP, "53"), realnode.PublicResolver
	url := func(scheme, host string) string { return scheme + "://" + host + "/v1/sandbox" }
	httpAct := func(u string, extra ...any) map[string]any {
		a := map[string]any{"op": "http", "url": u, "timeout_ms": 4000}
		for i := 0; i+1 < len(extra); i += 2 {
			a[extra[i].(string)] = extra[i+1]
		}
		return a
	}
	tunnel := func(addr string, extra ...any) map[string]any {
		a := map[string]any{"op": "tunnel", "addr": addr, "timeout_ms": 4000}
		for i := 0; i+1 < len(extra); i += 2 {
			a[extra[i].(string)] = extra[i+1]
		}
		return a
	}
	rows := []row{
		{mode: "open", name: "a public host by IP (HTTP)", from: open.Status.PodIP, action: web(realnode.PublicIP), reached: true},
		{mode: "open", name: "DNS through the cluster's DNS", from: open.Status.PodIP, action: dnsVia(clusterDNS), reached: true},
		{mode: "open", name: "DNS to a public resolver", from: open.Status.PodIP, action: dnsVia(publicDNS)},

		{mode: "isolated", name: "a public host by IP (HTTP)", from: iso.Status.PodIP, action: web(realnode.PublicIP)},
		{mode: "isolated", name: "a public host by IP (443)", from: iso.Status.PodIP, action: connect(public443)},
		{mode: "isolated", name: "a public host by name (no DNS)", from: iso.Status.PodIP, action: httpAct(url("http", realnode.AllowedName))},
		{mode: "isolated", name: "DNS through the cluster's DNS", from: iso.Status.PodIP, action: dnsVia(clusterDNS)},
		{mode: "isolated", name: "DNS to the public resolver", from: iso.Status.PodIP, action: dnsVia(publicDNS)},
		{mode: "isolated", name: "DNS to the node's resolver", from: iso.Status.PodIP, action: dnsVia(rn.NodeResolver())},
		{mode: "isolated", name: "the egress proxy", from: iso.Status.PodIP, action: connect(proxyAddr)},

		{mode: "allowlist", name: "a listed name over HTTP", from: al.Status.PodIP, action: httpAct(url("http", realnode.AllowedName)), reached: true, says: `"host_header":"` + realnode.AllowedName, viaProxy: true},
		{mode: "allowlist", name: "a listed name over HTTPS (the host's own certificate)", from: al.Status.PodIP, action: httpAct(url("https", realnode.AllowedName), "insecure", true), reached: true, says: "cert=" + hostCert, viaProxy: true},
		{mode: "allowlist", name: "a name below a listed *. name", from: al.Status.PodIP, action: httpAct(url("http", realnode.WildName)), reached: true, says: "200", viaProxy: true},
		{mode: "allowlist", name: "the apex of a listed *. name", from: al.Status.PodIP, action: httpAct(url("http", realnode.WildApexName)), says: "not on this sandbox's egress list", viaProxy: true},
		{mode: "allowlist", name: "an unlisted name (HTTPS, CONNECT)", from: al.Status.PodIP, action: tunnel(realnode.UnlistedName+":443", "sni", realnode.UnlistedName), says: "403", viaProxy: true},
		{mode: "allowlist", name: "an unlisted name (HTTP)", from: al.Status.PodIP, action: httpAct(url("http", realnode.UnlistedName)), says: "not on this sandbox's egress list", viaProxy: true},
		{mode: "allowlist", name: "an IP literal", from: al.Status.PodIP, action: httpAct(url("http", realnode.PublicIP)), says: "403", viaProxy: true},
		{mode: "allowlist", name: "a listed name that resolves to a private address (rebinding)", from: al.Status.PodIP, action: httpAct(url("http", realnode.RebindName)), says: "private address", viaProxy: true},
		{mode: "allowlist", name: "a listed name with a mixed answer", from: al.Status.PodIP, action: httpAct(url("http", realnode.MixedName)), says: "private address", viaProxy: true},
		{mode: "allowlist", name: "a Host header other than the URL's", from: al.Status.PodIP, action: httpAct(url("http", realnode.AllowedName), "host", realnode.UnlistedName), says: "403", viaProxy: true},
		{mode: "allowlist", name: "a Host inside a CONNECT other than its target", from: al.Status.PodIP, action: tunnel(realnode.AllowedName+":80", "host", realnode.UnlistedName), says: "403", viaProxy: true},
		{mode: "allowlist", name: "an SNI other than the CONNECT target", from: al.Status.PodIP, action: tunnel(realnode.AllowedName+":443", "sni", realnode.UnlistedName), says: "access denied", viaProxy: true},
		{mode: "allowlist", name: "Encrypted ClientHello", from: al.Status.PodIP, action: tunnel(realnode.AllowedName+":443", "sni", realnode.AllowedName, "ech", true), says: "access denied", viaProxy: true},
		{mode: "allowlist", name: "a direct connection (bypassing the proxy, 443)", from: al.Status.PodIP, action: connect(public443)},
		{mode: "allowlist", name: "a direct connection (bypassing the proxy, 80)", from: al.Status.PodIP, action: connect(public80)},
		{mode: "allowlist", name: "DNS through the cluster's DNS", from: al.Status.PodIP, action: dnsVia(clusterDNS)},
		{mode: "allowlist", name: "DNS to the public resolver", from: al.Status.PodIP, action: dnsVia(publicDNS)},
		{mode: "allowlist", name: "DNS to the node's resolver", from: al.Status.PodIP, action: dnsVia(rn.NodeResolver())},
	}
	before := proxyCounts(t, ns)
	var table strings.Builder
	fmt.Fprintf(&table, "\n| mode | attempt from a sandbox | expected | observed | what the sandbox saw |\n|---|---|---|---|---|\n")
	for i, seen := range execAll(t, len(rows), func(i int) (string, map[string]any) { return rows[i].from, rows[i].action }) {
		r, ok, detail := rows[i], seen.ok, seen.detail
		// A refusal inside an answer (a 403 body) is a block for the row.
		reached := ok && !strings.HasPrefix(detail, "403") && !strings.HasPrefix(detail, "502")
		fmt.Fprintf(&table, "| %s | %s | %s | %s | %.90s |\n", r.mode, r.name, word(r.reached), word(reached), strings.ReplaceAll(detail, "|", "/"))
		if reached != r.reached {
			t.Errorf("%s: %s: %s (%s), want %s", r.mode, r.name, word(reached), detail, word(r.reached))
		}
		if r.says != "" && !strings.Contains(detail, r.says) {
			t.Errorf("%s: %s: the sandbox saw %q, want it to say %q", r.mode, r.name, detail, r.says)
		}
	}
	t.Log(table.String())
	// The proxy counted each refusal under its reason.
	after := proxyCounts(t, ns)
	for _, reason := range []string{"not_listed", "ip_literal", "forbidden_address", "host_mismatch", "sni", "ech"} {
		if after["refused/"+reason] <= before["refused/"+reason] {
			t.Errorf("the proxy's refusals for %s did not grow (%v → %v)", reason, before["refused/"+reason], after["refused/"+reason])
		}
	}
	// And logged each, naming the sandbox and the reason.
	logs := proxyLogs(t, ns)
	for _, reason := range []string{"not_listed", "ip_literal", "forbidden_address", "host_mismatch", "sni", "ech"} {
		if !strings.Contains(logs, `"reason":"`+reason+`"`) || !strings.Contains(logs, `"sandbox":"allow1"`) {
			t.Errorf("the proxy's log has no refusal of allow1 for %s", reason)
		}
	}
	if after["allowed/ok"] < before["allowed/ok"]+3 {
		t.Errorf("the proxy counted %v allowed connections, want 3 more than %v", after["allowed/ok"], before["allowed/ok"])
	}
	// Controls: the backend (no sandbox, no proxy) reaches the public host
	// and both resolvers directly: they are up, so a block above is ours.
	for _, c := range []map[string]any{web(realnode.PublicIP), connect(public443), dnsVia(clusterDNS), dnsVia(publicDNS), dnsVia(rn.NodeResolver())} {
		if ok, detail := execIn(t, backendIP, c); !ok {
			t.Errorf("control %v from the backend: %s; the target is down", c, detail)
		}
	}

	// Grants at run time: unlisted until granted, reachable within a second
	// of the answer, closed again for the next connection after a revoke.
	granted := httpAct(url("http", realnode.GrantedName))
	if ok, detail := execIn(t, al.Status.PodIP, granted); ok && !strings.HasPrefix(detail, "403") {
		t.Fatalf("%s before its grant: %s", realnode.GrantedName, detail)
	}
	if r, err := f.DoWithHeaders("POST", "/api/sandboxes/allow1/egress", map[string]any{"allow": []string{realnode.GrantedName}, "for": "10m"}, as(bobKey)); err != nil || r.Code != 404 {
		t.Errorf("bob's grant on alice's sandbox: %v %d %s, want 404", err, r.Code, r.Raw)
	}
	r, err := f.DoWithHeaders("POST", "/api/sandboxes/allow1/egress", map[string]any{"allow": []string{realnode.GrantedName}, "for": "10m"}, as(aliceKey))
	if err != nil || r.Code != 200 {
		t.Fatalf("grant: %v %d %s", err, r.Code, r.Raw)
	}
	in := waitFor(t, time.Second, func() bool { ok, d := execIn(t, al.Status.PodIP, granted); return ok && strings.HasPrefix(d, "200") })
	t.Logf("a grant opened %s %s after its answer", realnode.GrantedName, in.Round(time.Millisecond))
	if in > time.Second {
		t.Errorf("a grant took %s to reach the proxy, want within a second", in)
	}
	if got := mustDo(t, f, "GET", "/api/sandboxes/allow1", nil); got.Code != 404 {
		// default's key sees none of alice's sandboxes.
		t.Errorf("default's get of alice's sandbox: %d, want 404", got.Code)
	}
	if r, err := f.DoWithHeaders("GET", "/api/sandboxes/allow1", nil, as(aliceKey)); err != nil || !strings.Contains(string(r.Raw), realnode.GrantedName) {
		t.Errorf("get does not show the grant: %v %s", err, r.Raw)
	}
	if r, err := f.DoWithHeaders("DELETE", "/api/sandboxes/allow1/egress", map[string]any{"allow": []string{realnode.GrantedName}}, as(aliceKey)); err != nil || r.Code != 200 {
		t.Fatalf("revoke: %v %d %s", err, r.Code, r.Raw)
	}
	out := waitFor(t, time.Second, func() bool { ok, d := execIn(t, al.Status.PodIP, granted); return !ok || strings.HasPrefix(d, "403") })
	t.Logf("a revoke closed %s %s after its answer", realnode.GrantedName, out.Round(time.Millisecond))
	if r, err := f.DoWithHeaders("POST", "/api/sandboxes/open1/egress", map[string]any{"allow": []string{realnode.GrantedName}}, as(aliceKey)); err != nil || r.Code != 409 {
		t.Errorf("a grant to an open sandbox: %v %d %s, want 409", err, r.Code, r.Raw)
	}

	// The proxy down: allowlist reaches nothing (fail closed), open is
	// unaffected. Then back.
	scaleProxy(t, ns, 0)
	if ok, detail := execIn(t, al.Status.PodIP, httpAct(url("http", realnode.AllowedName))); ok && strings.HasPrefix(detail, "200") {
		t.Errorf("with the proxy down the allowlist sandbox reached %s: %s", realnode.AllowedName, detail)
	}
	if ok, detail := execIn(t, open.Status.PodIP, web(realnode.PublicIP)); !ok {
		t.Errorf("with the proxy down the open sandbox lost the public host: %s", detail)
	}
	scaleProxy(t, ns, 2)
	waitFor(t, 30*time.Second, func() bool {
		ok, d := execIn(t, al.Status.PodIP, httpAct(url("http", realnode.AllowedName)))
		return ok && strings.HasPrefix(d, "200")
	})
}

// deployProxy applies config/300-egress-proxy.yaml into ns, as `make run
// NODE=real` does (realnode.DeployProxy says what it changes, and why).
func deployProxy(t *testing.T, ns string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := realnode.DeployProxy(ctx, client(), filepath.Join("..", "..", "config", "300-egress-proxy.yaml"), ns); err != nil {
		waitProxyReady(t, ns, 2) // its diagnostics: the Pods' states and logs
		t.Fatal(err)
	}
}

func waitProxyReady(t *testing.T, ns string, n int32) {
	t.Helper()
	defer func() {
		if !t.Failed() {
			return
		}
		for _, p := range pods(t, ns, "app.kubernetes.io/name=sandbox-egress-proxy") {
			t.Logf("proxy Pod %s on %q: %s %+v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.ContainerStatuses)
			logs, err := client().CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{TailLines: ptr.To[int64](30)}).DoRaw(context.Background())
			t.Logf("its log (%v):\n%s", err, logs)
		}
	}()
	eventually(t, 90*time.Second, fmt.Sprintf("%d egress proxy replicas ready", n), func() (bool, error) {
		d, err := client().AppsV1().Deployments(ns).Get(context.Background(), "sandbox-egress-proxy", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return d.Status.ReadyReplicas == n && d.Status.Replicas == n, fmt.Errorf("ready %d of %d", d.Status.ReadyReplicas, d.Status.Replicas)
	})
}

func scaleProxy(t *testing.T, ns string, n int32) {
	t.Helper()
	patch := []byte(fmt.Sprintf(`{"spec":{"replicas":%d}}`, n))
	if _, err := client().AppsV1().Deployments(ns).Patch(context.Background(), "sandbox-egress-proxy", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		eventually(t, 60*time.Second, "no egress proxy Pod left", func() (bool, error) {
			p := pods(t, ns, "app.kubernetes.io/name=sandbox-egress-proxy")
			return len(p) == 0, fmt.Errorf("%d Pods", len(p))
		})
		return
	}
	waitProxyReady(t, ns, n)
}

// proxyCounts sums sandbox_egress_proxy_requests_total by verdict/reason
// over the proxy's Pods, read from each Pod's metrics port on the node.
func proxyCounts(t *testing.T, ns string) map[string]float64 {
	t.Helper()
	sums := map[string]float64{}
	for _, p := range pods(t, ns, "app.kubernetes.io/name=sandbox-egress-proxy") {
		resp, err := freshClient(5 * time.Second).Get("http://" + net.JoinHostPort(p.Status.PodIP, "9090") + "/metrics")
		if err != nil {
			t.Fatalf("the proxy's metrics: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			if !strings.HasPrefix(line, "sandbox_egress_proxy_requests_total{") {
				continue
			}
			labels, value, _ := strings.Cut(strings.TrimPrefix(line, "sandbox_egress_proxy_requests_total{"), "} ")
			var reason, verdict string
			for _, kv := range strings.Split(labels, ",") {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "reason":
					reason = strings.Trim(v, `"`)
				case "verdict":
					verdict = strings.Trim(v, `"`)
				}
			}
			var n float64
			fmt.Sscan(value, &n)
			sums[verdict+"/"+reason] += n
		}
	}
	return sums
}

// proxyLogs is the log of every egress proxy Pod (through the API server,
// from the real node's kubelet).
func proxyLogs(t *testing.T, ns string) string {
	t.Helper()
	var all strings.Builder
	for _, p := range pods(t, ns, "app.kubernetes.io/name=sandbox-egress-proxy") {
		b, err := client().CoreV1().Pods(ns).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(context.Background())
		if err != nil {
			t.Fatalf("the log of %s: %v", p.Name, err)
		}
		all.Write(b)
	}
	return all.String()
}

// envOf is the sandbox container's plain env.
func envOf(p corev1.Pod) map[string]string {
	env := map[string]string{}
	for _, c := range p.Spec.Containers {
		if c.Name != "sandbox" {
			continue
		}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
	}
	return env
}

// waitFor polls cond (every 50 ms, bounded by limit and 60 tries at least)
// and returns how long it took to hold; the test fails if it never does.
func waitFor(t *testing.T, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		if cond() {
			return time.Since(start)
		}
		if time.Since(start) > limit && i >= 3 {
			t.Fatalf("not within %s (%d tries)", limit, i+1)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
