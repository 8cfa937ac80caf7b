package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestCreateLeavesNothingWhenTheCountFails injects errors into the quota's
// count with client-go's fake clientset (a stand-in for the API server; the
// real one is in test/e2e): a create whose count was refused or failed
// removes its Pod and Service, so nothing lingers that no count admitted.
func TestCreateLeavesNothingWhenTheCountFails(t *testing.T) {
	existing := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: PodName("older"), Namespace: "deer-flow", Labels: labels(Spec{ID: "older"})}}
	tests := []struct {
		name     string
		env      map[string]string
		objects  []runtime.Object
		failList string // the resource whose list fails
		wantKind Kind
	}{
		{name: "the quick count's Services list fails", failList: "services", wantKind: KindUnavailable},
		{name: "the quick count's Pod list fails", failList: "pods", wantKind: KindUnavailable},
		{name: "the full count's ReplicaSet list fails", env: map[string]string{"MAX_SANDBOXES_PER_USER": "5"}, failList: "replicasets", wantKind: KindUnavailable},
		{name: "refused", env: map[string]string{"MAX_SANDBOXES": "1"}, objects: []runtime.Object{existing}, wantKind: KindQuota},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"}
			for k, v := range tc.env {
				env[k] = v
			}
			client := fake.NewClientset(tc.objects...)
			if tc.failList != "" {
				client.PrependReactor("list", tc.failList, func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewServiceUnavailable("injected")
				})
			}
			m := NewManager(testConfig(t, env), client)
			ctx, cancel := context.WithTimeout(WithCaller(context.Background(), Caller{Principal: "default"}), 10*time.Second)
			defer cancel()
			_, err := m.Create(ctx, Spec{ID: "new1", UserID: "u", ThreadID: "t", IdleTimeout: time.Hour, MaxLifetime: time.Hour}, 0)
			if KindOf(err) != tc.wantKind {
				t.Fatalf("create: %v (kind %v), want kind %v", err, KindOf(err), tc.wantKind)
			}
			pods, perr := client.Tracker().List(corev1.SchemeGroupVersion.WithResource("pods"), corev1.SchemeGroupVersion.WithKind("Pod"), "deer-flow")
			svcs, serr := client.Tracker().List(corev1.SchemeGroupVersion.WithResource("services"), corev1.SchemeGroupVersion.WithKind("Service"), "deer-flow")
			if perr != nil || serr != nil {
				t.Fatal(perr, serr)
			}
			var left []string
			for _, p := range pods.(*corev1.PodList).Items {
				left = append(left, "Pod "+p.Name)
			}
			for _, s := range svcs.(*corev1.ServiceList).Items {
				left = append(left, "Service "+s.Name)
			}
			var want []string
			for _, o := range tc.objects {
				want = append(want, "Pod "+o.(*corev1.Pod).Name)
			}
			if diff := cmp.Diff(want, left); diff != "" {
				t.Errorf("objects after the create (-want +got):\n%s", diff)
			}
		})
	}
}
