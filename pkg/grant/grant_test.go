package grant

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/api/apitest"
	"github.com/deerflow-sandbox/provisioner/pkg/config/configtest"
	"github.com/deerflow-sandbox/provisioner/pkg/egress"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// counts records EgressChanged calls.
type counts map[string]int

func (c counts) EgressChanged(op, outcome string) { c[op+" "+outcome]++ }

// setup makes, through the real Manager against a fake clientset (a
// stand-in for the API server), sandbox "al1" of alice in allowlist mode
// and "op1" of alice in open mode (a template), and a Granter over them.
func setup(t *testing.T) (*Granter, *fake.Clientset, counts, *bytes.Buffer) {
	t.Helper()
	cfg := configtest.Load(t, map[string]string{"SANDBOX_EGRESS_MODE": "allowlist", "SANDBOX_EGRESS_ALLOW": "pypi.org",
		"PROVISIONER_API_KEYS": "alice=alice-key-0123456789,bob=bob-key-0123456789"})
	objs := []runtime.Object{&corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-egress-proxy", Namespace: cfg.Namespace},
		Spec: corev1.ServiceSpec{ClusterIP: "10.96.0.99", Ports: []corev1.ServicePort{{Port: 3128, Protocol: corev1.ProtocolTCP}}}},
		&corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: "open", Namespace: cfg.Namespace, Labels: map[string]string{keys.LabelTemplate: "true"},
			Annotations: map[string]string{keys.TemplateEgress: "open"}},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "sandbox", Image: "sandbox"}}}}}}
	for _, np := range resources.SharedPolicies(cfg.Objects()) {
		objs = append(objs, np)
	}
	client := fake.NewClientset(objs...)
	m := sandbox.NewManager(cfg, client)
	ctx := api.WithCaller(context.Background(), api.Caller{Principal: "alice"})
	for id, tmpl := range map[string]string{"al1": "", "op1": "open"} {
		s := apitest.Spec()
		s.ID, s.UserID, s.ThreadID, s.Template, s.Now = id, "u-"+id, "t-"+id, tmpl, time.Now()
		if _, err := m.Create(ctx, s, 0); err != nil {
			t.Fatalf("create %s: %v", id, err)
		}
	}
	var log bytes.Buffer
	c := counts{}
	return New(cfg, client, m, slog.New(slog.NewJSONHandler(&log, nil)), c), client, c, &log
}

// TestGrants: a grant is recorded on the sandbox's Service for its time
// (the proxy reads it there) and answered; granting again extends it; a
// revoke removes it; each is audited and counted.
func TestGrants(t *testing.T) {
	g, client, c, log := setup(t)
	now := time.Date(2026, 11, 28, 10, 0, 0, 0, time.UTC)
	g.now = func() time.Time { return now }
	alice := api.WithCaller(context.Background(), api.Caller{Principal: "alice"})
	in10 := now.Add(10 * time.Minute)

	sb, err := g.Egress(alice, "al1", api.EgressChange{Allow: []string{"granted.test"}, For: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	want := &api.EgressView{Mode: egress.Allowlist, Allow: []string{"pypi.org"}, Grants: []egress.Grant{{Name: "granted.test", Until: &in10}}}
	if diff := cmp.Diff(want, sb.Egress); diff != "" {
		t.Errorf("after a grant (-want +got):\n%s", diff)
	}
	svc, err := client.CoreV1().Services("deer-flow").Get(alice, resources.ServiceName("al1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := egress.DecodeGrants(svc.Annotations[keys.AnnotationEgressGrants]); !cmp.Equal(want.Grants, got) {
		t.Errorf("the Service records %v, want %v", got, want.Grants)
	}
	if sb, err = g.Egress(alice, "al1", api.EgressChange{Allow: []string{"granted.test"}}); err != nil || sb.Egress.Grants[0].Until != nil {
		t.Errorf("a lifetime grant over a timed one: %+v, %v", sb.Egress, err)
	}
	if sb, err = g.Egress(alice, "al1", api.EgressChange{Allow: []string{"granted.test"}, Revoke: true}); err != nil || len(sb.Egress.Grants) != 0 {
		t.Errorf("after the revoke: %+v, %v", sb.Egress, err)
	}
	svc, _ = client.CoreV1().Services("deer-flow").Get(alice, resources.ServiceName("al1"), metav1.GetOptions{})
	if _, ok := svc.Annotations[keys.AnnotationEgressGrants]; ok {
		t.Errorf("the revoke left %q", svc.Annotations[keys.AnnotationEgressGrants])
	}
	if diff := cmp.Diff(counts{"egress-grant ok": 2, "egress-revoke ok": 1}, c); diff != "" {
		t.Errorf("counted (-want +got):\n%s", diff)
	}
	if n := strings.Count(log.String(), `"operation":"egress-`); n != 3 {
		t.Errorf("%d audit records, want 3:\n%s", n, log)
	}
}

// TestGrantRefusals: another principal's sandbox is not found, and nothing
// is written to it; an open sandbox takes no grant (a grant never turns a
// mode into another); a missing sandbox is not found.
func TestGrantRefusals(t *testing.T) {
	g, client, c, _ := setup(t)
	alice := api.WithCaller(context.Background(), api.Caller{Principal: "alice"})
	bob := api.WithCaller(context.Background(), api.Caller{Principal: "bob"})
	for _, tc := range []struct {
		name string
		ctx  context.Context
		id   string
		kind api.Kind
		says string
	}{
		{"bob's grant on alice's sandbox", bob, "al1", api.KindNotFound, "not found"},
		{"a grant to an open sandbox", alice, "op1", api.KindConflict, "open egress mode"},
		{"a grant to no sandbox", alice, "nobody", api.KindNotFound, "not found"},
	} {
		_, err := g.Egress(tc.ctx, tc.id, api.EgressChange{Allow: []string{"evil.test"}})
		if api.KindOf(err) != tc.kind || !strings.Contains(api.DetailOf(err), tc.says) {
			t.Errorf("%s: %v (kind %v), want %v saying %q", tc.name, err, api.KindOf(err), tc.kind, tc.says)
		}
	}
	for _, id := range []string{"al1", "op1"} {
		svc, err := client.CoreV1().Services("deer-flow").Get(alice, resources.ServiceName(id), metav1.GetOptions{})
		if err != nil || svc.Annotations[keys.AnnotationEgressGrants] != "" {
			t.Errorf("%s's Service after the refusals: %v %v", id, svc.Annotations, err)
		}
	}
	if c["egress-grant ok"] != 0 || len(c) == 0 {
		t.Errorf("counted %v, want refusals only", c)
	}
}
