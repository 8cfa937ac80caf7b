//go:build e2e

package knative

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// suiteTriggers are the Triggers the tests made, deleted by TestMain.
var suiteTriggers []string

// backendSA is the sender config/450-eventpolicy.yaml allows by default.
const backendSA = "deer-flow-backend"

// brokerAddress is the Broker's ingress URL and the audience its tokens
// must carry (Eventing's OIDC).
func brokerAddress(t *testing.T) (url, audience string) {
	t.Helper()
	u, err := dyn.Resource(brokers).Namespace(ns).Get(context.Background(), "default", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	url, _, _ = unstructured.NestedString(u.Object, "status", "address", "url")
	audience, _, _ = unstructured.NestedString(u.Object, "status", "address", "audience")
	if url == "" || audience == "" {
		t.Fatalf("the Broker has no address (%q) or audience (%q): is authentication-oidc on?", url, audience)
	}
	return url, audience
}

// tokenFor is a token of ServiceAccount sa for audience, as a Pod of that
// ServiceAccount gets one (a projected token).
func tokenFor(t *testing.T, sa, audience string) string {
	t.Helper()
	ctx := context.Background()
	_, err := kube.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	tr, err := kube.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// postEvent sends a binary-mode CloudEvent to the Broker from a Pod running
// as ServiceAccount sa (labelled as DeerFlow's backend), with that
// ServiceAccount's token for the Broker, and returns the ingress's status.
// As a sender should, it retries a 5xx for a while: right after the Broker
// reports Ready its channel may not yet take the ingress's deliveries.
func postEvent(t *testing.T, sa, ceType, data string, ext map[string]string) int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		code := postEventOnce(t, sa, ceType, data, ext)
		if code < 500 || time.Now().After(deadline) {
			return code
		}
		t.Logf("the Broker answered %d to %s; retrying", code, ceType)
		time.Sleep(2 * time.Second)
	}
}

func postEventOnce(t *testing.T, sa, ceType, data string, ext map[string]string) int {
	t.Helper()
	url, audience := brokerAddress(t)
	pod := backendPod(t, "sender-"+sa, sa)
	headers := map[string]string{
		"Authorization":  "Bearer " + tokenFor(t, sa, audience),
		"Content-Type":   "application/json",
		"Ce-Specversion": "1.0",
		"Ce-Type":        ceType,
		"Ce-Source":      "/test/knative/" + sa,
		"Ce-Id":          fmt.Sprintf("%s-%d", sa, time.Now().UnixNano()),
	}
	for k, v := range ext {
		headers["Ce-"+k] = v
	}
	action, _ := json.Marshal(map[string]any{"op": "http", "url": url, "method": http.MethodPost, "headers": headers, "body": data, "timeout_ms": 60000})
	var res struct {
		OK            bool
		Error, Output string
	}
	raw := execInPod(t, pod, string(action))
	if err := json.Unmarshal([]byte(raw), &res); err != nil || !res.OK {
		t.Fatalf("POST to the Broker from %s: %s", pod.Name, raw)
	}
	var code int
	if _, err := fmt.Sscan(res.Output, &code); err != nil {
		t.Fatalf("POST to the Broker: %q", res.Output)
	}
	return code
}

// receiver is a CloudEvent subscriber on this machine (the node), on the
// node's address so the Broker's filter reaches it from its Pod.
type receiver struct {
	URL    string
	mu     sync.Mutex
	events []http.Header
	bodies []string
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	ln, err := net.Listen("tcp", nodeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	r := &receiver{URL: "http://" + ln.Addr().String() + "/"}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(io.LimitReader(req.Body, 1<<20))
		r.mu.Lock()
		r.events, r.bodies = append(r.events, req.Header.Clone()), append(r.bodies, string(body))
		r.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return r
}

// seen returns the body of the first event of type ceType with subject
// (any subject when ""), or "".
func (r *receiver) seen(ceType, subject string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, h := range r.events {
		if h.Get("Ce-Type") == ceType && (subject == "" || h.Get("Ce-Subject") == subject) {
			return r.bodies[i]
		}
	}
	return ""
}

// trigger creates a Trigger on the Broker and waits until it is Ready.
func trigger(t *testing.T, name string, filter map[string]any, subscriber map[string]any) {
	t.Helper()
	ctx := context.Background()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "eventing.knative.dev/v1", "kind": "Trigger",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec":     map[string]any{"broker": "default", "filter": map[string]any{"attributes": filter}, "subscriber": subscriber},
	}}
	if _, err := dyn.Resource(triggers).Namespace(ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Deleted when the suite ends, not when the test does: Eventing v0.50's
	// in-memory channel keeps a deleted Trigger's subscriber, the filter
	// answers it 404, and the channel's synchronous fan-out retries that
	// ten times with backoff (about 200 s) on every later event.
	suiteTriggers = append(suiteTriggers, name)
	eventually(t, 2*time.Minute, "Trigger "+name+" Ready", func() (bool, error) {
		got, err := dyn.Resource(triggers).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		ok, why := ready(got)
		return ok, fmt.Errorf("%s", why)
	})
}

