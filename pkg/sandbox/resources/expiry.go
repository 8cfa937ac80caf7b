package resources

import (
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/template"
)

// The expiry rules: what a sandbox workload's annotations say about its
// lifetime, and when the reap removes or pauses it. Pure functions of an
// object and the time, beside ExpiresAt that writes the deadline.

// Lifetime is what a workload's annotations say about its expiry.
type Lifetime struct {
	Created, LastActivity time.Time
	Idle, Max             time.Duration
}

// LifetimeOf reads obj's lifetime annotations; false when it has none
// (DeerFlow's provisioner made it) or they do not parse.
func LifetimeOf(obj metav1.Object) (Lifetime, bool) {
	a := obj.GetAnnotations()
	created, err1 := time.Parse(time.RFC3339, a[keys.AnnotationCreatedAt])
	last, err2 := time.Parse(time.RFC3339, a[keys.AnnotationLastActivity])
	idle, err3 := strconv.ParseInt(a[keys.AnnotationIdleTimeout], 10, 64)
	max, err4 := strconv.ParseInt(a[keys.AnnotationMaxLifetime], 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return Lifetime{}, false
	}
	return Lifetime{Created: created, LastActivity: last, Idle: time.Duration(idle) * time.Second, Max: time.Duration(max) * time.Second}, true
}

// SandboxSince is when obj became a sandbox: the later of its creation and
// its created-at annotation. They differ for a pooled Pod, made long before
// a claim turned it into a sandbox (and wrote created-at): how long it has
// been one is what says whether the create that made it is over.
func SandboxSince(obj metav1.Object) time.Time {
	since := obj.GetCreationTimestamp().Time
	if c, err := time.Parse(time.RFC3339, obj.GetAnnotations()[keys.AnnotationCreatedAt]); err == nil && c.After(since) {
		since = c
	}
	return since
}

// ExpiresAt is the earlier of l's idle deadline and its lifetime cap.
func (l Lifetime) ExpiresAt() time.Time {
	return ExpiresAt(l.Created, l.LastActivity, l.Idle, l.Max)
}

// ExpiryReason says why a Pod should go now, or "" if it should stay.
func ExpiryReason(p *corev1.Pod, now time.Time) string {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return "ended"
	}
	lt, ok := LifetimeOf(p)
	if !ok {
		return ""
	}
	if !now.Before(lt.Created.Add(lt.Max)) {
		return "lifetime"
	}
	if !now.Before(lt.LastActivity.Add(lt.Idle)) {
		return "idle"
	}
	return ""
}

// ReplicaSetExpiry says what the reap does to a ReplicaSet sandbox now: the
// reason, and whether it pauses rather than deletes. The lifetime cap holds
// paused or not; a paused sandbox goes after its paused timeout; an idle
// one is paused when its template says so, else deleted.
func ReplicaSetExpiry(rs *appsv1.ReplicaSet, now time.Time) (string, bool) {
	lt, ok := LifetimeOf(rs)
	if !ok {
		return "", false
	}
	a := rs.Annotations
	switch {
	case !now.Before(lt.Created.Add(lt.Max)):
		return "lifetime", false
	case Paused(rs):
		at, err1 := time.Parse(time.RFC3339, a[keys.AnnotationPausedAt])
		limit, err2 := strconv.ParseInt(a[keys.AnnotationPausedTimeout], 10, 64)
		if err1 == nil && err2 == nil && !now.Before(at.Add(time.Duration(limit)*time.Second)) {
			return "paused-timeout", false
		}
		return "", false
	case !now.Before(lt.LastActivity.Add(lt.Idle)):
		return "idle", a[keys.AnnotationIdleAction] == template.IdlePause
	}
	return "", false
}
