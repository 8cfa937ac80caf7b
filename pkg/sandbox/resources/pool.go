package resources

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/config"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PoolSpec is what a pooled Pod of t is built from: a create that asks for
// t and nothing else.
func PoolSpec(cfg config.Objects, t *template.Template) api.Spec {
	s, _ := api.CreateRequest{SandboxID: "pool", Template: t.Name}.Validate(cfg, time.Time{}) // valid by construction
	return WithTemplate(cfg, s, t)
}

// poolIdentity are the annotations that make a Pod one sandbox; a claim
// writes them, a pooled Pod has none.
var poolIdentity = []string{keys.AnnotationUserID, keys.AnnotationThreadID, keys.AnnotationCreatedAt, keys.AnnotationLastActivity,
	keys.AnnotationIdleTimeout, keys.AnnotationMaxLifetime, keys.AnnotationExpiresAt, keys.AnnotationMetadata}

// PoolPodTemplate is the Pod a create of s would make, without what makes
// it one sandbox (name, id, user, thread, token and pod labels, lifecycle annotations,
// deadline), labelled with the hash of all that is left. Two specs with one
// hash make interchangeable Pods: that is the test of whether a request may
// take a pooled Pod, so any field a request can set (mounts, env, shell
// sessions, resources, Lark containers) sends it the cold way by itself.
//
// An E2B sandbox's token hash is left out too: a pooled Pod's agent starts
// without one, and the router gives it the hash of the token it checks
// before the first call it forwards (envd's /init).
func PoolPodTemplate(cfg config.Objects, s api.Spec) corev1.PodTemplateSpec {
	s.EnvdTokenHash = ""
	pod := BuildPod(cfg, s)
	for _, k := range []string{keys.LabelID, keys.LabelUser, keys.LabelThread, keys.LabelToken, keys.LabelPod} {
		delete(pod.Labels, k)
	}
	for _, k := range poolIdentity {
		delete(pod.Annotations, k)
	}
	pod.Spec.ActiveDeadlineSeconds = nil
	tpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: pod.Labels, Annotations: pod.Annotations}, Spec: pod.Spec}
	data, _ := json.Marshal(tpl)
	sum := sha256.Sum256(data)
	tpl.Labels[keys.LabelPoolHash] = hex.EncodeToString(sum[:])[:16]
	return tpl
}

// WithTemplate fills the bounded fields the request left unset from t, and
// sets the sandbox's egress (EgressOf).
func WithTemplate(cfg config.Objects, s api.Spec, t *template.Template) api.Spec {
	s.Resolved = t
	s.Egress = EgressOf(cfg, t)
	if t == nil {
		return s
	}
	if !s.Requested.IdleTimeout && t.IdleTimeout > 0 {
		s.IdleTimeout = t.IdleTimeout
	}
	if !s.Requested.MaxLifetime && t.MaxLifetime > 0 {
		s.MaxLifetime = t.MaxLifetime
	}
	if !s.Requested.CPU && t.CPULimit != nil {
		s.CPULimit = *t.CPULimit
	}
	if !s.Requested.Memory && t.MemoryLimit != nil {
		s.MemoryLimit = *t.MemoryLimit
	}
	return s
}
