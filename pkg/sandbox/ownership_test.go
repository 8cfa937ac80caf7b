package sandbox

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
)

// TestCreateRefusesAnotherPrincipalsData: with two principals, a create
// that names another principal's user_id or thread_id, or omits user_id,
// is refused (KindForbidden, audited as forbidden) before it writes
// anything of the sandbox; the owner's creates go on.
func TestCreateRefusesAnotherPrincipalsData(t *testing.T) {
	client := fake.NewClientset()
	var buf bytes.Buffer
	m := NewManager(testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true",
		"PROVISIONER_API_KEY": "the-default-key-0123456789", "PROVISIONER_API_KEYS": "alice=alice-key-0123456789abcdef,bob=bob-key-0123456789abcdef"}),
		client, WithAuditLog(slog.New(slog.NewJSONHandler(&buf, nil))))
	ctx := func(p string) context.Context {
		return api.WithCaller(context.Background(), api.Caller{Principal: p})
	}
	spec := func(id, user, thread string) api.Spec {
		s := ownerSpec(id)
		s.UserID, s.ThreadID = user, thread
		return s
	}
	if _, err := m.Create(ctx("alice"), spec("own-a1", "u1", "t1"), 0); err != nil {
		t.Fatalf("alice's create: %v", err)
	}
	type outcome struct {
		ID   string
		Kind api.Kind
	}
	var got []outcome
	for _, c := range []struct {
		who string
		s   api.Spec
	}{
		{"bob", spec("own-b1", "u1", "tb")},
		{"bob", spec("own-b2", "ub", "t1")},
		{"bob", spec("own-b3", api.DefaultUserID, "tb3")},
		{"alice", spec("own-a2", "u1", "t2")},
	} {
		_, err := m.Create(ctx(c.who), c.s, 0)
		k := api.Kind(-1)
		if err != nil {
			k = api.KindOf(err)
		}
		got = append(got, outcome{c.s.ID, k})
	}
	want := []outcome{{"own-b1", api.KindForbidden}, {"own-b2", api.KindForbidden}, {"own-b3", api.KindForbidden}, {"own-a2", -1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("creates (-want +got):\n%s", diff)
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pods.Items {
		names = append(names, p.Name)
	}
	svcs, err := client.CoreV1().Services(metav1.NamespaceAll).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range svcs.Items {
		names = append(names, s.Name)
	}
	if diff := cmp.Diff([]string{"sandbox-own-a1", "sandbox-own-a2", "sandbox-own-a1-svc", "sandbox-own-a2-svc"}, names); diff != "" {
		t.Errorf("objects after the refusals (-want +got):\n%s", diff)
	}
	var outcomes []string
	for _, l := range auditLines(t, &buf) {
		outcomes = append(outcomes, l["sandbox_id"].(string)+" "+l["outcome"].(string))
	}
	if diff := cmp.Diff([]string{"own-a1 ok", "own-b1 forbidden", "own-b2 forbidden", "own-b3 forbidden", "own-a2 ok"}, outcomes); diff != "" {
		t.Errorf("audit (-want +got):\n%s", diff)
	}
}
