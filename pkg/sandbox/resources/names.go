package resources

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

const (
	containerName = "sandbox"
	portName      = "http"
)

// PodName is the name DeerFlow's provisioner gives a sandbox's Pod.
func PodName(id string) string { return "sandbox-" + id }

// ServiceName is the name DeerFlow's provisioner gives a sandbox's Service.
func ServiceName(id string) string { return "sandbox-" + id + "-svc" }

// IsSandbox reports whether obj carries the labels both provisioners put on
// sandbox id's objects. Get, destroy and reap touch nothing else, so an id
// such as "provisioner-x" cannot reach a Pod that merely has the name
// sandbox-provisioner-x (the function's own, say).
func IsSandbox(obj metav1.Object, id string) bool {
	l := obj.GetLabels()
	return l[keys.LabelApp] == keys.LabelAppValue && l[keys.LabelID] == id
}

// PodID is the id of the sandbox whose Pod p is (labelled as a sandbox and
// named for its id, or claimed from a warm pool, whose name it keeps), or ""
// when p is no sandbox's Pod: a ReplicaSet sandbox's, or an unclaimed pooled
// one (no id).
func PodID(p *corev1.Pod) string {
	if id := p.Labels[keys.LabelID]; id != "" && (p.Name == PodName(id) || p.Labels[keys.LabelPooled] == "true") && IsSandbox(p, id) {
		return id
	}
	return ""
}

// ServiceID is PodID for Services.
func ServiceID(s *corev1.Service) string {
	if id := s.Labels[keys.LabelID]; id != "" && s.Name == ServiceName(id) && IsSandbox(s, id) {
		return id
	}
	return ""
}

// ReplicaSetID is PodID for ReplicaSets, which share the Pod's name.
func ReplicaSetID(rs *appsv1.ReplicaSet) string {
	if id := rs.Labels[keys.LabelID]; id != "" && rs.Name == PodName(id) && IsSandbox(rs, id) {
		return id
	}
	return ""
}

// sandboxLabels is the label every sandbox object carries, ours and
// DeerFlow's.
func sandboxLabels() labels.Set { return labels.Set{keys.LabelApp: keys.LabelAppValue} }

// SelectorAll selects every sandbox, ours and DeerFlow's, so list adopts leftovers.
var SelectorAll = sandboxLabels().String()

// SelectorAllWith selects the sandbox objects that also carry every label
// of with.
func SelectorAllWith(with labels.Set) string { return labels.Merge(sandboxLabels(), with).String() }

// ListSelector selects the sandboxes the caller may list: all of them for
// an administrator, those labelled with its principal otherwise (the
// annotation is checked again on each: the label is a hash). The legacy
// principal's include those that record none, which no label selects: it
// lists every sandbox and List keeps what it sees.
func ListSelector(c api.Caller) string {
	if c.Admin || c.Principal == api.LegacyPrincipal {
		return SelectorAll
	}
	return SelectorAllWith(labels.Set{keys.LabelPrincipal: PrincipalLabelValue(c.Principal)})
}

// SelectorReplicaSetServices selects the Services of ReplicaSet sandboxes.
var SelectorReplicaSetServices = SelectorAllWith(labels.Set{keys.LabelWorkload: keys.WorkloadReplicaSetValue})

// LabelValue returns v if it is a valid label value, otherwise a stable hash
// of it: user and thread ids may be 64 characters or start with '_'.
func LabelValue(v string) string {
	if len(validation.IsValidLabelValue(v)) == 0 {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "h-" + hex.EncodeToString(sum[:])[:40]
}

// Labels are a sandbox's labels, on its workload and its Service.
func Labels(s api.Spec) map[string]string {
	l := map[string]string{
		keys.LabelApp:       keys.LabelAppValue,
		keys.LabelID:        s.ID,
		keys.LabelName:      "deer-flow",
		keys.LabelComponent: "sandbox",
		keys.LabelManagedBy: keys.ManagedByValue,
		keys.LabelUser:      LabelValue(s.UserID),
		keys.LabelThread:    LabelValue(s.ThreadID),
	}
	if s.Token != "" {
		l[keys.LabelToken] = s.Token
	}
	if s.Egress.Mode != "" {
		l[keys.LabelEgress] = string(s.Egress.Mode)
	}
	if s.Resolved != nil && s.Resolved.Envd {
		l[keys.LabelEnvd] = "true"
	}
	return l
}