// requestsTotal reads the function's requests_total for one series from
// /metrics through the route (every replica is asked until one has it;
// with one replica that is the one).
func requestsTotal(t *testing.T, operation, transport, code string) float64 {
	t.Helper()
	var total float64
	for _, p := range functionPods(t) {
		resp, err := http.Get("http://" + p.Status.PodIP + ":8080/metrics")
		if err != nil {
			t.Fatalf("metrics of %s: %v", p.Name, err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := fmt.Sprintf(`sandbox_provisioner_requests_total{code="%s",operation="%s",transport="%s"} `, code, operation, transport)
		for _, l := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(l, want); ok {
				var f float64
				_, _ = fmt.Sscan(v, &f)
				total += f
			}
		}
	}
	return total
}

// TestTriggersCarryOIDCTokens: an event posted to the Broker reaches the
// function through its Trigger with the token Eventing mints for that
// Trigger's ServiceAccount (subscriber.audience), is accepted, and the
// reply event goes back into the Broker, where a test subscriber sees it.
// A Trigger whose ServiceAccount the function does not allow is refused
// with 403, in the function's log and metrics.
func TestTriggersCarryOIDCTokens(t *testing.T) {
	need(t)
	rcv := newReceiver(t)
	trigger(t, "test-reply-watcher", map[string]any{"type": "dev.deerflow.sandbox.listed"}, map[string]any{"uri": rcv.URL})

	// Keep the function warm so the log below is one Pod's.
	call(t, http.MethodGet, "/api/sandboxes", nil)
	if code := postEvent(t, backendSA, "dev.deerflow.sandbox.list", `{}`, nil); code != http.StatusAccepted {
		t.Fatalf("the Broker answered %d to the allowed sender's list event, want 202", code)
	}
	var reply string
	eventually(t, 60*time.Second, "the function's reply (dev.deerflow.sandbox.listed) back through the Broker", func() (bool, error) {
		reply = rcv.seen("dev.deerflow.sandbox.listed", "")
		return reply != "", nil
	})
	var listed struct {
		Count *int `json:"count"`
	}
	if err := json.Unmarshal([]byte(reply), &listed); err != nil || listed.Count == nil {
		t.Errorf("reply data %q is not a list answer", reply)
	}
	// The function saw the Trigger's identity (the principal of the
	// audit line), not a key.
	listSubject := "system:serviceaccount:" + ns + ":sandbox-provisioner-list-oidc-eventing.knative.dev-trigger"
	if logs := functionLogsNaming(t, listSubject, 30*time.Second); !strings.Contains(logs, listSubject) {
		t.Errorf("the function's log never names the list Trigger's identity %s", listSubject)
	}

	// A Trigger the function was never told about: Eventing mints its
	// token all the same, and the function refuses it.
	before := requestsTotal(t, "list", "cloudevent", "403")
	// (A list, which the shipped list Trigger answers 200 as well: an
	// answer Eventing retries, such as a 404, would hold the channel.)
	trigger(t, "test-intruder", map[string]any{"type": "dev.deerflow.sandbox.list", "testcase": "intruder"},
		map[string]any{"ref": map[string]any{"apiVersion": "serving.knative.dev/v1", "kind": "Service", "name": "sandbox-provisioner"}, "audience": "sandbox-provisioner"})
	// The in-memory channel fans out synchronously, so the sender hears
	// the intruder's refusal as a failed delivery (5xx) even though the
	// shipped list Trigger's delivery succeeded: only its log and metrics
	// tell who refused what.
	code := postEventOnce(t, backendSA, "dev.deerflow.sandbox.list", `{}`, map[string]string{"Testcase": "intruder"})
	t.Logf("the Broker answered %d to the event both list Triggers match", code)
	intruder := "system:serviceaccount:" + ns + ":test-intruder-oidc-eventing.knative.dev-trigger"
	eventually(t, 60*time.Second, "the function refuses the unlisted Trigger with 403 (log and metrics)", func() (bool, error) {
		logged := false
		for _, l := range strings.Split(functionLogs(t), "\n") {
			if strings.Contains(l, "event refused") && strings.Contains(l, `"status":403`) && strings.Contains(l, intruder) {
				logged = true
			}
		}
		after := requestsTotal(t, "list", "cloudevent", "403")
		return logged && after > before, fmt.Errorf("logged %v, requests_total{list,cloudevent,403} %v → %v", logged, before, after)
	})
}

// TestEventPolicyRefusesOtherSenders: only the ServiceAccounts
// config/450-eventpolicy.yaml names may send into the Broker; a Pod with
// another ServiceAccount posting a destroy is refused at the Broker's
// ingress, and the sandbox stays.
func TestEventPolicyRefusesOtherSenders(t *testing.T) {
	need(t)
	const id = "policy0000target"
	destroyLater(t, id)
	// Made through the Broker too, so that it belongs to the Triggers'
	// principal (events), which the destroy below acts as.
	if code := postEvent(t, backendSA, "dev.deerflow.sandbox.create", `{"sandbox_id":"`+id+`"}`, nil); code != http.StatusAccepted {
		t.Fatalf("the Broker answered %d to the backend's create, want 202", code)
	}
	eventually(t, 60*time.Second, "the sandbox created by the backend's event", func() (bool, error) {
		l, err := kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sandboxSel + ",sandbox-id=" + id})
		return err == nil && len(l.Items) == 1, err
	})
	if code := postEvent(t, "not-the-backend", "dev.deerflow.sandbox.destroy", `{"sandbox_id":"`+id+`"}`, nil); code != http.StatusForbidden {
		t.Errorf("the Broker answered %d to a sender the EventPolicy does not name, want 403", code)
	}
	time.Sleep(3 * time.Second)
	if l, err := kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sandboxSel + ",sandbox-id=" + id}); err != nil || len(l.Items) != 1 {
		t.Fatalf("after the refused destroy: %v Pods (%v), want the sandbox still there", len(l.Items), err)
	}
	// The named sender may.
	if code := postEvent(t, backendSA, "dev.deerflow.sandbox.destroy", `{"sandbox_id":"`+id+`"}`, nil); code != http.StatusAccepted {
		t.Errorf("the Broker answered %d to the backend's destroy, want 202", code)
	}
	eventually(t, 60*time.Second, "the sandbox destroyed by the backend's event", func() (bool, error) {
		l, err := kube.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{LabelSelector: sandboxSel + ",sandbox-id=" + id})
		return err == nil && len(l.Items) == 0, fmt.Errorf("%d Pods (%v)", len(l.Items), err)
	})
}

