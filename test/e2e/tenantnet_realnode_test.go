//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/test/framework/realnode"
)

// TestTenantNetwork (issue 45): on the real node, under gVisor, in each
// Service mode, two principals (alice and bob), each with its own backend
// (a Pod labelled tenant=alice or tenant=bob, named as its sources in
// PROVISIONER_PRINCIPAL_INGRESS):
//   - alice's backend reaches alice's sandbox by Pod IP, ClusterIP and node
//     port; bob's backend reaches none of them, and the same the other way;
//   - an unclaimed pooled Pod (wired: a token and a Service of its own)
//     answers neither backend, by Pod IP, its wire's ClusterIP or node port;
//   - once alice claims it, her backend reaches it and bob's does not.
//
// Each target is first shown up from the host (root, which the policy
// agent always admits), so a block is the policies' doing. NodePort mode
// names no node addresses: kube-network-policies judges a connection to a
// node port on the client's own address, before kube-proxy's SNAT, so each
// principal's sources hold there too (docs/tenancy.md says what an agent
// that judges after the SNAT needs).
func TestTenantNetwork(t *testing.T) {
	needRealNode(t)
	for _, mode := range []string{"ClusterIP", "NodePort", "Headless"} {
		t.Run(mode, func(t *testing.T) { tenantNetwork(t, mode) })
	}
}

// target is one way to reach a sandbox or a pooled Pod.
type target struct {
	what, addr, owner string // owner: "alice", "bob" or "" (no one)
}

