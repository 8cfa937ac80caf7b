package resources

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestSandboxURL(t *testing.T) {
	tests := []struct {
		name string
		env  map[string]string
		svc  corev1.Service
		want string
	}{{
		name: "NodePort on NODE_HOST",
		env:  map[string]string{"NODE_HOST": "10.0.0.5"},
		svc:  corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{NodePort: 31234}}}},
		want: "http://10.0.0.5:31234",
	}, {
		name: "NodePort on an IPv6 NODE_HOST",
		env:  map[string]string{"NODE_HOST": "fd00::5"},
		svc:  corev1.Service{Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Ports: []corev1.ServicePort{{NodePort: 31234}}}},
		want: "http://[fd00::5]:31234",
	}, {
		name: "ClusterIP by DNS name",
		env:  map[string]string{"SANDBOX_SERVICE_TYPE": "ClusterIP"},
		svc:  corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-a-svc", Namespace: "deer-flow"}, Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP}},
		want: "http://sandbox-a-svc.deer-flow.svc.cluster.local:8080",
	}, {
		name: "Headless by the same DNS name",
		env:  map[string]string{"SANDBOX_SERVICE_TYPE": "Headless"},
		svc: corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "sandbox-a-svc", Namespace: "deer-flow"},
			Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeClusterIP, ClusterIP: corev1.ClusterIPNone}},
		want: "http://sandbox-a-svc.deer-flow.svc.cluster.local:8080",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := URL(testConfig(t, tc.env).Objects(), &tc.svc); got != tc.want {
				t.Errorf("url = %q, want %q", got, tc.want)
			}
		})
	}
}
