package sandbox

import (
	"context"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/deerflow-sandbox/provisioner/pkg/api"
	"github.com/deerflow-sandbox/provisioner/pkg/keys"
	"github.com/deerflow-sandbox/provisioner/pkg/sandbox/resources"
	"github.com/deerflow-sandbox/provisioner/pkg/sleep"
)

// ensureEnvSecret writes the env Secret of s (resources.EnvSecret), owned
// by svc, this create's own slot, before the workload that references it:
// a container whose Secret is missing does not start until the kubelet's
// next try. A create without env writes nothing (nil).
//
// The slot is the id's lock, so no other create of the id writes a Secret
// while this one holds it. A Secret of the name that is already there is
// this create's own (a write cut after it landed: owned by svc's UID), or
// one left by a sandbox of the id whose Service is gone, which the garbage
// collector has not removed yet: that one goes (with its UID as
// precondition) and this create writes its own. A Secret of the name that
// is not a sandbox's is never touched: 409.
func (m *Manager) ensureEnvSecret(ctx context.Context, s api.Spec, svc *corev1.Service) (*corev1.Secret, error) {
	if len(s.Env) == 0 {
		return nil, nil
	}
	want := resources.EnvSecret(m.cfg.Objects(), s, svc)
	secrets := m.client.CoreV1().Secrets(m.cfg.Namespace)
	for attempt := 0; attempt < maxConvergeAttempts; attempt++ {
		created, err := secrets.Create(ctx, want, metav1.CreateOptions{})
		if err == nil {
			return created, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return nil, m.createFailed(err, "Secret", s)
		}
		existing, err := secrets.Get(ctx, want.Name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			continue
		case err != nil:
			return nil, api.Classify(err, "read the existing env Secret of the sandbox")
		case !resources.IsEnvSecret(existing, s.ID):
			return nil, &api.Error{Kind: api.KindConflict, Detail: "a Secret named " + existing.Name + " exists and is not a sandbox's; choose another sandbox_id"}
		case resources.EnvSecretOwnedBy(existing, svc.UID) && existing.DeletionTimestamp == nil:
			return existing, nil
		}
		// Of a Service gone (this create holds the id's Service): stale.
		err = secrets.Delete(ctx, existing.Name, metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions(string(existing.UID))})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return nil, api.Classify(err, "replace a stale env Secret of the sandbox")
		}
		if err := sleep.For(ctx, time.Duration(attempt)*50*time.Millisecond); err != nil {
			return nil, api.Classify(err, "replace a stale env Secret of the sandbox")
		}
	}
	return nil, &api.Error{Kind: api.KindConflict, Detail: "the env Secret of sandbox " + s.ID + " is changing concurrently; retry"}
}

// dropEnv removes the env Secret a failed create wrote (nil: none). One
// that cannot be removed now still goes with its owner, the create's slot.
func (m *Manager) dropEnv(ctx context.Context, secret *corev1.Secret) {
	if secret == nil {
		return
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.cfg.RequestTimeout)
	defer cancel()
	if err := m.rm.EnvSecret(uctx, secret); err != nil {
		m.audit.Leftover(ctx, secret.Labels[keys.LabelID], err)
	}
}
