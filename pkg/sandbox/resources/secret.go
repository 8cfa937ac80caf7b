package resources

import (
	"maps"
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
)

// A request's env (api.Spec.Env) is often a credential (docs/api.md's
// example is an API key), and anyone who may read Pods or ReplicaSets, or
// sees a watch of them, would read a value written into the spec. So the
// values live in one Secret per sandbox, EnvSecretName(id), and the
// sandbox container takes each by reference (env valueFrom.secretKeyRef):
// the workload carries names only. The Secret is owned by the sandbox's
// Service, which its workload owns, so the garbage collector removes it
// with the sandbox; the admission policy lets a sandbox reference no other
// Secret (config/800-admission-policy.yaml). A request without env writes
// no Secret: DeerFlow's creates write what they always did.

// EnvSecretName names the Secret that holds sandbox id's request env. It
// has the length of ServiceName's, so every valid id fits.
func EnvSecretName(id string) string { return "sandbox-" + id + "-env" }

// EnvSecret is the Secret holding s.Env for the sandbox whose Service is
// svc, owned by svc (by UID): it goes when the Service goes, and a stale
// one (of a Service gone) is told apart from this create's by that UID
// (EnvSecretOwnedBy). The values are stored as sent: a secretKeyRef is
// never expanded as $(NAME), so nothing needs escaping. Immutable, so
// nothing changes a sandbox's env after its create (the kubelet also
// stops watching it).
func EnvSecret(cfg config.Objects, s api.Spec, svc *corev1.Service) *corev1.Secret {
	data := make(map[string][]byte, len(s.Env))
	for name, value := range s.Env {
		data[name] = []byte(value)
	}
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      EnvSecretName(s.ID),
			Namespace: cfg.Namespace,
			Labels: map[string]string{
				keys.LabelApp:       keys.LabelAppValue,
				keys.LabelID:        s.ID,
				keys.LabelManagedBy: keys.ManagedByValue,
			},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Service", Name: svc.Name, UID: svc.UID,
				BlockOwnerDeletion: ptr.To(false),
			}},
		},
		Type:      corev1.SecretTypeOpaque,
		Immutable: ptr.To(true),
		Data:      data,
	}
}

// EnvSecretOwnedBy reports whether secret is a sandbox's env Secret owned
// by the Service of that UID.
func EnvSecretOwnedBy(secret *corev1.Secret, uid types.UID) bool {
	return slices.ContainsFunc(secret.OwnerReferences, func(r metav1.OwnerReference) bool {
		return r.APIVersion == "v1" && r.Kind == "Service" && r.UID == uid
	})
}

// requestEnv is the request's env in name order, each a reference to its
// key in the sandbox's env Secret (EnvSecret), never its value.
func requestEnv(id string, in map[string]string) []corev1.EnvVar {
	var env []corev1.EnvVar
	for _, name := range slices.Sorted(maps.Keys(in)) {
		env = append(env, corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: EnvSecretName(id)}, Key: name,
		}}})
	}
	return env
}

// UsesEnvSecret reports whether spec takes any variable from sandbox id's
// env Secret.
func UsesEnvSecret(spec *corev1.PodSpec, id string) bool {
	return slices.ContainsFunc(spec.Containers, func(c corev1.Container) bool {
		return slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == EnvSecretName(id)
		})
	})
}
