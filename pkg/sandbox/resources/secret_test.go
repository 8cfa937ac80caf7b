package resources

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// envValues are request env values no builder may write anywhere but the
// env Secret.
var envValues = map[string]string{"OPENAI_API_KEY": "sk-live-7f3a9c", "DOLLARS": "pay-$(HOME)-$$"}

func slotOf(s api.Spec) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: ServiceName(s.ID), UID: "uid-slot"}}
}

// TestEnvSecret pins the env Secret of a request: named from the id,
// owned by the sandbox's Service by UID (so the GC removes it with the
// sandbox), Opaque and immutable (what the admission policy admits), and
// holding each value as sent: a secretKeyRef is never expanded, so no $
// is doubled.
func TestEnvSecret(t *testing.T) {
	cfg := testConfig(t, nil)
	s := testSpec()
	s.Env = envValues
	want := &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: "sandbox-0123456789abcdef-env", Namespace: "deer-flow",
			Labels: map[string]string{"app": "deer-flow-sandbox", "sandbox-id": "0123456789abcdef", "app.kubernetes.io/managed-by": "deerflow-sandbox-provisioner"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: "sandbox-0123456789abcdef-svc", UID: "uid-slot",
				BlockOwnerDeletion: ptr.To(false)}},
		},
		Type:      corev1.SecretTypeOpaque,
		Immutable: ptr.To(true),
		Data:      map[string][]byte{"OPENAI_API_KEY": []byte("sk-live-7f3a9c"), "DOLLARS": []byte("pay-$(HOME)-$$")},
	}
	got := EnvSecret(cfg.Objects(), s, slotOf(s))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("EnvSecret (-want +got):\n%s", diff)
	}
	if !EnvSecretOwnedBy(got, "uid-slot") || EnvSecretOwnedBy(got, "uid-other") {
		t.Errorf("EnvSecret is not recognised as the sandbox's own, owned by its slot alone")
	}
}

// TestWorkloadsCarryNoEnvValue (issue 45 finding 8): whatever a create
// with env writes besides its Secret (a bare Pod, a ReplicaSet's Pod
// template, the shape a pooled create compares) names each variable and
// its Secret, and holds none of the values: anyone who may read Pods or
// ReplicaSets reads nothing of them.
func TestWorkloadsCarryNoEnvValue(t *testing.T) {
	cfg := testConfig(t, nil)
	s := testSpec()
	s.Env = envValues
	rsSpec := s
	rsSpec.Resolved = &template.Template{Name: "rs", Kind: template.KindReplicaSet}
	for _, tc := range []struct {
		name string
		obj  any
		spec func() *corev1.PodSpec
	}{
		{"bare Pod", BuildPodFor(cfg.Objects(), s), func() *corev1.PodSpec { return &BuildPodFor(cfg.Objects(), s).Spec }},
		{"ReplicaSet", BuildReplicaSet(cfg.Objects(), rsSpec), func() *corev1.PodSpec { return &BuildReplicaSet(cfg.Objects(), rsSpec).Spec.Template.Spec }},
		{"pooled shape", PoolPodTemplate(cfg.Objects(), s), func() *corev1.PodSpec { tpl := PoolPodTemplate(cfg.Objects(), s); return &tpl.Spec }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := json.Marshal(tc.obj)
			if err != nil {
				t.Fatal(err)
			}
			for name, v := range envValues {
				if strings.Contains(string(raw), v) {
					t.Errorf("the %s holds the value of %s", tc.name, name)
				}
			}
			if !UsesEnvSecret(tc.spec(), s.ID) {
				t.Errorf("the %s does not reference %s", tc.name, EnvSecretName(s.ID))
			}
			if UsesEnvSecret(tc.spec(), "another") {
				t.Errorf("the %s references another sandbox's env Secret", tc.name)
			}
		})
	}
	noEnv := testSpec()
	if UsesEnvSecret(&BuildPodFor(cfg.Objects(), noEnv).Spec, noEnv.ID) {
		t.Error("a Pod without env references an env Secret")
	}
}
