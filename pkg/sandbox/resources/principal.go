package resources

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PrincipalLabelValue is the label value for a principal: always a hash, so
// that every name (a username has ':') maps to one form, and no key name can
// pose as another principal's hash.
func PrincipalLabelValue(principal string) string {
	sum := sha256.Sum256([]byte(principal))
	return "p-" + hex.EncodeToString(sum[:])[:40]
}

// RecordPrincipal writes the creating principal onto an object being built.
func RecordPrincipal(obj metav1.Object, s api.Spec) {
	if s.Caller.Principal == "" {
		return
	}
	l, a := obj.GetLabels(), obj.GetAnnotations()
	if l == nil {
		l = map[string]string{}
	}
	if a == nil {
		a = map[string]string{}
	}
	l[keys.LabelPrincipal] = PrincipalLabelValue(s.Caller.Principal)
	a[keys.AnnotationPrincipal] = s.Caller.Principal
	obj.SetLabels(l)
	obj.SetAnnotations(a)
}

// BuildPodFor is BuildPod with the creating principal recorded.
func BuildPodFor(cfg config.Objects, s api.Spec) *corev1.Pod {
	pod := BuildPod(cfg, s)
	RecordPrincipal(pod, s)
	return pod
}
