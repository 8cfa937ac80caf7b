package pool

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clienttesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// TestManagerServesFromThePool drives sandbox.Manager with a pool over a
// fake clientset: a create claims the Ready pooled Pod and gives it a
// Service; get, list, a create again and destroy treat it as the sandbox;
// the other pooled Pod is no sandbox; a request the pool cannot serve, or
// one with the pool empty, starts cold.
func TestManagerServesFromThePool(t *testing.T) {
	t.Setenv("SANDBOX_SERVICE_TYPE", "ClusterIP")
	t.Setenv("SANDBOX_NETWORK_POLICY", "false")
	cfg := testConfig(t)
	tmpl := pooled(t, cfg, 2)
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "warm", Namespace: ns, UID: tmpl.UID, Labels: map[string]string{template.Label: "true"},
			Annotations: map[string]string{template.AnnotationPoolSize: "2", template.AnnotationDeerFlowMounts: "false"}},
		Template: tmpl.Pod,
	}
	cs := clientset(pt, poolPod(cfg, tmpl, "sandbox-pool-warm-aaaaa", true), poolPod(cfg, tmpl, "sandbox-pool-warm-bbbbb", false))
	var c counts
	p := newPool(cfg, cs, &c, tmpl)
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(p))
	ctx := sandbox.WithCaller(context.Background(), sandbox.Caller{Principal: "alice"})
	spec := func(id string, mutate func(*sandbox.CreateRequest)) sandbox.Spec {
		req := sandbox.CreateRequest{SandboxID: id, Template: "warm"}
		if mutate != nil {
			mutate(&req)
		}
		s, err := req.Validate(cfg, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return s
	}

	sb, err := m.Create(ctx, spec("abc", nil), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !sb.Pooled || sb.URL == "" || sb.Status != "Running" {
		t.Fatalf("create: %+v; want a pooled, Running sandbox with a URL", sb)
	}
	claimed, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-pool-warm-aaaaa", metav1.GetOptions{})
	if err != nil || claimed.Annotations[sandbox.AnnotationPrincipal] != "alice" || claimed.Labels[sandbox.LabelPrincipal] != sandbox.PrincipalLabelValue("alice") {
		t.Fatalf("claimed Pod: %v %v; want it to record its principal alice", err, claimed.ObjectMeta)
	}
	// Another principal does not see it, nor can it take the id.
	bob := sandbox.WithCaller(context.Background(), sandbox.Caller{Principal: "bob"})
	if _, err := m.Get(bob, "abc", 0); sandbox.KindOf(err) != sandbox.KindNotFound {
		t.Errorf("get by another principal: %v; want not found", err)
	}
	if _, err := m.Create(bob, spec("abc", nil), 0); sandbox.KindOf(err) != sandbox.KindConflict {
		t.Errorf("create of the id by another principal: %v; want a conflict", err)
	}
	svc, err := cs.CoreV1().Services(ns).Get(ctx, "sandbox-abc-svc", metav1.GetOptions{})
	if err != nil || len(svc.OwnerReferences) != 1 || svc.OwnerReferences[0].Name != "sandbox-pool-warm-aaaaa" {
		t.Fatalf("Service: %v %+v; want owned by the claimed Pod", err, svc)
	}
	if got, err := m.Get(ctx, "abc", 0); err != nil || !got.Pooled || got.URL != sb.URL {
		t.Errorf("get: %+v %v", got, err)
	}
	again, err := m.Create(ctx, spec("abc", nil), 0)
	if err != nil || again.URL != sb.URL || !again.Pooled {
		t.Errorf("create again: %+v %v; want the same sandbox", again, err)
	}
	list, err := m.List(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "abc" {
		t.Errorf("list: %+v %v; want only abc (the unclaimed pooled Pod is no sandbox)", list, err)
	}
	// Nothing Ready left: cold, in the same call.
	cold, err := m.Create(ctx, spec("def", nil), 0)
	if err != nil || cold.Pooled {
		t.Errorf("create with the pool empty: %+v %v; want a cold sandbox", cold, err)
	}
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-def", metav1.GetOptions{}); err != nil {
		t.Errorf("cold Pod: %v", err)
	}
	// A request the pool cannot serve: cold, counted as a miss.
	shells, err := m.Create(ctx, spec("ghi", func(r *sandbox.CreateRequest) { n := 2; r.MaxShellSessions = &n }), 0)
	if err != nil || shells.Pooled {
		t.Errorf("create with max_shell_sessions: %+v %v; want cold", shells, err)
	}
	if err := m.Destroy(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, "sandbox-pool-warm-aaaaa", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("claimed Pod after destroy: %v; want gone", err)
	}
	if _, err := m.Get(ctx, "abc", 0); sandbox.KindOf(err) != sandbox.KindNotFound {
		t.Errorf("get after destroy: %v; want not found", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m["warm/hit"] != 1 || c.m["warm/empty"] != 1 || c.m["warm/miss"] != 1 {
		t.Errorf("observed %v; want one hit, one empty, one miss", c.m)
	}
}

// TestClaimWhoseServiceFailsIsUndone: a claimed Pod whose Service cannot be
// made is deleted (a retry, which finds sandboxes by their Pod's name or
// Service, would not find it), and the create fails with a transient error.
func TestClaimWhoseServiceFailsIsUndone(t *testing.T) {
	t.Setenv("SANDBOX_SERVICE_TYPE", "ClusterIP")
	t.Setenv("SANDBOX_NETWORK_POLICY", "false")
	cfg := testConfig(t)
	tmpl := pooled(t, cfg, 1)
	pt := &corev1.PodTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "warm", Namespace: ns, UID: tmpl.UID, Labels: map[string]string{template.Label: "true"},
			Annotations: map[string]string{template.AnnotationPoolSize: "1", template.AnnotationDeerFlowMounts: "false"}},
		Template: tmpl.Pod,
	}
	cs := clientset(pt, poolPod(cfg, tmpl, "sandbox-pool-warm-aaaaa", true))
	cs.PrependReactor("create", "services", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewServiceUnavailable("etcd is away")
	})
	var c counts
	m := sandbox.NewManager(cfg, cs, sandbox.WithPool(newPool(cfg, cs, &c, tmpl)))
	s, err := sandbox.CreateRequest{SandboxID: "abc", Template: "warm"}.Validate(cfg, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Create(sandbox.WithCaller(context.Background(), sandbox.Caller{Principal: "alice"}), s, 0); sandbox.KindOf(err) != sandbox.KindUnavailable {
		t.Fatalf("create with the Service refused: %v; want unavailable", err)
	}
	if _, err := cs.CoreV1().Pods(ns).Get(context.Background(), "sandbox-pool-warm-aaaaa", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("claimed Pod without a Service: %v; want deleted", err)
	}
}
