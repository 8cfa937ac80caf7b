package sandbox

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// The tests here use client-go's fake clientset as a stand-in for the API
// server (it filters lists by label as the real one does); test/e2e runs
// the same behaviour against a real one, through both doors.

func ownerSpec(id string) api.Spec {
	s := testSpec()
	s.ID, s.Now = id, time.Now()
	return s
}

// auditLines decodes the audit records written to buf.
func auditLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		delete(rec, "time")
		delete(rec, "level")
		delete(rec, "msg")
		delete(rec, "request_id")
		delete(rec, "detail")
		out = append(out, rec)
	}
	buf.Reset()
	return out
}

// TestPrincipalsSeeOnlyTheirOwn: another principal's sandbox is absent to
// get, pause, resume and list, and a destroy of it answers as for an id
// that never existed but leaves it alone; an administrator sees all,
// including sandboxes that record no principal (made before principals).
func TestPrincipalsSeeOnlyTheirOwn(t *testing.T) {
	client := fake.NewClientset()
	var buf bytes.Buffer
	m := NewManager(testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"}), client,
		WithAuditLog(slog.New(slog.NewJSONHandler(&buf, nil))))
	bg := context.Background()
	alice := api.WithCaller(bg, api.Caller{Principal: "alice"})
	bob := api.WithCaller(bg, api.Caller{Principal: "system:serviceaccount:deer-flow:bob"})
	admin := api.WithCaller(bg, api.Caller{Principal: "ops", Admin: true})
	for _, c := range []struct {
		ctx context.Context
		id  string
	}{{alice, "a1"}, {bob, "b1"}} {
		if _, err := m.Create(c.ctx, ownerSpec(c.id), 0); err != nil {
			t.Fatalf("create %s: %v", c.id, err)
		}
	}
	// A sandbox from before principals: no annotation, no label.
	legacy := resources.BuildPod(m.cfg.Objects(), ownerSpec("old1"))
	legacy.CreationTimestamp = metav1.Now() // as the API server stamps it: a young Pod, not a leftover
	if _, err := client.CoreV1().Pods("deer-flow").Create(bg, legacy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := client.CoreV1().Pods("deer-flow").Get(bg, resources.PodName("a1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := client.CoreV1().Services("deer-flow").Get(bg, resources.ServiceName("a1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []metav1.Object{pod, svc} {
		if o.GetAnnotations()[keys.AnnotationPrincipal] != "alice" || o.GetLabels()[keys.LabelPrincipal] != resources.PrincipalLabelValue("alice") {
			t.Errorf("%s does not record its principal: %v %v", o.GetName(), o.GetLabels(), o.GetAnnotations())
		}
	}
	buf.Reset()

	listed := func(ctx context.Context) []string {
		all, err := m.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, s := range all {
			ids = append(ids, s.ID)
		}
		return ids
	}
	// The sandbox from before principals is the default key's, the one
	// credential that could make it then.
	deflt := api.WithCaller(bg, api.Caller{Principal: api.LegacyPrincipal})
	if diff := cmp.Diff(map[string][]string{"alice": {"a1"}, "bob": {"b1"}, "admin": {"a1", "b1", "old1"}, "default": {"old1"}},
		map[string][]string{"alice": listed(alice), "bob": listed(bob), "admin": listed(admin), "default": listed(deflt)}); diff != "" {
		t.Errorf("lists (-want +got):\n%s", diff)
	}

	kinds := map[string]api.Kind{}
	record := func(name string, err error) {
		if err != nil {
			kinds[name] = api.KindOf(err)
		} else {
			kinds[name] = -1
		}
	}
	_, err = m.Get(bob, "a1", 0)
	record("bob gets a1", err)
	_, err = m.Pause(bob, "a1")
	record("bob pauses a1", err)
	_, err = m.Resume(bob, "a1", 0)
	record("bob resumes a1", err)
	record("bob destroys a1", m.Destroy(bob, "a1"))
	record("bob destroys never1", m.Destroy(bob, "never1"))
	_, err = m.Create(bob, ownerSpec("a1"), 0)
	record("bob creates a1", err)
	_, err = m.Get(alice, "old1", 0)
	record("alice gets old1", err)
	_, err = m.Get(deflt, "old1", 0)
	record("default gets old1", err)
	_, err = m.Get(admin, "a1", 0)
	record("admin gets a1", err)
	_, err = m.Get(alice, "a1", 0)
	record("alice gets a1", err)
	_, err = m.Get(bg, "a1", 0)
	record("nobody gets a1", err)
	want := map[string]api.Kind{
		"bob gets a1": api.KindNotFound, "bob pauses a1": api.KindNotFound, "bob resumes a1": api.KindNotFound,
		"bob destroys a1": -1, "bob destroys never1": -1, "bob creates a1": api.KindConflict,
		"alice gets old1": api.KindNotFound, "default gets old1": -1, "admin gets a1": -1, "alice gets a1": -1, "nobody gets a1": api.KindInternal,
	}
	if diff := cmp.Diff(want, kinds); diff != "" {
		t.Errorf("error kinds, -1 for none (-want +got):\n%s", diff)
	}
	if after, err := client.CoreV1().Pods("deer-flow").Get(bg, resources.PodName("a1"), metav1.GetOptions{}); err != nil || after.UID != pod.UID {
		t.Errorf("bob's destroy touched alice's sandbox: %v", err)
	}
	wantAudit := []map[string]any{
		{"audit": "sandbox", "principal": "system:serviceaccount:deer-flow:bob", "admin": false, "operation": "pause", "sandbox_id": "a1", "outcome": "not_found"},
		{"audit": "sandbox", "principal": "system:serviceaccount:deer-flow:bob", "admin": false, "operation": "resume", "sandbox_id": "a1", "outcome": "not_found"},
		{"audit": "sandbox", "principal": "system:serviceaccount:deer-flow:bob", "admin": false, "operation": "destroy", "sandbox_id": "a1", "outcome": "hidden"},
		{"audit": "sandbox", "principal": "system:serviceaccount:deer-flow:bob", "admin": false, "operation": "destroy", "sandbox_id": "never1", "outcome": "absent"},
		{"audit": "sandbox", "principal": "system:serviceaccount:deer-flow:bob", "admin": false, "operation": "create", "sandbox_id": "a1", "outcome": "conflict"},
	}
	if diff := cmp.Diff(wantAudit, auditLines(t, &buf)); diff != "" {
		t.Errorf("audit lines (-want +got):\n%s", diff)
	}

	// The administrator destroys another's sandbox and a legacy one.
	for _, id := range []string{"a1", "old1"} {
		if err := m.Destroy(admin, id); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff([]string{"b1"}, listed(admin)); diff != "" {
		t.Errorf("after the administrator's destroys (-want +got):\n%s", diff)
	}
	wantAudit = []map[string]any{
		{"audit": "sandbox", "principal": "ops", "admin": true, "operation": "destroy", "sandbox_id": "a1", "outcome": "ok"},
		{"audit": "sandbox", "principal": "ops", "admin": true, "operation": "destroy", "sandbox_id": "old1", "outcome": "ok"},
	}
	if diff := cmp.Diff(wantAudit, auditLines(t, &buf)); diff != "" {
		t.Errorf("audit lines (-want +got):\n%s", diff)
	}
}

// TestPerPrincipalQuota: MAX_SANDBOXES_PER_PRINCIPAL counts each
// principal's sandboxes apart; an existing id is never refused.
func TestPerPrincipalQuota(t *testing.T) {
	client := fake.NewClientset()
	var buf bytes.Buffer
	m := NewManager(testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true", "MAX_SANDBOXES_PER_PRINCIPAL": "1"}), client,
		WithAuditLog(slog.New(slog.NewJSONHandler(&buf, nil))))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	alice := api.WithCaller(ctx, api.Caller{Principal: "alice"})
	bob := api.WithCaller(ctx, api.Caller{Principal: "bob"})
	got := map[string]api.Kind{}
	for _, c := range []struct {
		name string
		ctx  context.Context
		id   string
	}{{"alice a1", alice, "a1"}, {"alice a2", alice, "a2"}, {"alice a1 again", alice, "a1"}, {"bob b1", bob, "b1"}} {
		_, err := m.Create(c.ctx, ownerSpec(c.id), 0)
		got[c.name] = -1
		if err != nil {
			got[c.name] = api.KindOf(err)
			if !strings.Contains(api.DetailOf(err), "MAX_SANDBOXES_PER_PRINCIPAL") {
				t.Errorf("%s: detail %q does not name MAX_SANDBOXES_PER_PRINCIPAL", c.name, api.DetailOf(err))
			}
		}
	}
	if diff := cmp.Diff(map[string]api.Kind{"alice a1": -1, "alice a2": api.KindQuota, "alice a1 again": -1, "bob b1": -1}, got); diff != "" {
		t.Errorf("error kinds, -1 for none (-want +got):\n%s", diff)
	}
	pods, err := client.CoreV1().Pods("deer-flow").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	if diff := cmp.Diff([]string{"sandbox-a1", "sandbox-b1"}, names); diff != "" {
		t.Errorf("Pods (-want +got):\n%s", diff)
	}
}
