//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	neturl "net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestReadyMeansReachable: on the real node, under gVisor, `ready: true`
// means the sandbox's own backend reaches it at the URL the same answer
// gives, in Headless mode: the URL's name resolves through cluster DNS to
// the Pod itself (the create holds its answer until an EndpointSlice lists
// the Pod, pkg/follow's AwaitName). This node's cluster DNS is a stand-in
// that answers every name alike, so the test resolves the name as CoreDNS
// does, from the Service's EndpointSlices as they are at the answer: a
// name that lists no address yet is a miss. A backend Pod of the sandbox's
// principal (admitted by PROVISIONER_PRINCIPAL_INGRESS) sends one GET
// {sandbox_url}/v1/sandbox the moment each create answers, with no retry,
// 100 creates in a row.
//
// NodePort and ClusterIP modes are not here because it does not hold
// there: their URLs go through kube-proxy, which (v1.36, iptables) waits
// its minSyncPeriod (1 s) after each run, and a new Service is two runs
// (the Service, then its first, empty EndpointSlice, some 10 ms later), so
// an endpoint that appears 1.3 s after the Service (the Pod's address and
// Ready arrive together, in the kubelet's status write after the
// container starts) is programmed some 0.8 s after Ready
// (docs/performance.md, "Where a create's time goes, and Ready against
// reachable"). That other tenants
// cannot reach a sandbox is TestTenantNetwork's.
func TestReadyMeansReachable(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	f := start(t, ns, realEnv(t, ns, map[string]string{
		"SANDBOX_SERVICE_TYPE":          "Headless",
		"PROVISIONER_API_KEYS":          "alice=" + aliceKey,
		"PROVISIONER_PRINCIPAL_INGRESS": "alice=pods:tenant=alice",
	}))
	backend := standInPods(t, ns, map[string]map[string]string{"alice-backend": {"tenant": "alice"}})["alice-backend"]
	alice := map[string]string{"X-API-Key": aliceKey}

	// Two at a time bounds the test's time (a create is about 1.5 s here),
	// and each create's answer then comes while another sandbox starts or
	// goes beside it, as on a shared node.
	const n, workers = 100, 2
	var (
		mu     sync.Mutex
		misses []string
		took   []time.Duration
	)
	var g errgroup.Group
	for w := range workers {
		g.Go(func() error {
			for i := w; i < n; i += workers {
				id := fmt.Sprintf("reach%d", i)
				start := time.Now()
				r, err := f.DoWithHeaders("POST", "/api/sandboxes?wait=20s", map[string]any{"sandbox_id": id, "user_id": id, "thread_id": id}, alice)
				if err != nil || r.Code != 200 || r.Body["ready"] != true {
					return fmt.Errorf("create %s: %v %d %s", id, err, r.Code, r.Raw)
				}
				url, err := resolveHeadless(ns, id, r.Body["sandbox_url"])
				if err != nil {
					return err
				}
				ok, detail := false, "its name listed no address at the answer"
				if url != "" {
					if ok, detail, err = tryExecAt(backend+":8080", map[string]any{"op": "http", "url": url + "/v1/sandbox", "timeout_ms": 2000}); err != nil {
						return err
					}
				}
				mu.Lock()
				took = append(took, time.Since(start))
				if !ok || !strings.HasPrefix(detail, "200 ") {
					misses = append(misses, fmt.Sprintf("%s at %s: %s", id, url, detail))
				}
				mu.Unlock()
				if r, err := f.DoWithHeaders("DELETE", "/api/sandboxes/"+id, nil, alice); err != nil || r.Code != 200 {
					return fmt.Errorf("destroy %s: %v %d %s", id, err, r.Code, r.Raw)
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if len(misses) > 0 {
		t.Errorf("%d of %d first requests from the sandbox's backend right after `ready: true` did not answer 200:\n%s", len(misses), n, strings.Join(misses, "\n"))
	}
	slices.Sort(took)
	t.Logf("%d creates, each answered `ready: true` and then its backend's first request: %v at the median", len(took), took[len(took)/2].Round(time.Millisecond))
}

// resolveHeadless is sandbox id's URL (sandboxURL, its Service's name) with
// the name resolved as cluster DNS resolves a headless Service's: to the
// addresses its EndpointSlices list (all of them: the Service publishes
// not-ready addresses); "" when they list none.
func resolveHeadless(ns, id string, sandboxURL any) (string, error) {
	raw, _ := sandboxURL.(string)
	u, err := neturl.Parse(raw)
	if err != nil || u.Port() == "" {
		return "", fmt.Errorf("sandbox_url %q of %s is not a URL with a port: %v", raw, id, err)
	}
	slices, err := client().DiscoveryV1().EndpointSlices(ns).List(context.Background(), metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + resources.ServiceName(id)})
	if err != nil {
		return "", fmt.Errorf("the EndpointSlices of %s: %w", id, err)
	}
	for _, s := range slices.Items {
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) > 0 {
				u.Host = net.JoinHostPort(ep.Addresses[0], u.Port())
				return u.String(), nil
			}
		}
	}
	return "", nil
}
