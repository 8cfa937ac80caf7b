package sandbox

import (
	"bytes"
	"context"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestReapAnswersOnlyWhatTheCallerSees: a reap removes every expired
// sandbox, whoever made it (expiry is the operator's policy), but answers
// its caller with the ids of the sandboxes that caller may see: its own
// (the legacy principal's include those that record none), or all of them
// for an administrator. The audit line names everything it removed.
func TestReapAnswersOnlyWhatTheCallerSees(t *testing.T) {
	tests := []struct {
		name   string
		caller api.Caller
		want   []string
	}{
		{name: "alice", caller: api.Caller{Principal: "alice"}, want: []string{"alice1"}},
		{name: "bob", caller: api.Caller{Principal: "bob"}, want: []string{"bob1"}},
		{name: "the legacy principal", caller: api.Caller{Principal: api.LegacyPrincipal}, want: []string{"old1"}},
		{name: "an administrator", caller: api.Caller{Principal: "ops", Admin: true}, want: []string{"alice1", "bob1", "old1"}},
		{name: "a principal with none", caller: api.Caller{Principal: "carol"}, want: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			apiServerWrites(t, client) // UIDs, which the owner checks compare
			var audit bytes.Buffer
			m := NewManager(testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"}), client,
				WithAuditLog(slog.New(slog.NewJSONHandler(&audit, nil))))
			bg := context.Background()
			expired := func(id string) api.Spec {
				s := ownerSpec(id)
				s.Now = time.Now().Add(-2 * time.Hour) // idle for an hour past its timeout
				return s
			}
			for _, c := range []struct {
				principal string
				spec      api.Spec
			}{{"alice", expired("alice1")}, {"alice", ownerSpec("alice2")}, {"bob", expired("bob1")}} {
				if _, err := m.Create(api.WithCaller(bg, api.Caller{Principal: c.principal}), c.spec, 0); err != nil {
					t.Fatalf("create %s: %v", c.spec.ID, err)
				}
			}
			// A sandbox from before principals: no annotation, no label.
			if _, err := client.CoreV1().Pods("deer-flow").Create(bg, resources.BuildPod(m.cfg.Objects(), expired("old1")), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			audit.Reset()

			r, err := m.Reap(api.WithCaller(bg, tc.caller))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, s := range r.Removed {
				got = append(got, s.ID)
			}
			sort.Strings(got)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ids in the answer (-want +got):\n%s", diff)
			}
			if r.Count != len(tc.want) {
				t.Errorf("count %d, want %d", r.Count, len(tc.want))
			}
			pods, err := client.CoreV1().Pods("deer-flow").List(bg, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, p := range pods.Items {
				left = append(left, p.Name)
			}
			if diff := cmp.Diff([]string{resources.PodName("alice2")}, left); diff != "" {
				t.Errorf("Pods after the reap, which removes every expired one (-want +got):\n%s", diff)
			}
			// Their Services too, at once: each owns its Pod (issue 49), so
			// no garbage collector would (the fake has none anyway).
			svcs, err := client.CoreV1().Services("deer-flow").List(bg, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			left = nil
			for _, s := range svcs.Items {
				left = append(left, s.Name)
			}
			if diff := cmp.Diff([]string{resources.ServiceName("alice2")}, left); diff != "" {
				t.Errorf("Services after the reap (-want +got):\n%s", diff)
			}
			lines := auditLines(t, &audit)
			if len(lines) != 1 {
				t.Fatalf("audit lines %v, want one", lines)
			}
			removed, _ := lines[0]["removed"].([]any)
			var audited []string
			for _, id := range removed {
				audited = append(audited, id.(string))
			}
			sort.Strings(audited)
			if diff := cmp.Diff([]string{"alice1", "bob1", "old1"}, audited); diff != "" {
				t.Errorf("the audit line's removed ids (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReapSparesAClaimBetweenItsLists: the reap lists Services, then Pods.
// A pooled create makes its Service, then claims a Pod made long before;
// when both writes land between the two lists, the reap sees an old Pod of
// the id that no listed Service names. It is a sandbox since its claim
// (created-at), not since the Pod was made: it stays. A Pod no Service
// names since longer than any create (its claim's patch landed after the
// client gave up) is half-made and goes.
func TestReapSparesAClaimBetweenItsLists(t *testing.T) {
	tests := []struct {
		name        string
		claimedAgo  time.Duration // 0: by the create racing the reap
		serviceMade bool          // between the reap's two lists
		wantReaped  []string
	}{
		{name: "claimed between the lists", serviceMade: true, wantReaped: []string{}},
		{name: "claimed long ago, named by no Service", claimedAgo: 5 * time.Minute, wantReaped: []string{"half-made"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			m := NewManager(testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"}), client)
			bg := context.Background()
			alice := api.WithCaller(bg, api.Caller{Principal: "alice"})
			s := ownerSpec("px")
			s.Now = time.Now().Add(-tc.claimedAgo)
			if _, err := m.Create(alice, s, 0); err != nil {
				t.Fatal(err)
			}
			// The Pod stands in for a pooled one: made two hours before its claim.
			pod, err := client.CoreV1().Pods("deer-flow").Get(bg, resources.PodName("px"), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			pod.CreationTimestamp = metav1.NewTime(time.Now().Add(-2 * time.Hour))
			if _, err := client.CoreV1().Pods("deer-flow").Update(bg, pod, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			svc, err := client.CoreV1().Services("deer-flow").Get(bg, resources.ServiceName("px"), metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := client.CoreV1().Services("deer-flow").Delete(bg, svc.Name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			// The Service is made right after the reap's list of Services has
			// been answered, before its list of Pods.
			client.PrependReactor("list", "services", func(action k8stesting.Action) (bool, runtime.Object, error) {
				l, err := client.Tracker().List(corev1.SchemeGroupVersion.WithResource("services"),
					corev1.SchemeGroupVersion.WithKind("Service"), "deer-flow")
				if err == nil && tc.serviceMade {
					svc.ResourceVersion = ""
					err = client.Tracker().Create(corev1.SchemeGroupVersion.WithResource("services"), svc, "deer-flow")
				}
				return true, l, err
			})

			r, err := m.Reap(api.WithCaller(bg, api.Caller{Principal: "ops", Admin: true}))
			if err != nil {
				t.Fatal(err)
			}
			reasons := []string{}
			for _, x := range r.Removed {
				reasons = append(reasons, x.Reason)
			}
			if diff := cmp.Diff(tc.wantReaped, reasons); diff != "" {
				t.Errorf("reaped (-want +got):\n%s", diff)
			}
			_, err = client.CoreV1().Pods("deer-flow").Get(bg, pod.Name, metav1.GetOptions{})
			if stays := err == nil; stays != (len(tc.wantReaped) == 0) {
				t.Errorf("the claimed Pod stays: %v (read: %v)", stays, err)
			}
		})
	}
}
