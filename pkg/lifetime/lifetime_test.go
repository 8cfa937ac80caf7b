package lifetime

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// found is Manager.Get's part here: it finds every id (ownership is
// re-checked on the workload itself, which this test exercises).
type found struct{}

func (found) Get(_ context.Context, id string, _ time.Duration) (api.Sandbox, error) {
	return api.Sandbox{ID: id}, nil
}

func pod(id, principal string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-" + id, Namespace: "deer-flow",
		Labels: map[string]string{keys.LabelID: id},
		Annotations: map[string]string{
			keys.AnnotationPrincipal:    principal,
			keys.AnnotationCreatedAt:    "2026-11-28T10:00:00Z",
			keys.AnnotationLastActivity: "2026-11-28T10:00:00Z",
			keys.AnnotationIdleTimeout:  "300",
			keys.AnnotationMaxLifetime:  "7200",
			keys.AnnotationExpiresAt:    "2026-11-28T10:05:00Z",
		}}}
}

func TestSetTimeout(t *testing.T) {
	cfg, err := config.Load()
	if err != nil {
		t.Fatal(err)
	}
	client := fake.NewClientset(pod("a1", "alice"), pod("b1", "bob"))
	s := New(cfg, client, found{}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	s.now = func() time.Time { return time.Date(2026, 11, 28, 11, 0, 0, 0, time.UTC) }
	ctx := api.WithCaller(context.Background(), api.Caller{Principal: "alice"})

	cases := []struct {
		name, id string
		d        time.Duration
		kind     api.Kind
		expires  string
		ok       bool
	}{
		{"from now", "a1", 10 * time.Minute, 0, "2026-11-28T11:10:00Z", true},
		{"capped by the lifetime", "a1", 2 * time.Hour, 0, "2026-11-28T12:00:00Z", true},
		{"another's", "b1", time.Minute, api.KindNotFound, "", false},
		{"too short", "a1", 0, api.KindInvalid, "", false},
		{"above the cap", "a1", cfg.MaxIdleTimeout + time.Second, api.KindInvalid, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sb, err := s.SetTimeout(ctx, c.id, c.d)
			if !c.ok {
				if err == nil || api.KindOf(err) != c.kind {
					t.Fatalf("= %v; want an error of kind %v", err, c.kind)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			p, _ := client.CoreV1().Pods("deer-flow").Get(ctx, "sandbox-"+c.id, metav1.GetOptions{})
			got := map[string]string{"answer": sb.ExpiresAt, "expires": p.Annotations[keys.AnnotationExpiresAt],
				"idle": p.Annotations[keys.AnnotationIdleTimeout], "activity": p.Annotations[keys.AnnotationLastActivity]}
			want := map[string]string{"answer": c.expires, "expires": c.expires,
				"idle": map[time.Duration]string{10 * time.Minute: "600", 2 * time.Hour: "7200"}[c.d], "activity": "2026-11-28T11:00:00Z"}
			if d := cmp.Diff(want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
	p, _ := client.CoreV1().Pods("deer-flow").Get(ctx, "sandbox-b1", metav1.GetOptions{})
	if p.Annotations[keys.AnnotationExpiresAt] != "2026-11-28T10:05:00Z" {
		t.Error("alice moved bob's deadline")
	}
}
