package resources

import (
	"strconv"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Which objects make one sandbox, and whose it is: the checks every door
// runs on what it found of an id (pkg/sandbox's fetch and create).

// CheckOwner refuses to hand a sandbox to anyone but the user and thread it
// was made for. DeerFlow derives ids from user and thread, so without this
// anyone who can create could pre-create another user's sandbox and receive
// that user's agent traffic, or take over an existing one. The detail names
// neither the owner nor the URL.
func CheckOwner(obj metav1.Object, kind string, s api.Spec) error {
	if !IsSandbox(obj, s.ID) {
		return &api.Error{Kind: api.KindConflict, Detail: "a " + kind + " named " + obj.GetName() + " exists and is not a sandbox; choose another sandbox_id"}
	}
	if a := obj.GetAnnotations(); a[keys.AnnotationUserID] != s.UserID || a[keys.AnnotationThreadID] != s.ThreadID || !s.Caller.Sees(obj) {
		return &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " exists for another user or thread; choose another sandbox_id"}
	}
	return nil
}

// CheckCapacity refuses to reuse a Pod that was created for fewer shell
// sessions than now requested, so DeerFlow's backend replaces it.
func CheckCapacity(obj metav1.Object, s api.Spec) error {
	if s.MaxShellSessions == 0 {
		return nil
	}
	have, err := strconv.Atoi(obj.GetAnnotations()[keys.AnnotationMaxShellSessions])
	if err != nil {
		return &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " exists but was created without max_shell_sessions; delete it and create it again to get " + strconv.Itoa(s.MaxShellSessions)}
	}
	if have < s.MaxShellSessions {
		return &api.Error{Kind: api.KindConflict, Detail: "sandbox " + s.ID + " exists with capacity for " + strconv.Itoa(have) +
			" shell sessions, fewer than the " + strconv.Itoa(s.MaxShellSessions) + " requested; delete it and create it again"}
	}
	return nil
}

// SameSandbox reports whether svc was made for s's user, thread and
// principal, as its labels and annotation record them.
func SameSandbox(svc *corev1.Service, s api.Spec) bool {
	l := svc.Labels
	return l[keys.LabelUser] == LabelValue(s.UserID) && l[keys.LabelThread] == LabelValue(s.ThreadID) &&
		api.PrincipalOf(svc) == s.Caller.Records()
}

// ClaimedOwner reports whether svc belongs to a Pod claimed from a pool:
// a Pod that keeps the name its pool gave it, not sandbox-<id>.
func ClaimedOwner(svc *corev1.Service, id string) bool {
	ref := SandboxOwner(svc.OwnerReferences)
	return ref != nil && ref.Kind == "Pod" && ref.Name != PodName(id)
}

// Pending reports whether svc holds id for a workload still to come: a
// pooled Pod still to be claimed, or a cold create's slot. A slot that owns
// its Pod (OwnedBy) looks the same from svc alone: a caller that can meet
// one reads the Pod (pkg/sandbox's boundWorkload, slot.Slots.Await).
func Pending(svc *corev1.Service, id string) bool {
	return ClaimedOwner(svc, id) || SandboxOwner(svc.OwnerReferences) == nil && SelectedToken(svc) != ""
}
