//go:build e2e

package e2e

import (
	"context"
	"maps"
	"path/filepath"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
)

// TestAdmissionAdmitsWarmPools runs the function as the provisioner's
// ServiceAccount under config/'s Role and admission policies with a pooled
// template: the pool's ReplicaSet is admitted and fills, a create claims a
// pooled Pod (a Pod update the Pod policy admits), and the ReplicaSet
// policy refuses, for real, pool ReplicaSets that would escape: a hostPath
// outside the roots, more replicas than maxPoolSize, Pods with a
// sandbox-id, a selector that is not the ReplicaSet's own pool. The Pod
// policy refuses a change of a sandbox's image.
func TestAdmissionAdmitsWarmPools(t *testing.T) {
	ns, sa := serviceAccountNamespace(t)
	ctx := context.Background()
	// The Role may only read the shared sandbox NetworkPolicy: put config/'s
	// in this namespace, as an operator would.
	np := readObjects(t, filepath.Join("..", "..", "config", "701-networkpolicy-sandboxes.yaml"))
	for _, o := range np {
		o.SetNamespace(ns)
	}
	applyServerSide(t, np)

	proxy.Impersonate(serviceAccount)
	defer proxy.Impersonate("")
	// The runtime class as config/ sets it (without a user namespace, as
	// config/ runs gVisor), which the policies require.
	f := start(t, ns, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "false", "SANDBOX_RUNTIME_CLASS": "gvisor", "SANDBOX_USER_NAMESPACE": "false"})
	warmUp(t, f, ns, "warm", 2)

	r := mustDo(t, f, "POST", "/api/sandboxes", map[string]any{"sandbox_id": "pp1", "template": "warm", "user_id": "u1"})
	expectCode(t, r, 200, "create of a pooled template as the ServiceAccount")
	if r.Body["pooled"] != true {
		t.Fatalf("create answered %s; want a sandbox claimed from the pool (pooled: true)", r.Raw)
	}
	claimed := pods(t, ns, "sandbox-id=pp1")
	if len(claimed) != 1 || claimed[0].Labels[poolLabel] != "" || len(claimed[0].OwnerReferences) != 0 || claimed[0].Spec.ActiveDeadlineSeconds == nil {
		t.Fatalf("claimed Pods %+v; want one, out of the pool, with a deadline", claimed)
	}
	// The claimed Pod carries its pin (its own name), and what reaches it
	// (its wire, or its own Service when it was claimed unwired) selects
	// that name beside its token (issue 45): each write the policies
	// admitted.
	svc, err := client().CoreV1().Services(ns).Get(ctx, resources.ServiceName("pp1"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if name := resources.URLService(svc); name != "" {
		if svc, err = client().CoreV1().Services(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if claimed[0].Labels[keys.LabelPod] != claimed[0].Name || svc.Spec.Selector[keys.LabelPod] != claimed[0].Name ||
		svc.Spec.Selector[keys.LabelToken] != claimed[0].Labels[keys.LabelToken] {
		t.Errorf("claimed Pod labels %v, Service %s selects %v; want the Pod's own name as its pin, selected beside its token", claimed[0].Labels, svc.Name, svc.Spec.Selector)
	}

	// The pool refills through the ReplicaSet the policy admitted.
	eventually(t, 60*time.Second, "the pool refilled", func() (bool, error) {
		return poolReady(t, ns, "warm") == 2, poolState(t, ns, "warm")
	})

	// A claim may set activeDeadlineSeconds; nothing else in the spec changes.
	image := []byte(`{"spec":{"containers":[{"name":"` + claimed[0].Spec.Containers[0].Name + `","image":"evil:1"}]}}`)
	if _, err := sa.CoreV1().Pods(ns).Patch(ctx, claimed[0].Name, types.StrategicMergePatchType, image, metav1.PatchOptions{}); !refusedBy(err, podPolicy, "changes nothing in a sandbox Pod's spec") {
		t.Errorf("a sandbox's image changed as the ServiceAccount: %v; want a refusal by %s", err, podPolicy)
	}

	live, err := client().AppsV1().ReplicaSets(ns).Get(ctx, "sandbox-pool-warm", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// poolRS is the function's pool ReplicaSet for another pool, as the
	// function would make it, with no Pods.
	poolRS := func(pool string) *appsv1.ReplicaSet {
		rs := &appsv1.ReplicaSet{
			ObjectMeta: metav1.ObjectMeta{Name: "sandbox-pool-" + pool, Namespace: ns, Labels: maps.Clone(live.Labels), Annotations: live.Annotations},
			Spec:       *live.Spec.DeepCopy(),
		}
		rs.Labels[poolLabel] = pool
		rs.Spec.Replicas = ptr.To[int32](0)
		rs.Spec.Selector.MatchLabels[poolLabel] = pool
		rs.Spec.Template.Labels[poolLabel] = pool
		return rs
	}
	// The positive control: the same shape for another pool is admitted.
	if _, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, poolRS("other"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("a pool ReplicaSet of the function's shape is refused: %v", err)
	}
	for _, tc := range []struct {
		name, message string
		mutate        func(*appsv1.ReplicaSet)
	}{{
		name: "hostPath outside the roots", message: "may mount from the node only",
		mutate: func(rs *appsv1.ReplicaSet) {
			rs.Spec.Template.Spec.Volumes = append(rs.Spec.Template.Spec.Volumes, corev1.Volume{Name: "etc",
				VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/etc", Type: ptr.To(corev1.HostPathDirectory)}}})
			c := &rs.Spec.Template.Spec.Containers[0]
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "etc", MountPath: "/host-etc"})
		},
	}, {
		name: "replicas above maxPoolSize", message: "runs at most 10 Pods",
		mutate: func(rs *appsv1.ReplicaSet) { rs.Spec.Replicas = ptr.To[int32](11) },
	}, {
		name: "Pods with a sandbox-id", message: "with its pool label and no sandbox-id",
		mutate: func(rs *appsv1.ReplicaSet) { rs.Spec.Template.Labels["sandbox-id"] = "stolen" },
	}, {
		name: "another pool's selector", message: "a warm pool's, sandbox-pool-<pool>",
		mutate: func(rs *appsv1.ReplicaSet) {
			rs.Spec.Selector.MatchLabels[poolLabel], rs.Spec.Template.Labels[poolLabel] = "warm", "warm"
		},
	}, {
		name: "a selector wider than its pool", message: "a warm pool's, sandbox-pool-<pool>",
		mutate: func(rs *appsv1.ReplicaSet) {
			delete(rs.Spec.Selector.MatchLabels, poolLabel)
			rs.Spec.Selector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: poolLabel, Operator: metav1.LabelSelectorOpExists}}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rs := poolRS("x")
			tc.mutate(rs)
			_, err := sa.AppsV1().ReplicaSets(ns).Create(ctx, rs, metav1.CreateOptions{})
			if !refusedBy(err, rsPolicy, tc.message) {
				t.Errorf("pool ReplicaSet created as the ServiceAccount: %v; want a refusal by %s saying %q", err, rsPolicy, tc.message)
			}
		})
	}
	// Resizing the live pool above the cap is refused too (an update).
	big := live.DeepCopy()
	big.Spec.Replicas = ptr.To[int32](11)
	if _, err := sa.AppsV1().ReplicaSets(ns).Update(ctx, big, metav1.UpdateOptions{}); !refusedBy(err, rsPolicy, "runs at most 10 Pods") {
		t.Errorf("pool resized to 11 as the ServiceAccount: %v; want a refusal by %s", err, rsPolicy)
	}
}
