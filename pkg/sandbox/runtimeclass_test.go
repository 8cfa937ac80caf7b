package sandbox

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// events records the reasons of the Events a Manager emits.
type events struct {
	mu      sync.Mutex
	reasons []string
}

func (e *events) Eventf(_ runtime.Object, eventtype, reason, _ string, _ ...interface{}) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reasons = append(e.reasons, eventtype+" "+reason)
}

// gauges records the last isolation verdict per check, as the metric does.
type gauges struct {
	nopObserver
	mu  sync.Mutex
	got map[string]bool
}

func (g *gauges) Isolation(check string, inForce bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.got[check] = inForce
}

// TestRuntimeClassFailsClosed: with SANDBOX_RUNTIME_CLASS naming a class the
// cluster lacks, creates are refused with a 5xx naming the setting and
// write nothing (no sandbox falls back to the node's default runtime); the
// metric says so, one Warning Event says it once; once the class exists,
// creates go on under it. The fake clientset stands in for the API server;
// test/e2e runs sandboxes under the real class on the real node.
func TestRuntimeClassFailsClosed(t *testing.T) {
	// As config/ deploys gVisor: without a user namespace (see
	// TestGVisorRefusesUserNamespaces).
	cfg := testConfig(t, map[string]string{"SANDBOX_RUNTIME_CLASS": "gvisor", "SANDBOX_USER_NAMESPACE": "false", "SANDBOX_NETWORK_POLICY_CHECK_TTL": "0s"})
	client := fake.NewClientset(sharedPolicies(cfg)...)
	rec, obs := &events{}, &gauges{got: map[string]bool{}}
	m := NewManager(cfg, client, WithRecorder(rec), WithObserver(obs))
	ctx := api.WithCaller(context.Background(), api.Caller{Principal: "default"})
	create := func(id string) error {
		s := testSpec()
		s.ID = id
		_, err := m.Create(ctx, s, 0)
		return err
	}
	for i := range 2 {
		err := create(fmt.Sprintf("refused%d", i))
		if api.KindOf(err) != api.KindUnavailable || !strings.Contains(api.DetailOf(err), "SANDBOX_RUNTIME_CLASS") || !strings.Contains(api.DetailOf(err), `"gvisor"`) {
			t.Fatalf("create without the class: %v (kind %v), want unavailable naming SANDBOX_RUNTIME_CLASS and the class", err, api.KindOf(err))
		}
	}
	if pods, _ := client.CoreV1().Pods(cfg.Namespace).List(ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Fatalf("a refused create left %d Pods", len(pods.Items))
	}
	if diff := cmp.Diff(map[string]bool{"network_policy": true, "runtime_class": false, "ingress_policy": true}, obs.got); diff != "" {
		t.Errorf("isolation metric (-want +got):\n%s", diff)
	}
	rc := &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}
	if _, err := client.NodeV1().RuntimeClasses().Create(ctx, rc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond) // the TTL is 0: the next create looks again
	if err := create("admitted"); err != nil {
		t.Fatalf("create with the class: %v", err)
	}
	pod, err := client.CoreV1().Pods(cfg.Namespace).Get(ctx, resources.PodName("admitted"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := pod.Spec.RuntimeClassName; got == nil || *got != "gvisor" {
		t.Errorf("the sandbox Pod's runtimeClassName = %v, want gvisor", got)
	}
	want := []string{"Warning RuntimeClassMissing", "Normal IsolationInForce", "Normal SandboxCreated"}
	if diff := cmp.Diff(want, rec.reasons); diff != "" {
		t.Errorf("Events (-want +got):\n%s", diff)
	}
}

// TestGVisorRefusesUserNamespaces: under a class whose handler is gVisor's
// runsc, SANDBOX_USER_NAMESPACE=true makes Pods that never start (runsc's
// gofer cannot join the Pod's user namespace), so creates fail closed
// naming the setting, write nothing, and never drop the user namespace
// unasked; another handler keeps it.
func TestGVisorRefusesUserNamespaces(t *testing.T) {
	tests := []struct {
		name, handler, userNS string
		refused               bool
	}{
		{name: "gVisor with a user namespace: refused", handler: "runsc", userNS: "true", refused: true},
		{name: "gVisor without one: as config/ ships it", handler: "runsc", userNS: "false"},
		{name: "another runtime with a user namespace", handler: "kata", userNS: "true"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, map[string]string{"SANDBOX_RUNTIME_CLASS": "sandboxed", "SANDBOX_USER_NAMESPACE": tc.userNS})
			client := fake.NewClientset(append(sharedPolicies(cfg), &nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "sandboxed"}, Handler: tc.handler})...)
			m := NewManager(cfg, client)
			s := testSpec()
			_, err := m.Create(api.WithCaller(context.Background(), api.Caller{Principal: "default"}), s, 0)
			refused := api.KindOf(err) == api.KindUnavailable && strings.Contains(api.DetailOf(err), "SANDBOX_USER_NAMESPACE")
			if refused != tc.refused || (!tc.refused && err != nil) {
				t.Fatalf("create: %v; want refused naming SANDBOX_USER_NAMESPACE: %v", err, tc.refused)
			}
			pods, _ := client.CoreV1().Pods(cfg.Namespace).List(context.Background(), metav1.ListOptions{})
			if tc.refused && len(pods.Items) != 0 {
				t.Errorf("a refused create left %d Pods", len(pods.Items))
			}
			if !tc.refused {
				if len(pods.Items) != 1 {
					t.Fatalf("%d Pods, want the one sandbox", len(pods.Items))
				}
				hostUsers := pods.Items[0].Spec.HostUsers
				if inUserNS := hostUsers != nil && !*hostUsers; inUserNS != (tc.userNS == "true") {
					t.Errorf("the Pod's hostUsers is %v, not as SANDBOX_USER_NAMESPACE=%s asks", hostUsers, tc.userNS)
				}
			}
		})
	}
}