// TestPingSourceReaps: with a schedule in seconds, the PingSource's event
// (with its own token) reaches the function through Eventing and an
// expired sandbox is removed.
func TestPingSourceReaps(t *testing.T) {
	need(t)
	ctx := context.Background()
	u, err := dyn.Resource(pingSrcs).Namespace(ns).Get(ctx, "sandbox-reaper", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	old, _, _ := unstructured.NestedString(u.Object, "spec", "schedule")
	setSchedule := func(s string) {
		raw, _ := json.Marshal(map[string]any{"spec": map[string]any{"schedule": s}})
		if _, err := dyn.Resource(pingSrcs).Namespace(ns).Patch(ctx, "sandbox-reaper", types.MergePatchType, raw, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	const id = "reaped0000byping"
	destroyLater(t, id)
	expectCode(t, call(t, http.MethodPost, "/api/sandboxes", map[string]any{"sandbox_id": id, "idle_timeout_seconds": 1}), http.StatusOK, "create")
	setSchedule("*/5 * * * * *")
	t.Cleanup(func() { setSchedule(old) })
	eventually(t, 90*time.Second, "the expired sandbox reaped", func() (bool, error) {
		l, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sandboxSel + ",sandbox-id=" + id})
		if err != nil {
			return false, err
		}
		return len(l.Items) == 0, fmt.Errorf("%d Pods left", len(l.Items))
	})
	pinger := "system:serviceaccount:" + ns + ":sandbox-reaper-oidc-sources.knative.dev-pingsource"
	if logs := functionLogsNaming(t, pinger, 30*time.Second); !strings.Contains(logs, pinger) {
		t.Errorf("the function's log never names the PingSource's identity %s", pinger)
	}
}
