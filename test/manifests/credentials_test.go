package manifests

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	servingv1 "knative.dev/serving/pkg/apis/serving/v1"
)

// TestFunctionPodHasNoVolume: the function's Pod mounts nothing, so the
// kubelet starts it without waiting on its volume manager (which checks a
// Pod's mounts every 300 ms: a Pod with one volume started 517 ms after its
// create on the real node, one without 212 ms); its ServiceAccount mounts
// no token, and the token and CA it reaches the API server with come by env
// from that account's token Secret, which config/ ships empty for the
// cluster's token controller to fill (docs/security.md, "The function's
// credentials").
func TestFunctionPodHasNoVolume(t *testing.T) {
	var svc servingv1.Service
	decode(t, "400-service.yaml", &svc)
	spec := svc.Spec.Template.Spec.PodSpec
	if len(spec.Volumes) != 0 {
		t.Errorf("400-service.yaml: the function's Pod has %d volumes; want none", len(spec.Volumes))
	}
	for _, c := range spec.Containers {
		if len(c.VolumeMounts) != 0 {
			t.Errorf("400-service.yaml: container %s mounts %d volumes; want none", c.Name, len(c.VolumeMounts))
		}
	}
	var (
		sa     *corev1.ServiceAccount
		tokens = map[string]corev1.Secret{}
	)
	for _, o := range configObjects(t) {
		switch o.groupKind().Kind {
		case "ServiceAccount":
			var a corev1.ServiceAccount
			o.into(t, &a)
			if a.Name == spec.ServiceAccountName {
				sa = &a
			}
		case "Secret":
			var s corev1.Secret
			o.into(t, &s)
			if s.Type == corev1.SecretTypeServiceAccountToken {
				tokens[s.Name] = s
			}
		}
	}
	if sa == nil {
		t.Fatalf("config/ has no ServiceAccount %s, the function's", spec.ServiceAccountName)
	}
	if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		t.Errorf("ServiceAccount %s mounts its token into the function's Pod (a volume); want automountServiceAccountToken: false", sa.Name)
	}
	if spec.AutomountServiceAccountToken != nil && *spec.AutomountServiceAccountToken {
		t.Error("400-service.yaml mounts the ServiceAccount's token (a volume)")
	}
	type ref struct{ Secret, Key string }
	got := map[string]ref{}
	for _, e := range spec.Containers[0].Env {
		if (e.Name == "K8S_TOKEN" || e.Name == "K8S_CA_CERT") && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			r := e.ValueFrom.SecretKeyRef
			if r.Optional != nil && *r.Optional {
				t.Errorf("%s is optional: a Pod without it would start with no credentials", e.Name)
			}
			got[e.Name] = ref{r.Name, r.Key}
			if s, ok := tokens[r.Name]; !ok || s.Annotations[corev1.ServiceAccountNameKey] != sa.Name {
				t.Errorf("%s comes from Secret %s, which is not a token Secret of ServiceAccount %s in config/", e.Name, r.Name, sa.Name)
			}
		}
	}
	want := map[string]ref{"K8S_TOKEN": {got["K8S_TOKEN"].Secret, corev1.ServiceAccountTokenKey}, "K8S_CA_CERT": {got["K8S_TOKEN"].Secret, corev1.ServiceAccountRootCAKey}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the function's credentials by env (-want +got):\n%s", diff)
	}
}
