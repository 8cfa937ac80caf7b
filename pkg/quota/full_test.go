package quota

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestFull (issue 45, "a principal at its limit writes nothing"): with its
// Service cache running, the counter refuses a create before any write
// when settled sandboxes already fill a limit, and only then: room, an id
// that exists, a limit full of racing (young) creates, and a cache not
// running all leave the decision to the slot's count (Check). It writes
// nothing.
func TestFull(t *testing.T) {
	svc := func(id, principal string, age time.Duration) runtime.Object {
		s := api.Spec{ID: id, UserID: "u-" + id, ThreadID: "t", Caller: api.Caller{Principal: principal}}
		svc := resources.BuildService(testConfig(t, nil).Objects(), s, resources.PodOwnerRef(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: resources.PodName(id), UID: types.UID("pod-" + id)}}))
		resources.RecordPrincipal(svc, s)
		svc.CreationTimestamp = metav1.NewTime(time.Now().Add(-age))
		return svc
	}
	bobsTwo := []runtime.Object{svc("b1", "bob", time.Hour), svc("b2", "bob", time.Hour), svc("a1", "alice", time.Hour)}
	spec := func(id, principal string) api.Spec {
		return api.Spec{ID: id, UserID: "u-" + id, ThreadID: "t", Caller: api.Caller{Principal: principal}}
	}
	tests := []struct {
		name    string
		quota   config.QuotaConfig
		objs    []runtime.Object
		spec    api.Spec
		stopped bool // the cache never runs
		want    string
	}{
		{name: "bob at his limit", quota: config.QuotaConfig{MaxSandboxesPerPrincipal: 2}, objs: bobsTwo, spec: spec("b3", "bob"), want: "principal"},
		{name: "the total at its limit", quota: config.QuotaConfig{MaxSandboxes: 3}, objs: bobsTwo, spec: spec("c1", "carol"), want: "total"},
		{name: "alice has room", quota: config.QuotaConfig{MaxSandboxesPerPrincipal: 2}, objs: bobsTwo, spec: spec("a2", "alice")},
		{name: "bob's existing sandbox again", quota: config.QuotaConfig{MaxSandboxesPerPrincipal: 2}, objs: bobsTwo, spec: spec("b1", "bob")},
		{name: "full of racing creates: the slot decides", quota: config.QuotaConfig{MaxSandboxesPerPrincipal: 2},
			objs: []runtime.Object{svc("b1", "bob", time.Hour), svc("b2", "bob", 0)}, spec: spec("b3", "bob")},
		{name: "no cache: the slot decides", quota: config.QuotaConfig{MaxSandboxesPerPrincipal: 2}, objs: bobsTwo, spec: spec("b3", "bob"), stopped: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.objs...)
			c := New(tc.quota, "deer-flow", client)
			if !tc.stopped {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				c.Run(ctx)
				if !c.Synced(ctx, 5*time.Second) {
					t.Fatal("the Service cache did not sync")
				}
			}
			calls := len(client.Actions())
			err := c.Full(context.Background(), tc.spec)
			var qe *Error
			got := ""
			if errors.As(err, &qe) {
				got = qe.Scope
				if api.KindOf(err) != api.KindQuota {
					t.Errorf("refusal of kind %v, want KindQuota", api.KindOf(err))
				}
			} else if err != nil {
				t.Fatalf("Full: %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("refused scope (-want +got):\n%s", diff)
			}
			// Over the limit the count asks for the ended Pods (a read);
			// nothing is ever written.
			for _, a := range client.Actions()[calls:] {
				if v := a.GetVerb(); v != "list" && v != "watch" {
					t.Errorf("Full made a %s of %s", v, a.GetResource().Resource)
				}
			}
		})
	}
}
