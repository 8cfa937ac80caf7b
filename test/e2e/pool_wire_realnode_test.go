//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/function"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// TestRealPoolClaimIsWired (issue 32), on the real node, NodePort mode as
// deployed (the node's bridge address admitted, SANDBOX_INGRESS_NODE_CIDRS):
//   - the reap wires the warm pool's Pod: a token of its own, and its wire,
//     a NodePort Service that answers from the Pod before any claim;
//   - attack rows: that unclaimed Pod, by its Pod IP and by its wire's
//     NodePort, is reached by no one, the backend included (a pooled Pod
//     answers no one until it is claimed): not from the backend, another
//     sandbox, a bystander Pod, nor a host outside the cluster; once
//     claimed, the backend reaches it;
//   - DeerFlow's own recorded anonymous create (no template: the pooled
//     "default") claims it, and the first poll DeerFlow's backend makes
//     (remote_backend.py's wait_for_sandbox_ready: GET
//     {sandbox_url}/v1/sandbox with a 5 s timeout, then a 1 s sleep) is a
//     200 from that Pod: sandbox_url is the wire's, and the claim changed
//     no endpoint (the wire and its EndpointSlice are as they were).
func TestRealPoolClaimIsWired(t *testing.T) {
	rn := needRealNode(t)
	ns := namespace(t)
	f := start(t, ns, realEnv(t, ns, map[string]string{"SANDBOX_SERVICE_TYPE": "NodePort", "SANDBOX_INGRESS_NODE_CIDRS": "10.88.0.1/32"}))
	ctx := context.Background()

	// The attacker first, from the built-in default template (no pool yet).
	expectCode(t, mustDo(t, f, "POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": "attacker"}), 200, "create attacker")
	attacker := runningPod(t, ns, "attacker")

	putTemplate(t, ns, pooledTemplate("default", 1, corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: realnode.SandboxImage}}}))
	keepPools(t, f)
	eventually(t, 90*time.Second, "a Ready pooled Pod on the real node", func() (bool, error) {
		return poolReady(t, ns, "default") == 1, nil
	})
	keepPools(t, f) // wires the Pod the first reap's ReplicaSet made
	var pooled corev1.Pod
	var wire *corev1.Service
	eventually(t, 30*time.Second, "the pooled Pod wired", func() (bool, error) {
		for _, p := range pods(t, ns, poolLabel+"=default") {
			if p.Labels[keys.LabelToken] == "" {
				continue
			}
			w, err := client().CoreV1().Services(ns).Get(ctx, resources.WireName(&p), metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			pooled, wire = p, w
			return true, nil
		}
		return false, nil
	})
	if wire.Spec.Type != corev1.ServiceTypeNodePort || wire.Spec.Ports[0].NodePort == 0 {
		t.Fatalf("wire %s: %+v; want a NodePort Service", wire.Name, wire.Spec)
	}
	wireAddr := net.JoinHostPort(rn.HostIP, strconv.Itoa(int(wire.Spec.Ports[0].NodePort)))
	// The wire answers from the unclaimed Pod (from the host, as root, which
	// the policy agent admits): kube-proxy has programmed it.
	answers(t, "http://"+wireAddr+"/v1/sandbox", pooled.Name)

	ips := standInPods(t, ns, map[string]map[string]string{
		"backend":   {"app.kubernetes.io/name": "deer-flow-backend"},
		"bystander": {"app": "bystander"},
	})
	podAddr := net.JoinHostPort(pooled.Status.PodIP, "8080")
	type probe struct {
		from, at, to, addr string
		reached            bool
	}
	probes := []probe{
		// No principal owns it until a claim: not even the backend.
		{"the backend Pod", net.JoinHostPort(ips["backend"], "8080"), "its Pod IP", podAddr, false},
		{"the backend Pod", net.JoinHostPort(ips["backend"], "8080"), "its wire's NodePort on the node's address", wireAddr, false},
		{"another sandbox", net.JoinHostPort(attacker.Status.PodIP, "8080"), "its Pod IP", podAddr, false},
		{"another sandbox", net.JoinHostPort(attacker.Status.PodIP, "8080"), "its wire's NodePort on the node's address", wireAddr, false},
		{"a bystander Pod", net.JoinHostPort(ips["bystander"], "8080"), "its Pod IP", podAddr, false},
		{"a bystander Pod", net.JoinHostPort(ips["bystander"], "8080"), "its wire's NodePort on the node's address", wireAddr, false},
		{"a host outside the cluster", net.JoinHostPort(realnode.PublicIP, "80"), "its Pod IP", podAddr, false},
		{"a host outside the cluster", net.JoinHostPort(realnode.PublicIP, "80"), "its wire's NodePort on the node's address", wireAddr, false},
	}
	var table strings.Builder
	table.WriteString("\nwho reaches an unclaimed wired pooled Pod:\n| from | to | expected | observed |\n|---|---|---|---|\n")
	for _, p := range probes {
		ok, detail := execAt(t, p.at, connect(p.addr))
		table.WriteString("| " + p.from + " | " + p.to + " | " + word(p.reached) + " | " + word(ok) + " |\n")
		if ok != p.reached {
			t.Errorf("%s → the unclaimed wired Pod's %s (%s): %s (%s), want %s", p.from, p.to, p.addr, word(ok), detail, word(p.reached))
		}
	}
	t.Log(table.String())

	slicesBefore := wireSlices(t, ns, wire.Name)

	// DeerFlow's recorded anonymous create, as its backend sends it.
	rec := function.GoldenRequests(t)[1]
	if rec.Method != "POST" || !strings.Contains(string(rec.Body), `"thread_id": null`) {
		t.Fatalf("the recording's second request is not the anonymous create: %s %s", rec.Method, rec.Body)
	}
	rec.Headers["X-API-Key"] = function.Key
	r, err := f.DoWithHeaders(rec.Method, rec.Path, []byte(rec.Body), rec.Headers)
	if err != nil || r.Code != 200 || r.Body["pooled"] != true {
		t.Fatalf("DeerFlow's anonymous create: %v %d %s; want a pooled sandbox", err, r.Code, r.Raw)
	}
	url, _ := r.Body["sandbox_url"].(string)
	if want := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(int(wire.Spec.Ports[0].NodePort))); url != want {
		t.Errorf("sandbox_url %q, want the wire's %q", url, want)
	}
	began := time.Now()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(url + "/v1/sandbox")
	if err != nil {
		t.Fatalf("DeerFlow's first poll of %s: %v; want a 200 (its next poll would come a second later)", url, err)
	}
	var body strings.Builder
	_, _ = io.Copy(&body, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(body.String(), pooled.Name) {
		t.Fatalf("DeerFlow's first poll of %s: %d %q; want a 200 from %s", url, resp.StatusCode, body.String(), pooled.Name)
	}
	t.Logf("DeerFlow's first poll of %s answered 200 in %s", url, time.Since(began).Round(time.Millisecond))
	// Claimed, it is DeerFlow's: its backend reaches it by Pod IP and wire
	// (the policy agent judges the claim's new labels on the next
	// connection).
	for _, addr := range []string{podAddr, wireAddr} {
		eventually(t, 10*time.Second, "the backend reaches the claimed Pod at "+addr, func() (bool, error) {
			ok, detail := execAt(t, net.JoinHostPort(ips["backend"], "8080"), connect(addr))
			return ok, fmt.Errorf("%s", detail)
		})
	}

	id, _ := r.Body["sandbox_id"].(string)
	svc, err := client().CoreV1().Services(ns).Get(ctx, resources.ServiceName(id), metav1.GetOptions{})
	if err != nil || svc.Spec.ClusterIP != corev1.ClusterIPNone || resources.URLService(svc) != wire.Name {
		t.Errorf("the sandbox's own Service: %v %+v; want headless, naming the wire %s", err, svc, wire.Name)
	}
	after, err := client().CoreV1().Services(ns).Get(ctx, wire.Name, metav1.GetOptions{})
	if err != nil || after.UID != wire.UID || after.ResourceVersion != wire.ResourceVersion {
		t.Errorf("the wire after the claim: %v; want it untouched (UID %s, resourceVersion %s)", err, wire.UID, wire.ResourceVersion)
	}
	if got := wireSlices(t, ns, wire.Name); got != slicesBefore {
		t.Errorf("the wire's EndpointSlices changed with the claim: %s, then %s", slicesBefore, got)
	}
	if g := mustDo(t, f, "GET", "/api/sandboxes/"+id, nil); g.Body["sandbox_url"] != url {
		t.Errorf("get answered %s, want the wire's URL %s", g.Raw, url)
	}

	// The wire deleted by hand: the sandbox has no URL (get writes
	// nothing), and DeerFlow's next create of it (the same request, as its
	// backend sends on every acquire) makes the wire again, through the
	// admission policy, with a new node port that answers from the Pod.
	if err := client().CoreV1().Services(ns).Delete(ctx, wire.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "get to answer without a URL", func() (bool, error) {
		g := mustDo(t, f, "GET", "/api/sandboxes/"+id, nil)
		return g.Code == 200 && g.Body["sandbox_url"] == "", nil
	})
	r, err = f.DoWithHeaders(rec.Method, rec.Path, []byte(rec.Body), rec.Headers)
	if err != nil || r.Code != 200 || r.Body["sandbox_id"] != id {
		t.Fatalf("DeerFlow's create again: %v %d %s; want sandbox %s", err, r.Code, r.Raw, id)
	}
	rewired, err := client().CoreV1().Services(ns).Get(ctx, wire.Name, metav1.GetOptions{})
	if err != nil || rewired.UID == wire.UID || rewired.Spec.Type != corev1.ServiceTypeNodePort {
		t.Fatalf("the wire after the create again: %v %+v; want a new NodePort wire", err, rewired)
	}
	url2, _ := r.Body["sandbox_url"].(string)
	if want := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(int(rewired.Spec.Ports[0].NodePort))); url2 != want {
		t.Errorf("sandbox_url after the create again %q, want the new wire's %q", url2, want)
	}
	answers(t, url2+"/v1/sandbox", pooled.Name)
}

// wireSlices is the wire's EndpointSlices as name@resourceVersion with
// their endpoints, to tell whether anything about them changed.
func wireSlices(t *testing.T, ns, svc string) string {
	t.Helper()
	l, err := client().DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + svc})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, s := range l.Items {
		b.WriteString(s.Name + "@" + s.ResourceVersion + ":")
		for _, e := range s.Endpoints {
			b.WriteString(strings.Join(e.Addresses, ",") + " ")
		}
	}
	return b.String()
}
