//go:build e2e

package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestStrayPodNeverJoinsAnotherPrincipalsSandbox is issue 29's third
// attack on a real API server and its EndpointSlice controller: alice
// claims px from a warm pool; bob's create of px, given up by its client
// after its Pod was written, left a bare Pod sandbox-px. (The Pod is
// written here as that create writes it, with bob's principal and a token
// of its own: an abort's timing does not replay.) Alice's Service never
// lists bob's Pod; alice gets her sandbox, bob gets 404 and never her URL,
// and bob's destroy removes his stray Pod and nothing of alice's.
func TestStrayPodNeverJoinsAnotherPrincipalsSandbox(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	// default keeps the pools (a reap), granted as to config/'s PingSource.
	f := start(t, ns, map[string]string{"PROVISIONER_API_KEYS": "alice=" + aliceKey + ",bob=" + bobKey,
		"PROVISIONER_PRINCIPAL_OPERATIONS": "default=create,get,list,destroy,pause,resume,reap,templates,capabilities"})
	warmUp(t, f, ns, "warm", 1)
	alice, bob := keyHeader(aliceKey), keyHeader(bobKey)
	create := door{name: "create px", method: "POST", path: "/api/sandboxes", body: `{"sandbox_id":"px","template":"warm","user_id":"alice-user"}`}
	get := door{name: "get px", method: "GET", path: "/api/sandboxes/px"}
	r := as(t, f, alice, create)
	expectCode(t, r, 200, "alice's pooled create")
	if r.Body["pooled"] != true {
		t.Fatalf("alice's create was not served from the pool: %s", r.Raw)
	}
	url := r.Body["sandbox_url"]
	claimed := pods(t, ns, keys.LabelID+"=px")
	if len(claimed) != 1 {
		t.Fatalf("%d Pods of px after alice's claim", len(claimed))
	}
	ctx := context.Background()
	stray := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: resources.PodName("px"), Namespace: ns,
			Labels: map[string]string{keys.LabelApp: keys.LabelAppValue, keys.LabelID: "px", keys.LabelManagedBy: keys.ManagedByValue,
				keys.LabelPrincipal: resources.PrincipalLabelValue("bob"), keys.LabelToken: "0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b"},
			Annotations: map[string]string{keys.AnnotationPrincipal: "bob", keys.AnnotationUserID: "bob-user", keys.AnnotationThreadID: "px"}},
		Spec: *claimed[0].Spec.DeepCopy(),
	}
	stray.Spec.NodeName = ""
	if _, err := client().CoreV1().Pods(ns).Create(ctx, stray, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "bob's stray Pod Ready", func() (bool, error) {
		p, err := client().CoreV1().Pods(ns).Get(ctx, stray.Name, metav1.GetOptions{})
		return err == nil && ready(p), err
	})
	// The slice controller has seen the stray once it is Ready; for a few
	// seconds more, alice's slice lists her Pod and never his.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		eps, err := client().DiscoveryV1().EndpointSlices(ns).List(ctx, metav1.ListOptions{LabelSelector: discoveryv1.LabelServiceName + "=" + resources.ServiceName("px")})
		if err != nil {
			t.Fatal(err)
		}
		var listed []string
		for _, s := range eps.Items {
			for _, e := range s.Endpoints {
				if e.TargetRef != nil {
					listed = append(listed, e.TargetRef.Name)
				}
			}
		}
		if !slicesEqual(listed, []string{claimed[0].Name}) {
			t.Fatalf("alice's Service lists %v, want her claimed Pod %s alone", listed, claimed[0].Name)
		}
		time.Sleep(250 * time.Millisecond)
	}
	r = as(t, f, alice, get)
	expectCode(t, r, 200, "alice's get beside bob's stray")
	if r.Body["sandbox_url"] != url {
		t.Errorf("alice's URL changed from %v to %v", url, r.Body["sandbox_url"])
	}
	if r := as(t, f, bob, get); r.Code != 404 {
		t.Errorf("bob's get of px: %d %s, want 404", r.Code, r.Raw)
	}
	expectCode(t, as(t, f, bob, door{name: "delete px", method: "DELETE", path: "/api/sandboxes/px"}), 200, "bob's destroy")
	if _, err := client().CoreV1().Services(ns).Get(ctx, resources.ServiceName("px"), metav1.GetOptions{}); err != nil {
		t.Errorf("alice's Service after bob's destroy: %v", err)
	}
	eventually(t, 30*time.Second, "bob's stray Pod gone", func() (bool, error) {
		for _, p := range pods(t, ns, keys.LabelID+"=px") {
			if p.Name == stray.Name && p.DeletionTimestamp == nil {
				return false, nil
			}
		}
		return true, nil
	})
	if got := pods(t, ns, keys.LabelID+"=px"); !slices.ContainsFunc(got, func(p corev1.Pod) bool { return p.Name == claimed[0].Name && p.DeletionTimestamp == nil }) {
		t.Errorf("alice's claimed Pod after bob's destroy: %v", got)
	}
	expectCode(t, as(t, f, alice, get), 200, "alice's get after bob's destroy")
}

