package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Label and annotation keys. The first four labels are DeerFlow's, so its
// tooling and ours see the same sandboxes.
const (
	LabelApp       = "app"
	LabelAppValue  = "deer-flow-sandbox"
	LabelID        = "sandbox-id"
	LabelName      = "app.kubernetes.io/name"
	LabelComponent = "app.kubernetes.io/component"
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedByValue = "deerflow-sandbox-provisioner"
	LabelUser      = "sandbox.deerflow.dev/user"
	LabelThread    = "sandbox.deerflow.dev/thread"

	AnnotationUserID           = "sandbox.deerflow.dev/user-id"
	AnnotationThreadID         = "sandbox.deerflow.dev/thread-id"
	AnnotationCreatedAt        = "sandbox.deerflow.dev/created-at"
	AnnotationLastActivity     = "sandbox.deerflow.dev/last-activity"
	AnnotationIdleTimeout      = "sandbox.deerflow.dev/idle-timeout-seconds"
	AnnotationMaxLifetime      = "sandbox.deerflow.dev/max-lifetime-seconds"
	AnnotationExpiresAt        = "sandbox.deerflow.dev/expires-at"
	AnnotationMaxShellSessions = "sandbox.deerflow.dev/max-shell-sessions"
	// AnnotationTemplate names the template a sandbox was made from.
	AnnotationTemplate = "sandbox.deerflow.dev/template-name"
	// On a ReplicaSet sandbox: what the reap does when it is idle, how long
	// it may stay paused, and since when it is.
	AnnotationIdleAction    = "sandbox.deerflow.dev/idle-action"
	AnnotationPausedTimeout = "sandbox.deerflow.dev/paused-timeout-seconds"
	AnnotationPausedAt      = "sandbox.deerflow.dev/paused-at"

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
	return l[LabelApp] == LabelAppValue && l[LabelID] == id
}

// podID is the id of the sandbox whose Pod p is (labelled as a sandbox and
// named for its id, or claimed from a warm pool, whose name it keeps), or ""
// when p is no sandbox's Pod: a ReplicaSet sandbox's, or an unclaimed pooled
// one (no id).
func podID(p *corev1.Pod) string {
	if id := p.Labels[LabelID]; id != "" && (p.Name == PodName(id) || p.Labels[LabelPooled] == "true") && IsSandbox(p, id) {
		return id
	}
	return ""
}

// serviceID is podID for Services.
func serviceID(s *corev1.Service) string {
	if id := s.Labels[LabelID]; id != "" && s.Name == ServiceName(id) && IsSandbox(s, id) {
		return id
	}
	return ""
}

// replicaSetID is podID for ReplicaSets, which share the Pod's name.
func replicaSetID(rs *appsv1.ReplicaSet) string {
	if id := rs.Labels[LabelID]; id != "" && rs.Name == PodName(id) && IsSandbox(rs, id) {
		return id
	}
	return ""
}

// selectorAll selects every sandbox, ours and DeerFlow's, so list adopts leftovers.
var selectorAll = LabelApp + "=" + LabelAppValue

// selectorReplicaSetServices selects the Services of ReplicaSet sandboxes.
var selectorReplicaSetServices = selectorAll + "," + LabelWorkload + "=" + workloadReplicaSetValue

// LabelValue returns v if it is a valid label value, otherwise a stable hash
// of it: user and thread ids may be 64 characters or start with '_'.
func LabelValue(v string) string {
	if len(validation.IsValidLabelValue(v)) == 0 {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "h-" + hex.EncodeToString(sum[:])[:40]
}

func labels(s Spec) map[string]string {
	return map[string]string{
		LabelApp:       LabelAppValue,
		LabelID:        s.ID,
		LabelName:      "deer-flow",
		LabelComponent: "sandbox",
		LabelManagedBy: ManagedByValue,
		LabelUser:      LabelValue(s.UserID),
		LabelThread:    LabelValue(s.ThreadID),
	}
}
