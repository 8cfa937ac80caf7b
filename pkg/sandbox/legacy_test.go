package sandbox

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// TestLegacyServiceIsDefaultsWithItsPod: a Service DeerFlow's provisioner
// made (no owner, no token, no principal) holds a node port that DeerFlow's
// backend may still use. Only default's create adopts it, and only with the
// Pod it was made for; another principal's create of the id is answered as
// for a taken id and changes nothing, with the Pod or without. A Service
// whose Pod is gone names no sandbox: default's create replaces it.
func TestLegacyServiceIsDefaultsWithItsPod(t *testing.T) {
	const id, nodePort = "legacy1", int32(30123)
	type result struct {
		Refused string // the create's error, "" when it succeeded
		Objects []string
		// Kept: the Service is the legacy one (its UID and node port).
		Kept        bool
		Chain       string // which of the Service and the Pod owns the other (chain)
		ReplicaSets int
	}
	tests := []struct {
		name    string
		caller  string
		withPod bool
		kind    string // the template's workload kind; "" for a Pod
		want    result
	}{{
		name: "another principal, the Pod gone", caller: "bob",
		want: result{Refused: "sandbox " + id + " exists for another user or thread; choose another sandbox_id", Objects: []string{"Service " + resources.ServiceName(id)}, Kept: true},
	}, {
		name: "another principal, with the Pod", caller: "bob", withPod: true,
		want: result{Refused: "sandbox " + id + " exists for another user or thread; choose another sandbox_id", Objects: []string{"Pod " + resources.PodName(id), "Service " + resources.ServiceName(id)}, Kept: true},
	}, {
		name: "default, with the Pod", caller: config.DefaultPrincipal, withPod: true,
		want: result{Objects: []string{"Pod " + resources.PodName(id), "Service " + resources.ServiceName(id)}, Kept: true, Chain: "Pod owns Service"},
	}, {
		// The ReplicaSet create answers with the Pod that holds the id, as a
		// create of the other kind does, and adopts nothing.
		name: "default's ReplicaSet, with the Pod", caller: config.DefaultPrincipal, withPod: true, kind: template.KindReplicaSet,
		want: result{Objects: []string{"Pod " + resources.PodName(id), "Service " + resources.ServiceName(id)}, Kept: true},
	}, {
		name: "default, the Pod gone", caller: config.DefaultPrincipal,
		want: result{Objects: []string{"Pod " + resources.PodName(id), "Service " + resources.ServiceName(id)}, Chain: "Service owns Pod"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			apiServerWrites(t, client)
			cfg := testConfig(t, map[string]string{"SANDBOX_NETWORK_POLICY_ENSURE": "true"})
			m := NewManager(cfg, client)
			bg := context.Background()
			s := ownerSpec(id)
			if tc.withPod {
				pod := resources.BuildPod(cfg.Objects(), s)
				delete(pod.Annotations, keys.AnnotationPrincipal)
				if _, err := client.CoreV1().Pods(cfg.Namespace).Create(bg, pod, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			legacy := resources.BuildService(cfg.Objects(), s, metav1.OwnerReference{})
			legacy.OwnerReferences = nil
			delete(legacy.Annotations, keys.AnnotationPrincipal)
			legacy.Spec.Type = corev1.ServiceTypeNodePort
			legacy.Spec.Ports[0].NodePort = nodePort
			legacy, err := client.CoreV1().Services(cfg.Namespace).Create(bg, legacy, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}

			create := ownerSpec(id)
			if tc.kind != "" {
				create.Template = "healing"
				pt := &corev1.PodTemplate{ObjectMeta: metav1.ObjectMeta{Name: create.Template, Namespace: cfg.Namespace,
					Labels: map[string]string{keys.LabelTemplate: "true"}, Annotations: map[string]string{keys.TemplateKind: tc.kind}},
					Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: template.ContainerName, Image: "sandbox"}}}}}
				if _, err := client.CoreV1().PodTemplates(cfg.Namespace).Create(bg, pt, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			_, err = m.Create(api.WithCaller(bg, api.Caller{Principal: tc.caller}), create, 0)
			got := result{Objects: objectsLeft(t, client)}
			if err != nil {
				got.Refused = api.DetailOf(err)
				if api.KindOf(err) != api.KindConflict {
					t.Errorf("create as %s: %v, want a conflict (409) or success", tc.caller, err)
				}
			}
			svc, gerr := client.CoreV1().Services(cfg.Namespace).Get(bg, resources.ServiceName(id), metav1.GetOptions{})
			if gerr != nil {
				t.Fatal(gerr)
			}
			rss, lerr := client.AppsV1().ReplicaSets(cfg.Namespace).List(bg, metav1.ListOptions{})
			if lerr != nil {
				t.Fatal(lerr)
			}
			got.ReplicaSets = len(rss.Items)
			got.Kept = svc.UID == legacy.UID && svc.Spec.Ports[0].NodePort == nodePort
			if pod, err := client.CoreV1().Pods(cfg.Namespace).Get(bg, resources.PodName(id), metav1.GetOptions{}); err == nil {
				got.Chain = chain(svc, pod)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("create as %s (-want +got):\n%s", tc.caller, diff)
			}
		})
	}
}