func slicesEqual(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// TestSandboxFromBeforeTokensKeepsItsURL (issue 29, item 3) on the real
// node: a sandbox made before tokens (here: one made now, then edited to
// what an older function left, Pod without a token and a Service
// selecting the id alone; a stand-in for running the older release) is
// reached at its URL; the next create of it, as DeerFlow sends on every
// reuse, gives it a token and its Service selects by it, in place: the
// same URL and node port, and the sandbox still answers there.
func TestSandboxFromBeforeTokensKeepsItsURL(t *testing.T) {
	needRealNode(t)
	ns := namespace(t)
	f := start(t, ns, realEnv(t, ns, map[string]string{"SANDBOX_SERVICE_TYPE": "NodePort", "SANDBOX_INGRESS_NODE_CIDRS": "10.88.0.1/32"}))
	body := map[string]any{"sandbox_id": "pre1", "thread_id": "t1"}
	r := mustDo(t, f, "POST", "/api/sandboxes?wait=20s", body)
	if r.Code != 200 || r.Body["ready"] != true {
		t.Fatalf("create: %d %s", r.Code, r.Raw)
	}
	url, _ := r.Body["sandbox_url"].(string)
	ctx := context.Background()
	pod := runningPod(t, ns, "pre1")
	// That release's Pod owned its Service, not the other way round.
	patched, err := client().CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType,
		[]byte(`{"metadata":{"ownerReferences":null,"labels":{"`+keys.LabelToken+`":null}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := client().CoreV1().Services(ns).Get(ctx, resources.ServiceName("pre1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.OwnerReferences = []metav1.OwnerReference{resources.PodOwnerRef(patched)}
	svc.Spec.Selector = map[string]string{keys.LabelID: "pre1"}
	if svc, err = client().CoreV1().Services(ns).Update(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodePort := svc.Spec.Ports[0].NodePort
	answers(t, url+"/v1/sandbox", pod.Name)

	r = mustDo(t, f, "POST", "/api/sandboxes?wait=20s", body)
	if r.Code != 200 || r.Body["sandbox_url"] != url {
		t.Fatalf("the next create of a sandbox from before tokens: %d %s; want 200 at %s", r.Code, r.Raw, url)
	}
	pod = runningPod(t, ns, "pre1")
	tok := pod.Labels[keys.LabelToken]
	if len(tok) != 32 {
		t.Fatalf("the Pod's token after the next create: %q", tok)
	}
	svc, err = client().CoreV1().Services(ns).Get(ctx, resources.ServiceName("pre1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := svc.Spec.Selector; got[keys.LabelToken] != tok || got[keys.LabelID] != "pre1" || len(got) != 2 {
		t.Errorf("the Service's selector after the next create: %v; want the id and %s", got, tok)
	}
	if svc.Spec.Ports[0].NodePort != nodePort {
		t.Errorf("the node port moved from %d to %d", nodePort, svc.Spec.Ports[0].NodePort)
	}
	answers(t, url+"/v1/sandbox", pod.Name)
}
