package follow

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func slice(svc string, endpoints ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: svc + "-x1", Namespace: "deer-flow", Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpoints,
	}
}

func endpointOf(uid types.UID, addrs ...string) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{Addresses: addrs, TargetRef: &corev1.ObjectReference{Kind: "Pod", UID: uid}}
}

// TestListsAddress pins which EndpointSlice lets a create answer in
// Headless mode: one of its own Service that lists an address of its Pod.
func TestListsAddress(t *testing.T) {
	const pod types.UID = "pod-1"
	tests := []struct {
		name  string
		slice *discoveryv1.EndpointSlice
		pod   types.UID
		want  bool
	}{
		{"its Pod's address", slice("sandbox-a-svc", endpointOf("pod-1", "10.88.0.5")), pod, true},
		{"no endpoints yet", slice("sandbox-a-svc"), pod, false},
		{"its Pod without an address", slice("sandbox-a-svc", endpointOf("pod-1")), pod, false},
		{"another Pod's address (the one before a resume)", slice("sandbox-a-svc", endpointOf("pod-0", "10.88.0.4")), pod, false},
		{"another Service's slice", slice("sandbox-b-svc", endpointOf("pod-1", "10.88.0.5")), pod, false},
		{"any address, when the Pod is not known yet", slice("sandbox-a-svc", endpointOf("pod-9", "10.88.0.9")), "", true},
		{"an address without a Pod behind it", slice("sandbox-a-svc", discoveryv1.Endpoint{Addresses: []string{"10.88.0.5"}}), pod, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ListsAddress(tt.slice, "sandbox-a-svc", tt.pod); got != tt.want {
				t.Errorf("ListsAddress = %v, want %v", got, tt.want)
			}
		})
	}
}