func tenantNetwork(t *testing.T, mode string) {
	rn := needRealNode(t)
	ns := namespace(t)
	f := start(t, ns, realEnv(t, ns, map[string]string{
		"SANDBOX_SERVICE_TYPE":          mode,
		"PROVISIONER_API_KEYS":          "alice=" + aliceKey + ",bob=" + bobKey,
		"PROVISIONER_PRINCIPAL_INGRESS": "alice=pods:tenant=alice;bob=pods:tenant=bob",
		// The reap (which makes and wires the pool) is granted, as to
		// config/'s PingSource.
		"PROVISIONER_PRINCIPAL_OPERATIONS": "default=create,get,list,destroy,reap,templates,capabilities",
	}))
	as := func(key string) map[string]string { return map[string]string{"X-API-Key": key} }
	create := func(key, id, template string) map[string]any {
		t.Helper()
		body := map[string]any{"sandbox_id": id, "user_id": id, "thread_id": id}
		if template != "" {
			body["template"] = template
		}
		r, err := f.DoWithHeaders("POST", "/api/sandboxes?wait=20s", body, as(key))
		if err != nil || r.Code != 200 {
			t.Fatalf("create %s: %v %d %s", id, err, r.Code, r.Raw)
		}
		return r.Body
	}
	create(aliceKey, "alice1", "")
	create(bobKey, "bob1", "")
	backends := standInPods(t, ns, map[string]map[string]string{
		"alice-backend": {"tenant": "alice"},
		"bob-backend":   {"tenant": "bob"},
	})

	// A warm pool of one, its Pod wired (a reap makes the pool; the next
	// wires the Pod it made).
	putTemplate(t, ns, pooledTemplate("warm", 1, corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: realnode.SandboxImage}}}))
	keepPools(t, f)
	eventually(t, 90*time.Second, "a Ready pooled Pod", func() (bool, error) { return poolReady(t, ns, "warm") == 1, nil })
	// Headless mode wires no pooled Pod (a claim answers with the Pod's own
	// name): there it is reached by Pod IP alone.
	wired := mode != "Headless"
	var pooled corev1.Pod
	eventually(t, 30*time.Second, "the pooled Pod Ready (and wired, but in Headless mode)", func() (bool, error) {
		keepPools(t, f)
		for _, p := range pods(t, ns, poolLabel+"=warm") {
			if (p.Labels[keys.LabelToken] != "" || !wired) && realnode.Ready(&p) {
				pooled = p
				return true, nil
			}
		}
		return false, nil
	})

	var targets []target
	add := func(owner, name string, pod corev1.Pod, svcName string) {
		targets = append(targets, target{name + " by Pod IP", net.JoinHostPort(pod.Status.PodIP, "8080"), owner})
		if svcName == "" {
			return
		}
		svc := serviceNamed(t, ns, svcName)
		if svc.Spec.ClusterIP != "" && svc.Spec.ClusterIP != corev1.ClusterIPNone {
			targets = append(targets, target{name + " by ClusterIP", net.JoinHostPort(svc.Spec.ClusterIP, strconv.Itoa(int(svc.Spec.Ports[0].Port))), owner})
		}
		if svc.Spec.Type == corev1.ServiceTypeNodePort {
			targets = append(targets, target{name + " by node port", net.JoinHostPort(rn.HostIP, strconv.Itoa(int(svc.Spec.Ports[0].NodePort))), owner})
		}
	}
	add("alice", "alice's sandbox", runningPod(t, ns, "alice1"), resources.ServiceName("alice1"))
	add("bob", "bob's sandbox", runningPod(t, ns, "bob1"), resources.ServiceName("bob1"))
	wire := ""
	if wired {
		wire = resources.WireName(&pooled)
	}
	add("", "an unclaimed pooled Pod", pooled, wire)
	if want := map[string]int{"ClusterIP": 6, "NodePort": 9, "Headless": 3}[mode]; len(targets) != want {
		t.Fatalf("%d targets in %s mode, want %d: %+v", len(targets), mode, want, targets)
	}

	var table strings.Builder
	fmt.Fprintf(&table, "\n%s mode, who reaches whose sandbox:\n| from | to | expected | observed | from the host (control) |\n|---|---|---|---|---|\n", mode)
	// probe checks every target from both backends: first that each
	// answers the host (the control, once kube-proxy has programmed its
	// Service), then the rows that must be blocked, eight at once (each
	// waits out its connect timeout), then those that must reach it.
	probe := func(tgs []target) {
		t.Helper()
		for _, tg := range tgs {
			answers(t, "http://"+tg.addr+"/v1/sandbox", "")
		}
		type row struct {
			tg  target
			who string
		}
		var blocked []row
		for _, tg := range tgs {
			for _, who := range []string{"alice", "bob"} {
				if tg.owner != who {
					blocked = append(blocked, row{tg, who})
				}
			}
		}
		seen := execAll(t, len(blocked), func(i int) (string, map[string]any) {
			return backends[blocked[i].who+"-backend"], connect(blocked[i].tg.addr)
		})
		next := 0 // blocked's rows come in this loop's order
		for _, tg := range tgs {
			for _, who := range []string{"alice", "bob"} {
				want := tg.owner == who
				var ok bool
				var detail string
				if want {
					// A new policy or label is in force within moments.
					eventually(t, 10*time.Second, who+"'s backend reaches "+tg.what, func() (bool, error) {
						ok, detail = execAt(t, net.JoinHostPort(backends[who+"-backend"], "8080"), connect(tg.addr))
						return ok, fmt.Errorf("%s", detail)
					})
				} else {
					ok, detail = seen[next].ok, seen[next].detail
					next++
				}
				fmt.Fprintf(&table, "| %s's backend | %s | %s | %s | reached |\n", who, tg.what, word(want), word(ok))
				if ok != want {
					t.Errorf("%s's backend → %s (%s): %s (%s), want %s", who, tg.what, tg.addr, word(ok), detail, word(want))
				}
			}
		}
	}
	probe(targets)

	// alice claims the pooled Pod: it is hers now, by every way to it.
	claimed := create(aliceKey, "alice2", "warm")
	if claimed["pooled"] != true {
		t.Fatalf("alice's create of the pooled template answered %v; want the pooled Pod claimed", claimed)
	}
	var again []target
	for _, tg := range targets {
		if tg.owner == "" {
			tg.owner, tg.what = "alice", strings.Replace(tg.what, "an unclaimed pooled Pod", "the pooled Pod alice claimed", 1)
			again = append(again, tg)
		}
	}
	probe(again)
	t.Log(table.String())
}

// serviceNamed reads the Service name of ns.
func serviceNamed(t *testing.T, ns, name string) *corev1.Service {
	t.Helper()
	svc, err := client().CoreV1().Services(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("Service %s: %v", name, err)
	}
	return svc
}
